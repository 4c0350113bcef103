#!/usr/bin/env bash
# Install sb3-amago with every extra into the current Python (or $PYTHON).
# Where no torch is importable, take the CPU build torch==2.13.0 first (cheap); a torch that
# is already installed is kept as it is, whatever its version or build.
set -euo pipefail
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.."
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
"$PY" -m pip install -q -e ".[all]"
