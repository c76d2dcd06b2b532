"""Child processes: start them in their own session, stop them for sure, and let
none outlive this process (its lifeline: cluster.ownership).

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

from cluster.ownership import LIFELINE_ENV, lifeline_fd

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


class SpareCores:
    """Whether this host has cores to spare: the share of all its CPUs' time spent idle
    (idle + iowait in Linux's ``/proc/stat``), over windows of ``every_s``.

    A partition spends CPU for latency while there are (results go out mid-batch,
    batches run ahead of peers' reads) and saves it while there are not (results wait
    for the batch's end, batches wait for peers: executor.deterministic.delivery).
    ``spare`` turns on when a window's idle share reaches ``SPARE_ON`` and off when one
    falls below ``SPARE_OFF``: spending CPU lowers the idle share it reacts to, and
    the gap keeps it from flipping itself off. Measured 2026-11-26 on 2 cores, TPC-C
    New Order, 200 terminals: 1 replica x 2 partitions 22-24% idle, 12-13% while
    spending; 2 replicas x 2 partitions 1-3% either way. Host-wide, so every partition
    of a host decides alike.

    Only a window in which the caller did work (``work``, a count it keeps, grew)
    decides, and turning on takes ``SPARE_WINDOWS`` such windows in a row: an idle host
    says nothing about the load to come, and the first second of a load still looks
    idle. Spending CPU in that second at 2 replicas x 2 partitions put one replica
    behind its twin for the rest of the run (its partitions' holds ran out every
    second) in 2 of 5 runs. So ``spare`` starts False (save). True where the file
    cannot be read (another platform): a partition then behaves as on an idle host.
    """

    SPARE_ON = 0.08
    SPARE_OFF = 0.04
    SPARE_WINDOWS = 2

    def __init__(self, every_s: float = 1.0, path: str = "/proc/stat") -> None:
        self.every_s = every_s
        self.path = path
        self.spare = False
        self.idle: float | None = None  # the last loaded window's idle share
        self._idle_windows = 0  # loaded windows in a row at or above SPARE_ON
        self._start: tuple[float, int, int, int] | None = None  # (now, idle, all, work)

    def _ticks(self) -> tuple[int, int] | None:
        """(idle, all) clock ticks of every CPU since boot."""
        try:
            with open(self.path, "rb") as f:
                fields = f.readline().split()
            # cpu user nice system idle iowait irq softirq steal (guest: within user)
            ticks = [int(x) for x in fields[1:9]]
        except (OSError, ValueError):
            return None
        if fields[:1] != [b"cpu"] or len(ticks) < 5:
            return None
        return ticks[3] + ticks[4], sum(ticks)

    def update(self, now: float, work: int) -> bool:
        """Close the window if ``every_s`` has passed (``now``: time.monotonic(),
        ``work``: the caller's monotonic count of work done, e.g. transactions
        applied); returns ``spare``."""
        start = self._start
        if start is not None and now - start[0] < self.every_s:
            return self.spare
        ticks = self._ticks()
        if ticks is None:
            self._start = None
            self.spare = True
            return True
        if start is not None and ticks[1] > start[2] and work > start[3]:
            self.idle = (ticks[0] - start[1]) / (ticks[1] - start[2])
            self._idle_windows = self._idle_windows + 1 if self.idle >= self.SPARE_ON else 0
            if self._idle_windows >= self.SPARE_WINDOWS:
                self.spare = True
            elif self.idle < self.SPARE_OFF:
                self.spare = False
        self._start = (now, *ticks, work)
        return self.spare


def spawn_python(args: list[str], log_path: Path, module: str = "cluster.cli") -> subprocess.Popen:
    """Start ``python -m module args...`` in its own session, output appended to a log,
    holding this process's lifeline (cluster.ownership): it stops when this one exits."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    lifeline = lifeline_fd()
    env[LIFELINE_ENV] = str(lifeline)
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            pass_fds=(lifeline,),
        )


def last_line(log_path: Path, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a child's log (what it said before it exited), or ""."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


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
