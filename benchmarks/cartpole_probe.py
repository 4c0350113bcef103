"""CartPole probe: how AMAGO's deterministic CartPole-v1 policy fails, checkpoint by checkpoint.

    python benchmarks/cartpole_probe.py --seed 1 --steps 20000            # train, checkpoint, probe
    python benchmarks/cartpole_probe.py --seed 1 --conf-file my_amago.yml # another entry
    python benchmarks/cartpole_probe.py --probe-only                      # probe the saved checkpoints

One run of the swap-in benchmark's CartPole setting (``swap_in.py``: AMAGO's zoo entry, 8 envs) saves
the model every ``--every`` env steps to ``--ckpt-dir``; each checkpoint then plays
``--episodes`` deterministic episodes on CartPole-v1 (seeds 1000, 1001, ...), and per checkpoint the
report gives: the episode lengths and how each ended (``x``: the cart left the track, ``theta``: the
pole fell, ``limit``: 500 steps), the mean and final cart position, the share of steps that push
right, the actor's mean margin ``|p(right) - 0.5|`` at the main gamma, and the critics' mean action
gap ``|Q(right) - Q(left)|`` at the main gamma in return units beside the mean ``|Q|``, and the
critics' value of the action taken at each episode's last step (about 1 where the episode then fails:
one reward and no future; a critic that has not learned where the track ends rates it like any
other state). A policy that
balances the pole but pushes one way more often drifts off the track in every episode; the sign of
that drift across checkpoints, and the action gap against the values, say whether the critics can
resolve what the policy needs.

Beside them, what the TD targets can have built by then: each update moves the target critics a
share ``tau`` towards the online ones, and each target refresh lets a value reach ``n_step`` steps
further, so after ``U`` updates the main-gamma value of a state that keeps earning 1 per step is at
most about ``(1 - gamma^N) / (1 - gamma)`` with ``N = n_step * tau * U`` (``bootstrapped value``),
whatever the episodes' true length. And PopArt's output scale ``w`` of the first (shortest) and the
main discount factor: a head whose targets barely vary (CartPole's constant reward at gamma 0.1)
ends with a ``w`` far above the others', and its errors then dominate the critics' gradient.
Results: ``benchmarks/results/cartpole_probe.{md,json}``.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from common import run_metadata
from curves import table_report, write_report
from learning import make_envs, run_settings
from stable_baselines3.common.callbacks import CheckpointCallback
from swap_in import TASKS

from sb3_amago import AMAGO, PrevRewardWrapper
from sb3_amago.zoo import HYPERPARAMS_FILE

X_LIMIT, MAX_STEPS, EPISODE_SEED = 2.4, 500, 1000


def train_with_checkpoints(seed: int, steps: int, every: int, ckpt_dir: Path, conf_file: Path) -> None:
    """The swap-in CartPole run of ``seed``, saved every ``every`` env steps as ``ckpt_dir/cartpole_<n>_steps.zip``."""
    task = TASKS["CartPole"]
    settings = run_settings(task, "amago", task.budget, conf_file)
    env = make_envs(task, settings, settings.n_envs, seed, training=True)
    model = settings.algo_class(env=env, seed=seed, device="cpu", verbose=0, **settings.kwargs)
    model.learn(steps, callback=CheckpointCallback(max(1, every // settings.n_envs), str(ckpt_dir), name_prefix="cartpole"))
    env.close()


def probe_episode(model: AMAGO, env: gym.Env, seed: int) -> dict[str, Any]:
    """One deterministic episode with the policy's and the critics' view of each step."""
    policy = model.policy
    states: list[th.Tensor] = []
    hook = policy.actor.register_forward_hook(lambda _module, inputs, _out: states.append(inputs[0].detach()))
    obs, _ = env.reset(seed=seed)
    context, positions, rights, margins, gaps, values, taken = None, [], [], [], [], [], []
    done, t = False, 0
    while not done:
        action, context = model.predict(obs, state=context, episode_start=np.array([t == 0]), deterministic=True)
        with th.no_grad():
            state = states[-1]
            probs = policy.actor(state).probs[..., -1, :].reshape(-1)  # main gamma, (2,)
            q = policy.critics(state)  # (..., C, G, 2)
            q_main = policy.popart.denormalize(q.movedim(-1, 0))[..., -1].reshape(2, -1).mean(-1)  # (2,), critics' mean
        action = int(np.asarray(action).reshape(-1)[0])
        rights.append(action)
        margins.append(abs(float(probs[1]) - 0.5))
        gaps.append(abs(float(q_main[1] - q_main[0])))
        values.append(float(q_main.abs().mean()))
        taken.append(float(q_main[action]))
        obs, _, terminated, truncated, _ = env.step(action)
        positions.append(float(obs["observation"][0] if isinstance(obs, dict) else obs[0]))
        done, t = terminated or truncated, t + 1
    hook.remove()
    end = "limit" if t >= MAX_STEPS else ("x" if abs(positions[-1]) > X_LIMIT else "theta")
    return {
        "length": t,
        "end": end,
        "mean_x": float(np.mean(positions)),
        "final_x": positions[-1],
        "right_share": float(np.mean(rights)),
        "actor_margin": float(np.mean(margins)),
        "action_gap": float(np.mean(gaps)),
        "mean_abs_q": float(np.mean(values)),
        "last_q": float(taken[-1]),
    }


def probe(ckpt_dir: Path, episodes: int) -> list[dict[str, Any]]:
    """Every checkpoint in ``ckpt_dir``, in order of env steps, probed on ``episodes`` episodes."""
    rows = []
    for path in sorted(ckpt_dir.glob("cartpole_*_steps.zip"), key=lambda p: int(p.stem.split("_")[1])):
        model = AMAGO.load(path, device="cpu")
        env = PrevRewardWrapper(gym.make("CartPole-v1"))
        runs = [probe_episode(model, env, EPISODE_SEED + i) for i in range(episodes)]
        env.close()
        refreshes = model.loss_config.n_step * model.tau * model._n_updates
        popart = model.policy.popart
        rows.append(
            {
                "env_steps": int(path.stem.split("_")[1]),
                "updates": model._n_updates,
                "gammas": list(model.gammas),
                "popart_w": popart.w.detach().tolist(),
                "popart_sigma": popart.sigma.tolist(),
                "target_refreshes": refreshes,
                "bootstrapped_value": (1.0 - model.gamma**refreshes) / (1.0 - model.gamma),
                "episodes": runs,
            }
        )
        print(f"{path.name}: lengths {[r['length'] for r in runs]} ends {[r['end'] for r in runs]}", flush=True)
    return rows


def markdown(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    def mean(row: dict[str, Any], key: str) -> float:
        return float(np.mean([episode[key] for episode in row["episodes"]]))

    table = [
        (
            f"{row['env_steps']:,}",
            " / ".join(str(e["length"]) for e in row["episodes"]),
            " / ".join(e["end"] for e in row["episodes"]),
            f"{mean(row, 'mean_x'):+.2f}",
            f"{mean(row, 'final_x'):+.2f}",
            f"{mean(row, 'right_share'):.2f}",
            f"{mean(row, 'actor_margin'):.3f}",
            f"{mean(row, 'action_gap'):.3f}",
            f"{mean(row, 'mean_abs_q'):.1f}",
            " / ".join(f"{e['last_q']:.1f}" for e in row["episodes"]),
            f"{row['updates']:,}",
            f"{row['target_refreshes']:.1f}",
            f"{row['bootstrapped_value']:.1f}",
            f"{row['popart_w'][0]:.1f} / {row['popart_w'][-1]:.1f}",
        )
        for row in rows
    ]
    header = (
        "env steps",
        "lengths",
        "ends",
        "mean x",
        "final x",
        "right share",
        "actor margin",
        "action gap",
        "mean abs Q",
        "Q at the last step",
        "updates",
        "N",
        "bootstrapped value",
        "PopArt w, first / main gamma",
    )
    description = (
        "Deterministic episodes of each checkpoint (columns: see the docstring of `benchmarks/cartpole_probe.py`; "
        "means over the episodes)."
    )
    return table_report("CartPole probe", meta, description, header, table)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps of the run")
    parser.add_argument("--every", type=int, default=2_500, help="env steps between checkpoints")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--ckpt-dir", type=Path, default=Path("/tmp/cartpole_probe"))
    parser.add_argument("--conf-file", type=Path, default=HYPERPARAMS_FILE, help="AMAGO's hyperparameter file")
    parser.add_argument("--probe-only", action="store_true", help="probe the checkpoints already saved")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    if not args.probe_only:
        train_with_checkpoints(args.seed, args.steps, args.every, args.ckpt_dir, args.conf_file)
    rows = probe(args.ckpt_dir, args.episodes)
    meta = run_metadata()
    payload = {"seed": args.seed, "conf_file": str(args.conf_file), "checkpoints": rows, **meta}
    write_report(args.out_dir, "cartpole_probe", payload, markdown(rows, meta))


if __name__ == "__main__":
    sys.exit(main())
