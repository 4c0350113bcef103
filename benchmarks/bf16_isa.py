"""What bf16 autocast costs on CPUs without bf16 matrix instructions, measured on one that has them.

The reference update (``bench_updates.updates_per_second``: batch 8, d_model 128, 3 layers, L = 64)
runs in fresh processes: in fp32, and under bf16 autocast with oneDNN, which runs torch's bf16
matrix products on the CPU, free to use every instruction set, held to AVX-512 without BF16 (as on
a Skylake or Cascade Lake Xeon) and held to AVX2 (as on most AMD Zen 2/3 and older Intel cores)
through ``ONEDNN_MAX_CPU_ISA``. The settings alternate, ``--rounds`` times; the medians and each
setting's ratio to fp32 are reported. Run it on a CPU with AMX or AVX-512 BF16 (elsewhere the cap
changes nothing). This is why ``AMAGO`` warns when ``mixed_precision`` meets a CPU without them.

    python benchmarks/bf16_isa.py --threads 2 --rounds 3

Results: ``benchmarks/results/bf16_isa.json`` / ``.md``.
"""

import argparse

from common import RESULTS_DIR, write_results
from compare_commits import measure_rounds

#: Setting -> (precision, oneDNN's instruction-set cap; ALL: none).
SETTINGS = {
    "fp32": ("fp32", "ALL"),
    "bf16_native": ("bf16", "ALL"),
    "bf16_avx512_without_bf16": ("bf16", "AVX512_CORE"),
    "bf16_avx2": ("bf16", "AVX2"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--updates", type=int, default=10, help="timed updates per measurement")
    args = parser.parse_args()
    settings = {
        name: {"precision": precision, "extra_env": {"ONEDNN_MAX_CPU_ISA": isa}} for name, (precision, isa) in SETTINGS.items()
    }
    result = measure_rounds(settings, args.threads, args.length, args.updates, args.rounds)
    figures = {
        f"updates_per_s_{name}": {
            "value": result.median(name),
            "unit": "updates/s (median)",
            "ratio_to_fp32": result.median(name) / result.median("fp32"),
            "runs": [round(v, 3) for v in result.runs[name]],
        }
        for name in SETTINGS
    }
    figures["load_average"] = {
        "value": max(result.loads),
        "unit": "highest 1-minute load average",
        "range": result.load_range,
    }
    config = {"length": args.length, "batch_size": 8, "threads": args.threads, "rounds": args.rounds, "updates": args.updates}
    write_results("bf16_isa", config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
