"""Position probe: how fast each position scheme lets the Transformer learn to recall a fixed lag.

    python benchmarks/position_probe.py                      # every scheme, seeds 0 1 2
    python benchmarks/position_probe.py --schemes rotary sinusoidal --seeds 0

The RL-free core of POPGym RepeatPrevious: random tokens (4 symbols, one-hot) in sequences of 52
steps; the target at step t is the token at t - 4. The trajectory encoder alone (d_model 128 x 3
layers x 8 heads, d_ff 512, the sizes of the ablation record) plus a linear read-out, trained with
AdamW (lr 1e-4, weight decay 1e-3, batch 24: the package's optimizer settings) on cross-entropy.
Recorded: the number of updates until the accuracy averaged over the last 50 updates reaches 0.99
(capped at ``--max-updates``), and the cosine similarity between the position codes of steps 4
apart where the scheme adds a code to the input. Results: ``benchmarks/results/position_probe.{md,json}``.
"""

import argparse
import sys
from collections.abc import Sequence

import torch as th
from common import write_results
from torch.nn import functional as F

from sb3_amago.nets import TransformerTrajEncoder
from sb3_amago.nets.transformer import POS_EMB_TYPES, sinusoidal_embedding

LENGTH, LAG, N_TOKENS, BATCH = 52, 4, 4, 24
ENCODER = {"d_model": 128, "n_heads": 8, "d_ff": 512, "n_layers": 3}
TARGET_ACCURACY, SMOOTHING = 0.99, 50


def updates_to_recall(scheme: str, seed: int, max_updates: int) -> int | None:
    """Updates until the smoothed lag-``LAG`` recall accuracy reaches the target (None: never)."""
    th.manual_seed(seed)
    extra = {"max_time": 1000} if scheme == "learnable" else {}
    encoder = TransformerTrajEncoder(N_TOKENS, LENGTH + 1, pos_emb=scheme, **ENCODER, **extra)
    readout = th.nn.Linear(ENCODER["d_model"], N_TOKENS)
    params = [*encoder.parameters(), *readout.parameters()]
    optimizer = th.optim.AdamW(params, lr=1e-4, weight_decay=1e-3)
    time_idx = th.arange(LENGTH).repeat(BATCH, 1)
    real = th.ones(BATCH, LENGTH, dtype=th.bool)
    recent: list[float] = []
    for update in range(1, max_updates + 1):
        tokens = th.randint(N_TOKENS, (BATCH, LENGTH))
        logits = readout(encoder(F.one_hot(tokens, N_TOKENS).float(), time_idx, real))[:, LAG:]  # (B, L - LAG, N_TOKENS)
        target = tokens[:, :-LAG]
        loss = F.cross_entropy(logits.reshape(-1, N_TOKENS), target.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        recent = [*recent[-(SMOOTHING - 1) :], (logits.argmax(-1) == target).float().mean().item()]
        if len(recent) == SMOOTHING and sum(recent) / SMOOTHING >= TARGET_ACCURACY:
            return update
    return None


def lag_similarity(scheme: str) -> float | None:
    """Mean cosine similarity of the added position codes of steps ``LAG`` apart (None: no code added)."""
    if scheme == "sinusoidal":
        codes = sinusoidal_embedding(th.arange(LENGTH), ENCODER["d_model"])
    elif scheme == "learnable":
        codes = th.nn.Embedding(1000, ENCODER["d_model"]).weight.detach()[:LENGTH]  # at initialisation
    else:
        return None
    codes = F.normalize(codes, dim=-1)
    return float((codes[LAG:] * codes[:-LAG]).sum(-1).mean())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemes", nargs="+", default=list(POS_EMB_TYPES), choices=list(POS_EMB_TYPES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--max-updates", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    figures = {}
    for scheme in args.schemes:
        per_seed = [updates_to_recall(scheme, seed, args.max_updates) for seed in args.seeds]
        reached = [n for n in per_seed if n is not None]
        print(scheme, per_seed, flush=True)
        figures[f"{scheme}: updates to {TARGET_ACCURACY:g} lag-{LAG} recall"] = {
            "value": max(per_seed, key=lambda n: n or args.max_updates + 1) or float("nan"),
            "unit": "updates (worst seed; nan: some seed never)",
            "per_seed": " / ".join(str(n) if n is not None else f">{args.max_updates}" for n in per_seed),
            "seeds_reaching": len(reached),
        }
        similarity = lag_similarity(scheme)
        if similarity is not None:
            figures[f"{scheme}: cosine similarity of codes {LAG} steps apart"] = {"value": similarity, "unit": "cosine"}
    config = {
        "length": LENGTH,
        "lag": LAG,
        "tokens": N_TOKENS,
        "batch": BATCH,
        **ENCODER,
        "seeds": args.seeds,
        "max_updates": args.max_updates,
    }
    write_results("position_probe", config, figures)


if __name__ == "__main__":
    sys.exit(main())
