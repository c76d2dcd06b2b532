"""Process checks shared by tests that start, kill and wait for real processes (not a
test module itself)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie its parent has not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def gone_within(pid: int, within_s: float) -> bool:
    """Whether the process is gone within ``within_s`` seconds (polled)."""
    deadline = time.monotonic() + within_s
    while not gone(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children now."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]
