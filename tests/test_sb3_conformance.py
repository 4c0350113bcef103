"""Stable-Baselines3's own algorithm tests, run against AMAGO.

The tests come from the source distribution of the installed stable-baselines3 version (downloaded
with pip once, then cached under ``$XDG_CACHE_HOME/sb3_amago``, default ``~/.cache/sb3_amago``);
its ``tests/`` modules are imported by path and their test functions called with
``model_class=AMAGO`` and the other parameters SB3 gives them. Where an SB3 test branches on the
class (``if model_class in {SAC, TD3}``), AMAGO takes the generic path. A few SB3 tests name one
algorithm in their body instead of taking ``model_class``; those that test behaviour every algorithm
must have run with that name pointed at AMAGO (noted below). No assertion is changed.

SB3 tests that cannot apply to AMAGO:

=========================================================  ========================================================
SB3 test                                                   Why it does not apply
=========================================================  ========================================================
test_save_load.py::test_warn_buffer[optimize_memory        AMAGO's trajectory replay stores each observation once
_usage=True]                                               already, so it refuses ``optimize_memory_usage``; the
                                                           warning under test is about that option's truncation
test_save_load.py::test_save_load_policy[use_sde=True]     SB3 skips it for every algorithm without gSDE; AMAGO
                                                           has no gSDE
test_save_load.py::test_save_load_pytorch_var,             SAC's entropy coefficient, DQN's q_net and target
test_save_load_q_net, test_dqn_target_update_interval,     update interval, PPO's clip range and net_arch=None:
test_save_load_no_target_params,                           attributes AMAGO does not have
test_save_load_backward_compatible,
test_save_load_clip_range_portable, test_cast_lr_schedule,
test_save_load_net_arch_none
test_run.py (all but test_offpolicy_multi_env)             name A2C, PPO, SAC, TD3, DDPG or DQN and their own
                                                           arguments (action noise, entropy coefficient, n_steps)
test_spaces.py::test_action_spaces                         branches per SB3 class on which action spaces it
                                                           supports; for another class its expectation is unset
test_spaces.py::test_discrete_obs_space                    on-policy / DQN arguments (n_steps); AMAGO's Discrete
                                                           observations run in test_dict_env.py's test_dict_spaces
test_train_eval_mode.py: test_dqn_/td3_/sac_/a2c_ppo_      read the networks of one SB3 class (q_net, actor_target,
train_with_batch_norm, test_a2c_ppo_collect_rollouts_...   rollout_buffer)
test_train_eval_mode.py::test_predict_with_dropout_        gives every class but DQN, TD3 and SAC PPO's ``n_steps``
batch_norm
test_callbacks.py: all but test_callbacks                  name A2C, DQN + HER, or SAC with a one-step buffer
test_deterministic.py, test_dict_env.py,                   (the ``model_class`` tests all run here; the others are
test_predict.py: the tests without ``model_class``         env or class checks: test_env, test_policy_hint,
                                                           test_goal_env (on-policy), test_dqn_epsilon_greedy)
=========================================================  ========================================================
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import stable_baselines3
from gymnasium import spaces

from sb3_amago import AMAGO

SB3_VERSION = stable_baselines3.__version__
BOX_F32 = spaces.Box(low=-1, high=1, shape=(2,), dtype=np.float32)
BOX_F64 = spaces.Box(low=-1, high=1, shape=(2,), dtype=np.float64)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sb3_amago" / f"sb3-{SB3_VERSION}-tests"


def _download_sb3_tests(target: Path) -> None:
    """Fetch SB3's source distribution and put its ``tests/`` folder at ``target`` (atomically)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        command += [f"stable-baselines3=={SB3_VERSION}", "-d", tmp, "--quiet"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if result.returncode != 0 or not archives:
            pytest.skip(f"cannot download the stable-baselines3=={SB3_VERSION} sdist: {result.stderr.strip()[-500:]}")
        with tarfile.open(archives[0]) as archive:
            prefix = f"{archive.getnames()[0].split('/')[0]}/tests/"
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            archive.extractall(tmp, members=members, filter="data")
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=target.parent))
        shutil.move(Path(tmp) / prefix, staged / "tests")
        try:
            os.replace(staged / "tests", target)
        except OSError:  # another process cached it first
            pass
        shutil.rmtree(staged, ignore_errors=True)


@pytest.fixture(scope="session")
def sb3() -> Callable[[str], ModuleType]:
    """Import one of SB3's test modules (by file name, without ``.py``) from the cached sdist."""
    tests_dir = _cache_dir()
    if not (tests_dir / "test_save_load.py").exists():
        _download_sb3_tests(tests_dir)
    modules: dict[str, ModuleType] = {}

    def load(name: str) -> ModuleType:
        if name not in modules:
            spec = importlib.util.spec_from_file_location(f"sb3_upstream_tests.{name}", tests_dir / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            with warnings.catch_warnings():  # SB3 registers its own marks (e.g. "expensive") in its setup.cfg
                warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
                spec.loader.exec_module(module)
            modules[name] = module
        return modules[name]

    return load


# ------------------------------------------------------------------------------ test_save_load.py


def test_save_load(sb3: Callable, tmp_path: Path) -> None:
    sb3("test_save_load").test_save_load(tmp_path, AMAGO)


def test_set_env(sb3: Callable, tmp_path: Path) -> None:
    sb3("test_save_load").test_set_env(tmp_path, AMAGO)


def test_exclude_include_saved_params(sb3: Callable, tmp_path: Path) -> None:
    sb3("test_save_load").test_exclude_include_saved_params(tmp_path, AMAGO)


def test_save_load_env_cnn(sb3: Callable, tmp_path: Path) -> None:
    sb3("test_save_load").test_save_load_env_cnn(tmp_path, AMAGO)


def test_save_load_replay_buffer(sb3: Callable, tmp_path: Path) -> None:
    sb3("test_save_load").test_save_load_replay_buffer(tmp_path, AMAGO)


def test_warn_buffer(sb3: Callable, recwarn: pytest.WarningsRecorder) -> None:
    sb3("test_save_load").test_warn_buffer(recwarn, AMAGO, optimize_memory_usage=False)


@pytest.mark.parametrize("policy_str", ["MlpPolicy", "CnnPolicy"])
def test_save_load_policy(sb3: Callable, tmp_path: Path, policy_str: str) -> None:
    sb3("test_save_load").test_save_load_policy(tmp_path, AMAGO, policy_str, use_sde=False)


def test_load_invalid_object(sb3: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's test names PPO; what it checks (a warning naming ``custom_objects``) is BaseAlgorithm.load's."""
    module = sb3("test_save_load")
    monkeypatch.setattr(module, "PPO", AMAGO)
    module.test_load_invalid_object(tmp_path)


def test_load_bad_zip(sb3: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = sb3("test_save_load")
    monkeypatch.setattr(module, "PPO", AMAGO)
    module.test_load_bad_zip(tmp_path)


# ------------------------------------------------------------------------------ test_predict.py


def test_auto_wrap(sb3: Callable) -> None:
    sb3("test_predict").test_auto_wrap(AMAGO)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
@pytest.mark.parametrize("device", ["cpu", "cuda", "auto"])
def test_predict(sb3: Callable, env_id: str, device: str) -> None:
    sb3("test_predict").test_predict(AMAGO, env_id, device)


def test_subclassed_space_env(sb3: Callable) -> None:
    sb3("test_predict").test_subclassed_space_env(AMAGO)


def test_mixing_gym_vecenv_api(sb3: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    module = sb3("test_predict")
    monkeypatch.setattr(module, "PPO", AMAGO)
    module.test_mixing_gym_vecenv_api()


# ------------------------------------------------------------------------------ test_run.py


def test_offpolicy_multi_env(sb3: Callable) -> None:
    sb3("test_run").test_offpolicy_multi_env(AMAGO)


# ------------------------------------------------------------------------------ test_deterministic.py


def test_deterministic_training_common(sb3: Callable) -> None:
    sb3("test_deterministic").test_deterministic_training_common(AMAGO)


# ------------------------------------------------------------------------------ test_dict_env.py


def test_consistency(sb3: Callable) -> None:
    sb3("test_dict_env").test_consistency(AMAGO)


@pytest.mark.parametrize("channel_last", [False, True])
def test_dict_spaces(sb3: Callable, channel_last: bool) -> None:
    sb3("test_dict_env").test_dict_spaces(AMAGO, channel_last)


def test_multiprocessing(sb3: Callable) -> None:
    sb3("test_dict_env").test_multiprocessing(AMAGO)


@pytest.mark.parametrize("channel_last", [False, True])
def test_dict_vec_framestack(sb3: Callable, channel_last: bool) -> None:
    sb3("test_dict_env").test_dict_vec_framestack(AMAGO, channel_last)


def test_vec_normalize(sb3: Callable) -> None:
    sb3("test_dict_env").test_vec_normalize(AMAGO)


# ------------------------------------------------------------------------------ test_spaces.py


@pytest.mark.parametrize("obs_space", [BOX_F32, BOX_F64, spaces.Dict({"a": BOX_F32, "b": BOX_F32}), spaces.Dict({"a": BOX_F32, "b": BOX_F64})])
@pytest.mark.parametrize("action_space", [BOX_F32, BOX_F64])
def test_float64_action_space(sb3: Callable, obs_space: spaces.Space, action_space: spaces.Box) -> None:
    sb3("test_spaces").test_float64_action_space(AMAGO, obs_space, action_space)


@pytest.mark.parametrize("env_name", ["DummyMultiDiscreteSpace", "DummyMultiBinary"])
def test_identity_spaces(sb3: Callable, env_name: str) -> None:
    module = sb3("test_spaces")
    env = module.DummyMultiDiscreteSpace([4, 3]) if env_name == "DummyMultiDiscreteSpace" else module.DummyMultiBinary((3, 2))
    module.test_identity_spaces(AMAGO, env)


# ------------------------------------------------------------------------------ test_callbacks.py


def test_callbacks(sb3: Callable, tmp_path: Path) -> None:
    sb3("test_callbacks").test_callbacks(tmp_path, AMAGO)


# ------------------------------------------------------------------------------ test_train_eval_mode.py


def _train_eval_module(sb3: Callable, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """SB3's test_train_eval_mode, told where AMAGO keeps the test's features extractor (in its
    timestep encoder): its ``CLONE_HELPERS`` map each class to such a locator."""
    module = sb3("test_train_eval_mode")

    def clone_amago(model: AMAGO) -> tuple:
        return module.clone_batch_norm_stats(model.policy.timestep_encoder.features_extractor.batch_norm)

    monkeypatch.setitem(module.CLONE_HELPERS, AMAGO, clone_amago)
    return module


def test_offpolicy_collect_rollout_batch_norm(sb3: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    _train_eval_module(sb3, monkeypatch).test_offpolicy_collect_rollout_batch_norm(AMAGO)


# ------------------------------------------------------------------------------ test_tensorboard.py


def test_tensorboard(sb3: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = sb3("test_tensorboard")
    monkeypatch.setitem(module.MODEL_DICT, "amago", (AMAGO, "Pendulum-v1"))
    module.test_tensorboard(tmp_path, "amago")
