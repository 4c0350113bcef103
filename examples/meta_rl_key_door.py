"""Meta-RL: in the dark key-to-door room the agent sees only its own position; the key and door
cells stay the same for the whole rollout, so an agent with memory finds them in the first trial
and walks straight to them in the next ones. Returns per rollout rise as it learns to explore,
then exploit. Runs on CPU in minutes (a small room and short rollouts); watch it with

    python examples/meta_rl_key_door.py --steps 40000
    tensorboard --logdir runs/meta_rl        # rollout/ep_rew_mean, train/*
"""

import argparse

import gymnasium as gym
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

import sb3_amago  # noqa: F401  (registers the amago-* env ids)
from sb3_amago import AMAGO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=5, help="room side (the paper's is 9)")
    parser.add_argument("--trial-length", type=int, default=20)
    parser.add_argument("--rollout-length", type=int, default=60, help="steps of trials per task")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env_kwargs = {"size": args.size, "trial_length": args.trial_length, "rollout_length": args.rollout_length}
    env = make_vec_env("amago-DarkKeyToDoor-v0", n_envs=8, seed=args.seed, env_kwargs=env_kwargs)
    model = AMAGO(
        "TransformerPolicy",
        env,
        max_seq_len=args.rollout_length,
        learning_starts=2_000,
        train_freq=1,
        reward_multiplier=100.0,
        exploration_steps=args.steps // 2,
        rollout_exploration_horizon=args.rollout_length,
        policy_kwargs={"traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2}, "d_embed": 64},
        tensorboard_log="runs/meta_rl",
        seed=args.seed,
        verbose=1,
    )
    eval_env = gym.make("amago-DarkKeyToDoor-v0", **env_kwargs)
    before, _ = evaluate_policy(model, eval_env, n_eval_episodes=20)
    model.learn(total_timesteps=args.steps, log_interval=50)
    after, _ = evaluate_policy(model, eval_env, n_eval_episodes=20)
    print(f"return per {args.rollout_length}-step rollout: {before:.2f} before training, {after:.2f} after")


if __name__ == "__main__":
    main()
