#!/usr/bin/env bash
# The checks that need a CUDA GPU, which CI has not: the GPU update rates (bench_updates.py
# --device cuda, written to benchmarks/results/updates_cuda.* and copied beside the logs), then the
# test suite with every model on the GPU (SB3's device="auto" picks it). Logs go to OUT_DIR (default
# gpu_check/); arguments after it go to pytest (e.g. `-n 12` with pytest-xdist installed). Timings
# first, while the GPU is idle.
#
#     bash scripts/gpu_check.sh gpu_check -n 12
set -uo pipefail
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.."
out="${1:-gpu_check}"
shift || true
mkdir -p "$out"
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: run this on a machine with a GPU')" || exit 1
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" | tee "$out/device.txt"
(cd benchmarks && "$PY" bench_updates.py --device cuda) 2>&1 | tee "$out/bench.log"
bench=$?
cp benchmarks/results/updates_cuda.* "$out/" 2>/dev/null
# -v: each test's outcome is in the log as it finishes, also when a time limit stops the run.
"$PY" -m pytest tests -v -rf -p no:cacheprovider "$@" > "$out/pytest.log" 2>&1
tests=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.log" | tail -n 40
echo "bench_updates exit $bench, pytest exit $tests; logs in $out/"
[ "$bench" -eq 0 ] && [ "$tests" -eq 0 ]
