"""Hindsight relabeling: exact goals, rewards, reward inputs and cut points, alone and through the buffer."""

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl

from sb3_amago.buffers import TrajectoryReplayBuffer
from sb3_amago.goals import goal_completion_steps, instruction_rewards, n_goals
from sb3_amago.keys import ACHIEVED_KEY, INSTRUCTION_KEY, PREV_REWARD_KEY
from sb3_amago.relabel import GoalEnvRelabeler, HindsightInstructionRelabeler, Relabeler, Rollout


def instruction_rollout(instruction: list[int], achieved: list[list[int]], m: int = 2) -> Rollout:
    """A rollout that earned the reward rule's rewards; ``achieved[t]``: goals reached on arriving at observation ``t + 1``."""
    table = np.zeros((len(achieved) + 1, m), dtype=np.int64)
    for t, goals in enumerate(achieved):
        table[t + 1, : len(goals)] = goals
    rewards = instruction_rewards(np.array(instruction), table[1:])
    reward_input = np.zeros((len(achieved) + 1, 1), dtype=np.float32)
    reward_input[1:, 0] = rewards
    observations = {
        INSTRUCTION_KEY: np.tile(np.array(instruction, dtype=np.int64), (len(achieved) + 1, 1)),
        ACHIEVED_KEY: table,
        PREV_REWARD_KEY: reward_input,
    }
    return Rollout(observations, np.arange(len(achieved))[:, None], rewards, truncated=True)


def assert_consistent(rollout: Rollout) -> None:
    """Rewards and reward input follow the reward rule for the rollout's (constant) instruction."""
    instruction = rollout.observations[INSTRUCTION_KEY]
    assert (instruction == instruction[0]).all()
    achieved = rollout.observations[ACHIEVED_KEY][1:]
    np.testing.assert_array_equal(rollout.rewards, instruction_rewards(instruction[0], achieved))
    np.testing.assert_array_equal(rollout.observations[PREV_REWARD_KEY][1:, 0], rollout.rewards)
    assert rollout.observations[PREV_REWARD_KEY][0, 0] == 0
    assert rollout.terminated != rollout.truncated
    assert len(rollout.actions) == rollout.length and np.array_equal(rollout.actions[:, 0], np.arange(rollout.length))


def test_relabeler_protocol() -> None:
    assert isinstance(HindsightInstructionRelabeler(), Relabeler)
    assert isinstance(GoalEnvRelabeler(lambda a, d, i: np.zeros(len(a))), Relabeler)
    with pytest.raises(ValueError, match="strategy"):
        HindsightInstructionRelabeler("future")


def test_no_success_and_more_goals_wanted_than_candidates() -> None:
    # Candidates: transition 0 (goal 4) and 2 (goal 5); goal 4 again at 3 is not fresh.
    rollout = instruction_rollout([1, 2, 3], [[4], [], [5], [4], []])
    relabeled = HindsightInstructionRelabeler("all").relabel(rollout)
    assert_consistent(relabeled)
    np.testing.assert_array_equal(relabeled.observations[INSTRUCTION_KEY][0], [4, 5, 3])
    np.testing.assert_array_equal(relabeled.rewards, [1, 0, 1])
    np.testing.assert_array_equal(relabeled.observations[PREV_REWARD_KEY][:, 0], [0, 1, 0, 1])
    assert relabeled.length == 3 and relabeled.truncated and not relabeled.terminated  # goal 3 remains
    assert rollout.length == 5 and rollout.rewards.sum() == 0, "the input rollout is not modified"


def test_nothing_to_relabel_returns_the_rollout_unchanged() -> None:
    done = instruction_rollout([1, 2], [[1], [3], [2]])
    nothing_achieved = instruction_rollout([1, 2], [[], [], []])
    for strategy in ("some", "all", "none"):
        relabeler = HindsightInstructionRelabeler(strategy)
        assert relabeler.relabel(done) is done
        assert relabeler.relabel(nothing_achieved) is nothing_achieved
    wanted = instruction_rollout([1, 2], [[5], [6]])
    assert HindsightInstructionRelabeler("none").relabel(wanted) is wanted


def test_real_successes_kept_and_merged_in_time_order() -> None:
    # Instruction [7, 8, 9]: real successes 7 at transition 1 and 8 at 4. Fresh candidates:
    # 0 (goal 3), 2 (goal 3 again, fresh after the success at 1), 3 (goal 4), 5 (goal 5).
    rollout = instruction_rollout([7, 8, 9], [[3], [7], [3], [4], [8], [5], []])
    expected = {
        (3, 7, 8): ([0, 1, 4], 5),
        (7, 3, 8): ([1, 2, 4], 5),
        (7, 4, 8): ([1, 3, 4], 5),
        (7, 8, 5): ([1, 4, 5], 6),
    }
    relabeler = HindsightInstructionRelabeler("all")
    seen = set()
    for _ in range(60):
        relabeled = relabeler.relabel(rollout)
        assert_consistent(relabeled)
        instruction = tuple(relabeled.observations[INSTRUCTION_KEY][0].tolist())
        successes, end = expected[instruction]
        np.testing.assert_array_equal(np.flatnonzero(relabeled.rewards), successes)
        assert relabeled.length == end and relabeled.terminated
        seen.add(instruction)
    assert seen == set(expected)


def test_repeated_and_simultaneous_achieved_goals() -> None:
    # Goal 2 at 0 then again at 1 and 2 (not fresh); goal 3 fresh at 2; goals 5 and 6 both fresh at 4.
    rollout = instruction_rollout([9, 0, 0], [[2], [2], [2, 3], [3], [5, 6], []])
    relabeler = HindsightInstructionRelabeler("all")
    last_goals = set()
    for _ in range(40):
        relabeled = relabeler.relabel(rollout)
        assert_consistent(relabeled)
        instruction = relabeled.observations[INSTRUCTION_KEY][0]
        np.testing.assert_array_equal(instruction[:2], [2, 3])
        np.testing.assert_array_equal(np.flatnonzero(relabeled.rewards), [0, 2, 4])
        assert relabeled.length == 5 and relabeled.terminated
        last_goals.add(int(instruction[2]))
    assert last_goals == {5, 6}


def test_some_draws_the_number_of_extra_goals_uniformly() -> None:
    rollout = instruction_rollout([1, 2, 3], [[4], [5], [6], [7], [8]])
    relabeler = HindsightInstructionRelabeler("some")
    counts = np.zeros(4)
    for _ in range(800):
        relabeled = relabeler.relabel(rollout)
        if relabeled is rollout:
            counts[0] += 1
            continue
        assert_consistent(relabeled)
        h = int(relabeled.rewards.sum())
        assert n_goals(relabeled.observations[INSTRUCTION_KEY][0]) == 3
        assert relabeled.terminated == (h == 3)
        counts[h] += 1
    np.testing.assert_allclose(counts / counts.sum(), 0.25, atol=0.05)


@pytest.mark.parametrize("strategy", ["some", "all"])
def test_random_rollouts_stay_consistent_with_the_reward_rule(strategy: str) -> None:
    rng = np.random.default_rng(0)
    relabeler = HindsightInstructionRelabeler(strategy)
    for _ in range(200):
        k, length = int(rng.integers(1, 5)), int(rng.integers(1, 30))
        instruction = [int(g) for g in rng.integers(1, 6, size=int(rng.integers(1, k + 1)))] + [0] * k
        achieved = [[int(g) for g in rng.integers(1, 6, size=int(rng.integers(0, 3)))] for _ in range(length)]
        rollout = instruction_rollout(instruction[:k], achieved)
        relabeled = relabeler.relabel(rollout)
        assert_consistent(relabeled)
        if relabeled is rollout:
            continue
        real = goal_completion_steps(np.array(instruction[:k]), rollout.observations[ACHIEVED_KEY][1:])
        real = real[real >= 0]
        successes = np.flatnonzero(relabeled.rewards)
        assert set(real.tolist()) <= set(successes.tolist()), "real successes are kept"
        assert relabeled.length == successes[-1] + 1, "cut at the last success"
        new = relabeled.observations[INSTRUCTION_KEY][0]
        assert relabeled.terminated == (n_goals(new) == len(successes))
        np.testing.assert_array_equal(new[len(successes) :], instruction[len(successes) : k])


def goal_rewards(achieved: np.ndarray, desired: np.ndarray, info, threshold: float) -> np.ndarray:
    return -(np.linalg.norm(achieved - desired, axis=-1) > threshold).astype(np.float32)


def sparse_reward(achieved: np.ndarray, desired: np.ndarray, info) -> np.ndarray:
    return goal_rewards(achieved, desired, info, 0.5)


def loose_reward(achieved: np.ndarray, desired: np.ndarray, info) -> np.ndarray:
    return goal_rewards(achieved, desired, info, 1.5)


def goal_env_rollout(desired: float, length: int = 6) -> Rollout:
    """A walk along a line: observation t has achieved goal ``[t]``."""
    achieved = np.arange(length + 1, dtype=np.float32)[:, None]
    desired_goal = np.full((length + 1, 1), desired, dtype=np.float32)
    rewards = sparse_reward(achieved[1:], desired_goal[1:], None)
    reward_input = np.concatenate([[[0.0]], rewards[:, None]]).astype(np.float32)
    observations = {"achieved_goal": achieved, "desired_goal": desired_goal, PREV_REWARD_KEY: reward_input}
    return Rollout(observations, np.arange(length)[:, None], rewards, truncated=True)


def test_goal_env_relabeling_is_the_one_goal_case() -> None:
    rollout = goal_env_rollout(100.0)
    ends = set()
    for _ in range(40):
        relabeled = GoalEnvRelabeler(sparse_reward, strategy="all").relabel(rollout)
        end = relabeled.length
        ends.add(end)
        np.testing.assert_array_equal(relabeled.observations["desired_goal"], np.full((end + 1, 1), end))
        np.testing.assert_array_equal(relabeled.rewards, [-1.0] * (end - 1) + [0.0])
        np.testing.assert_array_equal(relabeled.observations[PREV_REWARD_KEY][1:, 0], relabeled.rewards)
        assert relabeled.terminated and not relabeled.truncated
    assert ends == set(range(1, 7))
    succeeded = goal_env_rollout(3.0)
    assert GoalEnvRelabeler(sparse_reward, strategy="all").relabel(succeeded) is succeeded
    assert GoalEnvRelabeler(sparse_reward, strategy="none").relabel(rollout) is rollout


def test_goal_env_cut_at_the_first_success_and_truncation_option() -> None:
    rollout = goal_env_rollout(100.0)
    relabeler = GoalEnvRelabeler(loose_reward, strategy="all", terminate_on_success=False)
    for _ in range(20):
        relabeled = relabeler.relabel(rollout)
        goal = int(relabeled.observations["desired_goal"][0, 0])
        # The goal within 1.5 of the position one step earlier: reached there already (except from the start).
        assert relabeled.length == max(goal - 1, 1)
        assert relabeled.rewards[-1] == 0 and (relabeled.rewards[:-1] == -1).all()
        assert relabeled.truncated and not relabeled.terminated


def test_check_names_the_missing_keys() -> None:
    with pytest.raises(ValueError, match="Dict observation space"):
        HindsightInstructionRelabeler().check(spaces.Box(-1, 1, (3,)))
    with pytest.raises(ValueError, match="lacks \\['achieved'\\]"):
        HindsightInstructionRelabeler().check(spaces.Dict({INSTRUCTION_KEY: spaces.MultiDiscrete([4, 4])}))
    with pytest.raises(ValueError, match="desired_goal"):
        TrajectoryReplayBuffer(
            100, INSTRUCTION_SPACE, spaces.Discrete(2), relabeler=GoalEnvRelabeler(sparse_reward), device="cpu"
        )
    with pytest.raises(ValueError, match="integer goal tokens"):
        HindsightInstructionRelabeler().check(
            spaces.Dict({INSTRUCTION_KEY: spaces.MultiDiscrete([4, 4]), ACHIEVED_KEY: spaces.Box(0, 4, (2,))})
        )


INSTRUCTION_SPACE = spaces.Dict(
    {
        "position": spaces.Box(-100, 100, (1,), np.float32),
        INSTRUCTION_KEY: spaces.MultiDiscrete([10, 10]),
        ACHIEVED_KEY: spaces.MultiDiscrete([10]),
        PREV_REWARD_KEY: spaces.Box(-np.inf, np.inf, (1,), np.float32),
    }
)


def fill_instruction_buffer(relabeler: Relabeler | None, max_seq_len: int = 16) -> TrajectoryReplayBuffer:
    """One truncated 6-step episode, instruction [1, 2], reaching goal 5 at step 3 and goal 6 at step 5."""
    buffer = TrajectoryReplayBuffer(
        100, INSTRUCTION_SPACE, spaces.Discrete(3), device="cpu", max_seq_len=max_seq_len, relabeler=relabeler
    )
    achieved = [0, 0, 0, 5, 0, 6, 0]

    def obs(t: int) -> dict[str, np.ndarray]:
        return {
            "position": np.array([[t]], dtype=np.float32),
            INSTRUCTION_KEY: np.array([[1, 2]]),
            ACHIEVED_KEY: np.array([[achieved[t]]]),
            PREV_REWARD_KEY: np.zeros((1, 1), dtype=np.float32),
        }

    for t in range(6):
        buffer.add(obs(t), obs(t + 1), np.array([[t % 3]]), np.zeros(1), np.array([t == 5]), [{"TimeLimit.truncated": t == 5}])
    return buffer


def test_relabeling_through_the_buffer() -> None:
    buffer = fill_instruction_buffer(HindsightInstructionRelabeler("all"))
    stored = [buffer.rewards.copy(), buffer.observations[INSTRUCTION_KEY].copy(), buffer.observations[PREV_REWARD_KEY].copy()]
    batch = buffer.sample(4)
    assert ACHIEVED_KEY not in batch.observations and set(batch.observations) == {"position", INSTRUCTION_KEY, PREV_REWARD_KEY}
    mask = batch.real
    assert (mask.sum(1) == 6).all(), "cut after the last success, at observation 5"
    assert (batch.observations[INSTRUCTION_KEY][mask] == th.tensor([5, 6])).all()
    assert th.equal(batch.rewards, th.tensor([[0, 0, 0, 1, 0, 1]] * 4, dtype=th.float32))
    assert th.equal(batch.observations[PREV_REWARD_KEY][..., 0], batch.rewards)
    assert th.equal(batch.terminated, th.tensor([[0, 0, 0, 0, 0, 1]] * 4, dtype=th.float32))
    assert batch.truncated.sum() == 0
    assert th.equal(batch.observations["position"][..., 0].long(), batch.time_idx)
    assert th.equal(batch.actions[:, :5, 0], th.tensor([[0, 1, 2, 0, 1]] * 4, dtype=th.float32))
    assert th.equal(batch.prev_actions[:, 1:], batch.actions[:, :-1])
    for old, new in zip(stored, [buffer.rewards, buffer.observations[INSTRUCTION_KEY], buffer.observations[PREV_REWARD_KEY]]):
        np.testing.assert_array_equal(old, new)


def test_buffer_with_a_relabeler_pickles(tmp_path) -> None:
    buffer = fill_instruction_buffer(HindsightInstructionRelabeler("some"), max_seq_len=3)
    save_to_pkl(tmp_path / "buffer.pkl", buffer)
    loaded = load_from_pkl(tmp_path / "buffer.pkl")
    assert loaded.hidden_keys == (ACHIEVED_KEY,)
    np.random.seed(2)
    expected = buffer.sample(8)
    np.random.seed(2)
    got = loaded.sample(8)
    for key, value in got.observations.items():
        assert th.equal(value, expected.observations[key])
    assert th.equal(got.rewards, expected.rewards) and th.equal(got.real, expected.real)


def test_relabeler_none_samples_like_no_relabeler() -> None:
    plain = fill_instruction_buffer(None, max_seq_len=2)
    relabeled = fill_instruction_buffer(HindsightInstructionRelabeler("none"), max_seq_len=2)
    np.random.seed(5)
    expected = plain.sample(16)
    np.random.seed(5)
    got = relabeled.sample(16)
    assert ACHIEVED_KEY in expected.observations and ACHIEVED_KEY not in got.observations
    for key, value in got.observations.items():
        assert th.equal(value, expected.observations[key])
    for name in ("actions", "prev_actions", "rewards", "terminated", "truncated", "time_idx", "real"):
        assert th.equal(getattr(got, name), getattr(expected, name)), name
