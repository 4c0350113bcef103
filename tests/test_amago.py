"""Behaviour of the AMAGO algorithm: loss terms against hand computations, where gradients go,
what collection feeds the policy, acting with state, save/load, and clear errors on bad input."""

import copy
import dataclasses
import inspect
import pickle
import warnings
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import SAC, HerReplayBuffer
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import FakeImageEnv
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.noise import ActionNoise, NormalActionNoise, OrnsteinUhlenbeckActionNoise
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_amago import AMAGO, PrevRewardWrapper
from sb3_amago.buffers import TrajectoryReplayBuffer
from sb3_amago.exploration import ActionNoiseExploration, BiLevelSchedule, Exploration, QuietSpanSchedule
from sb3_amago.loss import LossConfig
from sb3_amago.nets import GRUTrajEncoder
from sb3_amago.policies import AmagoState

TINY = {
    "traj_encoder_kwargs": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1},
    "d_embed": 16,
    "actor_hidden": (16,),
    "critic_hidden": (16,),
    "timestep_encoder_kwargs": {"hidden_sizes": (16,)},
}


class CountingEnv(gym.Env):
    """Observation = [step number]; reward on arriving at step t+1 = 10 * t + action; ends after
    ``length`` steps (with ``random_length``, a length drawn from 2..length at each reset)."""

    def __init__(self, length: int = 6, action_space: spaces.Space | None = None, random_length: bool = False) -> None:
        self.max_length = self.length = length
        self.random_length = random_length
        self.observation_space = spaces.Box(0, 1000, shape=(1,), dtype=np.float32)
        self.action_space = action_space or spaces.Discrete(3)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        if self.random_length:
            self.length = int(self.np_random.integers(2, self.max_length + 1))
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        reward = 10.0 * self.t + float(np.sum(action))
        self.t += 1
        return np.array([float(self.t)], dtype=np.float32), reward, self.t >= self.length, False, {}


def tiny_model(env, **kwargs) -> AMAGO:
    params = {"max_seq_len": 8, "learning_starts": 0, "batch_size": 4, "seed": 0, "policy_kwargs": TINY}
    params.update(kwargs)
    return AMAGO("TransformerPolicy", env, **params)


def filled_model(env_id_or_env, steps: int = 64, **kwargs) -> AMAGO:
    model = tiny_model(env_id_or_env, learning_starts=steps + 1, **kwargs)
    model.learn(steps)
    return model


ACTION_SPACES = {
    "discrete": spaces.Discrete(3),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "box": spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32),
}


# --------------------------------------------------------------------------------------------
# Collection
# --------------------------------------------------------------------------------------------
def test_collection_feeds_previous_action_and_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    env = PrevRewardWrapper(CountingEnv(length=5))
    model = tiny_model(env, learning_starts=10_000)
    seen: list[tuple[float, float, float, int]] = []
    observe = model.policy.observe

    def recording_observe(obs, state):
        seen.append(
            (
                float(obs["observation"][0, 0]),
                float(obs["prev_reward"][0, 0]),
                float(state.prev_action[0, 0]),
                int(state.time_idx[0]),
            )
        )
        return observe(obs, state)

    monkeypatch.setattr(model.policy, "observe", recording_observe)
    model.learn(12)
    assert len(seen) == 12
    for i, (step, prev_reward, prev_action, time_idx) in enumerate(seen):
        assert time_idx == int(step), "the time index follows the rollout and resets with it"
        if step == 0:
            assert prev_reward == 0.0 and prev_action == 0.0
        else:
            # reward on arriving at step t = 10 * (t - 1) + previous action
            assert prev_reward == pytest.approx(10.0 * (step - 1) + prev_action), f"step {i}"


def test_training_updates_and_logs_sb3_names() -> None:
    model = tiny_model(PrevRewardWrapper(CountingEnv()), learning_starts=16, train_freq=4)
    model.learn(40)
    # One update after each 4 collected steps once past learning_starts: at steps 20, 24, ..., 40.
    assert model._n_updates == 6
    model.train(gradient_steps=2, batch_size=4)
    values = model.logger.name_to_value
    for key in ("critic_loss", "actor_loss", "bc_loss", "filter_pass_rate", "entropy", "grad_norm", "learning_rate"):
        assert np.isfinite(values[f"train/{key}"]), key
    assert values["train/n_updates"] == 8
    for gamma in model.gammas:
        assert f"train/q_mean_gamma_{gamma:g}" in values and f"train/popart_sigma_gamma_{gamma:g}" in values
    assert values["replay/bytes"] > 0


def test_update_targets_moves_each_target_by_tau_and_touches_nothing_else() -> None:
    """update_targets(tau) sets every target-head parameter to (1 - tau) target + tau online and changes no other tensor."""
    policy = tiny_model(gym.make("CartPole-v1")).policy
    with th.no_grad():
        for head in (policy.actor, policy.critics):
            for p in head.parameters():
                p.add_(th.randn_like(p))  # the targets start as copies: make them differ
    before = {name: t.clone() for name, t in policy.state_dict().items()}
    tau = 0.25
    policy.update_targets(tau)
    after = policy.state_dict()
    moved = 0
    for name, old in before.items():
        target_param = name.startswith(("actor_target.", "critics_target.")) and name != "critics_target.gamma_feat"
        if target_param:
            online = before[name.replace("_target.", ".", 1)]
            th.testing.assert_close(after[name], (1 - tau) * old + tau * online, rtol=1e-6, atol=1e-6)
            assert not th.equal(after[name], old)
            moved += 1
        else:
            assert th.equal(after[name], old), name
    assert moved == len(list(policy.actor_target.parameters())) + len(list(policy.critics_target.parameters()))


def test_learning_rate_warms_up_linearly_per_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Update n (1-based, counted across train calls) steps with lr * min(1, n / warmup_steps)."""
    model = filled_model(PrevRewardWrapper(CountingEnv()), steps=16, learning_rate=1e-3, warmup_steps=4)
    optimizer = model.policy.optimizer
    used: list[float] = []
    step = optimizer.step

    def recording_step(*args, **kwargs):
        used.append(optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    monkeypatch.setattr(optimizer, "step", recording_step)
    model.train(gradient_steps=3, batch_size=4)
    model.train(gradient_steps=1, batch_size=4)
    model.train(gradient_steps=2, batch_size=4)
    assert used == pytest.approx([1e-3 * n / 4 for n in (1, 2, 3)] + [1e-3] * 3, rel=1e-12)
    assert all(group["lr"] == used[-1] for group in optimizer.param_groups)


# --------------------------------------------------------------------------------------------
# Acting, save / load
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_predict_single_and_batched(env_id: str) -> None:
    """predict takes one observation or a batch and returns actions of the env's space, and a state per env."""
    env = gym.make(env_id)
    model = tiny_model(env)
    obs, _ = env.reset(seed=0)
    action, state = model.predict(obs, deterministic=True)
    assert env.action_space.contains(action) and state.n_envs == 1
    actions, state3 = model.predict(np.stack([obs, obs, obs]), deterministic=True)
    assert len(actions) == 3 and state3.n_envs == 3
    if isinstance(env.action_space, spaces.Box):
        assert actions.dtype == env.action_space.dtype


def _record_actor_outputs(policy, monkeypatch: pytest.MonkeyPatch) -> list[th.Tensor]:
    """Make ``policy.observe`` append each main-gamma actor output, flattened to ``(N, -1)``, to the returned list."""
    outputs: list[th.Tensor] = []
    observe = policy.observe

    def recording_observe(obs, state):
        out, new_state = observe(obs, state)
        outputs.append(th.cat(out, dim=-1).clone() if isinstance(out, tuple) else out.clone())
        return out, new_state

    monkeypatch.setattr(policy, "observe", recording_observe)
    return outputs


def test_predict_refuses_a_spent_state_and_a_deep_copy_branches() -> None:
    """predict advances the context in place: the state it was given is refused afterwards; a deep copy
    taken before the call acts from the same context again, as the original did."""
    model = tiny_model(gym.make("Pendulum-v1"))
    obs = np.random.default_rng(0).normal(size=(4, 1, 3)).astype(np.float32)
    _, state = model.predict(obs[0], deterministic=True)
    _, state = model.predict(obs[1], state=state, deterministic=True)
    branch = copy.deepcopy(state)
    action, new_state = model.predict(obs[2], state=state, deterministic=True)
    with pytest.raises(ValueError, match="already passed to predict"):
        model.predict(obs[2], state=state, deterministic=True)
    again, _ = model.predict(obs[2], state=branch, deterministic=True)
    np.testing.assert_array_equal(again, action)
    model.predict(obs[3], state=new_state, deterministic=True)  # the returned state stays usable


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_predict_state_carries_history_and_episode_start_resets_it(env_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor's output depends on the history in the state, and episode_start=True restores a fresh state exactly."""
    model = tiny_model(gym.make(env_id))
    outputs = _record_actor_outputs(model.policy, monkeypatch)
    rng = np.random.default_rng(0)
    obs_shape = model.observation_space.shape

    def observations(n: int, n_envs: int = 1) -> np.ndarray:
        return rng.normal(size=(n, n_envs, *obs_shape)).astype(np.float32)

    def feed(steps: np.ndarray, state=None, episode_start: np.ndarray | None = None):
        """predict over ``steps`` ``(T, N, ...)``, episode_start on the first; the outputs of each step and the state."""
        first = len(outputs)
        for i, obs in enumerate(steps):
            _, state = model.predict(obs, state=state, episode_start=episode_start if i == 0 else None, deterministic=True)
        return th.stack(outputs[first:]), state

    # (a) The same last observation after two histories of the same length (so the same time index),
    # with the same previous action, so that only the sequence model's context differs.
    last = observations(1)
    _, state_a = feed(observations(5))
    _, state_b = feed(observations(5))
    state_b = dataclasses.replace(state_b, prev_action=state_a.prev_action.clone())
    after_a, _ = feed(last, state=state_a)
    after_b, _ = feed(last, state=state_b)
    assert (after_a - after_b).abs().max() > 1e-4

    # (b) After a history longer than the context window, a reset gives the outputs of a fresh state.
    _, state = feed(observations(3 * model.max_seq_len))
    steps = observations(4)
    after_reset, _ = feed(steps, state=state, episode_start=np.array([True]))
    fresh, _ = feed(steps, state=model.policy.initial_state(1))
    th.testing.assert_close(after_reset, fresh, rtol=1e-5, atol=1e-6)
    # Without the reset the history still shows (so the check above is not vacuous).
    _, state = feed(observations(3 * model.max_seq_len))
    no_reset, _ = feed(steps, state=state, episode_start=np.array([False]))
    assert (no_reset - fresh).abs().max() > 1e-4

    # With two envs, only the env whose episode starts is reset; the other keeps its context.
    _, state = feed(observations(3 * model.max_seq_len, n_envs=2))
    kept = copy.deepcopy(state)
    steps = observations(4, n_envs=2)
    one_reset, _ = feed(steps, state=state, episode_start=np.array([True, False]))
    none_reset, _ = feed(steps, state=kept, episode_start=np.array([False, False]))
    fresh, _ = feed(steps[:, :1], state=model.policy.initial_state(1))
    th.testing.assert_close(one_reset[:, :1], fresh, rtol=1e-5, atol=1e-6)
    th.testing.assert_close(one_reset[:, 1], none_reset[:, 1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_policy_acts_with_the_main_gamma_head(env_id: str) -> None:
    """Deterministic actions come from the last (main) gamma's actor head; the other heads do not change them."""
    env = gym.make(env_id)
    model = tiny_model(env, gamma=0.99, multigammas=(0.5, 0.9))
    assert model.policy.gammas[-1] == 0.99
    last = model.policy.actor.net[-1]  # outputs laid out gamma-major: (G, A) or (G, 2, A) for Box (mean, log_std)
    per_gamma = last.out_features // 3
    if isinstance(env.action_space, spaces.Discrete):
        bias = th.tensor([[5.0, 0.0], [5.0, 0.0], [0.0, 5.0]])  # the other heads push left, the main head right
        expected = np.ones(5, dtype=np.int64)
    else:
        bias = th.tensor([[[-1.0], [0.0]], [[-0.5], [0.0]], [[0.3], [0.0]]])  # per gamma: mean, log_std
        expected = np.full((5, 1), 2.0 * np.tanh(0.3), dtype=np.float32)  # Pendulum's torque range is [-2, 2]
    with th.no_grad():
        last.weight.zero_()  # each head outputs its bias whatever the state
        last.bias.copy_(bias.flatten())
    obs = np.stack([env.observation_space.sample() for _ in range(5)])
    action, _ = model.predict(obs, deterministic=True)
    np.testing.assert_allclose(action, expected, rtol=1e-5)
    # Randomising every other head's weights and bias leaves the actions alone.
    with th.no_grad():
        last.weight[:-per_gamma].normal_(std=3.0)
        last.bias[:-per_gamma].normal_(std=5.0)
    action, _ = model.predict(obs, deterministic=True)
    np.testing.assert_allclose(action, expected, rtol=1e-5)


def test_save_load_round_trip_with_context(tmp_path) -> None:
    env = make_vec_env(lambda: PrevRewardWrapper(CountingEnv()), n_envs=2, seed=0)
    model = tiny_model(env, learning_starts=16, train_freq=4)
    model.learn(48)

    def rollout(m: AMAGO) -> list[np.ndarray]:
        obs, state, acts = env.reset(), None, []
        starts = np.ones(2, dtype=bool)
        for _ in range(10):
            action, state = m.predict(obs, state=state, episode_start=starts, deterministic=True)
            obs, _, starts, _ = env.step(action)
            acts.append(action)
        return acts

    env.seed(1)
    before = rollout(model)
    model.save(tmp_path / "amago")
    model.save_replay_buffer(tmp_path / "buffer")
    loaded = AMAGO.load(tmp_path / "amago", env=env)
    env.seed(1)
    after = rollout(loaded)
    np.testing.assert_array_equal(np.array(before), np.array(after))
    loaded.load_replay_buffer(tmp_path / "buffer")
    assert loaded.replay_buffer.size() == model.replay_buffer.size()
    loaded.learn(8, reset_num_timesteps=False)


def test_save_carries_the_optimizer_state(tmp_path) -> None:
    model = tiny_model(CountingEnv(), learning_starts=8, train_freq=4)
    model.learn(24)
    model.save(tmp_path / "amago")
    loaded = AMAGO.load(tmp_path / "amago")
    saved, restored = model.policy.optimizer.state_dict(), loaded.policy.optimizer.state_dict()
    assert len(restored["state"]) == len(saved["state"]) > 0
    for index, moments in saved["state"].items():
        for key, value in moments.items():
            assert th.equal(restored["state"][index][key], value), (index, key)


def _seeded_image_env() -> FakeImageEnv:
    """16 x 16 images; FakeImageEnv samples them from its observation space, seeded here."""
    env = FakeImageEnv(screen_height=16, screen_width=16)
    env.observation_space.seed(0)
    return env


@pytest.mark.parametrize("env", [*ACTION_SPACES, "amago-popgym-CountRecallEasy-v0", "images"])
def test_compiled_update_takes_the_eager_updates_values(env: str) -> None:
    """``compile_model=True`` compiles the update's forward (the sequence model, the TD target,
    PopArt's move and the loss) in one graph (no graph break). From the same replay and seed, its
    updates leave the parameters and PopArt's statistics where the eager ones do (the same dropout
    masks and action samples; only float rounding differs), on windows of changing length.
    ``env``: an action space of CountingEnv, a POPGym task with MultiDiscrete observations (one-hot
    coded) in a Dict, or 16 x 16 images."""

    def make_env() -> DummyVecEnv | str:
        if env in ACTION_SPACES:
            return make_vec_env(lambda: CountingEnv(action_space=ACTION_SPACES[env], random_length=True), n_envs=2, seed=1)
        if env == "images":
            return make_vec_env(_seeded_image_env, n_envs=2, seed=1)
        return env

    models = [filled_model(make_env(), compile_model=compiled) for compiled in (False, True)]
    th._dynamo.utils.counters.clear()
    for model in models:
        model.set_random_seed(1)
        model.train(gradient_steps=3, batch_size=4)
    assert not th._dynamo.utils.counters["graph_break"], dict(th._dynamo.utils.counters["graph_break"])
    eager, compiled = (model.policy.state_dict() for model in models)
    for key in eager:
        th.testing.assert_close(compiled[key], eager[key], atol=1e-4, rtol=1e-4, msg=key)


def _counting_vec_env() -> DummyVecEnv:
    """Box actions: any change in what the policy sees changes the actions, the rewards and the replay."""
    box = spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32)
    return make_vec_env(lambda: PrevRewardWrapper(CountingEnv(action_space=box, random_length=True)), n_envs=2, seed=3)


def _assert_same_run(a: AMAGO, b: AMAGO) -> None:
    """Every parameter, buffer (PopArt, running norms) and optimizer moment equal, bit for bit."""
    assert (a.num_timesteps, a._n_updates) == (b.num_timesteps, b._n_updates)
    state_a, state_b = a.policy.state_dict(), b.policy.state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert th.equal(state_a[key], state_b[key]), key
    opt_a, opt_b = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    for index in opt_a:
        for key in opt_a[index]:
            assert th.equal(opt_a[index][key], opt_b[index][key]), (index, key)


@pytest.mark.parametrize("traj_encoder", ["transformer", "gru"])
@pytest.mark.parametrize("saved_at", [16, 40])
def test_resumed_run_continues_identically(tmp_path, traj_encoder: str, saved_at: int) -> None:
    """Save at a learn boundary (before ``learning_starts``, random actions, or after it, with
    updates done), resume with load + load_replay_buffer + learn: the same run as one that never
    stopped. The envs' own state travels as a deep copy (what a user with restorable envs does)."""
    env = _counting_vec_env()
    encoder_kwargs = TINY["traj_encoder_kwargs"] if traj_encoder == "transformer" else {"d_hidden": 16}
    policy_kwargs = {**TINY, "traj_encoder": traj_encoder, "traj_encoder_kwargs": encoder_kwargs}
    model = tiny_model(
        env, learning_starts=24, train_freq=4, warmup_steps=50, exploration_steps=200, policy_kwargs=policy_kwargs
    )
    model.learn(saved_at)
    model.save(tmp_path / "amago")
    model.save_replay_buffer(tmp_path / "replay")
    saved_env = copy.deepcopy(env)
    fresh_env = copy.deepcopy(env)
    model.learn(32, reset_num_timesteps=False)

    resumed = AMAGO.load(tmp_path / "amago", env=saved_env, force_reset=False)
    resumed.load_replay_buffer(tmp_path / "replay")
    resumed.learn(32, reset_num_timesteps=False)
    _assert_same_run(model, resumed)

    # The comparison sees a difference: restarting the envs (SB3's default force_reset) changes the run.
    restarted = AMAGO.load(tmp_path / "amago", env=fresh_env)
    restarted.load_replay_buffer(tmp_path / "replay")
    restarted.learn(32, reset_num_timesteps=False)
    with pytest.raises(AssertionError):
        _assert_same_run(model, restarted)


def test_interrupted_replay_save_keeps_the_earlier_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = filled_model(CountingEnv(), steps=24)
    path = tmp_path / "replay.pkl"
    model.save_replay_buffer(path)
    original = path.read_bytes()
    model.learn(8, reset_num_timesteps=False)

    def interrupted_dump(obj, file, protocol=None) -> None:
        file.write(b"half of a replay")
        raise KeyboardInterrupt

    monkeypatch.setattr(pickle, "dump", interrupted_dump)
    with pytest.raises(KeyboardInterrupt):
        model.save_replay_buffer(path)
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["replay.pkl"]
    monkeypatch.undo()
    model.save_replay_buffer(tmp_path / "replay")  # SB3's default suffix
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.pkl"]
    assert path.read_bytes() != original


def _bad_replay_files(tmp_path, model: AMAGO) -> dict[str, tuple[object, str]]:
    """Files load_replay_buffer must refuse, each with the words its error must contain."""
    good = tmp_path / "good.pkl"
    model.save_replay_buffer(good)
    files = {}
    truncated = tmp_path / "truncated.pkl"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    files["truncated"] = (truncated, "truncated")
    old = copy.deepcopy(model.replay_buffer)
    old.format_version = 0
    old_path = tmp_path / "old.pkl"
    old_path.write_bytes(pickle.dumps(old))
    files["version"] = (old_path, "format version 0")
    other_model = filled_model(CountingEnv(action_space=spaces.Discrete(5)), steps=16)
    other_model.save_replay_buffer(tmp_path / "other_action.pkl")
    files["action space"] = (tmp_path / "other_action.pkl", "action space")
    other_obs = filled_model(PrevRewardWrapper(CountingEnv()), steps=16)
    other_obs.save_replay_buffer(tmp_path / "other_obs.pkl")
    files["observation space"] = (tmp_path / "other_obs.pkl", "observation space")
    other_envs = filled_model(make_vec_env(CountingEnv, n_envs=2), steps=16)
    other_envs.save_replay_buffer(tmp_path / "other_envs.pkl")
    files["n_envs"] = (tmp_path / "other_envs.pkl", "number of envs")
    sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=100, policy_kwargs={"net_arch": [8]})
    sac.save_replay_buffer(tmp_path / "sac.pkl")
    files["sac"] = (tmp_path / "sac.pkl", "not an AMAGO TrajectoryReplayBuffer")
    return files


def test_bad_replay_files_are_refused_and_the_model_stays_usable(tmp_path) -> None:
    model = filled_model(CountingEnv(), steps=24)
    replay = model.replay_buffer
    for name, (path, words) in _bad_replay_files(tmp_path, model).items():
        with pytest.raises(ValueError, match=words):
            model.load_replay_buffer(path)
        assert model.replay_buffer is replay, name
    model.learn(8, reset_num_timesteps=False)
    assert model._n_updates > 0
    model.load_replay_buffer(tmp_path / "good.pkl")
    assert model.replay_buffer is not replay and model.replay_buffer.size() > 0


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
def test_bad_constructor_arguments() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(ValueError, match="batch_size"):
        tiny_model(env, batch_size=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        tiny_model(env, max_seq_len=0)
    with pytest.raises(ValueError, match=r"gamma holds \[1.0\].*discount"):
        tiny_model(env, gamma=1.0)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"tau": -0.01}, r"tau must lie in \[0, 1\].*got -0.01"),
        ({"tau": 1.5}, r"tau must lie in \[0, 1\].*got 1.5"),
        ({"multigammas": (0.9, 1.0)}, r"multigammas holds \[1.0\].*\[0, 1\).*0.99"),
        ({"multigammas": (1.2,)}, r"multigammas holds \[1.2\]"),
        (
            {
                "policy_kwargs": {
                    **TINY,
                    "traj_encoder_kwargs": {**TINY["traj_encoder_kwargs"], "pos_emb": "learnable", "max_time": 8},
                }
            },
            r"max_time=8.*max_seq_len \+ 1 = 9.*raise max_time",
        ),
        ({"train_freq": (1, "episode"), "n_envs": 2}, r"train_freq=\(1, 'episode'\).*one env only.*\(1, 'step'\)"),
        ({"n_steps": 3, "n_step": 2}, r"n_steps=3 and n_step=2 disagree"),
        ({"use_sde": True}, r"use_sde=True.*no gSDE.*action_noise=NormalActionNoise"),
        ({"replay_buffer_class": ReplayBuffer}, r"replay_buffer_class=ReplayBuffer.*TrajectoryReplayBuffer"),
        ({"replay_buffer_class": HerReplayBuffer}, r"replay_buffer_class=HerReplayBuffer.*relabeler=.*GoalEnvRelabeler"),
    ],
)
def test_out_of_range_hyperparameters_are_named_at_construction(kwargs: dict, words: str) -> None:
    kwargs = dict(kwargs)
    env = make_vec_env(CountingEnv, n_envs=kwargs.pop("n_envs", 1))
    with pytest.raises(ValueError, match=words):
        tiny_model(env, **kwargs)


def test_sb3_style_policy_kwargs_reach_the_policy() -> None:
    """policy_kwargs n_critics (as SAC / TQC take it), a trajectory-encoder class (as features_extractor_class
    takes one) and filter_clip all reach the model; a conflicting n_critics or a class of the wrong kind is named."""
    env = PrevRewardWrapper(CountingEnv())
    model = tiny_model(env, policy_kwargs={**TINY, "n_critics": 2}, filter_clip=7.0)
    assert model.n_critics == 2 and model.policy.n_critics == 2
    assert model.policy.critics(th.zeros(1, model.policy.traj_encoder.out_dim, device=model.device)).shape[1] == 2
    assert model.loss_config.filter_clip == 7.0
    model = tiny_model(env, policy_kwargs={**TINY, "traj_encoder": GRUTrajEncoder, "traj_encoder_kwargs": {}})
    assert isinstance(model.policy.traj_encoder, GRUTrajEncoder)
    with pytest.raises(ValueError, match="disagree"):
        tiny_model(env, n_critics=3, policy_kwargs={**TINY, "n_critics": 2})
    with pytest.raises(ValueError, match="not a sb3_amago.nets.TrajEncoder subclass"):
        tiny_model(env, policy_kwargs={**TINY, "traj_encoder": th.nn.GRU})


def test_sb3_n_steps_sets_the_n_step_targets() -> None:
    """SB3's n_steps (n-step returns) and AMAGO's n_step are one setting: either name sets the loss's n_step."""
    env = PrevRewardWrapper(CountingEnv())
    assert tiny_model(env, n_steps=3).loss_config.n_step == 3
    assert tiny_model(env, n_step=3).loss_config.n_step == 3
    assert tiny_model(env, n_steps=3, n_step=3).loss_config.n_step == 3
    assert tiny_model(env).loss_config.n_step == 1


def test_loss_settings_have_one_source(tmp_path) -> None:
    """AMAGO's loss arguments default to LossConfig's fields, are checked at construction, and reach the loss
    from the model's attributes (so load can change them)."""
    defaults = inspect.signature(AMAGO).parameters
    for f in dataclasses.fields(LossConfig):
        assert defaults[f.name].default == f.default, f.name
    assert tiny_model(CountingEnv()).loss_config == LossConfig()
    with pytest.raises(ValueError, match="filter_kind"):
        tiny_model(CountingEnv(), filter_kind="sigmoid")
    tiny_model(CountingEnv(), bc_weight=0.5).save(tmp_path / "model")
    loaded = AMAGO.load(tmp_path / "model", reward_multiplier=100.0)
    assert loaded.loss_config == LossConfig(bc_weight=0.5, reward_multiplier=100.0)


def test_hyperparameters_at_the_limits_are_accepted() -> None:
    encoder = {**TINY["traj_encoder_kwargs"], "pos_emb": "learnable", "max_time": 9}
    tiny_model(CountingEnv(), tau=1.0, multigammas=(0.0,), policy_kwargs={**TINY, "traj_encoder_kwargs": encoder})
    tiny_model(CountingEnv(), tau=0.0, buffer_size=9, batch_size=9, learning_starts=8)
    tiny_model(make_vec_env(CountingEnv, n_envs=2), batch_size=24, learning_starts=16, buffer_size=48)


def test_normalize_images_false_is_taken_where_nothing_is_scaled() -> None:
    """SB3's normalize_images=False: float observations are used as they are, so it is accepted; uint8
    images, which the timestep encoder scales to [0, 1] all the same, are refused with the fix."""
    model = tiny_model(CountingEnv(), policy_kwargs={**TINY, "normalize_images": False})
    assert model.policy.normalize_images is False
    image_env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=True)
    with pytest.raises(ValueError, match=r"normalize_images=False.*uint8 images.*leave normalize_images=True"):
        tiny_model(image_env, policy_kwargs={**TINY, "normalize_images": False})


def _finite_train_stats(model: AMAGO) -> None:
    values = {k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")}
    assert values and all(np.isfinite(v) for v in values.values()), values


def test_a_batch_larger_than_the_replay_is_drawn_with_replacement() -> None:
    """As SB3 samples transitions with replacement, a batch may hold more windows than the replay
    holds transitions (SB3's test_offpolicy_multi_env: learning_starts=0, a batch of 24)."""
    model = tiny_model(make_vec_env(CountingEnv, n_envs=2), batch_size=24, learning_starts=0, train_freq=1)
    model.learn(4)  # two steps of each env, one update after each
    assert model.replay_buffer.size() == 4 and model._n_updates == 2
    batch = model.replay_buffer.sample(24)
    assert batch.real.shape[0] == 24
    _finite_train_stats(model)


@pytest.mark.parametrize(("buffer_size", "rows"), [(1, 2), (5, 5)])
def test_a_replay_shorter_than_a_window_trains_on_the_windows_it_holds(buffer_size: int, rows: int) -> None:
    """buffer_size below one window per env (max_seq_len + 1 = 9 steps) warns and trains on the shorter
    windows the replay holds; buffer_size=1 (SB3's test_callbacks_can_cancel_runs) keeps one transition."""
    with pytest.warns(UserWarning, match=rf"buffer_size={buffer_size} holds {rows} steps per env.*shorter windows"):
        model = tiny_model(CountingEnv(length=20), buffer_size=buffer_size, batch_size=4, learning_starts=1, train_freq=1)
    assert model.replay_buffer.buffer_size == rows
    model.learn(30)
    assert model._n_updates == 29
    assert model.replay_buffer.sample(4).real.shape[1] <= rows
    _finite_train_stats(model)


def test_sb3_off_policy_arguments_keep_their_meaning(recwarn: pytest.WarningsRecorder) -> None:
    """gradient_steps=-1, train_freq in episodes, optimize_memory_usage=True, a TrajectoryReplayBuffer
    subclass with replay_buffer_kwargs, stats_window_size, monitor_wrapper, and the gSDE options
    that SB3 ignores without use_sde."""
    model = tiny_model(make_vec_env(CountingEnv, n_envs=2), learning_starts=0, train_freq=3, gradient_steps=-1)
    model.learn(3)
    assert model.logger.name_to_value["train/n_updates"] == 6, "as many updates as env steps collected"

    class OwnReplay(TrajectoryReplayBuffer):
        pass

    model = tiny_model(
        CountingEnv(length=5),
        train_freq=(2, "episode"),
        learning_starts=0,
        optimize_memory_usage=True,
        replay_buffer_class=OwnReplay,
        replay_buffer_kwargs={"sample_by_length": True},
        stats_window_size=3,
        sde_sample_freq=4,
        use_sde_at_warmup=True,
    )
    assert isinstance(model.replay_buffer, OwnReplay) and model.replay_buffer.sample_by_length
    assert model.optimize_memory_usage is False, "SB3 would cut the last trajectory at each learn"
    model.learn(30)
    assert model._n_updates == 3, "one update per 2 episodes of 5 steps"
    model.learn(10)  # a new learn: no SB3 truncation warning, and the replay closes the interrupted rollout itself
    assert not [w for w in recwarn if "truncated" in str(w.message)]
    assert model.ep_info_buffer.maxlen == 3 and model.ep_success_buffer.maxlen == 3
    unwrapped = tiny_model(CountingEnv(), monitor_wrapper=False)
    assert not unwrapped.env.env_is_wrapped(Monitor)[0]
    assert tiny_model(CountingEnv()).env.env_is_wrapped(Monitor)[0]


def test_unsupported_spaces_are_named() -> None:
    class TupleActionEnv(CountingEnv):
        def __init__(self) -> None:
            super().__init__()
            self.action_space = spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3)))

    with pytest.raises((ValueError, AssertionError), match="(?i)action space|Tuple"):
        tiny_model(TupleActionEnv())

    class GraphObsEnv(CountingEnv):
        def __init__(self) -> None:
            super().__init__()
            self.observation_space = spaces.Dict({"text": spaces.Text(5)})

    with pytest.raises((ValueError, NotImplementedError), match="(?i)text|embed|space"):
        tiny_model(GraphObsEnv())


def test_nan_observation_and_reward_are_refused() -> None:
    model = tiny_model(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="NaN"):
        model.predict(np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32))

    class NaNRewardEnv(CountingEnv):
        def step(self, action):
            obs, _, term, trunc, info = super().step(action)
            return obs, float("nan"), term, trunc, info

    with pytest.raises(ValueError, match="NaN"):
        tiny_model(NaNRewardEnv()).learn(5)


def test_predict_without_trained_context_key_explains_the_wrapper() -> None:
    model = tiny_model(PrevRewardWrapper(CountingEnv()))
    with pytest.raises(ValueError, match="PrevRewardWrapper"):
        model.predict({"observation": np.array([0.0], dtype=np.float32)})


def test_load_refuses_other_algorithms_and_corrupt_files(tmp_path) -> None:
    sac_path = tmp_path / "sac.zip"
    SAC("MlpPolicy", "Pendulum-v1", policy_kwargs={"net_arch": [8]}).save(sac_path)
    with pytest.raises(ValueError, match="another algorithm"):
        AMAGO.load(sac_path)
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match="corrupted"):
        AMAGO.load(bad)


def test_models_saved_before_the_observation_key_rename_load_unchanged() -> None:
    """Earlier files keep a non-Dict observation's running statistics under ``obs``; they load into
    ``observation`` with every value intact."""
    model = filled_model(gym.make("CartPole-v1"), steps=40)
    saved = {
        key.replace("obs_norms.observation.", "obs_norms.obs."): value for key, value in model.policy.state_dict().items()
    }
    assert any("obs_norms.obs." in key for key in saved)
    fresh = tiny_model(gym.make("CartPole-v1"), seed=1)
    fresh.policy.load_state_dict(saved)
    for key, value in model.policy.state_dict().items():
        assert th.equal(fresh.policy.state_dict()[key], value), key


def test_model_without_optimizer_state_names_the_fix(tmp_path) -> None:
    model = filled_model(gym.make("CartPole-v1"), steps=24)
    model.save(tmp_path / "full.zip")
    old = tmp_path / "old.zip"
    with zipfile.ZipFile(tmp_path / "full.zip") as full, zipfile.ZipFile(old, "w") as stripped:
        for item in full.infolist():
            if item.filename != "policy.optimizer.pth":
                stripped.writestr(item, full.read(item.filename))
    with pytest.raises(ValueError, match="did not store the optimizer"):
        AMAGO.load(old)
    rebuilt = tiny_model(gym.make("CartPole-v1"), seed=1)
    rebuilt.set_parameters(str(old), exact_match=False)
    for key, value in model.policy.state_dict().items():
        assert th.equal(rebuilt.policy.state_dict()[key], value), key


def test_failed_save_keeps_the_earlier_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(gym.make("CartPole-v1"))
    path = tmp_path / "model.zip"
    model.save(path)
    original = path.read_bytes()

    def broken_state_dict(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(model.policy, "state_dict", broken_state_dict)
    with pytest.raises(RuntimeError, match="disk full"):
        model.save(path)
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["model.zip"]


@pytest.mark.parametrize(
    "name", ["AutoencodeEasy", "BattleshipEasy", "ConcentrationEasy", "LabyrinthEscapeEasy", "PositionOnlyPendulumEasy"]
)
def test_runs_on_popgym_spaces(name: str) -> None:
    """Tuple observations (wrapped as Dict keys, or raw), MultiDiscrete observations and actions, Box actions."""
    env = gym.make(f"amago-popgym-{name}-v0")
    model = tiny_model(env, learning_starts=30)
    model.learn(60)
    assert model._n_updates > 0
    obs, _ = env.reset(seed=0)
    action, _state = model.predict(obs, deterministic=True)
    assert env.action_space.contains(action)
    # The raw popgym observation (a tuple for Autoencode) is taken as it is.
    raw = env.unwrapped
    if isinstance(raw.observation_space, spaces.Tuple):
        raw_model = tiny_model(raw)
        raw_obs, _ = raw.reset(seed=0)
        assert raw.action_space.contains(raw_model.predict(raw_obs)[0])


# --------------------------------------------------------------------------------------------
# Exploration
# --------------------------------------------------------------------------------------------
def _exploration_model(action_space: spaces.Space, scale, **kwargs) -> tuple[AMAGO, AmagoState]:
    """A tiny model with the per-env multipliers set by hand and a fresh state for as many envs."""
    model = tiny_model(CountingEnv(action_space=action_space), **kwargs)
    model.num_timesteps = 0
    model.exploration.scale = np.asarray(scale, dtype=np.float64)
    return model, model.policy.initial_state(len(scale))


def _explore(model: AMAGO, action: th.Tensor, state: AmagoState) -> th.Tensor:
    """What collection takes in place of the policy's ``action`` at ``state``."""
    return model.exploration.explore(action, state.time_idx, model.num_timesteps, model.policy.action_type)


def test_exploration_epsilon_global_schedule_is_linear_then_flat() -> None:
    """epsilon() goes linearly from epsilon_start at step 0 to epsilon_end at exploration_steps and stays there."""
    model = tiny_model(CountingEnv(), epsilon_start=0.8, epsilon_end=0.1, exploration_steps=200)
    expected = {
        0: 0.8,
        1: 0.8 - 0.7 / 200,
        50: 0.625,
        100: 0.45,
        150: 0.275,
        199: 0.1 + 0.7 / 200,
        200: 0.1,
        201: 0.1,
        10_000: 0.1,
    }
    for steps, eps in expected.items():
        model.num_timesteps = steps
        assert model.epsilon() == pytest.approx(eps, abs=1e-12), steps
    # The defaults: 1.0 -> 0.05 over 1M steps.
    model = tiny_model(CountingEnv())
    for steps, eps in {0: 1.0, 500_000: 0.525, 1_000_000: 0.05, 3_000_000: 0.05}.items():
        model.num_timesteps = steps
        assert model.epsilon() == pytest.approx(eps, abs=1e-12), steps


def test_exploration_discrete_is_epsilon_greedy_per_env() -> None:
    """Discrete: an env with multiplier 0 keeps the greedy action; with eps 1 it is replaced by a uniform one (kept 1/n)."""
    K = 6000
    model, state = _exploration_model(ACTION_SPACES["discrete"], [0.0] * K + [1.0] * K + [0.5] * K)
    assert model.epsilon() == 1.0
    th.manual_seed(0)
    greedy = th.full((3 * K, 1), 2.0)
    out = _explore(model, greedy, state)
    assert out.shape == greedy.shape
    assert th.equal(out[:K], greedy[:K]), "multiplier 0: never explores"
    explored = out[K : 2 * K, 0]
    assert set(explored.tolist()) <= {0.0, 1.0, 2.0}
    for a in range(3):  # uniform over the 3 actions, the greedy one included
        assert float((explored == a).float().mean()) == pytest.approx(1 / 3, abs=0.03), a
    # Multiplier 0.5: replaced with probability 0.5, so kept 0.5 + 0.5 / 3 of the time.
    assert float((out[2 * K :, 0] == 2.0).float().mean()) == pytest.approx(2 / 3, abs=0.03)
    # The schedule scales it too: at epsilon_end (0.05) the multiplier-1 envs keep 1 - 0.05 + 0.05 / 3.
    model.num_timesteps = model.exploration_steps
    out = _explore(model, greedy, state)
    assert float((out[K : 2 * K, 0] == 2.0).float().mean()) == pytest.approx(1 - 0.05 * 2 / 3, abs=0.01)


def test_exploration_multidiscrete_replaces_each_sub_action_independently() -> None:
    """MultiDiscrete: each sub-action is replaced on its own, uniformly over its own number of choices."""
    K = 8000
    scale = [0.0] * K + [1.0] * K + [0.5] * K
    model, state = _exploration_model(ACTION_SPACES["multidiscrete"], scale)  # nvec [2, 3]
    th.manual_seed(0)
    greedy = th.tensor([[1.0, 2.0]]).repeat(3 * K, 1)
    out = _explore(model, greedy, state)
    assert th.equal(out[:K], greedy[:K])
    kept = out[K : 2 * K] == greedy[K : 2 * K]
    assert set(out[K:, 0].tolist()) <= {0.0, 1.0} and set(out[K:, 1].tolist()) <= {0.0, 1.0, 2.0}
    assert float(kept[:, 0].float().mean()) == pytest.approx(1 / 2, abs=0.03)
    assert float(kept[:, 1].float().mean()) == pytest.approx(1 / 3, abs=0.03)
    assert float(kept.all(-1).float().mean()) == pytest.approx(1 / 6, abs=0.03)
    # Multiplier 0.5: each sub-action is replaced with probability 0.5 on its own draw, so both are
    # kept (0.5 + 0.5 / 2) * (0.5 + 0.5 / 3) = 0.5 of the time (one shared draw would give 7 / 12).
    kept = out[2 * K :] == greedy[2 * K :]
    assert float(kept[:, 0].float().mean()) == pytest.approx(3 / 4, abs=0.03)
    assert float(kept[:, 1].float().mean()) == pytest.approx(2 / 3, abs=0.03)
    assert float(kept.all(-1).float().mean()) == pytest.approx(1 / 2, abs=0.03), "independent draws per sub-action"


def test_exploration_box_adds_gaussian_noise_of_std_epsilon_per_env() -> None:
    """Box: an env with multiplier 0 is unchanged; with multiplier 1 it gets N(0, epsilon^2) noise, clamped to [-1, 1]."""
    K = 5000
    model, state = _exploration_model(ACTION_SPACES["box"], [0.0] * K + [1.0] * K, epsilon_start=0.3)
    assert model.epsilon() == pytest.approx(0.3)
    th.manual_seed(0)
    out = _explore(model, th.zeros(2 * K, 2), state)
    assert th.equal(out[:K], th.zeros(K, 2))
    noise = out[K:]
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.02)
    assert float(noise.std()) == pytest.approx(0.3, rel=0.05)
    # Near the bound, the result is clamped into [-1, 1].
    out = _explore(model, th.full((2 * K, 2), 0.95), state)
    assert float(out.max()) == 1.0 and float(out.min()) >= -1.0
    assert float((out[K:] == 1.0).float().mean()) > 0.3


def test_exploration_bi_level_schedule_decays_with_the_time_index() -> None:
    """rollout_exploration_horizon H: the noise is epsilon * multiplier * (1 - 0.95 * min(t / H, 1)) for time index t."""
    H, K = 10, 4000
    times = [0, 5, 10, 40]
    factors = [1.0, 0.525, 0.05, 0.05]
    model, state = _exploration_model(
        ACTION_SPACES["box"], [1.0] * (len(times) * K), epsilon_start=0.4, rollout_exploration_horizon=H
    )
    state = dataclasses.replace(state, time_idx=th.tensor(times).repeat_interleave(K))
    th.manual_seed(0)
    out = _explore(model, th.zeros(len(times) * K, 2), state)
    for i, (t, factor) in enumerate(zip(times, factors)):
        assert float(out[i * K : (i + 1) * K].std()) == pytest.approx(0.4 * factor, rel=0.05), t
    # The multiplier still applies on top: multiplier 0.5 at t = H / 2 gives 0.4 * 0.5 * 0.525.
    model.exploration.scale = np.full(len(times) * K, 0.5)
    out = _explore(model, th.zeros(len(times) * K, 2), state)
    assert float(out[K : 2 * K].std()) == pytest.approx(0.4 * 0.5 * 0.525, rel=0.05)
    # Without the horizon the time index is ignored: every env gets the full epsilon.
    model, _ = _exploration_model(ACTION_SPACES["box"], [1.0] * (len(times) * K), epsilon_start=0.4)
    out = _explore(model, th.zeros(len(times) * K, 2), state)
    for i, t in enumerate(times):
        assert float(out[i * K : (i + 1) * K].std()) == pytest.approx(0.4, rel=0.05), t
    # Discrete, epsilon 1, t = H / 2: replaced with probability 0.525, so kept 1 - 0.525 * 2 / 3.
    model, state = _exploration_model(ACTION_SPACES["discrete"], [1.0] * K, rollout_exploration_horizon=H)
    state = dataclasses.replace(state, time_idx=th.full((K,), 5))
    out = _explore(model, th.zeros(K, 1), state)
    assert float((out == 0.0).float().mean()) == pytest.approx(1 - 0.525 * 2 / 3, abs=0.03)


def test_exploration_quiet_span_is_fixed_inside_and_the_schedule_outside() -> None:
    """QuietSpanSchedule: the fixed quiet level at time indices in [quiet_start, quiet_end) (no per-env
    multiplier), the annealed epsilon times the multiplier elsewhere."""
    K = 4000
    times = [0, 2, 5, 6, 9]
    inside = [False, True, True, False, False]
    schedule = QuietSpanSchedule(start=0.4, end=0.1, steps=100, quiet_start=2, quiet_end=6, quiet_level=0.02)
    # Its repr is the call that makes it (the learning records list the settings a run took).
    assert repr(schedule) == "QuietSpanSchedule(start=0.4, end=0.1, steps=100, quiet_start=2, quiet_end=6, quiet_level=0.02)"
    model, state = _exploration_model(ACTION_SPACES["box"], [0.5] * (len(times) * K), exploration=schedule)
    state = dataclasses.replace(state, time_idx=th.tensor(times).repeat_interleave(K))
    for steps, eps in ((0, 0.4), (50, 0.25), (500, 0.1)):
        model.num_timesteps = steps
        assert model.epsilon() == pytest.approx(eps)
        th.manual_seed(0)
        out = _explore(model, th.zeros(len(times) * K, 2), state)
        for i, (t, quiet) in enumerate(zip(times, inside)):
            assert float(out[i * K : (i + 1) * K].std()) == pytest.approx(0.02 if quiet else 0.5 * eps, rel=0.05), (steps, t)
    # Discrete: a quiet level of 0 keeps the greedy action everywhere in the span.
    schedule = QuietSpanSchedule(quiet_start=0, quiet_end=3, quiet_level=0.0)
    model, state = _exploration_model(ACTION_SPACES["discrete"], [1.0] * (2 * K), exploration=schedule)
    state = dataclasses.replace(state, time_idx=th.tensor([1, 3]).repeat_interleave(K))
    out = _explore(model, th.zeros(2 * K, 1), state)
    assert th.equal(out[:K], th.zeros(K, 1))
    assert float((out[K:] == 0.0).float().mean()) == pytest.approx(1 / 3, abs=0.03)
    for bad in ({"quiet_start": 3, "quiet_end": 3}, {"quiet_start": -1}, {"quiet_level": 1.5}):
        with pytest.raises(ValueError, match="QuietSpanSchedule"):
            QuietSpanSchedule(**bad)


def test_exploration_multiplier_is_redrawn_only_for_finished_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-env U(0, 1) multiplier is drawn at the start of learn and redrawn only for envs whose episode ended."""
    env = DummyVecEnv([lambda: CountingEnv(length=3), lambda: CountingEnv(length=5), lambda: CountingEnv(length=1000)])
    model = tiny_model(env, learning_starts=10_000)
    records: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    store = model._store_transition

    def recording_store(replay_buffer, buffer_action, new_obs, reward, dones, infos):
        before = model.exploration.scale.copy()
        store(replay_buffer, buffer_action, new_obs, reward, dones, infos)
        records.append((before, model.exploration.scale.copy(), np.asarray(dones, dtype=bool).copy()))

    monkeypatch.setattr(model, "_store_transition", recording_store)
    model.learn(3 * 60)
    assert len(records) == 60
    first = records[0][0]
    assert first.shape == (3,) and np.all((first >= 0) & (first < 1)) and len(set(first.tolist())) == 3
    new_draws = []
    for step, (before, after, dones) in enumerate(records):
        assert dones.tolist() == [(step + 1) % 3 == 0, (step + 1) % 5 == 0, False], step
        np.testing.assert_array_equal(after[~dones], before[~dones], err_msg=f"step {step}")
        assert np.all(after[dones] != before[dones]), f"step {step}: a finished env keeps its old multiplier"
        new_draws.extend(after[dones].tolist())
        if step + 1 < len(records):
            np.testing.assert_array_equal(records[step + 1][0], after)
    assert records[-1][1][2] == first[2], "the env that never finished keeps its first multiplier"
    assert len(new_draws) == 20 + 12
    assert min(new_draws) >= 0.0 and max(new_draws) < 1.0
    assert np.mean(new_draws) == pytest.approx(0.5, abs=0.2)


class CountingNoise(ActionNoise):
    """Zero noise that counts its resets."""

    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def __call__(self) -> np.ndarray:
        return np.zeros(2)


class CountingExploration(Exploration):
    """Takes the policy's actions and counts the env steps it saw (its state)."""

    def __init__(self) -> None:
        self.steps = 0

    def explore(self, action, time_idx, num_timesteps, action_type):
        self.steps += len(action)
        return action

    def get_state(self) -> dict:
        return {"steps": self.steps}

    def set_state(self, state: dict) -> None:
        self.steps = state["steps"]


def test_action_noise_is_added_to_the_scaled_action_and_clipped() -> None:
    """SB3's ActionNoise on Box actions, as TD3 applies it: noise + action in [-1, 1] units, clipped."""
    noise = NormalActionNoise(mean=np.zeros(2), sigma=np.full(2, 0.3))
    model = tiny_model(CountingEnv(action_space=ACTION_SPACES["box"]), action_noise=noise)
    assert isinstance(model.exploration, ActionNoiseExploration) and model.action_noise is None
    assert model.epsilon() is None
    model.exploration.reset(4)  # four envs: one noise process each
    action = th.tensor([[0.0, 0.0], [0.95, -0.95], [0.5, 0.5], [-1.0, 1.0]])
    np.random.seed(1)
    expected = np.clip(action.numpy() + np.random.normal(0.0, 0.3, size=(4, 2)), -1.0, 1.0)
    np.random.seed(1)
    got = model.exploration.explore(action, th.zeros(4, dtype=th.long), 0, model.policy.action_type)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    # Training logs no epsilon for it.
    model.learn(24)
    model.train(gradient_steps=1, batch_size=4)
    assert "rollout/exploration_epsilon" not in model.logger.name_to_value


def test_action_noise_of_an_env_is_reset_when_its_episode_ends() -> None:
    env = DummyVecEnv([lambda n=n: CountingEnv(length=n, action_space=ACTION_SPACES["box"]) for n in (3, 5, 1000)])
    model = tiny_model(env, action_noise=CountingNoise(), learning_starts=0)
    model.learn(3 * 60)
    # Per env: a reset when wrapped in a VectorizedActionNoise, one when learn starts, one per episode end.
    assert [noise.resets for noise in model.exploration.noise.noises] == [2 + 20, 2 + 12, 2]


def test_exploration_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="action_noise perturbs continuous actions.*epsilon schedule"):
        tiny_model(CountingEnv(), action_noise=NormalActionNoise(np.zeros(1), np.ones(1)))
    with pytest.raises(ValueError, match="not both"):
        tiny_model(CountingEnv(), action_noise=CountingNoise(), exploration=CountingExploration())
    # Schedule arguments beside an exploration object would change nothing: said, not silently dropped.
    with pytest.warns(UserWarning, match="exploration_steps=10, rollout_exploration_horizon=51 change nothing"):
        tiny_model(CountingEnv(), exploration=CountingExploration(), rollout_exploration_horizon=51, exploration_steps=10)


def test_action_noise_run_resumes_identically(tmp_path) -> None:
    """The Ornstein-Uhlenbeck processes of the envs continue across save and load as in a run that never stopped."""
    env = _counting_vec_env()
    noise = OrnsteinUhlenbeckActionNoise(mean=np.zeros(2), sigma=np.full(2, 0.2))
    model = tiny_model(env, learning_starts=8, train_freq=4, warmup_steps=50, action_noise=noise)
    model.learn(24)
    model.save(tmp_path / "amago")
    model.save_replay_buffer(tmp_path / "replay")
    saved_env = copy.deepcopy(env)
    model.learn(32, reset_num_timesteps=False)
    resumed = AMAGO.load(tmp_path / "amago", env=saved_env, force_reset=False)
    resumed.load_replay_buffer(tmp_path / "replay")
    assert isinstance(resumed.exploration, ActionNoiseExploration)
    resumed.learn(32, reset_num_timesteps=False)
    _assert_same_run(model, resumed)


def test_own_exploration_is_used_saved_and_resumed(tmp_path) -> None:
    model = tiny_model(CountingEnv(), exploration=CountingExploration(), learning_starts=10)
    model.learn(32)
    assert model.exploration.steps == 22, "called from learning_starts on, once per env step"
    model.save(tmp_path / "own")
    loaded = AMAGO.load(tmp_path / "own", env=CountingEnv())
    assert isinstance(loaded.exploration, CountingExploration) and loaded.exploration.steps == 22
    # The default schedule is built from the arguments, so load can change them.
    tiny_model(CountingEnv(), exploration_steps=300).save(tmp_path / "default")
    loaded = AMAGO.load(tmp_path / "default", exploration_steps=50, rollout_exploration_horizon=7)
    assert isinstance(loaded.exploration, BiLevelSchedule)
    assert (loaded.exploration.steps, loaded.exploration.horizon) == (50, 7)


@pytest.mark.parametrize("native", [True, False])
def test_mixed_precision_warns_on_a_cpu_without_bf16_instructions(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without AVX-512 BF16 or AMX, torch converts bf16 products in software (several times slower
    than fp32): training with mixed_precision says so and names the fix; with them it stays quiet."""
    monkeypatch.setattr("sb3_amago.precision.cpu_has_native_bf16", lambda: native)
    model = tiny_model(PrevRewardWrapper(CountingEnv()), learning_starts=8, train_freq=8, mixed_precision=True, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(16)
    messages = [str(w.message) for w in caught if "bf16 matrix instructions" in str(w.message)]
    assert model._n_updates > 0
    assert bool(messages) != native
    assert all("Set mixed_precision=False" in m for m in messages)
