#!/usr/bin/env bash
# The test command: set up the venv if needed, then run the whole suite (the hot modules
# compiled), then the hot modules' unit tests on their pure-Python fallback.
# Extra arguments go to the first pytest run (e.g. scripts/test.sh -k lock).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step says how long it took (CI has a 15-minute budget).
step() { echo "test: $1 took $((SECONDS - mark)) s"; mark=$SECONDS; }
mark=$SECONDS
scripts/setup.sh
step "set-up"
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
step "ruff, mypy and lint-imports"
# Two workers (pytest-xdist): most tests wait on processes, sockets or disks, so two
# share this machine's cores well (--dist loadfile: a file's tests, which may share a
# module fixture, run on one worker). Files are handed out in the order tests/conftest.py
# sorts them (kind by kind, slow kinds first; most tests first within a kind), so the
# run ends with short files: xdist's own order (most tests first over every kind) left
# the single-test integration files, the slowest, for one worker to finish alone.
# ORDO_TEST_WORKERS=0: in this process, in turn.
workers=(-n "${ORDO_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
if [ "${ORDO_TEST_WORKERS:-2}" = 0 ]; then workers=(-p no:xdist); fi
.venv/bin/python -m pytest "${workers[@]}" --durations=25 "$@"
step "the suite"
# The hot modules run compiled above (txn_library/native.py); the unit tests of those
# modules again on their pure-Python fallback (ORDO_PURE_PASS=0 skips this pass).
if [ "${ORDO_PURE_PASS:-1}" != 0 ]; then
  echo "test: the hot modules' unit tests again with ORDO_PURE=1 (from source)"
  u=tests/unit
  ORDO_PURE=1 .venv/bin/python -m pytest -q "${workers[@]}" "$u/test_engine.py" "$u/test_poison_pill.py" \
    "$u/test_storage_apply.py" "$u/test_row_encoding.py" "$u/test_lock_manager.py" \
    "$u/test_ordered_index.py" "$u/test_placement.py" "$u/test_checkpoint.py" \
    "$u/test_bench_procedures.py" "$u/test_native.py" "$u/test_queries.py" \
    "$u/test_reader.py" "$u/test_read_your_writes.py" "$u/test_reader_sinks.py" \
    "$u/test_stream_runs.py" \
    --deselect "$u/test_native.py::test_compiled_and_pure_engines_compute_the_same_histories"
  step "the pure pass"
fi
