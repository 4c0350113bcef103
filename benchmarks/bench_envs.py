"""Raw env throughput: steps per second of each registered env family under random actions.

Each case is made with ``gym.make(env_id)`` (so the registered wrappers are included), reset with a
seed, and stepped with uniformly random actions (reset on episode end) for ``--steps`` steps; the
best of ``--repeats`` timed runs is reported. Single process, no learning: this measures the
Python cost of the envs themselves, the floor under any training throughput.

Writes ``benchmarks/results/envs.json`` (configuration, per-case figures with units, the exact
command, library versions, torch threads, CPU model, date) and ``benchmarks/results/envs.md``.

    python benchmarks/bench_envs.py            # full size
    python benchmarks/bench_envs.py --quick    # a few hundred steps per env, to check the script

To add a family (e.g. the instruction-following envs), append :class:`BenchCase` entries to
:data:`CASES`; an env whose optional dependency is missing is reported as skipped.
"""

import argparse
import json
import platform
import time
import warnings
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from common import RESULTS_DIR, run_metadata

import sb3_amago  # noqa: F401  (registers the amago-* ids)


@dataclass(frozen=True)
class BenchCase:
    """One row of the table: an env family and the registered id measured for it."""

    family: str
    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)


#: The measured envs; append cases for new families here.
CASES: list[BenchCase] = [
    BenchCase("T-maze", "amago-TMaze-v0"),
    BenchCase("T-maze", "amago-TMaze10000-v0"),
    BenchCase("POPGym", "amago-popgym-RepeatPreviousEasy-v0"),
    BenchCase("POPGym", "amago-popgym-CountRecallHard-v0"),
    BenchCase("POPGym", "amago-popgym-BattleshipEasy-v0"),
    BenchCase("POPGym", "amago-popgym-PositionOnlyCartPoleEasy-v0"),
    BenchCase("POPGym", "amago-popgym-LabyrinthEscapeEasy-v0"),
    BenchCase("Meta-RL", "amago-DarkKeyToDoor-v0"),
    BenchCase("Meta-RL", "amago-HalfCheetahVel-v0"),
    BenchCase("Instruction", "amago-MazeRunner-v0"),
    BenchCase("Instruction", "amago-PackageDelivery-v0"),
    BenchCase("Instruction", "amago-CrafterInstructions-v0"),
]


def _steps_per_second(case: BenchCase, steps: int, repeats: int, seed: int) -> dict[str, Any]:
    """Best-of-``repeats`` steps/s of one case, with the episodes it finished."""
    env = gym.make(case.env_id, **case.kwargs)
    env.action_space.seed(seed)
    actions = [env.action_space.sample() for _ in range(steps)]
    best, episodes = 0.0, 0
    for repeat in range(repeats):
        env.reset(seed=seed + repeat)
        episodes = 0
        start = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                env.reset()
                episodes += 1
        best = max(best, steps / (time.perf_counter() - start))
    env.close()
    return {"steps_per_s": best, "episodes_finished": episodes}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("numpy", "gymnasium", "torch", "popgym", "mazelib", "mujoco", "sb3-amago"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def run(steps: int, repeats: int, seed: int) -> list[dict[str, Any]]:
    """Measure every case; a case whose dependency is missing is returned with ``skipped``."""
    rows = []
    for case in CASES:
        row: dict[str, Any] = {"family": case.family, "env_id": case.env_id, "kwargs": case.kwargs}
        try:
            row.update(_steps_per_second(case, steps, repeats, seed))
        except ImportError as err:
            row["skipped"] = str(err)
        rows.append(row)
        shown = f"{row['steps_per_s']:,.0f} steps/s" if "steps_per_s" in row else f"skipped ({row['skipped']})"
        print(f"{case.family:10s} {case.env_id:45s} {shown}", flush=True)
    return rows


def write_results(rows: list[dict[str, Any]], config: dict[str, Any], out_dir: Path) -> None:
    """``envs.json`` and ``envs.md`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        **run_metadata(),
        "versions": _versions(),
    }
    units = {"steps_per_s": "env steps per second (best of repeats)", "episodes_finished": "episodes in one run"}
    payload = {"benchmark": "envs", "config": config, "units": units, **meta, "results": rows}
    (out_dir / "envs.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# Env throughput (random actions, single process)",
        "",
        f"`{meta['command']}` on {meta['cpu_model']}, {meta['date']}; {config['steps']} steps x best of {config['repeats']}.",
        "",
        "| family | env id | steps/s | episodes |",
        "|---|---|---:|---:|",
    ]
    for row in rows:
        if "skipped" in row:
            lines.append(f"| {row['family']} | `{row['env_id']}` | skipped: {row['skipped']} | |")
        else:
            figures = f"{row['steps_per_s']:,.0f} | {row['episodes_finished']}"
            lines.append(f"| {row['family']} | `{row['env_id']}` | {figures} |")
    (out_dir / "envs.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    """Command line entry: parse, measure, write."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 steps, 1 repeat: checks the script, not the speed")
    parser.add_argument("--steps", type=int, default=20_000, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per env (best is reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    steps, repeats = (300, 1) if args.quick else (args.steps, args.repeats)
    if steps < 1 or repeats < 1:
        parser.error("--steps and --repeats must be >= 1")
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # popgym's maze notice
    np.random.seed(args.seed)
    config = {"steps": steps, "repeats": repeats, "seed": args.seed, "quick": args.quick, "actions": "uniform random"}
    write_results(run(steps, repeats, args.seed), config, args.out_dir)


if __name__ == "__main__":
    main()
