"""Start and stop a local cluster (sequencer + replicas' partitions) as OS processes.

Used by ``ordo up`` and by the integration tests. Every child is tracked by PID and
stopped on exit (SIGTERM, then SIGKILL after a grace period), even when the caller
fails, so no test leaves processes behind.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from cluster.config import ClusterConfig
from txn_library.client import Client

STOP_GRACE_S = 5.0


def _spawn(args: list[str], log_path: Path, module: str = "cluster.cli") -> subprocess.Popen:
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


class ProcessGroup(ABC):
    """Child processes tracked by name and PID, always stopped (SIGTERM, then SIGKILL)."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def logs_dir(self) -> Path:
        return Path(self.config.data_dir) / "logs"

    def spawn(self, name: str, args: list[str], log_name: str, module: str = "cluster.cli") -> None:
        self.procs[name] = _spawn(args, self.logs_dir / log_name, module)

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}; see {self.logs_dir}")

    def wait_exit(self, name: str, timeout_s: float) -> int:
        """Wait for a process expected to exit (an injected crash); forget it."""
        code = self.procs[name].wait(timeout=timeout_s)
        del self.procs[name]
        return code

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        kill_process(self.procs.pop(name), sig)

    def stop(self) -> None:
        stop_processes(list(self.procs.values()))
        self.procs.clear()

    @abstractmethod
    def start(self, wait_s: float = 60.0) -> ProcessGroup:
        """Start every process and wait until the cluster answers."""

    def __enter__(self):  # type: ignore[no-untyped-def]
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_foreground(self, should_stop: Callable[[], bool], poll_s: float = 0.2) -> None:
        """Block until ``should_stop()`` (e.g. after Ctrl-C), failing if a child dies."""
        while not should_stop():
            self.check_alive()
            time.sleep(poll_s)


class LocalCluster(ProcessGroup):
    """A sequencer and R x P partition processes on 127.0.0.1."""

    def start(self, wait_s: float = 60.0, replicas: list[int] | None = None) -> LocalCluster:
        """Start the sequencer and the partitions of ``replicas`` (default: all)."""
        self.config.save()
        self.start_sequencer()
        started = range(self.config.replicas) if replicas is None else replicas
        for r in started:
            for p in range(self.config.partitions):
                self.start_partition(r, p)
        self.wait_ready(wait_s, want=len(started) * self.config.partitions)
        return self

    def start_sequencer(self) -> None:
        self.spawn("sequencer", ["sequencer", "--data-dir", self.config.data_dir], "sequencer.log")

    def start_partition(self, r: int, p: int) -> None:
        self.spawn(
            f"r{r}p{p}",
            [
                "replica",
                "--data-dir",
                self.config.data_dir,
                "--replica",
                str(r),
                "--partition",
                str(p),
            ],
            f"replica-{r}-partition-{p}.log",
        )

    def wait_ready(self, wait_s: float = 60.0, want: int | None = None) -> dict:
        """Wait until ``want`` partitions (default all) report to the sequencer."""
        deadline = time.monotonic() + wait_s
        if want is None:
            want = self.config.replicas * self.config.partitions
        last_err: Exception | None = None
        with Client(self.config.client_addr, timeout_s=5) as c:
            while time.monotonic() < deadline:
                self.check_alive()
                try:
                    st = c.status(timeout_s=2)
                    if len(st["partitions"]) >= want:
                        return st
                except Exception as e:  # not up yet
                    last_err = e
                time.sleep(0.1)
        raise TimeoutError(
            f"cluster not ready after {wait_s}s ({last_err}); see logs in {self.logs_dir}"
        )


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORTS_LOWEST = 10_000


def _ports_below_ephemeral() -> int:
    """The first port the kernel may hand out as a connection's source port.

    A range picked inside the ephemeral range can be taken between the check and the
    bind by any outgoing connection (the cluster's own processes connect to each other
    while others still bind), so ranges are picked below it.
    """
    try:
        low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    return low


def free_base_port(span: int = 64) -> int:
    """A base port such that [base, base+span) is currently free on 127.0.0.1, below the
    kernel's ephemeral port range."""
    rng = random.Random()
    top = _ports_below_ephemeral() - span
    if top <= PORTS_LOWEST:
        raise RuntimeError(f"no room for {span} ports below the ephemeral port range")
    for _ in range(200):
        base = rng.randrange(PORTS_LOWEST, top)
        socks = []
        try:
            for port in range(base, base + span):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def is_quiescent(
    status: dict, partitions_status: list[dict], replicas: int, partitions: int
) -> bool:
    """Every partition of every replica reported, applied the last epoch, is idle, up
    and live, and nothing waits at the sequencer (``status`` from ``ordo status``)."""
    return (
        status["pending"] == 0
        and len(partitions_status) == replicas * partitions
        and all(
            p["last_epoch"] == status["epoch"]
            and p["active"] == 0
            and not p["down"]
            and not p["catching_up"]
            for p in partitions_status
        )
    )


def wait_quiescent(client: Client, replicas: int, partitions: int, timeout_s: float = 60.0) -> dict:
    """Wait until every partition of every replica applied the last epoch and is idle."""
    deadline = time.monotonic() + timeout_s
    st: dict = {}
    while time.monotonic() < deadline:
        st = client.status()
        parts = st["partitions"]
        if is_quiescent(st, parts, replicas, partitions):
            time.sleep(0.3)  # one more status round so hashes are the final ones
            st2 = client.status()
            if [p["state_hash"] for p in st2["partitions"]] == [p["state_hash"] for p in parts]:
                return st2
        time.sleep(0.1)
    raise TimeoutError(f"cluster did not quiesce: {st}")


def partition_status(client: Client, replica: int, partition: int) -> dict | None:
    for p in client.status()["partitions"]:
        if p["replica"] == replica and p["partition"] == partition:
            return p
    return None


def wait_live_again(
    client: Client, replica: int, partition: int, old_pid: int, epoch: int, timeout_s: float = 120.0
) -> dict:
    """Wait until a restarted partition (a pid other than ``old_pid``) has caught up to
    ``epoch`` and is live. Returns its status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        p = partition_status(client, replica, partition)
        if (
            p is not None
            and p["pid"] != old_pid
            and not p["catching_up"]
            and p["last_epoch"] >= epoch
            and p["active"] == 0
        ):
            return p
        time.sleep(0.02)
    raise TimeoutError(f"r{replica}p{partition} not live again within {timeout_s}s")


def stop_requested_on_signals() -> Callable[[], bool]:
    """Install SIGINT/SIGTERM handlers; the returned callable says whether one arrived."""
    flag = threading.Event()

    def on_signal(*_: object) -> None:
        flag.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return flag.is_set
