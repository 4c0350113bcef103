"""TrajectoryReplayBuffer: storage, alignment of sampled windows, eviction, SB3 conventions."""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_amago.buffers import TrajectoryReplayBuffer
from sb3_amago.type_aliases import TrajectoryBatch

# Scripted streams: observation (env, episode, t), action and reward encode the same.
OBS_SPACE = spaces.Box(-1e6, 1e6, shape=(3,), dtype=np.float32)
ACTION_SPACE = spaces.Discrete(10_000)
RUNNING = (10**6, False)


def scripted_action(episode: int, t: int) -> int:
    return 1 + 100 * episode + t


def scripted_reward(env: int, episode: int, t: int) -> float:
    """Reward received on arriving at step ``t``."""
    return 1000.0 * env + 100.0 * episode + t


class Stream:
    """Feeds ``n_envs`` scripted env streams to a buffer with SB3's ``add`` shapes.

    :param episodes: per env, the ``(length, truncated)`` of its episodes; a running one follows
    """

    def __init__(self, episodes: list[list[tuple[int, bool]]]) -> None:
        self.episodes = [list(eps) + [RUNNING] for eps in episodes]
        self.n_envs = len(episodes)
        self.episode = np.zeros(self.n_envs, dtype=np.int64)
        self.t = np.zeros(self.n_envs, dtype=np.int64)

    def obs(self) -> np.ndarray:
        return np.stack([np.arange(self.n_envs), self.episode, self.t], axis=1).astype(np.float32)

    def feed(self, buffer: TrajectoryReplayBuffer, steps: int) -> None:
        for _ in range(steps):
            obs = self.obs()
            next_obs = obs + np.array([0, 0, 1], dtype=np.float32)
            action = np.array([[scripted_action(k, t)] for k, t in zip(self.episode, self.t)])
            reward = np.array([scripted_reward(e, k, t + 1) for e, (k, t) in enumerate(zip(self.episode, self.t))])
            ends = [self.episodes[e][k] for e, k in enumerate(self.episode)]
            done = np.array([t + 1 == length for t, (length, _) in zip(self.t, ends)])
            infos = [
                {"TimeLimit.truncated": truncated, "terminal_observation": next_obs[e]} if done[e] else {}
                for e, (_, truncated) in enumerate(ends)
            ]
            buffer.add(obs, next_obs, action, reward.astype(np.float32), done, infos)
            self.t += 1
            self.episode[done] += 1
            self.t[done] = 0

    def check(self, batch: TrajectoryBatch) -> None:
        """Every real position of every window matches the script; padding is zero."""
        obs = batch.observations.numpy()
        mask = batch.real.numpy()
        assert batch.observations.dtype == th.float32 and batch.actions.dtype == th.float32
        assert batch.time_idx.dtype == th.int64 and batch.real.dtype == th.bool
        for b, i in zip(*np.nonzero(mask)):
            env, episode, t = (int(v) for v in obs[b, i])
            assert (obs[b, mask[b]][:, :2] == [env, episode]).all(), "a window mixes rollouts"
            length, truncated = self.episodes[env][episode]
            last = length if episode < self.episode[env] else self.t[env]
            assert batch.time_idx[b, i] == t
            assert batch.actions[b, i, 0] == (scripted_action(episode, t) if t < last else 0)
            assert batch.prev_actions[b, i, 0] == (scripted_action(episode, t - 1) if t > 0 else 0)
            assert batch.rewards[b, i] == (scripted_reward(env, episode, t) if t > 0 else 0)
            finished = episode < self.episode[env] and t == length
            assert batch.terminated[b, i] == float(finished and not truncated)
            assert batch.truncated[b, i] == float(finished and truncated)
            if i > 0 and mask[b, i]:
                assert obs[b, i - 1, 2] == t - 1
        padding = ~mask
        for field in (batch.observations, batch.actions, batch.prev_actions):
            assert (field[th.as_tensor(padding)] == 0).all()
        for field in (batch.rewards, batch.terminated, batch.truncated, batch.time_idx):
            assert (field[th.as_tensor(padding)] == 0).all()


def make_buffer(buffer_size: int = 1000, n_envs: int = 1, max_seq_len: int = 8, **kwargs) -> TrajectoryReplayBuffer:
    return TrajectoryReplayBuffer(
        buffer_size, OBS_SPACE, ACTION_SPACE, device="cpu", n_envs=n_envs, max_seq_len=max_seq_len, **kwargs
    )


def test_alignment_termination_and_truncation() -> None:
    stream = Stream([[(5, False), (7, True), (3, False), (12, True)]])
    buffer = make_buffer(max_seq_len=4)
    stream.feed(buffer, 5 + 7 + 3 + 12 + 6)
    for _ in range(50):
        stream.check(buffer.sample(16))
    assert buffer.num_rollouts() == 5
    assert buffer.size() == 5 + 7 + 3 + 12 + 6


def test_windows_of_a_long_rollout_cover_every_transition_as_often_as_the_middle() -> None:
    """In a rollout longer than a window, windows start at any transition and are cut short at its
    end: the last transition (the termination) is trained on as often as a middle one, and only
    the first ``max_seq_len - 1`` transitions less often (in ``t + 1`` of the ``max_seq_len``)."""
    stream = Stream([[(20, False)]])
    buffer = make_buffer(max_seq_len=4)
    stream.feed(buffer, 20)  # one finished rollout of 21 observations (20 transitions)
    assert buffer.num_rollouts() == 1
    np.random.seed(0)
    coverage = np.zeros(20)
    starts, lengths, n_windows = set(), set(), 0
    for _ in range(200):
        batch = buffer.sample(16)
        stream.check(batch)
        real = batch.real.sum(1).int()
        for b in range(16):
            start, n_obs = int(batch.time_idx[b, 0]), int(real[b])
            assert batch.real[b, :n_obs].all(), "padding is on the right"
            assert n_obs == min(5, 21 - start), "full windows, cut short only by the rollout's end"
            assert bool(batch.terminated[b, n_obs - 1]) == (start + n_obs == 21)
            coverage[start : start + n_obs - 1] += 1  # the window's transitions
            starts.add(start)
            lengths.add(n_obs)
            n_windows += 1
    assert starts == set(range(20)), "a window may start at any of the 20 transitions"
    assert lengths == {2, 3, 4, 5}
    share = coverage / n_windows  # expected: min(t + 1, 4) / 20 per transition t
    expected = np.minimum(np.arange(20) + 1, 4) / 20
    assert share == pytest.approx(expected, abs=0.025)
    assert share[-1] == pytest.approx(share[10], abs=0.025), "the last transition as often as a middle one"


def test_rollouts_that_fit_a_window_are_drawn_whole_with_one_draw_each() -> None:
    """Rollouts of at most ``max_seq_len + 1`` observations: offset 0 (after a lost first row: 1) and
    the whole rollout, one ``np.random`` draw per window, so runs whose windows hold whole rollouts
    sample the same batches as when every window was drawn at a full-length start."""
    buffer = make_buffer(max_seq_len=8)
    n_obs, first = np.array([9, 3, 9, 5]), np.array([0, 0, 1, 0])
    np.random.seed(3)
    offsets, lengths = buffer.draw_windows(n_obs, first)
    after = np.random.random()
    np.random.seed(3)
    np.random.randint(0, np.ones(4, dtype=np.int64))  # the one draw per window
    assert after == np.random.random()
    assert offsets.tolist() == [0, 0, 1, 0] and lengths.tolist() == [9, 3, 8, 5]


def test_short_rollouts_taken_whole_and_padded() -> None:
    stream = Stream([[(2, True), (10, False)]])
    buffer = make_buffer(max_seq_len=6)
    stream.feed(buffer, 12)
    lengths = set()
    for _ in range(30):
        batch = buffer.sample(6)
        stream.check(batch)
        assert batch.real.shape[1] == int(batch.real.sum(1).max()) <= 7
        lengths.update(batch.real.sum(1).tolist())
        for b in range(6):
            assert batch.real[b, : int(batch.real[b].sum())].all(), "padding is on the right"
    assert lengths == {2, 3, 4, 5, 6, 7}  # 3: the short rollout whole; 2-7: the 11-observation one, cut at its end


def test_in_progress_rollout_is_sampled() -> None:
    stream = Stream([[]])
    buffer = make_buffer(max_seq_len=16)
    stream.feed(buffer, 300)
    seen = set()
    for _ in range(40):
        batch = buffer.sample(8)
        stream.check(batch)
        seen.update(batch.time_idx[batch.real].tolist())
    assert buffer.num_rollouts() == 1 and buffer.size() == 300
    assert 300 in seen and 0 in seen


@pytest.mark.parametrize("buffer_size, kept", [(24, {0, 1, 2, 3}), (23, {1, 2, 3}), (18, {1, 2, 3})])
def test_eviction_drops_whole_rollouts(buffer_size: int, kept: set[int]) -> None:
    stream = Stream([[(5, False)] * 4])
    buffer = make_buffer(buffer_size=buffer_size)
    stream.feed(buffer, 20)  # 4 episodes of 6 rows (5 steps and the final observation)
    assert buffer.num_rollouts() == len(kept) and buffer.size() == 5 * len(kept)
    episodes = set()
    for _ in range(20):
        batch = buffer.sample(8)
        stream.check(batch)
        episodes.update(batch.observations[..., 1][batch.real].long().tolist())
    assert episodes == kept


def test_rollout_longer_than_its_column_keeps_its_newest_part() -> None:
    stream = Stream([[(40, True), (3, False)]])
    buffer = make_buffer(buffer_size=10)
    stream.feed(buffer, 25)
    for _ in range(20):
        batch = buffer.sample(4)
        stream.check(batch)
        assert batch.time_idx[batch.real].min() >= 25 - 8  # 9 newest observations, the row before them kept
    assert buffer.size() == 8
    stream.feed(buffer, 15)  # ends at 40 (truncated) and the next one starts
    batch = buffer.sample(64)
    stream.check(batch)
    assert (batch.truncated.sum(1) <= 1).all() and batch.truncated.sum() > 0
    stream.feed(buffer, 4)  # the next episode (3 steps, 4 rows) and a new one overwrite 6 more of its rows
    batch = buffer.sample(64)
    stream.check(batch)
    old = batch.real & (batch.observations[..., 1] == 0)
    assert old.any() and batch.time_idx[old].min() == 38


def test_parallel_streams_never_mix() -> None:
    stream = Stream([[(3, False), (9, True)] * 3, [(4, True)] * 8, [(11, False)] * 3])
    buffer = make_buffer(buffer_size=90, n_envs=3, max_seq_len=5)
    stream.feed(buffer, 40)
    envs = set()
    for _ in range(30):
        batch = buffer.sample(16)
        stream.check(batch)
        envs.update(batch.observations[..., 0][batch.real].long().tolist())
    assert envs == {0, 1, 2}


@pytest.mark.parametrize("sample_by_length", [False, True])
def test_random_streams_through_a_small_buffer(sample_by_length: bool) -> None:
    rng = np.random.default_rng(1)
    episodes = [[(int(n), bool(c)) for n, c in zip(rng.integers(1, 30, 40), rng.integers(0, 2, 40))] for _ in range(3)]
    stream = Stream(episodes)
    buffer = make_buffer(buffer_size=36, n_envs=3, max_seq_len=5, sample_by_length=sample_by_length)
    for _ in range(25):
        stream.feed(buffer, 8)
        batch = buffer.sample(16)
        stream.check(batch)
        assert 0 < buffer.size() < 36


def test_sample_by_length() -> None:
    stream = Stream([[(2, False), (38, False)]])
    uniform, by_length = make_buffer(), make_buffer(sample_by_length=True)
    stream.feed(uniform, 40)
    Stream([[(2, False), (38, False)]]).feed(by_length, 40)
    for buffer, expected in ((uniform, 0.5), (by_length, 3 / 42)):  # by observations: 3 of 3 + 39
        batch = buffer.sample(4000)
        from_short = float((batch.observations[:, 0, 1] == 0).float().mean())
        assert abs(from_short - expected) < 0.03


def test_timeouts_count_as_terminations_without_timeout_handling() -> None:
    stream = Stream([[(4, True)]])
    buffer = make_buffer(handle_timeout_termination=False)
    stream.feed(buffer, 4)
    batch = buffer.sample(64)
    assert batch.terminated.sum() > 0 and batch.truncated.sum() == 0


def test_stream_break_starts_a_new_rollout() -> None:
    buffer = make_buffer()
    stream = Stream([[RUNNING]])
    stream.feed(buffer, 6)
    stream.t[:] = 0
    stream.episode[:] = 1  # as after an env reset that the buffer was not told of
    stream.feed(buffer, 3)
    assert buffer.num_rollouts() == 2 and buffer.size() == 9
    for _ in range(10):
        batch = buffer.sample(8)
        assert (batch.terminated == 0).all() and (batch.truncated == 0).all()
        for b in range(8):
            assert len(set(batch.observations[b, batch.real[b], 1].tolist())) == 1


def test_dict_and_uint8_observations_keep_their_dtype() -> None:
    space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, shape=(4, 4, 1), dtype=np.uint8),
            "cell": spaces.Discrete(7),
            "vector": spaces.Box(-1, 1, shape=(2,), dtype=np.float32),
        }
    )
    buffer = TrajectoryReplayBuffer(100, space, spaces.Box(-1, 1, (2,), np.float32), device="cpu", n_envs=2, max_seq_len=3)
    for t in range(6):
        obs = {
            "image": np.full((2, 4, 4, 1), 200 + t, dtype=np.uint8),
            "cell": np.array([t, t]),
            "vector": np.full((2, 2), t / 10, dtype=np.float32),
        }
        next_obs = {"image": obs["image"] + 1, "cell": obs["cell"] + 1, "vector": obs["vector"] + 0.1}
        buffer.add(obs, next_obs, np.full((2, 2), 0.5), np.ones(2), np.array([t == 5, False]), [{}, {}])
    assert buffer.observations["image"].dtype == np.uint8
    batch = buffer.sample(5)
    assert batch.observations["image"].dtype == th.uint8 and batch.observations["image"].shape[2:] == (4, 4, 1)
    assert batch.observations["cell"].dtype == th.int64 and batch.observations["cell"].shape[2:] == (1,)
    assert batch.observations["vector"].dtype == th.float32
    real = batch.real
    assert (batch.observations["image"][real][:, 0, 0, 0].long() - 200 == batch.observations["cell"][real][:, 0]).all()
    assert batch.actions.shape[2] == 2


def test_storage_is_allocated_lazily() -> None:
    image = spaces.Box(0, 255, shape=(84, 84, 3), dtype=np.uint8)
    huge = TrajectoryReplayBuffer(10**9, image, ACTION_SPACE, device="cpu")
    assert huge.nbytes() == 0 and huge.observations is None
    buffer = make_buffer(buffer_size=100, n_envs=2)
    Stream([[], []]).feed(buffer, 1)
    rows = 50 * 2
    assert buffer.nbytes() >= rows * (3 * 4 + 8 + 4 + 1 + 1 + 4)
    buffer.reset()
    assert buffer.nbytes() == 0 and buffer.size() == 0


def _content(buffer: TrajectoryReplayBuffer) -> list[np.ndarray]:
    return [
        buffer.observations.copy(),
        buffer.actions.copy(),
        buffer.rewards.copy(),
        buffer.time_steps.copy(),
        buffer.index.head.copy(),
    ]


@pytest.mark.parametrize(
    "field, change",
    [
        ("obs", lambda a: {**a, "obs": a["obs"][:, :2]}),
        ("next_obs", lambda a: {**a, "next_obs": np.full_like(a["next_obs"], np.nan)}),
        ("next_obs", lambda a: {**a, "next_obs": np.full_like(a["next_obs"], -np.inf)}),
        ("action", lambda a: {**a, "action": np.full_like(a["action"], 10_000)}),
        ("action", lambda a: {**a, "action": -a["action"]}),
        ("reward", lambda a: {**a, "reward": np.array([np.nan, 0.0], dtype=np.float32)}),
        ("reward", lambda a: {**a, "reward": np.array([np.inf, 0.0], dtype=np.float32)}),
        ("done", lambda a: {**a, "done": np.zeros(3, dtype=bool)}),
        ("infos", lambda a: {**a, "infos": [{}]}),
    ],
)
def test_bad_input_is_refused_and_leaves_the_content_untouched(field: str, change) -> None:
    buffer = make_buffer(buffer_size=100, n_envs=2)
    stream = Stream([[], []])
    stream.feed(buffer, 3)
    before = _content(buffer)
    obs = stream.obs()
    good = {
        "obs": obs,
        "next_obs": obs + 1,
        "action": np.array([[3], [4]]),
        "reward": np.zeros(2, dtype=np.float32),
        "done": np.zeros(2, dtype=bool),
        "infos": [{}, {}],
    }
    with pytest.raises(ValueError, match=field):
        buffer.add(**change(good))
    for old, new in zip(before, _content(buffer)):
        np.testing.assert_array_equal(old, new)


def test_missing_dict_key_is_refused() -> None:
    space = spaces.Dict({"a": spaces.Box(-1, 1, (1,)), "b": spaces.MultiDiscrete([3, 3])})
    buffer = TrajectoryReplayBuffer(10, space, ACTION_SPACE, device="cpu")
    obs = {"a": np.zeros((1, 1)), "b": np.zeros((1, 2), dtype=np.int64)}
    with pytest.raises(ValueError, match="next_obs lacks"):
        buffer.add(obs, {"a": obs["a"]}, np.array([[1]]), np.zeros(1), np.zeros(1), [{}])
    with pytest.raises(ValueError, match=r"obs\['b'\]"):
        buffer.add({**obs, "b": np.full((1, 2), 3)}, obs, np.array([[1]]), np.zeros(1), np.zeros(1), [{}])
    assert buffer.nbytes() == 0


def test_pickle_round_trip_gives_the_same_samples(tmp_path) -> None:
    buffer = make_buffer(buffer_size=60, n_envs=2)
    stream = Stream([[(7, True), (9, False)], [(13, False)]])
    stream.feed(buffer, 40)
    save_to_pkl(tmp_path / "buffer.pkl", buffer)
    loaded = load_from_pkl(tmp_path / "buffer.pkl")
    np.random.seed(3)
    expected = buffer.sample(10)
    np.random.seed(3)
    got = loaded.sample(10)
    for a, b in zip(expected, got):
        assert th.equal(a, b)
    stream.feed(loaded, 5)  # a loaded buffer keeps adding where it stopped
    stream.check(loaded.sample(32))


def test_constructed_as_off_policy_algorithms_do() -> None:
    buffer = TrajectoryReplayBuffer(
        1000, OBS_SPACE, ACTION_SPACE, device="cpu", n_envs=4, optimize_memory_usage=False, max_seq_len=8
    )
    assert buffer.buffer_size == 250 and buffer.n_envs == 4
    # SB3's "store each observation once" is what this replay always does; one transition per env at the least.
    memory_optimized = TrajectoryReplayBuffer(1000, OBS_SPACE, ACTION_SPACE, optimize_memory_usage=True)
    assert memory_optimized.optimize_memory_usage is False and memory_optimized.buffer_size == 1000
    assert TrajectoryReplayBuffer(3, OBS_SPACE, ACTION_SPACE, n_envs=4).buffer_size == 2
    with pytest.raises(ValueError, match="no rollout"):
        buffer.sample(2)


class CountingEnv(gym.Env):
    """Observation ``[t, episode]``, reward ``t`` on arriving at step ``t``; even episodes terminate at t = 5."""

    observation_space = spaces.Box(0, 1e6, shape=(2,), dtype=np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self) -> None:
        self.t, self.episode = 0, -1

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.episode], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t), self.episode % 2 == 0 and self.t == 5, False, {}


def test_filled_by_sb3_collect_rollouts() -> None:
    env = make_vec_env(
        CountingEnv, n_envs=2, seed=0, wrapper_class=gym.wrappers.TimeLimit, wrapper_kwargs={"max_episode_steps": 8}
    )
    model = DQN(
        "MlpPolicy",
        env,
        learning_starts=10_000,
        replay_buffer_class=TrajectoryReplayBuffer,
        replay_buffer_kwargs={"max_seq_len": 6},
        buffer_size=400,
        seed=0,
        device="cpu",
    )
    model.learn(120)
    model.learn(40)  # resets the envs mid-episode: the buffer starts new rollouts instead of running on
    buffer = model.replay_buffer
    assert isinstance(buffer, TrajectoryReplayBuffer) and buffer.size() == 160
    for _ in range(20):
        batch = buffer.sample(16)
        obs, mask = batch.observations, batch.real
        assert th.equal(batch.time_idx[mask], obs[..., 0][mask].long())
        assert th.equal(batch.rewards[mask], obs[..., 0][mask])
        assert th.equal(batch.prev_actions[:, 1:][mask[:, 1:]], batch.actions[:, :-1][mask[:, 1:]])
        even = obs[..., 1].long() % 2 == 0
        assert th.equal(batch.terminated.bool(), mask & even & (obs[..., 0] == 5))
        assert th.equal(batch.truncated.bool(), mask & ~even & (obs[..., 0] == 8))


def test_vec_normalize_is_applied_when_sampling() -> None:
    venv = VecNormalize(DummyVecEnv([CountingEnv]), norm_obs=True, norm_reward=True, gamma=0.9)
    venv.reset()
    for _ in range(20):
        venv.step(np.array([0]))
    buffer = TrajectoryReplayBuffer(100, CountingEnv.observation_space, CountingEnv.action_space, device="cpu", max_seq_len=3)
    for t in range(6):
        obs = np.array([[t, 0]], dtype=np.float32)
        buffer.add(obs, obs + [[1, 0]], np.array([[0]]), np.array([t + 1.0], dtype=np.float32), np.array([t == 5]), [{}])
    np.random.seed(1)
    raw = buffer.sample(8)
    np.random.seed(1)
    normalized = buffer.sample(8, env=venv)
    mask = raw.real
    expected_obs = venv.normalize_obs(raw.observations.numpy())
    np.testing.assert_allclose(normalized.observations[mask].numpy(), expected_obs[mask.numpy()], rtol=1e-6)
    np.testing.assert_allclose(normalized.rewards.numpy(), venv.normalize_reward(raw.rewards.numpy()), rtol=1e-6)
    assert (normalized.observations[~mask] == 0).all()
