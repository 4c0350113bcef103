"""The compiled update with only the batch's time axis dynamic (the package's) against every axis dynamic.

On the CPU ``compile_model=True`` compiles the update's forward with the batch's time axis dynamic and
every other size (the batch size, the feature widths) compiled in (``sb3_amago.compiled_update``'s
``compile_update``). Two reference models (``bench_updates.trained_model``) in this process: one
compiled as the package does, one with the same backend and every size dynamic
(``torch.compile(..., dynamic=True)``), trained alternately for ``--rounds`` rounds of ``--updates``
updates, each side first in turn: the median of the per-round ratios and the rounds the package's side
was faster. One process, because this VM's speed moves between processes by more than a change of
this size.

    python benchmarks/dynamic_axes.py --threads 2 --length 64

Results: ``benchmarks/results/dynamic_axes_L{length}.json`` / ``.md`` (``--name`` changes it).
"""

from typing import Any

import torch as th
from bench_updates import against_the_package, alternation_parser
from common import RESULTS_DIR, print_and_write

from sb3_amago.compiled_update import CpuInductor, inductor_options
from sb3_amago.loss import update_forward


def inside_updates(length: int, rounds: int, updates: int) -> dict[str, dict[str, Any]]:
    """Per-round update times of the package's compiled update and of one with every size dynamic, alternated."""
    backend = CpuInductor(inductor_options(th.device("cpu")))
    return against_the_package(length, rounds, updates, lambda: th.compile(update_forward, dynamic=True, backend=backend))


def main() -> None:
    parser = alternation_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    figures = inside_updates(args.length, args.rounds, args.updates)
    config = {"length": args.length, "rounds": args.rounds, "updates_per_round": args.updates}
    print_and_write(args.name or f"dynamic_axes_L{args.length}", config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
