#!/usr/bin/env bash
# The project's checks, as CI runs them: lint and format (ruff, at the line length in
# pyproject.toml), types (mypy on the package), then the tests (arguments go to pytest).
set -euo pipefail
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.."
"$PY" -m ruff check .
"$PY" -m ruff format --check .
"$PY" -m mypy
"$PY" -m pytest "$@"
