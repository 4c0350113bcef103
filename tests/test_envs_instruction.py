"""The instruction-following envs: MazeRunner, Package Delivery, Crafter instructions."""

import importlib.util
import sys
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env

from sb3_amago.envs.crafter_instructions import CrafterInstructions, import_crafter
from sb3_amago.envs.instruction import InstructionEnv
from sb3_amago.envs.maze_runner import STAY, MazeRunner, generate_maze, shortest_path
from sb3_amago.envs.package_delivery import PackageDelivery
from sb3_amago.goals import instruction_rewards
from sb3_amago.keys import ACHIEVED_KEY, INSTRUCTION_KEY, PREV_REWARD_KEY

needs_crafter = pytest.mark.skipif(importlib.util.find_spec("crafter") is None, reason="crafter not installed")

# A 32 x 32 Crafter world generates four times faster than the default 64 x 64; the code is the same.
ENV_FACTORIES: dict[str, Callable[[], InstructionEnv]] = {
    "maze": lambda: MazeRunner(size=7),
    "delivery": lambda: PackageDelivery(),
    "crafter": lambda: CrafterInstructions(area=32),
}
ALL_ENVS = ["maze", "delivery", pytest.param("crafter", marks=needs_crafter)]


def rollout(env: InstructionEnv, policy: Callable[[], int], seed: int) -> dict[str, np.ndarray]:
    """Run one episode; return the per-step observations' keys and the rewards, reset step included."""
    obs, _ = env.reset(seed=seed)
    achieved, prev_rewards, rewards = [obs[ACHIEVED_KEY]], [obs[PREV_REWARD_KEY][0]], [0.0]
    terminated = truncated = False
    while not (terminated or truncated):
        obs, reward, terminated, truncated, info = env.step(policy())
        achieved.append(obs[ACHIEVED_KEY])
        prev_rewards.append(obs[PREV_REWARD_KEY][0])
        rewards.append(reward)
    return {
        "instruction": obs[INSTRUCTION_KEY],
        "achieved": np.array(achieved),
        "prev_rewards": np.array(prev_rewards),
        "rewards": np.array(rewards, dtype=np.float32),
        "success": np.array(info["success"]),
        "terminated": np.array(terminated),
    }


def epsilon_solver(env: MazeRunner | PackageDelivery, epsilon: float, seed: int) -> Callable[[], int]:
    """The env's solver, replaced by a uniform random action with probability ``epsilon``."""
    rng = np.random.default_rng(seed)
    return lambda: int(rng.integers(env.action_space.n)) if rng.random() < epsilon else env.solver_action()


@pytest.mark.parametrize("name", ALL_ENVS)
def test_env_checkers(name: str) -> None:
    env = ENV_FACTORIES[name]()
    gym_check_env(env, skip_render_check=True)  # needs a spec; the renders are tested below
    sb3_check_env(env, warn=True)


@pytest.mark.parametrize("name", ALL_ENVS)
def test_seeded_reset_reproduces(name: str) -> None:
    env = ENV_FACTORIES[name]()
    first, _ = env.reset(seed=3)
    again, _ = env.reset(seed=3)
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
    other, _ = env.reset(seed=4)
    assert any(not np.array_equal(first[key], other[key]) for key in first)
    assert not first[ACHIEVED_KEY].any() and first[PREV_REWARD_KEY][0] == 0.0


@pytest.mark.parametrize("size", [3, 7, 15])
def test_maze_solver_completes_every_instruction(size: int) -> None:
    env = MazeRunner(size=size)
    for seed in range(10):
        episode = rollout(env, env.solver_action, seed)
        n = np.count_nonzero(episode["instruction"])
        assert episode["success"] and episode["terminated"]
        assert episode["rewards"].sum() == n
        assert len(episode["rewards"]) - 1 <= n * size**2


def test_maze_is_perfect_and_lidar_matches_walls() -> None:
    rng = np.random.default_rng(0)
    passages = generate_maze(9, rng)
    # A spanning tree over 81 cells has 80 edges; every cell is reachable from a corner.
    assert passages.sum() == 2 * 80
    assert all(len(shortest_path(passages, (0, 0), (r, c))) >= 0 for r in range(9) for c in range(9))
    env = MazeRunner(size=5)
    obs, _ = env.reset(seed=1)
    row, col = env.agent
    lidar, position = obs["observation"][:4] * 4, obs["observation"][4:] * 4
    np.testing.assert_allclose(position, [row, col])
    for d, reading in enumerate(lidar):
        # Moving `reading` cells in direction d is possible, one more is not.
        for _ in range(round(reading)):
            assert env.passages[env.agent][d]
            env.step(d)
        assert not env.passages[env.agent][d]
        env.agent = (row, col)


def test_maze_tokens_render_and_wall_bumps() -> None:
    env = MazeRunner(size=4, min_goals=3, render_mode="ansi")
    obs, _ = env.reset(seed=2)
    assert env.token_cell(env.cell_token(2, 3)) == (2, 3)
    art = env.render()
    assert art.count("@") == 1 and all(str(i) in art for i in (1, 2, 3))
    blocked = next(d for d in range(4) if not env.passages[env.agent][d])
    start = env.agent
    obs, _reward, *_ = env.step(blocked)
    assert env.agent == start and obs[ACHIEVED_KEY][0] == env.cell_token(*start)
    env.step(STAY)
    assert env.agent == start


@pytest.mark.parametrize("epsilon", [0.5, 1.0])
@pytest.mark.parametrize("name", ["maze", "delivery"])
def test_live_rewards_equal_goals_rule(name: str, epsilon: float) -> None:
    env = ENV_FACTORIES[name]()
    n_rewarded = 0
    for seed in range(8):
        episode = rollout(env, epsilon_solver(env, epsilon, seed), seed)
        expected = instruction_rewards(episode["instruction"], episode["achieved"])
        np.testing.assert_array_equal(episode["rewards"], expected)
        np.testing.assert_array_equal(episode["prev_rewards"], expected)
        n_rewarded += int(expected.sum() > 0)
        if episode["terminated"]:
            assert expected[-1] == 1.0
    assert n_rewarded > 0


def test_delivery_solver_delivers_every_package() -> None:
    env = PackageDelivery()
    for seed in range(20):
        episode = rollout(env, env.solver_action, seed)
        n = np.count_nonzero(episode["instruction"])
        assert 2 <= n <= 4
        assert episode["success"] and episode["rewards"].sum() == n
        assert len(episode["rewards"]) - 1 <= n * (env.road_length + 1)


def test_delivery_road_mechanics() -> None:
    env = PackageDelivery(road_length=6, n_forks=1, min_packages=1, max_packages=1)
    env.reset(seed=0)
    fork = int(env.forks[0])
    address = env.address_token(fork + 1, 1)
    obs, _ = env.reset(seed=0, options={INSTRUCTION_KEY: [address]})
    obs, *_ = env.step(2)
    assert obs[ACHIEVED_KEY][0] == 0, "a drop at the depot achieves nothing"
    for _ in range(fork):
        obs, *_ = env.step(0)
    assert obs["observation"][1] == 1.0, "at the fork"
    obs, *_ = env.step(0)
    obs, reward, terminated, *_ = env.step(2)
    assert obs[ACHIEVED_KEY][0] == env.address_token(fork + 1, 0) != address and reward == 0 and not terminated
    for _ in range(env.road_length - fork - 1):
        obs, *_ = env.step(1)
    assert obs["observation"][0] == 0.0, "back at the depot after the road's end"
    for _ in range(fork):
        env.step(0)
    env.step(1)
    obs, reward, terminated, _, info = env.step(2)
    assert obs[ACHIEVED_KEY][0] == address and reward == 1.0 and terminated and info["success"]


@needs_crafter
def test_crafter_reset_steps_and_goals() -> None:
    env = CrafterInstructions(area=32)
    actions = import_crafter().constants.actions
    wood, west = env.goal_token("collect_wood"), env.goal_token("travel_1_2")
    assert env.goal_names[wood] == "collect_wood"
    # Travel: the player starts at the centre (16, 16), in region (2, 2); one step west is region (1, 2).
    obs, _ = env.reset(seed=0, options={INSTRUCTION_KEY: [west]})
    first_image = obs["image"]
    assert obs["image"].shape == (64, 64, 3) and obs["image"].dtype == np.uint8
    obs, reward, terminated, _, info = env.step(actions.index("move_left"))
    assert reward == 1.0 and terminated and info["success"]
    np.testing.assert_array_equal(env.reset(seed=0)[0]["image"], first_image)
    # Collect wood: alternate a random move with "do" until a tree gives wood.
    obs, _ = env.reset(seed=0, options={INSTRUCTION_KEY: [wood, west]})
    rng = np.random.default_rng(0)
    achieved, rewards = [obs[ACHIEVED_KEY]], [0.0]
    for t in range(500):
        move = actions.index(f"move_{rng.choice(['left', 'right', 'up', 'down'])}")
        obs, reward, terminated, truncated, info = env.step(move if t % 2 == 0 else actions.index("do"))
        achieved.append(obs[ACHIEVED_KEY])
        rewards.append(reward)
        if terminated or truncated:
            break
    assert info["goals_completed"] >= 1
    np.testing.assert_array_equal(rewards, instruction_rewards(obs[INSTRUCTION_KEY], np.array(achieved)))


@needs_crafter
def test_crafter_horizon_truncates() -> None:
    env = CrafterInstructions(area=32, horizon=3, render_mode="rgb_array")
    env.reset(seed=1)
    outcomes = [env.step(0)[2:4] for _ in range(3)]
    assert outcomes == [(False, False), (False, False), (False, True)]
    assert env.render().shape == (64, 64, 3)


def test_crafter_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "crafter", None)
    with pytest.raises(ImportError, match=r"sb3-amago\[envs\]"):
        CrafterInstructions()


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: MazeRunner(size=2), r"size must be an integer in \[3, 30\]"),
        (lambda: MazeRunner(size=31), r"size must be an integer in \[3, 30\]"),
        (lambda: MazeRunner(size=3, max_goals=9), r"max_goals must be an integer in \[1, 8\]"),
        (lambda: MazeRunner(min_goals=0), r"min_goals must be an integer in \[1, 3\]"),
        (lambda: MazeRunner(min_goals=3, max_goals=2), r"min_goals must be an integer in \[1, 2\]"),
        (lambda: MazeRunner(horizon=0), r"horizon must be an integer >= 1"),
        (lambda: MazeRunner(success_reward=0.0), r"success_reward"),
        (lambda: PackageDelivery(road_length=2), r"road_length must be an integer >= 3"),
        (lambda: PackageDelivery(n_forks=9), r"n_forks must be an integer in \[0, 8\]"),
        (lambda: PackageDelivery(min_packages=0), r"min_packages must be an integer in \[1, 4\]"),
        (lambda: PackageDelivery(max_packages=30), r"max_packages must be an integer in \[1, 29\]"),
        pytest.param(lambda: CrafterInstructions(max_goals=0), r"max_goals must be an integer in \[1, ", marks=needs_crafter),
        pytest.param(
            lambda: CrafterInstructions(region_grid=0),
            r"region_grid must be an integer in \[1, 64\]",
            marks=needs_crafter,
        ),
    ],
)
def test_bad_constructor_values(factory: Callable[[], InstructionEnv], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        factory()


@pytest.mark.parametrize("name", ["maze", "delivery"])
def test_bad_actions_and_instructions(name: str) -> None:
    env = ENV_FACTORIES[name]()
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    n = env.action_space.n
    for action in (n, -1, 1.5):
        with pytest.raises(ValueError, match=rf"\[0, {n - 1}\]"):
            env.step(action)
    with pytest.raises(ValueError, match="Goal tokens must be in"):
        env.reset(options={INSTRUCTION_KEY: [env.n_tokens]})
    with pytest.raises(ValueError, match="instruction needs 1 to"):
        env.reset(options={INSTRUCTION_KEY: []})


def test_registered_ids() -> None:
    # Registered by `import sb3_amago`.
    assert gym.make("amago-MazeRunner-v0").unwrapped.size == 15
    assert gym.make("amago-MazeRunner7-v0").unwrapped.size == 7
    delivery = gym.make("amago-PackageDelivery-v0").unwrapped
    assert (delivery.road_length, delivery.horizon, delivery.min_goals, delivery.max_goals) == (30, 180, 2, 4)
    if importlib.util.find_spec("crafter") is not None:
        assert isinstance(gym.make("amago-CrafterInstructions-v0").unwrapped, CrafterInstructions)


def test_relabeling_a_recorded_maze_rollout() -> None:
    relabel = pytest.importorskip("sb3_amago.relabel")
    env = MazeRunner(size=5, min_goals=3, horizon=60)
    # Seed 4: the random walk completes the first of its 3 goals, so the relabeler keeps one real
    # success and adds two hindsight goals.
    rng = np.random.default_rng(4)
    obs, _ = env.reset(seed=4)
    observations, actions, rewards, cells = [obs], [], [], [env.agent]
    terminated = truncated = False
    while not (terminated or truncated):
        actions.append(int(rng.integers(5)))
        obs, reward, terminated, truncated, _ = env.step(actions[-1])
        observations.append(obs)
        rewards.append(reward)
        cells.append(env.agent)
    keys = (INSTRUCTION_KEY, ACHIEVED_KEY, PREV_REWARD_KEY)
    rollout = relabel.Rollout(
        observations={key: np.array([o[key] for o in observations]) for key in keys},
        actions=np.array(actions)[:, None],
        rewards=np.array(rewards, dtype=np.float32),
        terminated=terminated,
        truncated=truncated,
    )
    relabeler = relabel.HindsightInstructionRelabeler("all")
    relabeler.check(env.observation_space)
    np.random.seed(1)
    new = relabeler.relabel(rollout)
    assert rollout.rewards.sum() == 1.0
    real_step = int(np.flatnonzero(rollout.rewards)[0])
    instruction = new.observations[INSTRUCTION_KEY][0]
    assert np.count_nonzero(instruction) == 3 and new.terminated
    # The real success keeps its goal and its step, merged in time order with the new goals.
    reward_steps = np.flatnonzero(new.rewards)
    assert instruction[reward_steps.tolist().index(real_step)] == observations[0][INSTRUCTION_KEY][0]
    # By hand: the rewards are 1 exactly at the steps where the agent first stood on each new goal
    # cell after the previous goal (goal i+1 is a cell not visited between goal i and it), in order.
    assert len(reward_steps) == 3 and reward_steps[-1] == new.length - 1
    previous = -1
    for goal, step in zip(instruction, reward_steps, strict=True):
        assert env.cell_token(*cells[step + 1]) == goal
        assert all(env.cell_token(*cell) != goal for cell in cells[previous + 2 : step + 1])
        previous = step
    np.testing.assert_array_equal(new.observations[PREV_REWARD_KEY][1:, 0], new.rewards)


def test_unsupported_render_mode_lets_make_vec_env_fall_back() -> None:
    with pytest.raises(TypeError, match="render_mode must be one of"):
        MazeRunner(render_mode="human")
    # SB3's make_vec_env asks for render_mode="rgb_array" first and retries without it on TypeError.
    vec_env = make_vec_env("amago-MazeRunner7-v0", n_envs=2, seed=0)
    assert vec_env.reset()["instruction"].shape[0] == 2
    vec_env = make_vec_env("amago-PackageDelivery-v0", n_envs=1, seed=0)
    assert "achieved" in vec_env.reset()
