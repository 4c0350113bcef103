#!/usr/bin/env bash
# The project's checks, as CI runs them: lint and format (ruff, at the line length in
# pyproject.toml), types (mypy on the package), then the tests (arguments go to pytest), spread
# over one pytest-xdist worker per logical CPU (PYTEST_WORKERS sets another count; 0 runs them in
# this process). Each test runs one torch thread, and a cold compile of an update is mostly
# single-threaded code generation and g++, so two workers on CI's 2 cores take the suite from about
# 18.5 to 8.2 min with empty compile caches (Intel Xeon, 2 vCPUs).
set -euo pipefail
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.."
"$PY" -m ruff check .
"$PY" -m ruff format --check .
"$PY" -m mypy
"$PY" -m pytest -n "${PYTEST_WORKERS:-logical}" "$@"
