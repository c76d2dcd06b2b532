#!/usr/bin/env bash
# The test command: set up the venv if needed, then run the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k lock).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
