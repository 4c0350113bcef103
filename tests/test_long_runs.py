"""Long runs: collection through the edge cases of rollout length and timing (rollouts longer than
the replay, truncation-only envs, an env that ends every step, envs ending together), and
interrupts (Ctrl-C and SIGTERM during learn, or during a save) that lose nothing already saved."""

import os
import signal

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv
from test_amago import CountingEnv, tiny_model

from sb3_amago import AMAGO, TrainingInterrupted
from sb3_amago.type_aliases import TrajectoryBatch


class StampEnv(gym.Env):
    """Observation = [env index, episode number, step within the episode]; terminates after
    ``length`` steps (None: never; wrap in a ``TimeLimit`` to truncate instead)."""

    def __init__(self, index: int, length: int | None) -> None:
        self.index, self.length = index, length
        self.observation_space = spaces.Box(0, 1e6, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode, self.t = -1, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.episode, self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.length is not None and self.t >= self.length, False, {}


def stamp_envs(lengths: list[int | None], time_limit: int | None = None) -> DummyVecEnv:
    def make(index: int, length: int | None):
        return lambda: StampEnv(index, length) if time_limit is None else TimeLimit(StampEnv(index, length), time_limit)

    return DummyVecEnv([make(i, length) for i, length in enumerate(lengths)])


def check_windows(batch: TrajectoryBatch, ends: dict[int, tuple[int, bool]]) -> None:
    """Every real step of every window comes from one episode of one env, in order, with the
    episode's own time index; a window reaching an episode's end flags it as ``ends[env]`` says
    (length, truncated)."""
    obs, real = batch.observations.cpu().numpy(), batch.real.cpu().numpy()
    for b in range(len(obs)):
        steps = obs[b, real[b]]  # (real steps, 3)
        assert len(steps) > 0
        assert (steps[:, :2] == steps[0, :2]).all(), "a window mixes envs or episodes"
        assert (np.diff(steps[:, 2]) == 1).all(), "a window skips or repeats steps"
        assert (batch.time_idx[b, real[b]].cpu().numpy() == steps[:, 2]).all()
        length, truncated = ends[int(steps[0, 0])]
        last = int(np.flatnonzero(real[b])[-1])
        at_end = steps[-1, 2] == length
        assert batch.terminated[b, last] == float(at_end and not truncated)
        assert batch.truncated[b, last] == float(at_end and truncated)
        assert batch.terminated[b, :last].sum() == 0 and batch.truncated[b, :last].sum() == 0


def trained_finite(model: AMAGO) -> bool:
    return model._n_updates > 0 and all(th.isfinite(p).all() for p in model.policy.parameters())


# --------------------------------------------------------------------------------------------
# Collection edge cases
# --------------------------------------------------------------------------------------------
def test_rollout_longer_than_the_replay() -> None:
    """One endless rollout through a 64-step replay: training samples its newest steps, with their
    true time indices (past 64), and never a window across the wrap-around."""
    model = tiny_model(stamp_envs([None]), buffer_size=64, batch_size=8, learning_starts=16)
    model.learn(300)
    buffer = model.replay_buffer
    assert buffer.num_rollouts() == 1 and buffer.size() < 64
    batch = buffer.sample(32)
    check_windows(batch, {0: (-1, False)})
    stamps = batch.observations[batch.real][..., 2]
    assert 300 - 64 < stamps.min() and stamps.max() <= 300
    assert trained_finite(model)


def test_truncation_only_env() -> None:
    """An env that never terminates, cut by a time limit: its rollouts end truncated, never terminated."""
    model = tiny_model(stamp_envs([None, None], time_limit=7), buffer_size=500, learning_starts=16)
    model.learn(100)
    buffer = model.replay_buffer
    assert buffer.num_rollouts() == 2 * (50 // 7) + 2
    for _ in range(5):
        check_windows(buffer.sample(16), {0: (7, True), 1: (7, True)})
    assert buffer.sample(64).truncated.sum() > 0
    assert trained_finite(model)


def test_one_env_ending_every_step_beside_longer_ones() -> None:
    """Env 0 ends after each step: each of its rollouts holds one transition, its context restarts at
    every step (it always acts at time index 0), and the other envs' rollouts are unaffected."""
    model = tiny_model(stamp_envs([1, 5, 9]), buffer_size=600, learning_starts=16)
    next_times: list[np.ndarray] = []

    class RecordTimes(BaseCallback):
        """Each env's context time index just after acting (the step's time index + 1)."""

        def _on_step(self) -> bool:
            next_times.append(model._collect_state.time_idx.cpu().numpy().copy())
            return True

    model.learn(120, callback=RecordTimes())  # 40 steps of each env
    times = np.array(next_times)  # (40, 3)
    assert (times[:, 0] == 1).all()
    assert sorted(set(times[:, 1].tolist())) == [1, 2, 3, 4, 5] and sorted(set(times[:, 2].tolist())) == list(range(1, 10))
    assert model.replay_buffer.num_rollouts() == 40 + 40 // 5 + (40 // 9 + 1)
    for _ in range(5):
        check_windows(model.replay_buffer.sample(16), {0: (1, False), 1: (5, False), 2: (9, False)})
    assert trained_finite(model)


def test_every_env_ending_on_the_same_step() -> None:
    """Three envs that end together every 5 steps: three rollouts per episode, every context restarted."""
    model = tiny_model(stamp_envs([5, 5, 5]), buffer_size=600, learning_starts=15)
    model.learn(60)  # 20 steps of each env: 4 episodes
    assert model.replay_buffer.num_rollouts() == 3 * 4
    assert (model._collect_state.time_idx == 0).all()
    assert model.exploration.scale is not None and len(set(model.exploration.scale.tolist())) == 3
    check_windows(model.replay_buffer.sample(32), {env: (5, False) for env in range(3)})
    assert trained_finite(model)


# --------------------------------------------------------------------------------------------
# Interrupts
# --------------------------------------------------------------------------------------------
class RaiseAt(BaseCallback):
    """Raises ``error`` (or sends the process a SIGTERM) at env step ``at``."""

    def __init__(self, at: int, error: BaseException | None = None) -> None:
        super().__init__()
        self.at, self.error = at, error

    def _on_step(self) -> bool:
        if self.num_timesteps == self.at:
            if self.error is None:
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                raise self.error
        return True


def assert_usable_after_interrupt(model: AMAGO, tmp_path) -> None:
    """predict, save / load and learn work; learn restarts the envs in new rollouts."""
    obs = model.env.reset()
    action, _ = model.predict(obs, deterministic=True)
    assert action.shape == (model.n_envs,)
    model.save(tmp_path / "after")
    loaded = AMAGO.load(tmp_path / "after")
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], action)
    rollouts, steps = model.replay_buffer.num_rollouts(), model.num_timesteps
    model.learn(10, reset_num_timesteps=False)
    assert model.num_timesteps >= steps + 10
    assert model.replay_buffer.num_rollouts() == rollouts + 1, "the interrupted rollout must not be continued"
    batch = model.replay_buffer.sample(16)
    assert (np.diff(batch.observations[..., 0].cpu().numpy(), axis=1)[batch.real[:, 1:].cpu().numpy()] == 1).all()


def test_keyboard_interrupt_during_collection_keeps_saves_and_model(tmp_path) -> None:
    model = tiny_model(CountingEnv(length=1000), buffer_size=500, learning_starts=8)
    model.learn(20)
    model.save(tmp_path / "checkpoint")
    saved = (tmp_path / "checkpoint.zip").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        model.learn(50, reset_num_timesteps=False, callback=RaiseAt(33, KeyboardInterrupt()))
    assert model.num_timesteps == 33
    assert (tmp_path / "checkpoint.zip").read_bytes() == saved
    assert_usable_after_interrupt(model, tmp_path)


def test_keyboard_interrupt_inside_an_update(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(CountingEnv(length=1000), buffer_size=500, learning_starts=8)
    model.learn(16)
    step = model.policy.optimizer.step
    calls = []

    def interrupted_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(model.policy.optimizer, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        model.learn(20, reset_num_timesteps=False)
    monkeypatch.undo()
    assert all(th.isfinite(p).all() for p in model.policy.parameters())
    assert_usable_after_interrupt(model, tmp_path)


def test_sigterm_during_learn_raises_training_interrupted(tmp_path) -> None:
    model = tiny_model(CountingEnv(length=1000), buffer_size=500, learning_starts=8)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted, match="SIGTERM"):
        model.learn(40, callback=RaiseAt(25))
    assert signal.getsignal(signal.SIGTERM) == before, "learn must restore the SIGTERM handler"
    assert model.num_timesteps == 25
    assert_usable_after_interrupt(model, tmp_path)


def test_own_sigterm_handler_is_left_alone() -> None:
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        model = tiny_model(CountingEnv(length=1000), buffer_size=500, learning_starts=8)
        model.learn(20, callback=RaiseAt(10))
        assert received == [signal.SIGTERM] and model.num_timesteps == 20
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_interrupted_model_save_keeps_the_earlier_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the middle of writing the model file: the earlier save is untouched, no temporary
    file is left behind, and the next save succeeds."""
    model = tiny_model(CountingEnv(), buffer_size=500, learning_starts=8)
    model.learn(16)
    path = tmp_path / "model.zip"
    model.save(path)
    original = path.read_bytes()
    model.learn(16, reset_num_timesteps=False)
    save = th.save

    def interrupted_save(obj, file, *args, **kwargs):
        save(obj, file, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(th, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        model.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["model.zip"]
    model.save(path)
    assert path.read_bytes() != original
    assert AMAGO.load(path).num_timesteps == 32
