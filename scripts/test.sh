#!/usr/bin/env bash
# The test command: set up the venv if needed, then run the whole suite (the hot modules
# compiled), then the unit tests on the pure-Python modules.
# Extra arguments go to the first pytest run (e.g. scripts/test.sh -k lock).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/python -m pytest "$@"
# The hot modules run compiled above (txn_library/native.py); the unit tests again on
# their pure-Python fallback (ORDO_PURE_PASS=0 skips this pass).
if [ "${ORDO_PURE_PASS:-1}" != 0 ]; then
  echo "test: the unit tests again with ORDO_PURE=1 (the hot modules from source)"
  ORDO_PURE=1 .venv/bin/python -m pytest -q -m "not spark" tests/unit \
    --deselect tests/unit/test_native.py::test_compiled_and_pure_engines_compute_the_same_histories
fi
