"""Load one checkpoint in this (fresh) process with the tree at ROOT; print the time.

    .venv/bin/python results/checkpoint_load_s10/load2.py ROOT CHECKPOINT_FILE

Used for loads.txt: ROOT alternated between a worktree of 3331283 (before deferred
indexes) and the main tree, one fresh process per load.
"""

import resource
import sys
import time
from pathlib import Path

root = sys.argv[1]
sys.path.insert(0, root)

import tpcc.schema  # noqa: E402, F401  (registers the TPC-C tables)
from executor.core import checkpoint  # noqa: E402
from txn_library import native  # noqa: E402

assert checkpoint.__file__.startswith(root), checkpoint.__file__
path = Path(sys.argv[2])
checkpoint.read_info(path)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
info, storage = checkpoint.load(path)
t1 = time.perf_counter()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(
    f"{root} {native.describe()[:8]} load {t1 - t0:.3f}s "
    f"user {r1.ru_utime - r0.ru_utime:.3f} sys {r1.ru_stime - r0.ru_stime:.3f} "
    f"rows {storage.row_count()}"
)
