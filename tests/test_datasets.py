"""Learning from data: datasets into the replay (Minari datasets and plain episodes), protected
rollouts, the protected share of a batch, offline training and offline-to-online, the replay
written back as a Minari dataset, and every kind of bad input refused with the replay unchanged.

The datasets are made here from scripted episodes, stored through Minari's
``create_dataset_from_buffers`` into a temporary folder (nothing is downloaded)."""

import os
import subprocess
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from test_amago import TINY

from sb3_amago import AMAGO, PrevRewardWrapper
from sb3_amago.buffers import TrajectoryReplayBuffer
from sb3_amago.keys import PREV_REWARD_KEY
from sb3_amago.relabel import Rollout

minari = pytest.importorskip("minari")
from minari.data_collector import EpisodeBuffer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:minari")

MARK = spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
ACTION_SPACES = {
    "discrete": spaces.Discrete(3),
    "multidiscrete": spaces.MultiDiscrete([2, 3]),
    "box": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
}


@pytest.fixture(autouse=True)
def minari_folder(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Minari's datasets go to a temporary folder."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


class MarkedEnv(gym.Env):
    """Observation ``[episode mark, t]``; reward on arriving at ``t + 1`` = ``100 * mark + t +
    sum(action)``; terminates after a length drawn from 2..``max_length``. The mark counts the
    episodes, offset by ``mark``."""

    def __init__(self, action_space: spaces.Space | None = None, max_length: int = 7, mark: int = 0) -> None:
        self.observation_space = MARK
        self.action_space = action_space or spaces.Discrete(3)
        self.max_length, self.mark = max_length, mark - 1
        self.t = self.length = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.mark, self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.mark = 0, self.mark + 1
        self.length = int(self.np_random.integers(2, self.max_length + 1))
        return self._obs(), {}

    def step(self, action):
        reward = 100.0 * self.mark + self.t + float(np.sum(action))
        self.t += 1
        return self._obs(), reward, self.t >= self.length, False, {}


class Recorder(gym.Wrapper):
    """Keeps every finished episode of the env it wraps in Minari's layout (a dict of arrays)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.episodes: list[dict[str, Any]] = []
        self._current: dict[str, list] | None = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._current = {"observations": [obs], "actions": [], "rewards": [], "terminations": [], "truncations": []}
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        assert self._current is not None
        for key, value in zip(
            ("observations", "actions", "rewards", "terminations", "truncations"), (obs, action, reward, terminated, truncated)
        ):
            self._current[key].append(np.copy(value))
        if terminated or truncated:
            self.episodes.append({key: np.array(value) for key, value in self._current.items()})
        return obs, reward, terminated, truncated, info


def scripted_episodes(n: int, action_space: spaces.Space | None = None, mark: int = 0, seed: int = 0, **env_kwargs) -> list:
    """``n`` episodes of a MarkedEnv (inside a time limit of 5, so some end truncated) under a seeded random policy."""
    env = Recorder(gym.wrappers.TimeLimit(MarkedEnv(action_space, mark=mark, **env_kwargs), max_episode_steps=5))
    env.action_space.seed(seed)
    env.reset(seed=seed)
    while len(env.episodes) < n:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return env.episodes


def minari_dataset(dataset_id: str, episodes: list[dict], observation_space: spaces.Space, action_space: spaces.Space):
    buffers = [EpisodeBuffer(id=i, infos={}, **episode) for i, episode in enumerate(episodes)]
    return minari.create_dataset_from_buffers(
        dataset_id, buffers, observation_space=observation_space, action_space=action_space, jpeg_encoding=False
    )


def model_for(env: Any, **kwargs: Any) -> AMAGO:
    params: dict[str, Any] = {
        "max_seq_len": 4,
        "learning_starts": 0,
        "batch_size": 4,
        "buffer_size": 400,
        "seed": 0,
        "policy_kwargs": TINY,
    }
    params.update(kwargs)
    return AMAGO("TransformerPolicy", env, **params)


def marked_model(action_space: spaces.Space | None = None, **kwargs: Any) -> AMAGO:
    return model_for(PrevRewardWrapper(MarkedEnv(action_space)), **kwargs)


def same_rollouts(a: list[Rollout], b: list[Rollout], exact: bool = True) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x.observations) == sorted(y.observations)
        for key in x.observations:
            np.testing.assert_array_equal(x.observations[key], y.observations[key])
        if exact:
            np.testing.assert_array_equal(x.actions, y.actions)
        else:
            np.testing.assert_allclose(x.actions, y.actions, atol=1e-6)
        np.testing.assert_array_equal(x.rewards, y.rewards)
        assert (x.terminated, x.truncated, x.start_time) == (y.terminated, y.truncated, y.start_time)


def replay_state(replay: TrajectoryReplayBuffer) -> dict[str, Any]:
    """Everything a failed add must leave as it was."""
    index = replay.index
    state: dict[str, Any] = {
        "table": index.table[: index.n_table].copy(),
        "head": index.head.copy(),
        "running": index.running.copy(),
        "protected": index.protected.copy(),
        "size": replay.size(),
    }
    if replay._obs is not None:
        store = replay.store()
        state["arrays"] = [a.copy() for a in (*store.obs.values(), store.actions, store.rewards, store.dones, store.timeouts)]
    return state


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        if key == "arrays":
            for x, y in zip(value, b[key]):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(value, b[key])


# --------------------------------------------------------------------------------------------
# Datasets into the replay
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("space", list(ACTION_SPACES))
def test_dataset_episodes_are_stored_as_online_collection_stores_them(space: str) -> None:
    """Collect episodes online (a seeded random policy, recorded by a wrapper below PrevRewardWrapper),
    then store the same episodes with add_dataset into a second model: the replays hold the same
    rows, the same rollout table, and the same windows."""
    action_space = ACTION_SPACES[space]
    recorder = Recorder(gym.wrappers.TimeLimit(MarkedEnv(action_space), max_episode_steps=5))
    online = model_for(PrevRewardWrapper(recorder), learning_starts=10_000)
    online.learn(60)
    offline = marked_model(action_space)
    offline.add_dataset(recorder.episodes)
    a, b = online.replay_buffer, offline.replay_buffer
    n_finished = len(recorder.episodes)
    rows = sum(len(episode["rewards"]) + 1 for episode in recorder.episodes)
    assert any(e["truncations"][-1] for e in recorder.episodes) and any(e["terminations"][-1] for e in recorder.episodes)
    np.testing.assert_array_equal(a.index.table[:n_finished], b.index.table[:n_finished])
    assert b.index.n_table == n_finished and b.size() == rows - n_finished
    store_a, store_b = a.store(), b.store()
    for key in store_a.obs:
        np.testing.assert_array_equal(store_a.obs[key][:rows], store_b.obs[key][:rows])
    exact = space != "box"  # Box actions pass to_env / to_buffer once more offline: equal to float precision
    for field in ("actions", "rewards", "dones", "timeouts", "time_steps"):
        x, y = getattr(store_a, field)[:rows], getattr(store_b, field)[:rows]
        if exact or field != "actions":
            np.testing.assert_array_equal(x, y, err_msg=field)
        else:
            np.testing.assert_allclose(x, y, atol=1e-6)
    spans = b.index.spans()
    length = spans.n_obs
    for protected in (False,):
        wa = a.gather(spans.cols, spans.first_rows, length, a.obs_keys, protected)
        wb = b.gather(spans.cols, spans.first_rows, length, b.obs_keys, protected)
        for key in wa.observations:
            np.testing.assert_array_equal(wa.observations[key], wb.observations[key])
        for field in ("rewards", "terminated", "truncated", "time_idx", "real"):
            np.testing.assert_array_equal(getattr(wa, field), getattr(wb, field))
        np.testing.assert_allclose(wa.actions, wb.actions, atol=0 if exact else 1e-6)
    same_rollouts(a.rollouts(), b.rollouts(), exact=exact)


def test_minari_dataset_to_replay_windows_equal_the_episodes() -> None:
    """A Minari dataset of scripted episodes (without prev_reward, which the model's observations
    carry): every sampled window matches its episode, step for step."""
    episodes = scripted_episodes(12)
    dataset = minari_dataset("test/marked-v0", episodes, MARK, spaces.Discrete(3))
    model = marked_model()
    model.add_dataset(minari.load_dataset("test/marked-v0"))
    assert model.replay_buffer.num_rollouts() == dataset.total_episodes == 12
    assert model.num_timesteps == 0
    for seed in range(3):
        np.random.seed(seed)
        batch = model.replay_buffer.sample(16)
        obs, prev_reward = batch.observations["observation"].cpu().numpy(), batch.observations[PREV_REWARD_KEY].cpu().numpy()
        for b, i in zip(*np.nonzero(batch.real.cpu().numpy())):
            mark, t = int(obs[b, i, 0]), int(obs[b, i, 1])
            episode = episodes[mark]
            n = len(episode["rewards"])
            assert batch.time_idx[b, i] == t
            assert batch.actions[b, i, 0] == (episode["actions"][t] if t < n else 0)
            assert batch.prev_actions[b, i, 0] == (episode["actions"][t - 1] if t > 0 else 0)
            reward = episode["rewards"][t - 1] if t > 0 else 0.0
            assert batch.rewards[b, i] == pytest.approx(reward) and prev_reward[b, i, 0] == pytest.approx(reward)
            assert batch.terminated[b, i] == float(t == n and bool(episode["terminations"][-1]))
            truncated = bool(episode["truncations"][-1]) and not bool(episode["terminations"][-1])  # a termination wins
            assert batch.truncated[b, i] == float(t == n and truncated)


def test_dict_observations_with_discrete_parts_and_prev_reward() -> None:
    """Dict observations (a Box and a Discrete part) from Minari; prev_reward added from the rewards."""
    space = spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float32), "room": spaces.Discrete(4)})
    episodes = []
    for k in range(3):
        n = 3 + k
        episodes.append(
            {
                "observations": {"pos": np.full((n + 1, 2), k, np.float32), "room": np.arange(n + 1) % 4},
                "actions": np.arange(n) % 3,
                "rewards": np.arange(n, dtype=np.float64) + k,
                "terminations": np.arange(n) == n - 1,
                "truncations": np.zeros(n, bool),
            }
        )
    minari_dataset("test/dict-v0", episodes, space, spaces.Discrete(3))

    class DictEnv(gym.Env):
        observation_space, action_space = space, spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, True, False, {}

    model = model_for(PrevRewardWrapper(DictEnv()))
    model.add_dataset(minari.load_dataset("test/dict-v0"))
    stored = model.replay_buffer.rollouts()
    for episode, rollout in zip(episodes, stored):
        np.testing.assert_array_equal(rollout.observations["room"][:, 0], episode["observations"]["room"])
        np.testing.assert_array_equal(rollout.observations["pos"], episode["observations"]["pos"])
        np.testing.assert_array_equal(rollout.observations[PREV_REWARD_KEY][:, 0], np.r_[0.0, episode["rewards"]])
        assert rollout.terminated and not rollout.truncated
    model.learn_offline(2, log_interval=0)


@pytest.mark.parametrize("space", ["discrete", "box"])
def test_replay_to_minari_and_back_is_identical(space: str) -> None:
    """A run's replay written as a Minari dataset and read back into another model: the same
    rollouts (running ones are left out)."""
    env = PrevRewardWrapper(gym.wrappers.TimeLimit(MarkedEnv(ACTION_SPACES[space]), max_episode_steps=5))
    model = model_for(env, learning_starts=10_000)
    model.learn(50)
    written = model.save_dataset("test/run-v0", author="tests")
    read = minari.load_dataset("test/run-v0")
    assert read.total_episodes == written.total_episodes == len(model.replay_buffer.rollouts())
    assert read.observation_space == model.observation_space and read.action_space == model.action_space
    again = model_for(PrevRewardWrapper(MarkedEnv(ACTION_SPACES[space])))
    again.add_dataset(read)
    same_rollouts(model.replay_buffer.rollouts(), again.replay_buffer.rollouts(), exact=space == "discrete")


def test_plain_box_observations_without_prev_reward() -> None:
    """A model without PrevRewardWrapper takes the episodes as they are (EpisodeData from Minari)."""
    episodes = scripted_episodes(4)
    minari_dataset("test/plain-v0", episodes, MARK, spaces.Discrete(3))
    model = model_for(MarkedEnv())
    model.add_dataset(list(minari.load_dataset("test/plain-v0").iterate_episodes()))
    rollouts = model.replay_buffer.rollouts()
    for episode, rollout in zip(episodes, rollouts):
        np.testing.assert_array_equal(rollout.observations["observation"], episode["observations"])


# --------------------------------------------------------------------------------------------
# Protected rollouts and their share of a batch
# --------------------------------------------------------------------------------------------
def test_protected_rollouts_survive_a_full_buffer_and_unprotected_ones_do_not() -> None:
    demos, others = scripted_episodes(5, mark=1000), scripted_episodes(5, mark=2000)
    model = marked_model(buffer_size=60, learning_starts=10_000)
    model.add_dataset(demos, protected=True)
    model.add_dataset(others)
    protected_before = model.replay_buffer.rollouts()[:5]
    model.learn(300)  # five times the ring
    replay = model.replay_buffer
    assert replay.index.full().all()
    marks = {int(r.observations["observation"][0, 0]) for r in replay.rollouts()}
    assert {1000, 1001, 1002, 1003, 1004} <= marks, "protected rollouts stay"
    assert not marks & set(range(2000, 2005)), "unprotected dataset rollouts are evicted like collected ones"
    same_rollouts(protected_before, replay.rollouts()[:5])
    assert replay.size() > sum(len(e["rewards"]) for e in demos)


def test_protected_share_of_each_batch() -> None:
    demos = scripted_episodes(4, mark=1000)
    model = marked_model(buffer_size=200, learning_starts=10_000, replay_buffer_kwargs={"protected_share": 0.25})
    model.add_dataset(demos, protected=True)
    # Only protected rollouts so far: the whole batch comes from them.
    batch = model.replay_buffer.sample(8)
    assert (batch.observations["observation"][:, 0, 0] >= 1000).all()
    model.learn(100)
    for seed in range(5):
        np.random.seed(seed)
        batch = model.replay_buffer.sample(8)
        marks = batch.observations["observation"][:, 0, 0]
        assert int((marks >= 1000).sum()) == 2, "a quarter of each batch"
        real, t = batch.real.cpu().numpy(), batch.time_idx.cpu().numpy()
        assert (np.sort(real, axis=1)[:, ::-1] == real).all(), "real steps are a prefix of each window"
        assert (batch.observations["observation"].cpu().numpy()[~real] == 0).all() and (t[~real] == 0).all()
        assert all((np.diff(t[b, real[b]]) == 1).all() for b in range(8)), "consecutive steps of one rollout"
    # Without a share, rollouts are drawn alike: over many batches the protected share is their share of rollouts.
    alike = marked_model(buffer_size=200, learning_starts=10_000)
    alike.add_dataset(demos, protected=True)
    alike.learn(100)
    share = np.mean(
        [
            float((alike.replay_buffer.sample(8).observations["observation"][:, 0, 0] >= 1000).float().mean())
            for _ in range(200)
        ]
    )
    expected = 4 / alike.replay_buffer.num_rollouts()
    assert abs(share - expected) < 0.05
    with pytest.raises(ValueError, match="protected_share"):
        marked_model(replay_buffer_kwargs={"protected_share": 1.5})


def test_replay_with_protected_rollouts_saves_and_loads(tmp_path) -> None:
    model = marked_model(learning_starts=10_000)
    model.add_dataset(scripted_episodes(3, mark=1000), protected=True)
    model.learn(20)
    model.save_replay_buffer(tmp_path / "replay")
    again = marked_model()
    again.load_replay_buffer(tmp_path / "replay")
    same_rollouts(model.replay_buffer.rollouts(), again.replay_buffer.rollouts())
    assert again.replay_buffer.index.protected_rows() == model.replay_buffer.index.protected_rows() > 0


# --------------------------------------------------------------------------------------------
# Offline training, offline-to-online, pure behaviour cloning
# --------------------------------------------------------------------------------------------
class CountUpdates(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _on_step(self) -> bool:
        self.calls += 1
        return self.calls < 7


def test_learn_offline_trains_without_env_steps_then_learn_continues_online(tmp_path) -> None:
    model = marked_model(learning_starts=0, train_freq=4)
    with pytest.raises(ValueError, match="add_dataset"):
        model.learn_offline(5)
    model.add_dataset(scripted_episodes(8))
    eval_env = make_vec_env(lambda: PrevRewardWrapper(MarkedEnv()), n_envs=1)
    evaluate = EvalCallback(eval_env, eval_freq=4, n_eval_episodes=2, log_path=str(tmp_path), verbose=0)
    model.learn_offline(10, callback=evaluate, log_interval=5, progress_bar=True)
    assert model.num_timesteps == 0 and model._n_updates == 10
    assert len(evaluate.evaluations_results) == 2  # at updates 4 and 8
    steps = [s["step"] for s in model.policy.optimizer.state.values() if "step" in s]
    assert steps and all(int(s) == 10 for s in steps)
    # A callback stops it as in learn.
    stopper = CountUpdates()
    model.learn_offline(100, callback=stopper)
    assert stopper.calls == 7 and model._n_updates == 17
    # Online from the same replay and optimizer.
    model.learn(8)
    assert model.num_timesteps == 8 and model._n_updates == 19
    assert model.replay_buffer.num_rollouts() >= 8


@pytest.mark.parametrize("compile_model", [False, True])
def test_pure_bc_trains_the_actor_and_encoder_only(compile_model: bool) -> None:
    """Compiled too: the update's forward without target or PopArt, one graph."""
    model = marked_model(pure_bc=True, compile_model=compile_model)
    th._dynamo.utils.counters.clear()
    model.add_dataset(scripted_episodes(6))
    critics = {k: v.clone() for k, v in model.policy.critics.state_dict().items()}
    actor = {k: v.clone() for k, v in model.policy.actor.state_dict().items()}
    popart = {k: v.clone() for k, v in model.policy.popart.state_dict().items()}
    model.learn_offline(3, log_interval=1)
    for key, value in model.policy.critics.state_dict().items():
        assert th.equal(value, critics[key]), key
    for key, value in model.policy.popart.state_dict().items():
        assert th.equal(value, popart[key]), key
    assert any(not th.equal(v, actor[k]) for k, v in model.policy.actor.state_dict().items())
    assert "train/bc_loss" in model.logger.name_to_value or model._n_updates == 3
    assert not th._dynamo.utils.counters["graph_break"]


def test_n_step_model_trains_offline() -> None:
    model = marked_model(n_step=3)
    model.add_dataset(scripted_episodes(6))
    model.learn_offline(3, log_interval=0)
    assert model.loss_config.n_step == 3 and model._n_updates == 3


# --------------------------------------------------------------------------------------------
# Bad input: a clear error, nothing stored
# --------------------------------------------------------------------------------------------
def _bad(episodes: list[dict], field: str, value: Any, which: int = 1) -> list[dict]:
    out = [dict(episode) for episode in episodes]
    out[which][field] = value
    return out


def bad_inputs() -> dict[str, tuple[Any, str]]:
    good = scripted_episodes(3)
    n = len(good[1]["rewards"])
    obs_nan = good[1]["observations"].copy()
    obs_nan[1, 0] = np.nan
    action_nan = good[1]["actions"].astype(np.float64)
    action_nan[0] = np.nan
    reward_nan = good[1]["rewards"].astype(np.float64)
    reward_nan[-1] = np.nan
    term_nan = good[1]["terminations"].astype(np.float64)
    term_nan[0] = np.nan
    early = np.zeros(n, bool)
    early[0] = True
    return {
        "short observations": (_bad(good, "observations", good[1]["observations"][:-1]), "different lengths"),
        "long actions": (_bad(good, "actions", np.r_[good[1]["actions"], 0]), "different lengths"),
        "nan observation": (_bad(good, "observations", obs_nan), r"episode 1: observations\['observation'\] holds NaN"),
        "nan action": (_bad(good, "actions", action_nan), "episode 1: actions holds NaN"),
        "nan reward": (_bad(good, "rewards", reward_nan), "episode 1: rewards holds NaN"),
        "nan termination": (_bad(good, "terminations", term_nan), "episode 1: terminations holds NaN"),
        "never ends": (
            _bad(_bad(good, "terminations", np.zeros(n, bool)), "truncations", np.zeros(n, bool)),
            "neither terminated nor truncated",
        ),
        "ends early": (_bad(good, "terminations", early), "episode 1: it ends at step 0, before its last step"),
        "action out of range": (_bad(good, "actions", np.full(n, 7)), "episode 1: actions holds values outside"),
        "missing field": ([good[0], {k: v for k, v in good[1].items() if k != "rewards"}], "episode 1: no 'rewards'"),
        "too large": (scripted_episodes(70), "more than the replay holds"),
        "not episodes": ({"observations": 1}, "iterable of episodes"),
    }


@pytest.mark.parametrize("protected", [False, True])
def test_bad_input_is_refused_and_the_replay_is_unchanged(protected: bool) -> None:
    model = marked_model(buffer_size=200, learning_starts=10_000)
    model.add_dataset(scripted_episodes(2, mark=500), protected=True)
    model.learn(20)
    before = replay_state(model.replay_buffer)
    for name, (dataset, message) in bad_inputs().items():
        with pytest.raises(ValueError, match=message):
            model.add_dataset(dataset, protected=protected)
        assert_same_state(before, replay_state(model.replay_buffer))
        assert model._last_obs is not None, name  # the envs were not interrupted either


def test_spaces_that_do_not_match_are_named() -> None:
    episodes = scripted_episodes(3)
    minari_dataset("test/other-obs-v0", episodes, spaces.Box(-1e6, 1e6, (2,), np.float64), spaces.Discrete(3))
    minari_dataset("test/other-act-v0", episodes, MARK, spaces.Discrete(4))
    model = marked_model()
    before = replay_state(model.replay_buffer)
    with pytest.raises(ValueError, match=r"observation space .*float64.* does not match the model's Dict"):
        model.add_dataset(minari.load_dataset("test/other-obs-v0"))
    with pytest.raises(ValueError, match=r"action space Discrete\(4\) does not match the model's Discrete\(3\)"):
        model.add_dataset(minari.load_dataset("test/other-act-v0"))
    assert_same_state(before, replay_state(model.replay_buffer))


def test_minari_dataset_larger_than_the_replay_is_refused_before_reading() -> None:
    minari_dataset("test/big-v0", scripted_episodes(40), MARK, spaces.Discrete(3))
    model = marked_model(buffer_size=50)
    with pytest.raises(ValueError, match=r"episodes take \d+ rows .*\(buffer_size=50\)"):
        model.add_dataset(minari.load_dataset("test/big-v0"))
    assert model.replay_buffer.num_rollouts() == 0


def test_package_imports_without_minari() -> None:
    """sb3_amago imports and trains without minari; the dataset functions name the extra to install."""
    code = (
        "import sys; sys.modules['minari'] = None\n"
        "import sb3_amago, sb3_amago.datasets as d\n"
        "try:\n    d.import_minari()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True
    )
    assert "pip install sb3-amago[data]" in out.stdout


def test_protected_rollouts_are_relabeled_when_sampled() -> None:
    """With a relabeler, protected rollouts are relabeled like the others (the relabeler reads the
    protected store)."""
    from sb3_amago.relabel import HindsightInstructionRelabeler

    kwargs = {"relabeler": HindsightInstructionRelabeler("all"), "max_seq_len": 8, "buffer_size": 2_000}
    source = model_for("amago-MazeRunner7-v0", learning_starts=10_000, **kwargs)
    source.learn(420)  # at least two episodes (a 7 x 7 maze is truncated after 196 steps)
    rollouts = source.replay_buffer.rollouts()
    assert len(rollouts) >= 2
    model = model_for("amago-MazeRunner7-v0", **kwargs)
    model.replay_buffer.add_rollouts(rollouts, protected=True)
    batch = model.replay_buffer.sample(6)
    assert "achieved" not in batch.observations, "the hidden key stays hidden"
    assert bool(batch.real.any())
    model.learn_offline(2, log_interval=0)


def test_episodes_spread_over_env_columns_and_time_limits_follow_handle_timeout_termination() -> None:
    """With several envs, episodes go to the column given the fewest rows so far; with
    handle_timeout_termination=False a truncated episode is stored as terminated, as online."""
    episodes = scripted_episodes(6)
    env = make_vec_env(lambda: PrevRewardWrapper(MarkedEnv()), n_envs=2)
    model = model_for(env, buffer_size=200)
    model.add_dataset(episodes)
    spans = model.replay_buffer.index.spans()
    per_column = [int(spans.n_obs[spans.cols == c].sum()) for c in (0, 1)]
    assert sorted(spans.cols.tolist()) == [0, 0, 0, 1, 1, 1] and abs(per_column[0] - per_column[1]) <= 6
    stored = sorted(model.replay_buffer.rollouts(), key=lambda r: int(r.observations["observation"][0, 0]))
    for episode, rollout in zip(episodes, stored):
        np.testing.assert_array_equal(rollout.observations["observation"], episode["observations"])
    truncated = [e for e in episodes if e["truncations"][-1] and not e["terminations"][-1]]
    assert truncated, "the scripted episodes include time-limit ends"
    strict = marked_model(replay_buffer_kwargs={"handle_timeout_termination": False})
    strict.add_dataset(truncated)
    assert all(r.terminated and not r.truncated for r in strict.replay_buffer.rollouts())
    with pytest.raises(ValueError, match=r"2 env columns of 100 rows"):
        model.add_dataset(scripted_episodes(50))
