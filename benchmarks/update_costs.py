"""What the parts of an update cost: the reference update (``bench_updates.py``) beside the same
model with one part taken out or changed, timed in one process, alternating, after warm-up.

Each variant differs from the reference in one setting: the sigma-reparameterised projections
plain (``sigma_reparam=False``), no dropout (``dropout=0``), no position code (``pos_emb="none"``,
the cost of the rotary one), or the sequence model compiled (``compile_model=True``). A variant's
speed-up is the median over rounds of the reference's time over its own in that round, so the
shares hold while absolute times drift with the machine. These are costs, not recommendations:
sigma reparameterisation, dropout and positions are part of AMAGO's defaults (``docs/defaults.md``).

    python benchmarks/update_costs.py --length 64 --threads 2
    python benchmarks/update_costs.py --length 64 --threads 2 --precision bf16 --name update_costs_L64_bf16

Results: ``benchmarks/results/update_costs_L<length>.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import copy
import os
import statistics
import time
from typing import Any

import torch as th
from bench_updates import REFERENCE_POLICY, WARM_UP_UPDATES, trained_model
from common import write_results

from sb3_amago import AMAGO


def encoder_change(**changes: Any) -> dict[str, Any]:
    """The reference policy with ``changes`` to its sequence model's settings."""
    policy: dict[str, Any] = copy.deepcopy(REFERENCE_POLICY)
    policy["traj_encoder_kwargs"].update(changes)
    return policy


#: Variant name -> (policy_kwargs, compile_model).
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "reference": (REFERENCE_POLICY, False),
    "sigma_reparam_off": (encoder_change(sigma_reparam=False), False),
    "dropout_off": (encoder_change(dropout=0.0), False),
    "positions_off": (encoder_change(pos_emb="none"), False),
    "compiled": (REFERENCE_POLICY, True),
}


def timed_update_ms(model: AMAGO, n_updates: int) -> float:
    start = time.perf_counter()
    model.train(gradient_steps=n_updates, batch_size=8)
    return 1e3 * (time.perf_counter() - start) / n_updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=64, help="window length L")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--updates", type=int, default=10, help="timed updates per model per round")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: under bf16 autocast")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--name", default=None, help="results file name (default: update_costs_L<length>)")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    names = ["reference", *(v for v in args.variants if v != "reference")]
    models = {}
    for name in names:
        policy_kwargs, compile_model = VARIANTS[name]
        models[name] = trained_model(
            args.length, args.precision == "bf16", compile_model=compile_model, policy_kwargs=policy_kwargs
        )
        models[name].train(gradient_steps=WARM_UP_UPDATES, batch_size=8)
    times: dict[str, list[float]] = {name: [] for name in names}
    loads = []
    for round_ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, model in models.items():
            times[name].append(timed_update_ms(model, args.updates))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {t[-1]:.1f} ms" for n, t in times.items()), flush=True)
    figures: dict[str, dict[str, Any]] = {}
    for name in names:
        speedups = [ref / own for ref, own in zip(times["reference"], times[name])]
        figures[name] = {
            "value": statistics.median(times[name]),
            "unit": "ms per update (median of rounds)",
            "speedup_vs_reference": round(statistics.median(speedups), 3),
            "runs_ms": [round(t, 2) for t in times[name]],
        }
        print(f"{name:18s} {figures[name]}")
    config = {
        "max_seq_len": args.length,
        "batch_size": 8,
        "threads": args.threads,
        "precision": args.precision,
        "rounds": args.rounds,
        "updates_per_round": args.updates,
        "warm_up_updates": WARM_UP_UPDATES,
        "load_average_range": f"{min(loads):.2f}-{max(loads):.2f}",
    }
    write_results(args.name or f"update_costs_L{args.length}", config, figures)


if __name__ == "__main__":
    main()
