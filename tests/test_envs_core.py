"""Core benchmark envs: T-maze, POPGym adapters, the trials wrapper, dark key-to-door, HalfCheetah-Vel."""

import importlib
import random
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env

import sb3_amago  # noqa: F401  (registers the ids)
from sb3_amago.envs import registered_ids
from sb3_amago.envs.key_door import DarkKeyToDoorEnv
from sb3_amago.envs.popgym_envs import (
    POPGYM_RETURN_RANGES,
    make_popgym,
    popgym_env_name,
    popgym_env_names,
    popgym_normalized_score,
    popgym_return_range,
)
from sb3_amago.envs.registration import meta_rl_family, popgym_family, tmaze_family
from sb3_amago.envs.tmaze import TMazeEnv
from sb3_amago.keys import PREV_REWARD_KEY, TRIAL_RESET_KEY
from sb3_amago.wrappers import TrialsWrapper

POPGYM_FAMILIES = sorted({name.removesuffix("Easy") for name in popgym_env_names("easy")})


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def _check_both(env: gym.Env, check_core: bool = True) -> None:
    """Gymnasium's checker on the env (and its unwrapped core if ``check_core``), SB3's on the env."""
    if check_core:
        gym_check_env(env.unwrapped, skip_render_check=True)
    gym_check_env(env, skip_render_check=True)
    sb3_check_env(env)


def _rollout(env: gym.Env, policy, seed: int = 0) -> tuple[float, int, bool, bool, dict]:
    """Run one episode; ``policy(env, obs) -> action``. Returns (return, length, terminated, truncated, info)."""
    obs, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy(env, obs))
        total += float(reward)
        steps += 1
        done = terminated or truncated
    return total, steps, terminated, truncated, info


# ---------------------------------------------------------------- registration


def test_ids_registered_without_namespace() -> None:
    ids = registered_ids()
    assert [len(family()) for family in (tmaze_family, popgym_family, meta_rl_family)] == [6, 48, 2]
    assert {"amago-TMaze-v0", "amago-TMaze10000-v0", "amago-DarkKeyToDoor-v0", "amago-HalfCheetahVel-v0"} <= set(ids)
    assert all(i in gym.registry and i.startswith("amago-") and "/" not in i for i in ids)


def test_importing_the_package_imports_no_env_module() -> None:
    """Registration names entry points only: no env module loads until one of its ids is made."""
    code = (
        "import sys, gymnasium as gym, sb3_amago\n"
        "print(sorted(m for m in sys.modules if m.startswith('sb3_amago.envs.')))\n"
        "gym.make('amago-TMaze-v0')\n"
        "print(sorted(m for m in sys.modules if m.startswith('sb3_amago.envs.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == str(["sb3_amago.envs.popgym_ranges", "sb3_amago.envs.registration"])
    assert "sb3_amago.envs.tmaze" in out[1] and "sb3_amago.envs.popgym_envs" not in out[1]


def test_make_vec_env_finds_ids() -> None:
    vec = make_vec_env("amago-TMaze-v0", n_envs=2, seed=0, env_kwargs={"corridor_length": 3})
    obs = vec.reset()
    assert obs["observation"].shape == (2, 3) and obs[PREV_REWARD_KEY].shape == (2, 1)
    vec.step(np.zeros(2, dtype=np.int64))
    vec.close()


# ---------------------------------------------------------------- T-maze


def _tmaze_policy(correct: bool):
    def policy(env: gym.Env, obs: dict) -> int:
        core = env.unwrapped
        if obs["observation"][2] < 1:  # not at the junction: move right
            return TMazeEnv.RIGHT
        up = core.goal_up if correct else not core.goal_up
        return TMazeEnv.UP if up else TMazeEnv.DOWN

    return policy


def test_tmaze_checkers() -> None:
    gym_check_env(TMazeEnv(5), skip_render_check=True)
    _check_both(gym.make("amago-TMaze-v0"))


@pytest.mark.parametrize("env_id", ["amago-TMaze-v0", "amago-TMaze10000-v0"])
def test_tmaze_scripted_policy_solves_and_wrong_one_fails(env_id: str) -> None:
    env = gym.make(env_id)
    h = env.unwrapped.corridor_length
    ret, steps, terminated, truncated, info = _rollout(env, _tmaze_policy(correct=True))
    assert (ret, steps, terminated, truncated) == (1.0, h + 1, True, False)
    assert info["success"] and info["is_success"]
    ret, steps, _, _, info = _rollout(env, _tmaze_policy(correct=False))
    assert (ret, steps, info["success"]) == (0.0, h + 1, False)


def test_tmaze_cue_only_at_start_and_penalty() -> None:
    env = TMazeEnv(4)
    obs, _ = env.reset(seed=3)
    assert obs[:2].sum() == 1 and obs[0] == float(env.goal_up)
    for _ in range(4):
        obs, reward, *_ = env.step(TMazeEnv.UP)  # never moves: penalised -1/H each corridor step
        assert obs[:2].sum() == 0 and reward == pytest.approx(-0.25)
    obs, reward, terminated, _, info = env.step(TMazeEnv.UP if env.goal_up else TMazeEnv.DOWN)
    assert (reward, terminated, info["success"]) == (0.0, True, False)  # right turn, but not at the junction


def test_tmaze_seeded_resets_reproduce() -> None:
    env = gym.make("amago-TMaze-v0")
    firsts = [env.reset(seed=s)[0]["observation"].tolist() for s in (7, 7, 8, 8)]
    assert firsts[0] == firsts[1] and firsts[2] == firsts[3]
    assert len({tuple(TMazeEnv(2).reset(seed=s)[0]) for s in range(10)}) == 2  # both goal sides occur


@pytest.mark.parametrize("bad", [0, -1, 10_001, 2.5, True, "50"])
def test_tmaze_rejects_bad_corridor(bad) -> None:
    with pytest.raises(ValueError, match=r"\[1, 10000\]"):
        TMazeEnv(bad)


def test_tmaze_rejects_bad_action() -> None:
    env = TMazeEnv(3)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        env.step(4)


# ---------------------------------------------------------------- POPGym


def test_popgym_table_matches_popgym() -> None:
    import popgym.envs

    popgym_names = {spec["id"].removeprefix("popgym-").removesuffix("-v0") for spec in popgym.envs.ALL.values()}
    assert popgym_names == set(POPGYM_RETURN_RANGES)
    assert len(POPGYM_FAMILIES) == 16


@pytest.mark.parametrize("name", list(POPGYM_RETURN_RANGES))
def test_popgym_every_id_resets_and_steps(name: str) -> None:
    env = gym.make(f"amago-popgym-{name}-v0")
    env.action_space.seed(0)
    first, _ = env.reset(seed=1)
    assert PREV_REWARD_KEY in first and first in env.observation_space
    for _ in range(5):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert obs in env.observation_space and obs[PREV_REWARD_KEY][0] == np.float32(reward)
        if terminated or truncated:
            break
    again, _ = env.reset(seed=1)
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])


@pytest.mark.parametrize("family", POPGYM_FAMILIES)
def test_popgym_checkers_one_per_family(family: str) -> None:
    # popgym's own classes are not checked: CountRecall and MultiarmedBandit share info arrays
    # between steps, which the adapter fixes by copying.
    _check_both(gym.make(f"amago-popgym-{family}Easy-v0"), check_core=False)


@pytest.mark.parametrize(
    ("name", "length", "terminated", "truncated"),
    [
        ("RepeatFirstEasy", 51, True, False),  # the game ends: every card dealt
        ("CountRecallEasy", 51, True, False),
        ("AutoencodeEasy", 103, True, False),
        ("MultiarmedBanditEasy", 200, False, True),  # pure time limits are reported as truncation
        ("PositionOnlyPendulumHard", 100, False, True),
        ("ConcentrationEasy", 104, False, True),
    ],
)
def test_popgym_episode_ends(name: str, length: int, terminated: bool, truncated: bool) -> None:
    env = make_popgym(name)
    env.action_space.seed(0)
    assert _rollout(env, lambda e, o: e.action_space.sample())[1:4] == (length, terminated, truncated)


def test_popgym_cartpole_time_limit_is_truncation() -> None:
    env = make_popgym("PositionOnlyCartPoleEasy")

    def balance(e: gym.Env, obs: dict) -> int:
        _, x_dot, theta, theta_dot = e.unwrapped.state
        return int(theta + 0.5 * theta_dot + 0.01 * x_dot > 0)

    ret, length, terminated, truncated, _ = _rollout(env, balance)
    assert (length, terminated, truncated) == (200, False, True)
    assert popgym_normalized_score("PositionOnlyCartPoleEasy", ret) == pytest.approx(1.0)


def _repeat_first(sign: int):
    def policy(env: gym.Env, obs: dict) -> int:
        card = int(env.unwrapped.card)
        return card if sign > 0 else (card + 1) % 4

    return policy


def _count_recall_oracle(env: gym.Env, obs: dict) -> int:
    core = env.unwrapped
    return int(core.counts[core.query])


def _battleship_all_misses(env: gym.Env, obs: dict) -> np.ndarray:
    return np.argwhere(env.unwrapped.board == 0)[0]


def _minesweeper_worst(env: gym.Env, obs: dict) -> np.ndarray:
    """One fresh cell, then re-click it until the last step, then a mine: the least return."""
    core = env.unwrapped
    viewed = np.argwhere(core.hidden_grid == 2)
    if core.timestep == core.max_episode_length - 1:
        return np.argwhere(core.hidden_grid == 1)[0]
    return viewed[0] if len(viewed) else np.argwhere(core.hidden_grid == 0)[0]


@pytest.mark.parametrize(
    ("name", "policy", "score"),
    [
        ("RepeatFirstEasy", _repeat_first(+1), 1.0),
        ("RepeatFirstEasy", _repeat_first(-1), 0.0),
        ("CountRecallEasy", _count_recall_oracle, 1.0),
        ("BattleshipEasy", _battleship_all_misses, 0.0),
        ("MineSweeperEasy", _minesweeper_worst, 0.0),
    ],
)
def test_popgym_scripted_extremes_reach_table_bounds(name: str, policy, score: float) -> None:
    ret = _rollout(make_popgym(name), policy)[0]
    assert popgym_normalized_score(name, ret) == pytest.approx(score, abs=1e-9)


def test_popgym_normalized_score_bounds_and_names() -> None:
    for name, (low, high) in POPGYM_RETURN_RANGES.items():
        assert low < high
        assert popgym_normalized_score(name, low) == 0.0
        assert popgym_normalized_score(f"amago-popgym-{name}-v0", high) == 1.0
    assert popgym_return_range("popgym-velocityonlycartpolehard-v0") == (0.0, 1.0)
    assert popgym_env_name("VelocityOnlyCartPoleEasy") == "VelocityOnlyCartpoleEasy"
    assert len(popgym_env_names()) == 48 and len(popgym_env_names("HARD")) == 16


def test_popgym_bad_inputs() -> None:
    with pytest.raises(ValueError, match="RepeatPreviousEasy"):
        popgym_normalized_score("RepeatPrevEasy", 0.0)
    with pytest.raises(ValueError, match="easy"):
        popgym_env_names("extreme")
    with pytest.raises(ValueError, match="Unknown POPGym env"):
        make_popgym("NotAnEnv")
    env = make_popgym("RepeatPreviousEasy")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        env.step(4)
    env = make_popgym("BattleshipEasy")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="nvec"):
        env.step(np.array([8, 0]))


def test_popgym_missing_dependencies_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import popgym.envs

    monkeypatch.setattr(popgym.envs, "ALL", {c: s for c, s in popgym.envs.ALL.items() if "Labyrinth" not in s["id"]})
    monkeypatch.setattr(popgym.envs, "has_mazelib", lambda: False)
    with pytest.raises(ImportError, match=r"mazelib.*sb3-amago\[envs\]"):
        make_popgym("LabyrinthEscapeEasy")
    monkeypatch.setitem(sys.modules, "popgym.core.maze", None)  # what importing it without mazelib gives
    make_popgym("RepeatFirstEasy").reset(seed=0)  # the other envs still work
    monkeypatch.setitem(sys.modules, "popgym.envs", None)
    with pytest.raises(ImportError, match=r"sb3-amago\[envs\]"):
        make_popgym("RepeatFirstEasy")


def test_labyrinth_mazes_are_seeded_and_leave_global_rngs_alone() -> None:
    env = make_popgym("LabyrinthExploreEasy")
    py_state, np_state = random.getstate(), np.random.get_state()
    mazes = [env.reset(seed=seed)[1]["maze"] for seed in (5, None, 5, None)]
    assert mazes[0] == mazes[2] and mazes[1] == mazes[3] and mazes[0] != mazes[1]
    assert random.getstate() == py_state
    np.testing.assert_array_equal(np.random.get_state()[1], np_state[1])


# ---------------------------------------------------------------- trials wrapper


def _walk_to(pos: np.ndarray, target: np.ndarray) -> int:
    """Action moving one cell from ``pos`` towards ``target`` (0 when there)."""
    dr, dc = np.sign(target - pos)
    return 2 if dr > 0 else 1 if dr < 0 else 4 if dc > 0 else 3 if dc < 0 else 0


def _key_door_oracle(env: gym.Env, obs: dict) -> int:
    core = env.unwrapped
    pos = obs["observation"].astype(np.int64)
    return _walk_to(pos, core.door if core.has_key else core.key)


def test_trials_wrapper_keeps_task_flags_trials_and_ends_after_k() -> None:
    env = TrialsWrapper(DarkKeyToDoorEnv(size=5, trial_length=6), n_trials=3)
    gym_check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    task = env.task.copy()
    assert obs[TRIAL_RESET_KEY][0] == 0 and obs[PREV_REWARD_KEY][0] == 0 and info["trial"] == 0
    flags, trials, steps, done = [], [], 0, False
    while not done:
        obs, _reward, terminated, truncated, info = env.step(0)  # stay: every trial is cut at 6 steps
        steps += 1
        done = terminated or truncated
        flags.append(obs[TRIAL_RESET_KEY][0])
        trials.append(info["trial"])
        np.testing.assert_array_equal(env.unwrapped.key, task[0])
        np.testing.assert_array_equal(env.unwrapped.door, task[1])
    assert steps == 18 and (terminated, truncated) == (False, True)
    assert [i for i, f in enumerate(flags) if f == 1] == [5, 11]
    assert trials == [0] * 5 + [1] * 6 + [2] * 7
    assert info["trial_returns"] == [0.0, 0.0, 0.0]
    env.reset()
    assert not np.array_equal(env.task, task)  # redrawn at the rollout's reset (5x5: 600 tasks)


def test_trials_wrapper_terminates_with_last_trial_and_carries_reward() -> None:
    env = TrialsWrapper(DarkKeyToDoorEnv(size=5, trial_length=30), n_trials=2)
    obs, _ = env.reset(seed=1)
    rewards, prev, resets = [], [], []
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(_key_door_oracle(env, obs))
        rewards.append(reward)
        prev.append(obs[PREV_REWARD_KEY][0])
        resets.append(obs[TRIAL_RESET_KEY][0])
        done = terminated or truncated
    assert (terminated, truncated) == (True, False)
    assert prev == rewards and info["trial_returns"] == [2.0, 2.0]
    # the observation after the first door is the second trial's start, carrying the door's reward
    assert resets.count(1.0) == 1 and rewards[resets.index(1.0)] == 1.0


def test_trials_wrapper_step_budget_cuts_mid_trial() -> None:
    env = TrialsWrapper(DarkKeyToDoorEnv(size=5, trial_length=4), max_rollout_steps=10)
    _ret, steps, terminated, truncated, info = _rollout(env, lambda e, o: 0)
    assert (steps, terminated, truncated, len(info["trial_returns"])) == (10, False, True, 3)


def test_trials_wrapper_seeded_reset_reproduces_task_and_obs() -> None:
    env = TrialsWrapper(DarkKeyToDoorEnv(), n_trials=2)
    runs = []
    for _ in range(2):
        obs, _ = env.reset(seed=11)
        obs2, _ = env.reset()
        runs.append((env.task.tolist(), obs["observation"].tolist(), obs2["observation"].tolist()))
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_trials": 0}, "n_trials"),
        ({"n_trials": 1.5}, "n_trials"),
        ({"max_rollout_steps": -5}, "max_rollout_steps"),
        ({}, "n_trials or max_rollout_steps"),
    ],
)
def test_trials_wrapper_rejects_bad_limits(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrialsWrapper(DarkKeyToDoorEnv(), **kwargs)


def test_trials_wrapper_needs_task_protocol() -> None:
    with pytest.raises(TypeError, match="sample_task"):
        TrialsWrapper(TMazeEnv(3), n_trials=2)


# ---------------------------------------------------------------- dark key-to-door


def test_key_door_checkers() -> None:
    gym_check_env(DarkKeyToDoorEnv(), skip_render_check=True)
    _check_both(gym.make("amago-DarkKeyToDoor-v0"))


def test_key_door_scripted_policy_gets_two_per_trial() -> None:
    env = gym.make("amago-DarkKeyToDoor-v0")
    ret, steps, terminated, truncated, info = _rollout(env, _key_door_oracle, seed=4)
    assert (steps, terminated, truncated) == (500, False, True)
    finished = info["trial_returns"][:-1]
    assert len(finished) >= 10 and all(r == 2.0 for r in finished)
    assert ret == pytest.approx(sum(info["trial_returns"]))


def test_key_door_bad_inputs() -> None:
    with pytest.raises(ValueError, match="size"):
        DarkKeyToDoorEnv(size=1)
    with pytest.raises(ValueError, match="trial_length"):
        DarkKeyToDoorEnv(trial_length=0)
    env = DarkKeyToDoorEnv()
    with pytest.raises(ValueError, match="distinct"):
        env.set_task([[1, 1], [1, 1]])
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        env.step(5)


# ---------------------------------------------------------------- HalfCheetah-Vel


@pytest.fixture(scope="module")
def cheetah() -> gym.Env:
    return gym.make("amago-HalfCheetahVel-v0")


def test_cheetah_checkers(cheetah: gym.Env) -> None:
    _check_both(cheetah)


def test_cheetah_reward_trials_and_tasks(cheetah: gym.Env) -> None:
    obs, _ = cheetah.reset(seed=2)
    target = cheetah.unwrapped.target_velocity
    assert 0.0 <= target <= 3.0
    action = np.full(6, 0.5, dtype=np.float32)
    steps, done = 0, False
    while not done:
        obs, reward, terminated, truncated, info = cheetah.step(action)
        steps += 1
        done = terminated or truncated
        assert info["target_velocity"] == target
        assert reward == pytest.approx(-abs(info["x_velocity"] - target) - 0.05 * 6 * 0.25)
        if steps == 200:
            assert obs[TRIAL_RESET_KEY][0] == 1.0
    assert (steps, terminated, truncated, len(info["trial_returns"])) == (400, False, True, 2)
    first, _ = cheetah.reset(seed=2)
    assert cheetah.unwrapped.target_velocity == target
    cheetah.reset()
    assert cheetah.unwrapped.target_velocity != target
    again, _ = cheetah.reset(seed=2)
    np.testing.assert_array_equal(first["observation"], again["observation"])
    with pytest.raises(ValueError, match=r"\[-1.0, 1.0\]"):
        cheetah.step(np.full(6, 2.0))


def test_cheetah_without_mujoco_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gymnasium.envs.mujoco.half_cheetah_v5", None)
    monkeypatch.delitem(sys.modules, "sb3_amago.envs.cheetah_vel", raising=False)
    with pytest.raises(ImportError, match=r"MuJoCo.*sb3-amago\[envs\]"):
        importlib.import_module("sb3_amago.envs.cheetah_vel")
