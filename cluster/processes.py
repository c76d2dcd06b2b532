"""Child processes: start them in their own session, stop them for sure.

Shared by the launcher (Ordo's roles) and cluster.zookeeper (ZooKeeper servers).
Invariant: a process handed to ``stop_processes`` is gone when it returns (SIGTERM,
then SIGKILL after ``STOP_GRACE_S``), and ``kill_process`` reaps what it kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STOP_GRACE_S = 5.0


def batch_scheduling() -> bool:
    """Put this process (and the threads it starts from now on, such as zmq's I/O
    thread) under SCHED_BATCH, for a CPU-bound server that must be started before any
    socket: the kernel then does not preempt a running thread to run the one it just
    woke. A partition wakes its own zmq I/O thread on every send; under the default
    policy that thread preempted the sender, and with more processes than cores py-spy
    found a partition's main thread runnable but off the CPU inside ``Socket.send`` for
    14% of its samples (2 replicas x 2 partitions, 2 cores), 5% under SCHED_BATCH. No
    privilege is needed. False where the platform has no SCHED_BATCH (nothing
    changes)."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


class CoreContention:
    """Whether the calling thread waits for a core: the share of wall time it spent
    runnable but not running, from Linux's ``/proc/thread-self/schedstat`` (its second
    field: nanoseconds waited on a run queue), over windows of ``every_s``.

    ``contended`` turns on when a window's share reaches ``CONTENDED_ON`` and off when
    one falls below ``CONTENDED_OFF``. The gap keeps it from flipping when acting on it
    lowers the wait (a partition that holds batches for its peers; measured 2026-11-26
    on 2 cores, TPC-C New Order, windows of 1 s: 2 replicas x 2 partitions waited 20-35%
    of the time, 13-21% while holding; 1 replica x 2 partitions 7-9% either way). False
    where the file cannot be read (another platform): nothing changes.
    """

    CONTENDED_ON = 0.18
    CONTENDED_OFF = 0.10

    def __init__(self, every_s: float = 1.0, path: str = "/proc/thread-self/schedstat") -> None:
        self.every_s = every_s
        self.path = path
        self.contended = False
        self.share: float | None = None  # the last window's, None before one ends
        self._start: tuple[float, int] | None = None

    def _waited_ns(self) -> int | None:
        try:
            with open(self.path, "rb") as f:
                return int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            return None

    def update(self, now: float) -> bool:
        """Close the window if ``every_s`` has passed (``now``: time.monotonic());
        returns ``contended``."""
        start = self._start
        if start is not None and now - start[0] < self.every_s:
            return self.contended
        waited = self._waited_ns()
        if waited is None:
            self._start = None
            self.contended = False
            return False
        if start is not None:
            self.share = (waited - start[1]) / 1e9 / (now - start[0])
            if self.share >= self.CONTENDED_ON:
                self.contended = True
            elif self.share < self.CONTENDED_OFF:
                self.contended = False
        self._start = (now, waited)
        return self.contended


def spawn_python(args: list[str], log_path: Path, module: str = "cluster.cli") -> subprocess.Popen:
    """Start ``python -m module args...`` in its own session, output appended to a log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )


KILL_WAIT_S = 10.0


def kill_process(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` (kill -9 by default) and reap the process."""
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        pass
    p.wait(timeout=KILL_WAIT_S)


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every live process, then SIGKILL whatever is left after STOP_GRACE_S."""
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_process(p)
