"""Files saved by earlier versions of the package load and continue: a model and its replay saved
before the replay's format version 2 (the rollout bookkeeping kept as attributes of the buffer, the
exploration multipliers kept in the run state as ``explore_scale``), with what that version read
back from them right after the save (``expected_v1.pt``).

The run behind them: ``scripts/fingerprint.py``'s "multidiscrete" case (a Dict observation with
``prev_reward``, GRU, the bi-level exploration schedule, 2 envs) with ``buffer_size=100``, saved
after ``learn(64)``."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch as th
from gymnasium import spaces

from sb3_amago import AMAGO
from sb3_amago.buffers import REPLAY_FORMAT_VERSION, TrajectoryReplayBuffer
from sb3_amago.exploration import BiLevelSchedule

DATA = Path(__file__).parent / "data"


@pytest.fixture
def expected() -> dict:
    return th.load(DATA / "expected_v1.pt", weights_only=False)


def test_version_1_replay_loads_with_the_same_rollouts_and_samples(expected: dict) -> None:
    model = AMAGO.load(DATA / "model_v1.zip")
    model.load_replay_buffer(DATA / "replay_v1.pkl")
    replay = model.replay_buffer
    assert isinstance(replay, TrajectoryReplayBuffer) and replay.format_version == REPLAY_FORMAT_VERSION
    assert (replay.size(), replay.num_rollouts()) == (expected["size"], expected["n_rollouts"])
    np.random.seed(3)
    batch = replay.sample(4)._asdict()
    for name, value in expected["batch"].items():
        if isinstance(value, dict):
            for key in value:
                assert th.equal(batch[name][key].cpu(), value[key]), (name, key)
        else:
            assert th.equal(batch[name].cpu(), value), name


def test_version_1_model_resumes_its_exploration_and_acts_as_saved(expected: dict) -> None:
    model = AMAGO.load(DATA / "model_v1.zip")
    assert model.num_timesteps == expected["num_timesteps"]
    assert isinstance(model.exploration, BiLevelSchedule) and model.exploration.horizon == 5
    np.testing.assert_array_equal(model.exploration.scale, expected["explore_scale"])
    action, _ = model.predict(expected["obs"], deterministic=True)
    np.testing.assert_array_equal(action, expected["action"])
    assert isinstance(model.action_space, spaces.MultiDiscrete)


def test_version_1_files_continue_training(tmp_path: Path) -> None:
    """Without the envs of the saved run (a fresh env restarts the rollouts), the loaded model and
    replay train on, and save and load again in the current format."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import fingerprint

    model = AMAGO.load(DATA / "model_v1.zip", env=fingerprint.CASES["multidiscrete"].make_envs(0))
    model.load_replay_buffer(DATA / "replay_v1.pkl")
    updates = model._n_updates
    model.learn(16, reset_num_timesteps=False)
    assert model._n_updates > updates
    model.save(tmp_path / "model")
    model.save_replay_buffer(tmp_path / "replay")
    again = AMAGO.load(tmp_path / "model")
    again.load_replay_buffer(tmp_path / "replay")
    assert again.replay_buffer.size() == model.replay_buffer.size()
