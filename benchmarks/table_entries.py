"""The compiled update with the package's decomposition table against the same table without some of its entries.

On the CPU ``compile_model=True`` compiles the update with :class:`sb3_amago.compiled_update.CpuInductor`,
whose decomposition table holds the package's entries (``compiled_update.PACKAGE_DECOMPOSITIONS``): the
layer norm's backward as torch's kernel (``sb3_amago/nets/layer_norm.py``), the rectifiers' operators as
their twins without autograd (``sb3_amago/nets/activations.py``). Two reference models
(``bench_updates.trained_model``) in this process: one compiled as the package does, one with the same
inductor options and a table that leaves out the entries of the operators named in ``--without``. They
train alternately for ``--rounds`` rounds of ``--updates`` updates, each side first in turn: the median of
the per-round ratios and the rounds the package's side was faster. One process, because this VM's speed
moves between processes by more than a change of this size.

    python benchmarks/table_entries.py --threads 2 --length 64 \\
        --without sb3_amago.leaky_relu.default sb3_amago.linear_leaky_relu.default --name table_entries_rectifier_twins_L64

Results: ``benchmarks/results/table_entries_L{length}.json`` / ``.md`` (``--name`` changes it).
"""

from collections.abc import Sequence
from typing import Any

import torch as th
from bench_updates import against_the_package, alternation_parser
from common import RESULTS_DIR, print_and_write

from sb3_amago.compiled_update import PACKAGE_DECOMPOSITIONS, CpuInductor, cpu_compiled, inductor_options
from sb3_amago.loss import update_forward


def inside_updates(length: int, rounds: int, updates: int, without: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-round update times of the package's compiled update and of one compiled without the package's
    entries for the operators named in ``without``, alternated (the other side's figures name them)."""
    unknown = set(without) - {str(op) for op in PACKAGE_DECOMPOSITIONS}
    if unknown or not without:
        raise ValueError(
            f"--without takes operators of the package's table, {sorted(str(op) for op in PACKAGE_DECOMPOSITIONS)}; "
            f"got {sorted(unknown) or 'none'}"
        )
    backend = CpuInductor(inductor_options(th.device("cpu")), without=without)
    figures = against_the_package(length, rounds, updates, lambda: cpu_compiled(update_forward, backend))
    figures["update_ms_other"]["without"] = list(without)
    return figures


def main() -> None:
    parser = alternation_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--without", nargs="+", required=True, help="operators whose package entries the other side leaves out"
    )
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    figures = inside_updates(args.length, args.rounds, args.updates, args.without)
    config = {"length": args.length, "rounds": args.rounds, "updates_per_round": args.updates, "without": args.without}
    print_and_write(args.name or f"table_entries_L{args.length}", config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
