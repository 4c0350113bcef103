"""Stable-Baselines3's own algorithm tests, run against AMAGO.

The tests come from the source distribution of the installed stable-baselines3 version (downloaded
with pip once, then cached under ``$XDG_CACHE_HOME/sb3_amago``, default ``~/.cache/sb3_amago``);
its ``tests/`` modules are imported by path and their test functions called with
``model_class=AMAGO``, AMAGO itself (no subclass, its default sizes), and the other parameters SB3
gives them. Where an SB3 test branches on the class (``if model_class in {SAC, TD3}``), AMAGO
takes the generic path. A few SB3 tests name one algorithm in their body instead of taking
``model_class``; those that test behaviour every algorithm must have run with that name pointed at
AMAGO (see their docstrings). No assertion and no argument is changed.

The SB3 tests of the modules used here that are not run against AMAGO, and why:

======================================================  =========================================================
SB3 test                                                Why it is not run against AMAGO
======================================================  =========================================================
test_save_load: test_warn_buffer                        the warning is about SB3's memory-efficient replay, which
[optimize_memory_usage=True]                            must mark its last stored step as an episode end at a new
                                                        learn; AMAGO's replay closes the interrupted rollout
                                                        itself with either setting, so it does not warn (the
                                                        [False] case checks that it stays silent)
test_save_load: test_save_load_policy[use_sde=True]     gSDE, which AMAGO lacks (SB3 skips it for such classes)
test_save_load: test_save_load_pytorch_var,             attributes of one SB3 class: SAC's entropy coefficient,
test_save_load_q_net, test_dqn_target_update_interval,  DQN's q_net / target_update_interval, PPO's clip_range
test_save_load_no_target_params,                        and net_arch=None, or (large_model) an 8192-wide TD3
test_save_load_backward_compatible,
test_save_load_clip_range_portable,
test_cast_lr_schedule, test_save_load_net_arch_none,
test_save_load_large_model
test_run: test_a2c, test_advantage_normalization,       one SB3 class each, with its own arguments (n_steps,
test_ppo, test_sac, test_n_critics, test_dqn,           ent_coef, target_update_interval, SAC's gSDE), or a
test_warn_dqn_multi_env, test_ppo_warnings              warning of DQN or PPO
test_run: test_deterministic_pg[NormalActionNoise],     run with one action noise (Ornstein-Uhlenbeck; Gaussian
test_train_freq[4, (4, "step")]                         noise runs in the TD3 documentation example) and one
                                                        train_freq (in episodes; steps run in every other test),
                                                        to keep the default run within its time
test_spaces: test_action_spaces                         sets its expectation per SB3 class; for others it is unset
test_spaces: test_discrete_obs_space                    on-policy / DQN arguments (n_steps); AMAGO's Discrete
                                                        observations run in test_dict_spaces
test_spaces: test_sde_multi_dim                         SAC with gSDE
test_spaces: test_multidim_binary_not_supported         MultiBinary actions, which AMAGO does not take at all
test_train_eval_mode: test_predict_with_dropout_        gives every class but DQN, TD3 and SAC PPO's n_steps
batch_norm
test_train_eval_mode: the *_train_with_batch_norm and   read one SB3 class's networks (q_net, actor_target) or
test_a2c_ppo_collect_rollouts_with_batch_norm           its rollout buffer
test_callbacks: test_eval_callback_vec_env,             A2C / DQN + HER must learn their task in a few hundred
test_eval_success_logging                               steps
test_callbacks: test_eval_callback_logs_are_written_    reads the TensorBoard folder by DQN's name ("DQN_1")
with_the_correct_timestep
test_callbacks: test_eval_friendly_error,               A2C / PPO with n_steps
test_eval_callback_chaining
test_callbacks: test_checkpoint_additional_info         DQN training 100 steps; the checkpoint's model and
                                                        replay files are AMAGO's save / save_replay_buffer,
                                                        run by test_callbacks and test_save_load_replay_buffer
test_dict_env: test_policy_hint, test_goal_env,         PPO / A2C: their policy-name hint, on-policy n_steps, and
test_dict_nested                                        VecEnv's nested-Dict refusal (before any algorithm code)
test_cnn: test_image_like_input[normalize_images=True]  expects CnnPolicy's NatureCNN to refuse float "images";
                                                        AMAGO's policy names are one policy, whose extractor takes
                                                        any Box (the normalize_images=False case runs)
test_cnn: test_features_extractor_target_net            reads SB3's actor / critic / critic_target networks
test_cnn: test_vec_transpose_skip,                      A2C with n_steps
test_channel_first_env
test_custom_policy: test_custom_offpolicy[[], [4],      run with net_arch=dict(qf=..., pi=...) only, to keep the
[4, 4]]                                                 default run within its time (list net_archs run in
                                                        test_offpolicy_multi_env, test_callbacks and others)
test_custom_policy: test_flexible_mlp,                  A2C / PPO (n_steps), DQN's policy class, or no algorithm
test_dqn_custom_policy, test_tf_like_rmsprop_optimizer,
test_create_mlp
test_logger: test_fps_logger                            a speed bound: over 100 env steps per second beside a
                                                        1 ms env, updates included (its third learn trains, being
                                                        set past learning_starts); AMAGO's default model acts at
                                                        about 150 steps/s on one core but, updating every 4
                                                        steps, collects about 40 steps/s
test_logger: test_rollout_success_rate_onpolicy_algo    PPO's rollouts
test_vec_normalize: test_her_normalization              HerReplayBuffer (see test_her below)
the tests without a model (test_env, test_open_file*,   check SB3's envs, loggers and utilities, or DQN's
test_escape_log_name, test_vec_normalize_image, the     epsilon-greedy
test_logger and test_vec_normalize helpers, ...),
test_predict: test_dqn_epsilon_greedy
======================================================  =========================================================

SB3 runs test_identity_spaces on MultiBinary(8) and MultiBinary((3, 2)); only the second runs
here, to keep the file's runtime modest (one MultiBinary path in AMAGO serves both).

SB3's other test modules take no AMAGO: test_her (``HerReplayBuffer``, which AMAGO refuses for its
own hindsight relabeling, ``relabeler=``), test_n_step_replay (its test_run asserts that
``n_steps`` builds SB3's ``NStepReplayBuffer``; AMAGO takes ``n_steps`` as its n-step targets,
computed within each window of its own replay, and the rest checks SB3's replay classes), test_identity (DQN / SAC / TD3 must solve the task to a
reward threshold within 400 to 1,200 steps at their settings, a learning benchmark rather than a
check of the interface), test_gae, test_sde and test_distributions (on-policy advantages, gSDE and
SB3's distribution classes; test_gae's test_infinite_horizon reads SAC's critic), and the modules
of SB3's buffers, envs, wrappers and utilities.
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
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import stable_baselines3
import torch as th
from gymnasium import spaces
from stable_baselines3.common.noise import NormalActionNoise

from sb3_amago import AMAGO
from sb3_amago.exploration import ActionNoiseExploration

SB3_VERSION = stable_baselines3.__version__
# The fixture below: SB3 test module name (file name without ".py") -> the imported module.
LoadSB3 = Callable[[str], ModuleType]
BOX_F32 = spaces.Box(low=-1, high=1, shape=(2,), dtype=np.float32)
BOX_F64 = spaces.Box(low=-1, high=1, shape=(2,), dtype=np.float64)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sb3_amago" / f"sb3-{SB3_VERSION}-tests"


def _unavailable(reason: str) -> None:
    """Skip the SB3 tests that need the source distribution, or fail where ``CI`` is set (CI must run them)."""
    message = f"cannot download the stable-baselines3=={SB3_VERSION} sdist: {reason}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{message}. CI runs SB3's own tests against AMAGO, so it needs them: give it network access to PyPI.")
    pytest.skip(message)


def _download_sb3_tests(target: Path) -> None:
    """Fetch SB3's source distribution and put its ``tests/`` folder at ``target`` (atomically)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        command += [f"stable-baselines3=={SB3_VERSION}", "-d", tmp, "--quiet"]
        try:
            result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            _unavailable("pip timed out after 600 s")
        archives = list(Path(tmp).glob("*.tar.gz"))
        if result.returncode != 0 or not archives:
            _unavailable(result.stderr.strip()[-500:])
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
def sb3() -> LoadSB3:
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


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_missing_sb3_sources_fail_in_ci_and_skip_elsewhere(
    ci: str, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the SB3 sdist (pip fails) the SB3 tests skip on a developer's machine but fail under CI=true."""
    monkeypatch.setenv("CI", ci)
    failed = subprocess.CompletedProcess(args=[], returncode=1, stdout="", stderr="no network")
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(outcome, match="cannot download"):
        _download_sb3_tests(tmp_path / "tests")


# ------------------------------------------------------------------------------ test_save_load.py


def test_save_load(sb3: LoadSB3, tmp_path: Path) -> None:
    sb3("test_save_load").test_save_load(tmp_path, AMAGO)


def test_set_env(sb3: LoadSB3, tmp_path: Path) -> None:
    sb3("test_save_load").test_set_env(tmp_path, AMAGO)


def test_exclude_include_saved_params(sb3: LoadSB3, tmp_path: Path) -> None:
    sb3("test_save_load").test_exclude_include_saved_params(tmp_path, AMAGO)


def test_save_load_env_cnn(sb3: LoadSB3, tmp_path: Path) -> None:
    sb3("test_save_load").test_save_load_env_cnn(tmp_path, AMAGO)


def test_save_load_replay_buffer(sb3: LoadSB3, tmp_path: Path) -> None:
    sb3("test_save_load").test_save_load_replay_buffer(tmp_path, AMAGO)


def test_warn_buffer(sb3: LoadSB3, recwarn: pytest.WarningsRecorder) -> None:
    sb3("test_save_load").test_warn_buffer(recwarn, AMAGO, optimize_memory_usage=False)


@pytest.mark.parametrize("policy_str", ["MlpPolicy", "CnnPolicy"])
def test_save_load_policy(sb3: LoadSB3, tmp_path: Path, policy_str: str) -> None:
    sb3("test_save_load").test_save_load_policy(tmp_path, AMAGO, policy_str, use_sde=False)


def test_load_invalid_object(sb3: LoadSB3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's test names PPO; what it checks (a warning naming ``custom_objects``) is BaseAlgorithm.load's."""
    module = sb3("test_save_load")
    monkeypatch.setattr(module, "PPO", AMAGO)
    module.test_load_invalid_object(tmp_path)


@pytest.mark.filterwarnings("error")  # SB3's own mark on the test, which calling it does not carry over
def test_no_resource_warning(sb3: LoadSB3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's test names PPO for model files and SAC for replay files; AMAGO overrides both save and load."""
    module = sb3("test_save_load")
    monkeypatch.setattr(module, "PPO", AMAGO)
    monkeypatch.setattr(module, "SAC", AMAGO)
    module.test_no_resource_warning(tmp_path)


def test_load_bad_zip(sb3: LoadSB3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's test names PPO; AMAGO overrides load, which must still name a non-zip file as such."""
    module = sb3("test_save_load")
    monkeypatch.setattr(module, "PPO", AMAGO)
    module.test_load_bad_zip(tmp_path)


# ------------------------------------------------------------------------------ test_predict.py


def test_auto_wrap(sb3: LoadSB3) -> None:
    sb3("test_predict").test_auto_wrap(AMAGO)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
@pytest.mark.parametrize("device", ["cpu", "cuda", "auto"])
def test_predict(sb3: LoadSB3, env_id: str, device: str) -> None:
    sb3("test_predict").test_predict(AMAGO, env_id, device)


def test_subclassed_space_env(sb3: LoadSB3) -> None:
    sb3("test_predict").test_subclassed_space_env(AMAGO)


def test_mixing_gym_vecenv_api(sb3: LoadSB3, monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's test names PPO; AMAGO overrides predict, which must still flag an (obs, info) tuple."""
    module = sb3("test_predict")
    monkeypatch.setattr(module, "PPO", AMAGO)
    module.test_mixing_gym_vecenv_api()


# ------------------------------------------------------------------------------ test_run.py


def test_offpolicy_multi_env(sb3: LoadSB3) -> None:
    sb3("test_run").test_offpolicy_multi_env(AMAGO)


def test_deterministic_pg(sb3: LoadSB3) -> None:
    """SB3's test of DDPG and TD3 with action noise (the Ornstein-Uhlenbeck case; the Gaussian one is the
    TD3 documentation example below)."""
    module = sb3("test_run")
    module.test_deterministic_pg(AMAGO, module.OrnsteinUhlenbeckActionNoise(np.zeros(1), 0.1 * np.ones(1)))


def test_train_freq_in_episodes(sb3: LoadSB3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's test names SAC; what it checks (train_freq=(1, "episode") across save and load, and given
    to load) is OffPolicyAlgorithm's. Its step cases (4, (4, "step")) run in AMAGO's own tests."""
    module = sb3("test_run")
    monkeypatch.setattr(module, "SAC", AMAGO)
    module.test_train_freq(tmp_path, (1, "episode"))


@pytest.mark.parametrize("train_freq", ["4", ("1", "episode"), "non_sense", (1, "close")])
def test_train_freq_fail(sb3: LoadSB3, monkeypatch: pytest.MonkeyPatch, train_freq: Any) -> None:
    """SB3's test names SAC; the ValueError for a malformed train_freq is OffPolicyAlgorithm's."""
    module = sb3("test_run")
    monkeypatch.setattr(module, "SAC", AMAGO)
    module.test_train_freq_fail(train_freq)


# ------------------------------------------------------------------------------ test_deterministic.py


def test_deterministic_training_common(sb3: LoadSB3) -> None:
    sb3("test_deterministic").test_deterministic_training_common(AMAGO)


# ------------------------------------------------------------------------------ test_dict_env.py


def test_consistency(sb3: LoadSB3) -> None:
    sb3("test_dict_env").test_consistency(AMAGO)


@pytest.mark.parametrize("channel_last", [False, True])
def test_dict_spaces(sb3: LoadSB3, channel_last: bool) -> None:
    sb3("test_dict_env").test_dict_spaces(AMAGO, channel_last)


def test_multiprocessing(sb3: LoadSB3) -> None:
    sb3("test_dict_env").test_multiprocessing(AMAGO)


@pytest.mark.parametrize("channel_last", [False, True])
def test_dict_vec_framestack(sb3: LoadSB3, channel_last: bool) -> None:
    sb3("test_dict_env").test_dict_vec_framestack(AMAGO, channel_last)


def test_vec_normalize(sb3: LoadSB3) -> None:
    sb3("test_dict_env").test_vec_normalize(AMAGO)


# ------------------------------------------------------------------------------ test_spaces.py


@pytest.mark.parametrize(
    "obs_space", [BOX_F32, BOX_F64, spaces.Dict({"a": BOX_F32, "b": BOX_F32}), spaces.Dict({"a": BOX_F32, "b": BOX_F64})]
)
@pytest.mark.parametrize("action_space", [BOX_F32, BOX_F64])
def test_float64_action_space(sb3: LoadSB3, obs_space: spaces.Space, action_space: spaces.Box) -> None:
    sb3("test_spaces").test_float64_action_space(AMAGO, obs_space, action_space)


@pytest.mark.parametrize(("env_class", "env_arg"), [("DummyMultiDiscreteSpace", [4, 3]), ("DummyMultiBinary", (3, 2))])
def test_identity_spaces(sb3: LoadSB3, env_class: str, env_arg: list[int] | tuple[int, int]) -> None:
    module = sb3("test_spaces")
    module.test_identity_spaces(AMAGO, getattr(module, env_class)(env_arg))


# ------------------------------------------------------------------------------ test_callbacks.py


def test_callbacks(sb3: LoadSB3, tmp_path: Path) -> None:
    sb3("test_callbacks").test_callbacks(tmp_path, AMAGO)


@pytest.mark.parametrize("callback_false_value", [False, np.bool_(0), th.tensor(0, dtype=th.bool)])
def test_callbacks_can_cancel_runs(sb3: LoadSB3, callback_false_value: bool | np.bool_ | th.Tensor) -> None:
    """SB3's arguments for SAC (``buffer_size=1``, ``batch_size=1``, ``learning_starts=1``)."""
    model_kwargs = {"learning_starts": 1, "buffer_size": 1, "batch_size": 1}
    sb3("test_callbacks").test_callbacks_can_cancel_runs(AMAGO, model_kwargs, callback_false_value)


# ------------------------------------------------------------------------------ test_train_eval_mode.py


def _train_eval_module(sb3: LoadSB3, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """SB3's test_train_eval_mode, told where AMAGO keeps the test's features extractor (in its
    timestep encoder): its ``CLONE_HELPERS`` map each class to such a locator."""
    module = sb3("test_train_eval_mode")

    def clone_amago(model: AMAGO) -> tuple:
        return module.clone_batch_norm_stats(model.policy.timestep_encoder.features_extractor.batch_norm)

    monkeypatch.setitem(module.CLONE_HELPERS, AMAGO, clone_amago)
    return module


def test_offpolicy_collect_rollout_batch_norm(sb3: LoadSB3, monkeypatch: pytest.MonkeyPatch) -> None:
    _train_eval_module(sb3, monkeypatch).test_offpolicy_collect_rollout_batch_norm(AMAGO)


# ------------------------------------------------------------------------------ test_tensorboard.py


def test_tensorboard(sb3: LoadSB3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SB3's test takes a key of its MODEL_DICT (class, env id); the run folder must be named after the class."""
    module = sb3("test_tensorboard")
    monkeypatch.setitem(module.MODEL_DICT, "amago", (AMAGO, "Pendulum-v1"))
    module.test_tensorboard(tmp_path, "amago")


# ------------------------------------------------------------------------------ test_cnn.py


def test_cnn(sb3: LoadSB3, tmp_path: Path) -> None:
    """SB3's share_features_extractor=True case returns at once for off-policy classes; this is the other."""
    sb3("test_cnn").test_cnn(tmp_path, AMAGO, share_features_extractor=False)


def test_image_like_input(sb3: LoadSB3) -> None:
    """normalize_images=False with float channel-first "images" (after VecNormalize), which AMAGO uses as
    they are. (The normalize_images=True case expects CnnPolicy's NatureCNN to refuse them: see the table.)"""
    sb3("test_cnn").test_image_like_input(AMAGO, normalize_images=False)


# ------------------------------------------------------------------------------ test_custom_policy.py


def test_custom_offpolicy(sb3: LoadSB3) -> None:
    """SB3's ``net_arch`` for the actor and the critics separately (its list cases: see the module docstring)."""
    sb3("test_custom_policy").test_custom_offpolicy(AMAGO, {"qf": [8], "pi": [8, 4]})


@pytest.mark.parametrize("optimizer_kwargs", [None, {"weight_decay": 0.0}])
def test_custom_optimizer(sb3: LoadSB3, optimizer_kwargs: dict[str, float] | None) -> None:
    sb3("test_custom_policy").test_custom_optimizer(AMAGO, optimizer_kwargs)


# ------------------------------------------------------------------------------ test_logger.py


@pytest.mark.parametrize("stats_window_size", [1, 42])
def test_ep_buffers_stats_window_size(sb3: LoadSB3, stats_window_size: int) -> None:
    sb3("test_logger").test_ep_buffers_stats_window_size(AMAGO, stats_window_size)


def test_fps_no_div_zero(sb3: LoadSB3) -> None:
    sb3("test_logger").test_fps_no_div_zero(AMAGO)


# ------------------------------------------------------------------------------ test_vec_normalize.py


def test_offpolicy_normalization(sb3: LoadSB3) -> None:
    sb3("test_vec_normalize").test_offpolicy_normalization(AMAGO)


# ------------------------------------------------------------------------------ SB3's generic arguments


def test_sb3_policy_kwargs() -> None:
    """SB3's ``net_arch`` sets the actor and critic hidden sizes (a list for both, ``pi`` / ``qf`` each),
    never beside AMAGO's own ``actor_hidden`` / ``critic_hidden``; SB3's image-feature size names reach
    the default extractor."""
    env = "Pendulum-v1"
    policy = AMAGO("MlpPolicy", env, policy_kwargs={"net_arch": {"pi": [8], "qf": [16, 4]}}).policy
    assert (policy.actor_hidden, policy.critic_hidden) == ((8,), (16, 4))
    policy = AMAGO(
        "MlpPolicy", env, policy_kwargs={"net_arch": [12], "features_extractor_kwargs": {"cnn_output_dim": 16}}
    ).policy
    assert (policy.actor_hidden, policy.critic_hidden) == ((12,), (12,))
    assert policy.features_extractor_kwargs == {"cnn_features_dim": 16}
    with pytest.raises(ValueError, match="not both"):
        AMAGO("MlpPolicy", env, policy_kwargs={"net_arch": [12], "actor_hidden": (8,)})
    with pytest.raises(ValueError, match="'pi'"):
        AMAGO("MlpPolicy", env, policy_kwargs={"net_arch": {"pi": [8]}})


# ------------------------------------------------------------------------------ SB3's documentation


def test_td3_documentation_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The TD3 example of SB3's documentation ("Examples" and the TD3 page) with only the class name
    changed, TD3 -> AMAGO: action noise, learning_starts and train_freq as written there (that is,
    AMAGO's defaults for the last two). Two departures, both outside the algorithm: the docs train
    for ``total_timesteps=10000``, here 1_020 (past AMAGO's ``learning_starts=1000``, so that it
    updates a few times; 10000 steps of AMAGO's default network take tens of minutes on a CPU), and
    the docs' endless ``while True`` loop with a window render becomes one episode without it."""
    monkeypatch.chdir(tmp_path)  # the docs save "td3_pendulum" in the working directory
    env = gym.make("Pendulum-v1", render_mode="rgb_array")

    # The noise objects for TD3
    n_actions = env.action_space.shape[-1]
    action_noise = NormalActionNoise(mean=np.zeros(n_actions), sigma=0.1 * np.ones(n_actions))

    model = AMAGO("MlpPolicy", env, action_noise=action_noise, verbose=1)
    model.learn(total_timesteps=1_020, log_interval=10)
    assert isinstance(model.exploration, ActionNoiseExploration) and model.exploration.base_noise is action_noise
    assert model._n_updates == 5  # one update per 4 steps from step 1_004 on, as SB3 counts
    model.save("td3_pendulum")
    vec_env = model.get_env()

    del model  # remove to demonstrate saving and loading

    model = AMAGO.load("td3_pendulum")

    obs = vec_env.reset()
    for _ in range(200):  # the docs: while True
        action, _states = model.predict(obs)
        obs, rewards, dones, info = vec_env.step(action)  # noqa: RUF059  (the docs' line)
        assert env.action_space.contains(action[0].astype(np.float32))
    assert dones[0], "Pendulum-v1 ends after 200 steps"
