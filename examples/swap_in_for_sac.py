"""AMAGO as a drop-in for SAC: the same pipeline code trains and evaluates either algorithm on
Pendulum-v1. Only the class name (and AMAGO's own sizes) change.

    python examples/swap_in_for_sac.py --algo amago --steps 20000
    python examples/swap_in_for_sac.py --algo sac --steps 20000
"""

import argparse

from stable_baselines3 import SAC
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_amago import AMAGO


def pipeline(algo_class: type, steps: int, seed: int, **kwargs) -> float:
    """A user's existing training pipeline: vectorised env, learn, save, load, evaluate."""
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
    model = algo_class("MlpPolicy", env, seed=seed, verbose=0, **kwargs)
    model.learn(total_timesteps=steps)
    model.save(f"/tmp/pendulum_{algo_class.__name__}")
    model = algo_class.load(f"/tmp/pendulum_{algo_class.__name__}", env=env)
    mean_return, _ = evaluate_policy(model, env, n_eval_episodes=10)
    return mean_return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=["amago", "sac"], default="amago")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.algo == "sac":
        score = pipeline(SAC, args.steps, args.seed)
    else:
        score = pipeline(
            AMAGO,
            args.steps,
            args.seed,
            gamma=0.99,
            multigammas=(0.9, 0.95, 0.97),
            max_seq_len=32,
            train_freq=1,
            exploration_steps=args.steps // 4,
            policy_kwargs={"traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2}, "d_embed": 64},
        )
    print(f"{args.algo} on Pendulum-v1: mean return {score:.1f} (solved: >= -200)")


if __name__ == "__main__":
    main()
