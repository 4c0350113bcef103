"""benchmarks/cartpole_probe.py: a short run's checkpoints are probed and reported (seconds)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_cartpole_probe_reports_each_checkpoint(tmp_path: Path) -> None:
    """Two checkpoints (before and after the first updates): each row has its episodes, how each
    ended, and the bootstrapped value that ``n_step * tau * updates`` target refreshes allow."""
    import cartpole_probe

    argv = ["--steps", "1200", "--every", "600", "--episodes", "1", "--ckpt-dir", str(tmp_path / "ckpt")]
    cartpole_probe.main([*argv, "--out-dir", str(tmp_path)])
    payload = json.loads((tmp_path / "cartpole_probe.json").read_text())
    rows = payload["checkpoints"]
    assert [row["env_steps"] for row in rows] == [600, 1200]
    assert rows[0]["updates"] == 0 and rows[1]["updates"] > 0
    gamma, refreshes = 0.99, rows[1]["target_refreshes"]
    assert rows[1]["bootstrapped_value"] == pytest.approx((1 - gamma**refreshes) / (1 - gamma))
    for row in rows:
        assert len(row["popart_w"]) == len(row["popart_sigma"]) == len(row["gammas"]) and row["gammas"][-1] == gamma
        (episode,) = row["episodes"]
        assert episode["end"] in {"x", "theta", "limit"} and 1 <= episode["length"] <= cartpole_probe.MAX_STEPS
        assert 0.0 <= episode["right_share"] <= 1.0 and 0.0 <= episode["actor_margin"] <= 0.5
        assert np.isfinite(episode["last_q"]) and abs(episode["last_q"]) <= episode["mean_abs_q"] * episode["length"]
    assert "| 1,200 |" in (tmp_path / "cartpole_probe.md").read_text()
