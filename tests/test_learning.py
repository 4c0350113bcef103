"""Learning tests: AMAGO solves memory tasks and the two classic control tasks it replaces DQN
and SAC on. Long (5-40 minutes each on one CPU core): marked slow, run with ``python -m pytest -m slow``.

Last runs (the 2-core machine shared with other runs): 2026-11-30, RepeatPrevious passed (6 min 44 s),
Pendulum passed (15 min 36 s), the T-maze test passed (13 min 51 s); 2026-12-01, CartPole passed with
the entry that draws rollouts in proportion to their length (5 min 50 s; it had failed at 279 of the
475 asked with the entries before, and was marked xfail until then)."""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

import sb3_amago  # noqa: F401  (registers the amago-* env ids)
from sb3_amago import AMAGO
from sb3_amago.zoo import read_zoo_entry

pytestmark = pytest.mark.slow

SMALL_TRANSFORMER = {"traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2}, "d_embed": 64}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    th.set_num_threads(1)


def test_tmaze_h50_is_solved() -> None:
    corridor = 50
    env = make_vec_env("amago-TMaze-v0", n_envs=8, seed=0, env_kwargs={"corridor_length": corridor})
    model = AMAGO(
        "TransformerPolicy",
        env,
        max_seq_len=corridor + 2,
        learning_rate=1e-4,
        learning_starts=1_000,
        train_freq=1,
        gradient_steps=1,
        exploration_steps=30_000,
        policy_kwargs=SMALL_TRANSFORMER,
        seed=0,
    )
    model.learn(60_000)
    eval_env = gym.make("amago-TMaze-v0", corridor_length=corridor)
    successes = []
    for episode in range(100):
        obs, _ = eval_env.reset(seed=1_000 + episode)
        state, done, info = None, False, {}
        while not done:
            action, state = model.predict(obs, state=state, deterministic=True)
            obs, _, terminated, truncated, info = eval_env.step(action)
            done = terminated or truncated
        successes.append(info["success"])
    assert np.mean(successes) >= 0.95


def test_repeat_previous_is_solved_in_8k_steps() -> None:
    """POPGym RepeatPreviousEasy at the ablation record's settings (benchmarks/ablations.py: 8 envs,
    one update per 8 env steps, d_model 128) returns >= 0.99 after 8,000 env steps (record: 4-5k)."""
    env = make_vec_env("amago-popgym-RepeatPreviousEasy-v0", n_envs=8, seed=0)
    model = AMAGO(
        "TransformerPolicy",
        env,
        max_seq_len=52,
        train_freq=1,
        gradient_steps=1,
        policy_kwargs={"traj_encoder_kwargs": {"d_model": 128, "n_heads": 8, "d_ff": 512, "n_layers": 3}},
        seed=0,
    ).learn(8_000)
    eval_env = make_vec_env("amago-popgym-RepeatPreviousEasy-v0", n_envs=8, seed=10_000)
    mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=16)
    assert mean_return >= 0.99


@pytest.mark.parametrize(
    ("env_id", "threshold"),
    [
        ("CartPole-v1", 475.0),
        ("Pendulum-v1", -200.0),
    ],
    ids=["cartpole_in_place_of_dqn", "pendulum_in_place_of_sac"],
)
def test_zoo_entry_solves_classic_control(env_id: str, threshold: float) -> None:
    """AMAGO with its RL Zoo entry, in place of DQN / SAC, reaches the solved return within the
    entry's budget (50k env steps on CartPole, 20k on Pendulum: the zoo's budgets for those peers),
    judged as SB3 users judge it: an EvalCallback every 2,500 steps on 10 deterministic episodes,
    stopping at the threshold. The same training run as seed 0 of ``benchmarks/swap_in.py`` (same entry, seeds
    and evaluation), which records the figure for DQN / SAC too."""
    entry = read_zoo_entry(env_id)
    env = make_vec_env(env_id, n_envs=entry.n_envs, seed=0, wrapper_class=entry.env_wrapper)
    eval_env = make_vec_env(env_id, n_envs=5, seed=10_000, wrapper_class=entry.env_wrapper)
    stop = StopTrainingOnRewardThreshold(reward_threshold=threshold)
    evaluation = EvalCallback(eval_env, callback_on_new_best=stop, eval_freq=max(1, 2_500 // entry.n_envs), n_eval_episodes=10)
    AMAGO(env=env, seed=0, **entry.kwargs).learn(entry.n_timesteps, callback=evaluation)
    assert evaluation.best_mean_reward >= threshold
