"""RL Zoo integration (``python -m sb3_amago.zoo``): short train runs with evaluation and checkpoints
then enjoy, end to end through the entry point; the ``-optimize`` path; the shipped hyperparameter
file (package data, mirrored in ``rl_zoo_hyperparams/``, every entry builds an AMAGO on its env); and
clear errors for bad input."""

import argparse
import itertools
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml

pytest.importorskip("rl_zoo3")

from sb3_amago import AMAGO, zoo
from sb3_amago.envs import registered_ids
from sb3_amago.envs.popgym_envs import POPGYM_RETURN_RANGES
from sb3_amago.exploration import QuietSpanSchedule
from sb3_amago.relabel import HindsightInstructionRelabeler

ROOT = Path(__file__).resolve().parents[1]
TINY_POLICY = (
    "policy_kwargs:dict(d_embed=16, traj_encoder_kwargs=dict(d_model=16, n_heads=2, d_ff=32, n_layers=1), "
    "timestep_encoder_kwargs=dict(hidden_sizes=(16,)), actor_hidden=(16,), critic_hidden=(16,))"
)
COMMON = ["--num-threads", "1", "--seed", "0", "-f", "logs"]
TMAZE_H = 5


def run_zoo(cwd: Path, *args: str) -> str:
    """``python -m sb3_amago.zoo ARGS`` in ``cwd``; its output, after asserting success."""
    proc = subprocess.run(
        [sys.executable, "-m", "sb3_amago.zoo", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


def file_entries() -> dict[str, dict[str, Any]]:
    """The shipped hyperparameter file as the zoo reads it."""
    return yaml.safe_load(zoo.HYPERPARAMS_FILE.read_text())


# ----------------------------------------------------------------------------------------------
# End to end through the entry point
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tmaze_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300-step T-maze training run (corridor 5, tiny model) with evaluation, checkpoints and
    tensorboard; returns its working directory (logs in ``logs/``, tensorboard in ``tb/``)."""
    cwd = tmp_path_factory.mktemp("tmaze")
    run_zoo(
        cwd, "train", "--env", "amago-TMaze-v0", "--env-kwargs", f"corridor_length:{TMAZE_H}", "-n", "300",
        "--eval-freq", "150", "--eval-episodes", "2", "--save-freq", "150", "-tb", "tb", *COMMON,
        "-params", "n_envs:2", f"max_seq_len:{TMAZE_H + 1}", f"exploration:QuietSpanSchedule(steps=200, quiet_end={TMAZE_H}, quiet_level=0.1)",
        "buffer_size:10000", "learning_starts:100", TINY_POLICY,
    )  # fmt: skip
    return cwd


def test_tmaze_train_writes_models_checkpoints_evaluations(tmaze_run: Path) -> None:
    run = tmaze_run / "logs" / "amago" / "amago-TMaze-v0_1"
    for name in ("amago-TMaze-v0.zip", "best_model.zip", "rl_model_150_steps.zip", "evaluations.npz"):
        assert (run / name).is_file(), name
    assert len(np.load(run / "evaluations.npz")["timesteps"]) >= 1
    config = yaml.load((run / "amago-TMaze-v0" / "config.yml").read_text(), Loader=yaml.UnsafeLoader)
    assert config["max_seq_len"] == TMAZE_H + 1  # -params override the file
    assert config["reward_multiplier"] == 100.0  # the file's T-maze entry
    assert list((tmaze_run / "tb").rglob("events.out.tfevents*"))


def test_tmaze_enjoy_through_entry_point(tmaze_run: Path) -> None:
    output = run_zoo(tmaze_run, "enjoy", "--env", "amago-TMaze-v0", "-n", "20", "--num-threads", "1")
    assert "without rendering" in output  # the T-maze cannot render: enjoy plays it headless
    assert f"Mean episode length: {TMAZE_H + 1:.2f}" in output  # env kwargs carried over from training


def test_enjoy_carries_context_and_reserves_no_replay(tmaze_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zoo's enjoy hands each step's AmagoState back to predict, resets it with episode_start,
    and the loaded model allocates no replay storage."""
    calls: list[SimpleNamespace] = []
    original = AMAGO.predict

    def recording_predict(
        self: AMAGO, observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False
    ) -> Any:
        action, new_state = original(self, observation, state=state, episode_start=episode_start, deterministic=deterministic)
        calls.append(
            SimpleNamespace(model=self, state_in=state, start=bool(np.asarray(episode_start)[0]), state_out=new_state)
        )
        return action, new_state

    monkeypatch.setattr(AMAGO, "predict", recording_predict)
    monkeypatch.chdir(tmaze_run)
    n_steps = 2 * (TMAZE_H + 1) + 2
    args = ["enjoy", "--env", "amago-TMaze-v0", "-n", str(n_steps), "--no-render", "--load-checkpoint", "150"]
    assert zoo.main(args) == 0
    assert len(calls) == n_steps
    assert calls[0].state_in is None
    assert all(later.state_in is earlier.state_out for earlier, later in itertools.pairwise(calls))
    episode_steps = [int(call.state_out.time_idx[0]) for call in calls]
    assert episode_steps == [t % (TMAZE_H + 1) + 1 for t in range(n_steps)]
    assert [call.start for call in calls] == [t % (TMAZE_H + 1) == 0 for t in range(n_steps)]
    assert calls[0].model.replay_buffer.nbytes() == 0


def test_popgym_train_subproc_then_enjoy(tmp_path: Path) -> None:
    """Subprocess vec envs (the env ids exist in the workers), two eval envs, checkpoints."""
    env_id = "amago-popgym-RepeatPreviousEasy-v0"
    run_zoo(
        tmp_path, "train", "--env", env_id, "-n", "300", "--eval-freq", "200", "--eval-episodes", "2",
        "--n-eval-envs", "2", "--save-freq", "200", "--vec-env", "subproc", *COMMON,
        "-params", "n_envs:2", "max_seq_len:16", "buffer_size:20000", "learning_starts:100", TINY_POLICY,
    )  # fmt: skip
    run = tmp_path / "logs" / "amago" / f"{env_id}_1"
    for name in (f"{env_id}.zip", "best_model.zip", "rl_model_200_steps.zip", "evaluations.npz"):
        assert (run / name).is_file(), name
    output = run_zoo(tmp_path, "enjoy", "--env", env_id, "-n", "110", "--load-best", "--num-threads", "1")
    assert "2 Episodes" in output and "Mean reward" in output


def test_optimize_two_trials(tmp_path: Path) -> None:
    output = run_zoo(
        tmp_path, "train", "--env", "amago-TMaze-v0", "--env-kwargs", "corridor_length:3", "-optimize",
        "--n-trials", "2", "-n", "120", "--n-evaluations", "1", "--eval-episodes", "1", "--sampler", "random",
        "--pruner", "none", "--no-optim-plots", *COMMON,
        "-params", "n_envs:2", "max_seq_len:4", "buffer_size:5000", "learning_starts:40", TINY_POLICY,
        "exploration:None",  # the schedule from the arguments, whose epsilon_end the trials sample
    )  # fmt: skip
    assert "Number of finished trials:  2" in output
    (report,) = (tmp_path / "logs" / "amago").glob("report_amago-TMaze-v0_2-trials-120-random-none_*.csv")
    lines = report.read_text().splitlines()
    assert len(lines) == 3 and all("COMPLETE" in line for line in lines[1:])


def test_sampler_and_converter() -> None:
    import optuna

    zoo.register()
    from rl_zoo3.hyperparams_opt import HYPERPARAMS_CONVERTER, HYPERPARAMS_SAMPLER

    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    sampled = HYPERPARAMS_SAMPLER["amago"](trial, 0, 1, {})
    zoo.check_hyperparameters(sampled, lambda key: "sampled")
    assert 0.95 <= sampled["gamma"] < 1.0
    assert HYPERPARAMS_CONVERTER["amago"](trial.params) == sampled


def test_relabeler_and_exploration_from_the_command_line() -> None:
    """``-params`` values are evaluated by the zoo's StoreDict, which sees the relabelers and
    exploration schedules once registered."""
    from rl_zoo3.utils import StoreDict

    zoo.register()
    parser = argparse.ArgumentParser()
    parser.add_argument("-params", nargs="+", action=StoreDict)
    params = parser.parse_args(["-params", "relabeler:HindsightInstructionRelabeler(strategy='all')"]).params
    assert isinstance(params["relabeler"], HindsightInstructionRelabeler) and params["relabeler"].strategy == "all"
    params = parser.parse_args(["-params", "exploration:QuietSpanSchedule(quiet_end=9, quiet_level=0.05)"]).params
    assert isinstance(params["exploration"], QuietSpanSchedule) and params["exploration"].quiet_end == 9


def test_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert zoo.main([]) == 2
    assert "usage: python -m sb3_amago.zoo {train,enjoy}" in capsys.readouterr().out
    assert zoo.main(["--help"]) == 0
    assert "enjoy" in capsys.readouterr().out
    assert zoo.main(["plot"]) == 2
    assert "unknown command 'plot'" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# The hyperparameter file
# ----------------------------------------------------------------------------------------------
def test_rl_zoo_hyperparams_is_the_package_file() -> None:
    assert (ROOT / "rl_zoo_hyperparams" / "amago.yml").read_bytes() == zoo.HYPERPARAMS_FILE.read_bytes()


def test_hyperparams_and_the_kernels_sources_ship_in_the_wheel(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "sb3_amago", source / "sb3_amago", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    from sb3_amago.nets import cpu_kernels

    sources = {f"sb3_amago/nets/{source.name}" for source in cpu_kernels.SOURCES}  # built on the user's machine
    assert {"sb3_amago/hyperparams/amago.yml", "sb3_amago/zoo.py", "sb3_amago/py.typed", *sources} <= set(
        zipfile.ZipFile(wheel).namelist()
    )


def test_entries_cover_the_registered_envs() -> None:
    entries = file_entries()
    missing = [env_id for env_id in registered_ids() if env_id not in entries]
    assert not missing, f"add an entry to {zoo.HYPERPARAMS_FILE} for {missing}"
    families = {name.removesuffix("Easy") for name in POPGYM_RETURN_RANGES if name.endswith("Easy")}
    assert len(families) == 16 and all(f"amago-popgym-{family}Easy-v0" in entries for family in families)
    assert {"default", "CartPole-v1", "Pendulum-v1"} <= set(entries)
    assert all("n_timesteps" in entry and "policy" in entry for entry in entries.values())


ENTRY_ENVS = {"default": "MountainCar-v0", "atari": "PongNoFrameskip-v4"}


@pytest.mark.parametrize("entry", list(file_entries()))
def test_entry_builds_amago(entry: str, tmp_path: Path) -> None:
    """The zoo's own preprocessing of each entry, then AMAGO built on the env it makes."""
    env_id = ENTRY_ENVS.get(entry, entry)
    if entry == "atari":
        gym.register_envs(pytest.importorskip("ale_py"))
    manager = zoo.AmagoExperimentManager(argparse.Namespace(), zoo.ALGO, env_id, str(tmp_path), eval_freq=-1)
    hyperparams, manager.env_wrapper, _, manager.vec_env_wrapper = manager._preprocess_hyperparams(
        manager.read_hyperparameters()[0]
    )
    try:
        env = manager.create_envs(1, no_log=True)
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        pytest.skip(f"{env_id} needs an optional dependency: {exc}")
    model = AMAGO(env=env, **hyperparams)
    assert model.max_seq_len == file_entries()[entry]["max_seq_len"]
    if "relabeler" in file_entries()[entry]:
        assert isinstance(model.relabeler, HindsightInstructionRelabeler)
    env.close()


@pytest.mark.parametrize("entry", [e for e in file_entries() if e.startswith("amago-") and "Crafter" not in e])
def test_context_covers_a_rollout(entry: str) -> None:
    """max_seq_len is at least the length of a (random-action) rollout of the env."""
    try:
        env = gym.make(entry)
    except (ImportError, gym.error.DependencyNotInstalled) as exc:
        pytest.skip(f"{entry} needs an optional dependency: {exc}")
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, done = 0, False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        steps, done = steps + 1, terminated or truncated
    assert file_entries()[entry]["max_seq_len"] >= steps


# ----------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test in its tmp folder (the zoo's default log folder is ./logs)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (["max_seq_length:8"], "no argument 'max_seq_length' (from -params). Did you mean 'max_seq_len'?"),
        (["seed:1"], "'seed' (from -params) is set by the zoo's --seed flag"),
        (["noise_type:'normal'"], "AMAGO takes no argument 'noise_type'"),
        (
            ["policy_kwargs:dict(d_embd=8)"],
            "TransformerPolicy (policy_kwargs) takes no argument 'd_embd' (from -params). Did you mean 'd_embed'?",
        ),
        (
            ["policy_kwargs:dict(max_seq_len=8)"],
            "policy_kwargs key 'max_seq_len' (from -params) comes from AMAGO's own hyperparameters",
        ),
        (
            ["relabeler:'HindsightRelabel()'"],
            "Cannot evaluate hyperparameter 'relabeler' = 'HindsightRelabel()' (from -params): NameError",
        ),
        (["relabeler:5"], "relabeler (from -params) must be an instance of sb3_amago.relabel.Relabeler"),
        (["exploration:0.1"], "exploration (from -params) must be an instance of sb3_amago.exploration.Exploration"),
    ],
)
def test_bad_hyperparameter_is_named(
    params: list[str], expected: str, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert zoo.main(["train", "--env", "amago-TMaze-v0", "-n", "10", "-params", *params]) == 2
    assert expected in capsys.readouterr().err
    assert not (in_tmp / "logs").exists()  # stopped before any folder, env or model was made


def test_bad_entry_in_a_conf_file_is_named(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_tmp / "conf.yml").write_text(
        "default:\n  n_timesteps: 10\n  policy: TransformerPolicy\n  policy_kwargs: 'dict(d_embed=)'\n"
    )
    assert zoo.main(["train", "--env", "amago-TMaze-v0", "-conf", "conf.yml"]) == 2
    assert "Cannot evaluate hyperparameter 'policy_kwargs'" in capsys.readouterr().err
    (in_tmp / "conf.yml").write_text("default:\n  policy: TransformerPolicy\n")
    assert zoo.main(["train", "--env", "amago-TMaze-v0", "-conf", "conf.yml"]) == 2
    assert "'n_timesteps' is missing" in capsys.readouterr().err


def test_env_without_entry_or_default(in_tmp: Path) -> None:
    (in_tmp / "conf.yml").write_text("CartPole-v1:\n  n_timesteps: 10\n  policy: TransformerPolicy\n")
    with pytest.raises(ValueError, match="Hyperparameters not found for amago-amago-TMaze-v0 in conf.yml"):
        zoo.main(["train", "--env", "amago-TMaze-v0", "-conf", "conf.yml"])


def test_unparsable_file(in_tmp: Path) -> None:
    (in_tmp / "conf.yml").write_text("default:\n  n_timesteps: 10\n  policy: [TransformerPolicy\n")
    with pytest.raises(yaml.YAMLError, match="conf.yml"):
        zoo.main(["train", "--env", "amago-TMaze-v0", "-conf", "conf.yml"])


def test_unregistered_env(in_tmp: Path) -> None:
    with pytest.raises(ValueError, match="amago-TMase-v0 not found in gym registry, you maybe meant amago-TMaze-v0"):
        zoo.main(["train", "--env", "amago-TMase-v0"])


def test_renderability() -> None:
    assert not zoo.can_render_human("amago-TMaze-v0")  # a factory without render_mode
    assert not zoo.can_render_human("amago-MazeRunner7-v0")  # text rendering only
    assert zoo.can_render_human("CartPole-v1")
