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
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.config import ClusterConfig
from cluster.metrics import Endpoint, LauncherMetrics, serve
from cluster.processes import kill_process, last_line, spawn_python, stop_processes
from txn_library import limits
from txn_library.client import Client
from txn_library.errors import CallTimeout


class ChildExited(RuntimeError):
    """A process of the cluster exited while it should be running."""


class ProcessGroup(ABC):
    """Child processes tracked by name and PID, always stopped (SIGTERM, then SIGKILL)."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen] = {}
        self.log_files: dict[str, Path] = {}
        self.restart_counts: Counter[str] = Counter()  # by the supervisor, per child
        self._metrics: Endpoint | None = None

    def serve_metrics(self) -> None:
        """Serve the children's states (cluster.metrics.LauncherMetrics) at the
        launcher's metrics address, while the group runs."""
        if self._metrics is None:
            self._metrics = serve(LauncherMetrics(self), *self.config.launcher_metrics_addr)

    @property
    def logs_dir(self) -> Path:
        return Path(self.config.data_dir) / "logs"

    def spawn(self, name: str, args: list[str], log_name: str, module: str = "cluster.cli") -> None:
        self.log_files[name] = self.logs_dir / log_name
        self.procs[name] = spawn_python(args, self.log_files[name], module)

    def check_alive(self) -> None:
        """Raise ChildExited if a child has exited, with the last line it logged."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                path = self.log_files.get(name, self.logs_dir)
                said = last_line(path) if path.is_file() else ""
                raise ChildExited(
                    f"{name} exited with {p.returncode}"
                    + (f": {said}" if said else "")
                    + f" (see {path})"
                )

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
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

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
    """Sequencers, R x P partition processes and (replicated) a ZooKeeper ensemble, all
    on this machine (the hosts of cluster.json are its loopback addresses)."""

    def __init__(self, config: ClusterConfig) -> None:
        super().__init__(config)
        self.ensemble: Any = None  # cluster.zookeeper.Ensemble when replicated

    def start(self, wait_s: float = 60.0, replicas: list[int] | None = None) -> LocalCluster:
        """Start ZooKeeper (if replicated), every sequencer and the partitions of
        ``replicas`` (default: all)."""
        self.config.save()
        self.serve_metrics()
        if self.config.curve:
            from cluster.security import ADMIN_CLIENT, create_keys, role_names

            create_keys(self.config.data_dir, role_names(self.config), [ADMIN_CLIENT])
        if self.config.replicated:
            self.start_zookeeper()
        for m in range(self.config.sequencers):
            self.start_sequencer(m)
        started = range(self.config.replicas) if replicas is None else replicas
        for r in started:
            for p in range(self.config.partitions):
                self.start_partition(r, p)
        for i in range(self.config.readers):
            self.start_reader(i)
        self.wait_ready(wait_s, want=len(started) * self.config.partitions)
        return self

    def run_foreground(self, should_stop: Callable[[], bool], poll_s: float = 0.2) -> None:
        """Block until ``should_stop()``. The embedded default fails when a child dies.
        A replicated cluster is built to survive that, so ``ordo up --ha`` supervises
        instead: a sequencer, partition or ZooKeeper server that exits is reported and
        started again (a sequencer rejoins as a follower, a partition recovers from its
        checkpoint and the log), at most ``limits.supervisor_restarts_max`` times per
        process within ``limits.supervisor_window_s``; past that, it fails as before."""
        if not self.config.replicated:
            super().run_foreground(should_stop, poll_s)
            return
        restarts: dict[str, list[float]] = {}
        while not should_stop():
            now = time.monotonic()
            dead = [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]
            if self.ensemble is not None:
                dead += [
                    (f"zookeeper-{n}", p.returncode)
                    for n, p in self.ensemble.procs.items()
                    if p.poll() is not None
                ]
            for name, code in dead:
                recent = [t for t in restarts.get(name, []) if now - t < limits.supervisor_window_s]
                if len(recent) >= limits.supervisor_restarts_max:
                    raise RuntimeError(
                        f"{name} exited with {code} {len(recent)} times in "
                        f"{limits.supervisor_window_s:.0f} s; see {self.logs_dir}"
                    )
                restarts[name] = [*recent, now]
                self.restart_counts[name] += 1
                print(f"ordo up: {name} exited with {code}; starting it again", flush=True)
                self._restart(name)
            time.sleep(poll_s)

    def _restart(self, name: str) -> None:
        if name.startswith("zookeeper-"):
            self.ensemble.start_server(int(name.split("-")[1]))
        elif name.startswith("reader-"):
            self.procs.pop(name)
            self.start_reader(int(name.split("-")[1]))
        elif name.startswith("sequencer"):
            self.procs.pop(name)
            self.start_sequencer(int(name.split("-")[1]) if "-" in name else 0)
        else:  # rRpP
            self.procs.pop(name)
            r, p = name[1:].split("p")
            self.start_partition(int(r), int(p))

    def start_zookeeper(self) -> None:
        from cluster.ordering_zk import ensemble_of, ensure_secret

        ensure_secret(self.config)
        self.ensemble = ensemble_of(self.config)
        self.ensemble.start()
        self.ensemble.wait_ready()

    @staticmethod
    def sequencer_name(config: ClusterConfig, member: int) -> str:
        return "sequencer" if config.sequencers == 1 else f"sequencer-{member}"

    def start_sequencer(self, member: int = 0) -> None:
        name = self.sequencer_name(self.config, member)
        args = ["sequencer", "--data-dir", self.config.data_dir]
        if self.config.sequencers > 1:
            args += ["--member", str(member)]
        self.spawn(name, args, f"{name}.log")

    def stop(self) -> None:
        super().stop()
        if self.ensemble is not None:
            self.ensemble.stop()

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

    def start_reader(self, i: int, from_genesis: bool = False) -> None:
        """Reader ``i`` (executor/reader/): it loads the newest checkpoint of a replica
        here (else, or ``from_genesis``, the genesis), replays the log from there, then
        follows it and answers queries."""
        flags = ["--from-genesis"] if from_genesis else []
        self.spawn(
            f"reader-{i}",
            ["reader", str(i), "--data-dir", self.config.data_dir, *flags],
            f"reader-{i}.log",
        )

    def wait_ready(self, wait_s: float = 60.0, want: int | None = None) -> dict:
        """Wait until ``want`` partitions (default all) report to the (leading)
        sequencer; returns its status."""
        deadline = time.monotonic() + wait_s
        if want is None:
            want = self.config.replicas * self.config.partitions
        last_err: Exception | str | None = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                st = leader_status(self.config, timeout_s=2)
                if st is None:
                    last_err = "no sequencer leads yet"
                elif len(st["partitions"]) >= want:
                    return st
            except Exception as e:  # not up yet
                last_err = e
            time.sleep(0.1)
        raise TimeoutError(
            f"cluster not ready after {wait_s}s ({last_err}); see logs in {self.logs_dir}"
        )


def cluster_client(
    config: ClusterConfig, address: str | list[str] | None = None, **kw: Any
) -> Client:
    """A Client of ``config``'s cluster: every sequencer's address by default (it fails
    over between them), every partition's query address and every reader's
    (``Client.query``: snapshot and read-committed queries go to the readers when the
    cluster has some), with the ``admin`` client's CURVE keys when the cluster runs
    CURVE (``ordo keys`` makes them)."""
    addresses = config.client_addrs if address is None else address
    kw.setdefault("query_addresses", config.query_addrs())
    kw.setdefault("reader_addresses", config.reader_addrs)
    if config.curve:
        from cluster.security import ADMIN_CLIENT, client_curves, partition_role, reader_role
        from cluster.security.keys import load_role_public

        curves = dict(zip(config.client_addrs, client_curves(config, ADMIN_CLIENT), strict=True))
        wanted = [addresses] if isinstance(addresses, str) else addresses
        kw["curve"] = [curves[a] for a in wanted]
        one = next(iter(curves.values()))
        query_curves = {
            config.query_addr(r, p): one.to_server(
                load_role_public(config.data_dir, partition_role(r, p))
            )
            for r in range(config.replicas)
            for p in range(config.partitions)
        }
        for i in range(config.readers):
            query_curves[config.reader_addr(i)] = one.to_server(
                load_role_public(config.data_dir, reader_role(i))
            )
        kw.setdefault("query_curves", query_curves)
    return Client(addresses, **kw)


def sequencer_statuses(config: ClusterConfig, timeout_s: float = 2.0) -> list[dict | None]:
    """Every sequencer's own status report (None: no answer within ``timeout_s``)."""
    out: list[dict | None] = []
    for addr in config.client_addrs:
        with cluster_client(config, addr, timeout_s=timeout_s) as c:
            try:
                out.append(c.status(timeout_s=timeout_s))
            except CallTimeout:
                out.append(None)
    return out


def leader_status(config: ClusterConfig, timeout_s: float = 2.0) -> dict | None:
    """The status of the sequencer that leads (the only one of the embedded default),
    or None while none does."""
    if config.sequencers == 1:
        with cluster_client(config, config.client_addr, timeout_s=timeout_s) as c:
            return c.status(timeout_s=timeout_s)
    leaders = [
        st
        for st in sequencer_statuses(config, timeout_s)
        if st is not None and st.get("role") == "leader"
    ]
    return max(leaders, key=lambda st: st["term"]) if leaders else None


def reader_report(
    config: ClusterConfig, reader: int, epochs: tuple = (), timeout_s: float = 2.0
) -> dict | None:
    """Reader ``reader``'s status (txn_library.wire.reader; ``hashes`` of ``epochs``),
    asked on its socket directly; None if it does not answer within ``timeout_s``."""
    import zmq

    from txn_library.client.connection import connect_dealer
    from txn_library.wire import reader as reader_wire
    from txn_library.wire.sequencer import unpack

    curve = None
    if config.curve:
        from cluster.security import ADMIN_CLIENT, reader_role
        from cluster.security.sockets import client_curve

        curve = client_curve(config.data_dir, ADMIN_CLIENT, reader_role(reader))
    sock = connect_dealer(zmq.Context.instance(), config.reader_addr(reader), curve)
    try:
        sock.send(reader_wire.encode(reader_wire.ReaderStatusRequest(tuple(epochs))))
        if not sock.poll(int(timeout_s * 1000)):
            return None
        msg = unpack(sock.recv())
        if isinstance(msg, tuple) and len(msg) == 2 and msg[0] == reader_wire.REP_READER_STATUS:
            return dict(msg[1])
        return None
    finally:
        sock.close(linger=0)


def reader_reports(config: ClusterConfig, timeout_s: float = 2.0) -> list[dict | None]:
    """Every reader's status (None: no answer)."""
    return [reader_report(config, i, timeout_s=timeout_s) for i in range(config.readers)]


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


PORT_WINDOW_ENV = "ORDO_PORT_WINDOW"


def port_window() -> tuple[int, int]:
    """Where ``free_base_port`` picks ports: [low, high), below the kernel's ephemeral
    range; ``ORDO_PORT_WINDOW=LOW-HIGH`` narrows it. Processes that pick ranges at the
    same time (the test suite's workers: tests/conftest.py gives each its own window)
    can then never pick the same ports: a range is free when picked but is bound only
    when the cluster's processes start, seconds later."""
    low, high = PORTS_LOWEST, _ports_below_ephemeral()
    spec = os.environ.get(PORT_WINDOW_ENV)
    if spec:
        try:
            lo, hi = (int(x) for x in spec.split("-"))
        except ValueError:
            raise ValueError(f"{PORT_WINDOW_ENV}={spec!r}: expected LOW-HIGH") from None
        low, high = max(low, lo), min(high, hi)
    return low, high


def free_base_port(span: int = 64) -> int:
    """A base port such that [base, base+span) is currently free on 127.0.0.1, inside
    ``port_window()`` (below the kernel's ephemeral port range)."""
    rng = random.Random()
    low, high = port_window()
    top = high - span
    if top <= low:
        raise RuntimeError(f"no room for {span} ports in the port window [{low}, {high})")
    for _ in range(200):
        base = rng.randrange(low, top)
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
