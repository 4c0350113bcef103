"""AMAGO's learning curve on the passive T-maze: env steps, updates and wall-clock until the
deterministic policy solves it (mean return 1.0: the cue remembered across the corridor).

    python benchmarks/tmaze_curve.py --corridor 50 --steps 60000

Prints one row per evaluation and writes benchmarks/results/tmaze_h<H>.json / .md. One torch
thread, 8 envs, one update (batch 24 windows) per 8 env steps, a 2-layer d_model-64 Transformer.
"""

import argparse
import time

import torch as th
from common import write_results
from curves import first_reach
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

import sb3_amago  # noqa: F401  (registers the amago-* env ids)
from sb3_amago import AMAGO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corridor", type=int, default=50)
    parser.add_argument("--steps", type=int, default=60_000)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--gradient-steps", type=int, default=1)
    parser.add_argument("--evals", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    h = args.corridor
    env = make_vec_env("amago-TMaze-v0", n_envs=8, seed=0, env_kwargs={"corridor_length": h})
    model = AMAGO(
        "TransformerPolicy",
        env,
        max_seq_len=h + 2,
        learning_rate=args.learning_rate,
        learning_starts=1_000,
        train_freq=1,
        gradient_steps=args.gradient_steps,
        batch_size=24,
        exploration_steps=args.steps // 2,
        policy_kwargs={"traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2}, "d_embed": 64},
        seed=0,
    )
    curve, train_seconds = [], 0.0
    for i in range(args.evals):
        start = time.perf_counter()
        model.learn(args.steps // args.evals, reset_num_timesteps=False)
        train_seconds += time.perf_counter() - start
        eval_env = make_vec_env("amago-TMaze-v0", n_envs=4, seed=100 + i, env_kwargs={"corridor_length": h})
        mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=40)
        curve.append(
            {
                "env_steps": model.num_timesteps,
                "updates": model._n_updates,
                "train_s": train_seconds,
                "eval_return": mean_return,
            }
        )
        print(curve[-1], flush=True)
    solved = first_reach(curve, 0.95, column="eval_return")
    figures = {
        "env_steps_to_solve": {
            "value": solved["env_steps"] if solved else float("nan"),
            "unit": "env steps (first eval >= 0.95)",
        },
        "updates_to_solve": {"value": solved["updates"] if solved else float("nan"), "unit": "gradient updates"},
        "train_seconds_to_solve": {
            "value": solved["train_s"] if solved else float("nan"),
            "unit": "s of training (eval excluded)",
        },
        "final_eval_return": {"value": curve[-1]["eval_return"], "unit": "mean return over 40 episodes (1 = solved)"},
    }
    config = {"corridor_length": h, **{k: v for k, v in vars(args).items() if k != "corridor"}, "curve": curve}
    write_results(f"tmaze_h{h}", config, figures)


if __name__ == "__main__":
    main()
