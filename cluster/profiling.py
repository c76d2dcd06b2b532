"""Opt-in profiling of an Ordo process (a flag for the process, never a side effect of
importing a workload).

With ORDO_PROFILE_DIR set, ``ordo sequencer`` and ``ordo replica -p N`` (hence every
process ``ordo up`` and ``ordo tpcc run`` start) profile themselves with cProfile
from start-up on and write ``<dir>/<role>-<pid>.prof`` at exit (a partition exits
normally on SIGTERM). Read it with ``python -m pstats``; start-up (genesis, checkpoint
load) shows as its own subtree. ORDO_PROFILE_CLOCK=cpu counts CPU time only (slower,
but honest on a busy machine where wall time includes time spent descheduled).
"""

from __future__ import annotations

import atexit
import cProfile
import os
import time
from pathlib import Path

PROFILE_ENV = "ORDO_PROFILE_DIR"
PROFILE_CLOCK_ENV = "ORDO_PROFILE_CLOCK"


def maybe_profile(role: str) -> None:
    """Profile this process from now on if ORDO_PROFILE_DIR is set (see module doc)."""
    out_dir = os.environ.get(PROFILE_ENV)
    if not out_dir:
        return
    cpu = os.environ.get(PROFILE_CLOCK_ENV) == "cpu"
    profiler = cProfile.Profile(time.process_time) if cpu else cProfile.Profile()
    path = Path(out_dir) / f"{role}-{os.getpid()}.prof"
    path.parent.mkdir(parents=True, exist_ok=True)

    def dump() -> None:
        profiler.disable()
        profiler.dump_stats(str(path))

    atexit.register(dump)
    profiler.enable()
