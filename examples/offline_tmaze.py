"""Learning from data: AMAGO trained offline on a Minari dataset of the passive T-maze, with zero
env steps, then fine-tuned online from the same replay (offline-to-online), and its replay
written back as a Minari dataset.

The dataset is made here: episodes of a scripted solver (walk right, then turn to the side the
first observation showed) and some random ones, stored with Minari's ``create_dataset_from_buffers``
in a temporary folder (``MINARI_DATASETS_PATH``); nothing is downloaded. Runs on CPU in a few
minutes at corridor 10 (seed 0: solved, return 1.0, after the offline updates with zero env steps,
and still after the online ones). Needs ``pip install sb3-amago[data]``.

    python examples/offline_tmaze.py [--corridor 10] [--episodes 100] [--updates 1500]
"""

import argparse
import os
import tempfile

import gymnasium as gym
import numpy as np
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

import sb3_amago  # noqa: F401  (registers the amago-* env ids)
from sb3_amago import AMAGO


def solver_action(first_obs: np.ndarray, t: int, corridor: int) -> int:
    """The T-maze solver: right (0) along the corridor, then up (1) or down (2) as the cue said."""
    if t < corridor:
        return 0
    return 1 if first_obs[0] > 0 else 2


def record_episodes(n: int, corridor: int, random_share: float, seed: int) -> list[dict[str, np.ndarray]]:
    """``n`` episodes in Minari's layout (``T + 1`` observations, ``T`` of the rest), the env's own
    observation (``add_dataset`` adds the ``prev_reward`` the model sees)."""
    env = gym.make("amago-TMaze-v0", corridor_length=corridor)
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(n):
        obs, _ = env.reset(seed=seed + i)
        observations, actions, rewards, terminations, truncations = [obs["observation"]], [], [], [], []
        is_random = rng.random() < random_share
        while True:
            t = len(actions)
            action = int(rng.integers(4)) if is_random else solver_action(observations[0], t, corridor)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs["observation"])
            actions.append(action)
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated)
            if terminated or truncated:
                break
        episodes.append(
            {
                "observations": np.array(observations),
                "actions": np.array(actions),
                "rewards": np.array(rewards),
                "terminations": np.array(terminations),
                "truncations": np.array(truncations),
            }
        )
    return episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corridor", type=int, default=10, help="corridor length H")
    parser.add_argument("--episodes", type=int, default=100, help="episodes in the dataset")
    parser.add_argument("--random-share", type=float, default=0.2, help="share of random episodes in it")
    parser.add_argument("--updates", type=int, default=1_500, help="offline updates")
    parser.add_argument("--online-steps", type=int, default=2_000, help="env steps of online fine-tuning")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("MINARI_DATASETS_PATH", tempfile.mkdtemp(prefix="minari-"))
    import minari
    from minari.data_collector import EpisodeBuffer

    # 1. A Minari dataset of the scripted solver, some episodes random.
    episodes = record_episodes(args.episodes, args.corridor, args.random_share, args.seed)
    raw_env = gym.make("amago-TMaze-v0", corridor_length=args.corridor).unwrapped  # without prev_reward
    minari.create_dataset_from_buffers(
        "tmaze/solver-v0",
        [EpisodeBuffer(id=i, infos={}, **episode) for i, episode in enumerate(episodes)],
        observation_space=raw_env.observation_space,
        action_space=raw_env.action_space,
        algorithm_name="scripted solver",
        author="sb3-amago example",
        author_email="none",
        code_permalink="examples/offline_tmaze.py",
        description="passive T-maze episodes of a scripted solver, some random",
    )
    dataset = minari.load_dataset("tmaze/solver-v0")
    print(f"dataset: {dataset.total_episodes} episodes, {dataset.total_steps} steps")

    # 2. Offline: the dataset into the replay, kept out of eviction, then updates with no env steps.
    env = make_vec_env("amago-TMaze-v0", n_envs=8, seed=args.seed, env_kwargs={"corridor_length": args.corridor})
    model = AMAGO(
        "TransformerPolicy",
        env,
        max_seq_len=args.corridor + 2,  # whole rollouts in context
        learning_starts=24,  # online fine-tuning starts learning at once: the replay holds the dataset
        train_freq=1,
        epsilon_start=0.1,  # the policy is good already: explore little online
        exploration_steps=args.online_steps,
        replay_buffer_kwargs={"protected_share": 0.25},  # a quarter of each batch from the dataset
        policy_kwargs={"traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2}, "d_embed": 64},
        seed=args.seed,
        verbose=1,
    )
    model.add_dataset(dataset, protected=True)
    model.learn_offline(args.updates, log_interval=500)
    eval_env = gym.make("amago-TMaze-v0", corridor_length=args.corridor)
    mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=20)
    print(f"offline, {model.num_timesteps} env steps: mean return {mean_return:.2f} (solved: 1.0)")

    # 3. Online from the same replay and optimizer.
    model.learn(args.online_steps, log_interval=20)
    mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=20)
    print(f"offline-to-online, {model.num_timesteps} env steps: mean return {mean_return:.2f}")

    # 4. The replay (dataset and online rollouts) as a Minari dataset, for other tools.
    written = model.save_dataset("tmaze/amago-replay-v0", author="sb3-amago example", author_email="none")
    print(f"replay written as a Minari dataset: {written.total_episodes} episodes, {written.total_steps} steps")


if __name__ == "__main__":
    main()
