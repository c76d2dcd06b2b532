"""A local ZooKeeper ensemble (Debian's ``zookeeper`` package) as child processes.

The foundation of the replicated ordering layer: a leader sequencer will be elected
through ZooKeeper and commit each batch there (a multi-op guarded by its term node's
version) before publishing it. This module only runs the ensemble: it writes each
server's configuration, starts, kills and restarts servers, and says when a quorum
serves.

Invariants:
- Server ``n`` (1-based) owns ``data_dir/zk<n>/`` (zoo.cfg, data with its ``myid``,
  its log files) and three consecutive ports from ``base_port + 3 * (n - 1)``: client,
  peer and election; every port is bound to its address only: ``host`` for all (one
  machine), or ``hosts[n - 1]`` (one server per host, e.g. cluster.netns hosts).
- Processes are started through ``spawn`` (default: a child process that the kernel
  kills when this process dies, ``_spawn_here``; with cluster.netns, ``Hosts.run`` on
  the server's host) and every TCP connection to a
  server (four-letter words, the readiness client) is opened through ``dial`` (default:
  from this namespace; with cluster.netns, ``Hosts.dialer(host)``).
- Every server started is tracked by pid and stopped by ``stop()`` (SIGTERM, then
  SIGKILL after a grace period), even when the caller fails.
- A restarted server reuses its data directory, so it rejoins as the same member.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler

from cluster.processes import kill_process, stop_processes
from txn_library import limits

JAR_DIR = Path("/usr/share/java")
ZOOKEEPER_JAR = JAR_DIR / "zookeeper.jar"  # its manifest lists its own dependencies
# slf4j's log4j binding, so servers log to their file (without it they log nothing)
LOGGING_JARS = (JAR_DIR / "slf4j-log4j12.jar", JAR_DIR / "log4j-1.2.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
LOG_PATTERN = "%d{ISO8601} %-5p [%t] %c{1}: %m%n"
SETUP_HINT = "run scripts/setup.sh (it installs Debian's zookeeper package)"

SERVER_COUNTS = (1, 3)
PORTS_PER_SERVER = 3  # client, peer, election
SERVING_MODES = ("leader", "follower", "standalone")

TICK_TIME_MS = 250
INIT_LIMIT_TICKS = 20  # a follower connects to and syncs with a leader within 5 s
SYNC_LIMIT_TICKS = 10  # a follower more than 2.5 s behind the leader is dropped
AUTOPURGE_INTERVAL_H = 1
READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.05
FOUR_LETTER_TIMEOUT_S = 1.0


# How to open a TCP connection to (address, port) within a timeout (seconds or None).
Dial = Callable[[tuple[str, int], float | None], socket.socket]


class Spawn(Protocol):
    """How to start server ``n``'s command ``argv`` (Popen keyword arguments as given)."""

    def __call__(self, n: int, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]: ...


def _spawn_here(n: int, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """A child that dies with this process (its launcher): the JVM cannot watch Ordo's
    lifeline (cluster.ownership), so util-linux's ``setpriv`` (in every Debian) sets
    the kernel's parent-death signal and execs it (same pid). Where it is missing, the
    server is not tied to the launcher."""
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
    return subprocess.Popen(argv, **popen_kwargs)


def _dial_here(address: tuple[str, int], timeout_s: float | None) -> socket.socket:
    return socket.create_connection(address, timeout=timeout_s)


class DialingHandler(SequentialThreadingHandler):
    """kazoo's threading handler with its TCP connections opened by ``dial``, so a client
    in this process reaches servers that only another network namespace can reach."""

    def __init__(self, dial: Dial) -> None:
        super().__init__()
        self._dial = dial

    def create_connection(  # kazoo's handler interface
        self,
        address: tuple[str, int],
        hostname: str | None = None,
        timeout: float | None = None,
        use_ssl: bool = False,
        **tls: object,
    ) -> socket.socket:
        if use_ssl:
            raise ValueError("DialingHandler does not do TLS")
        sock = self._dial((address[0], address[1]), timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


class ServerStatus(NamedTuple):
    server: int  # 1-based, the server's myid
    pid: int | None  # None: never started or stopped
    alive: bool
    mode: str | None  # from ``srvr``: leader, follower, standalone; None: no answer


def four_letter_word(
    host: str, port: int, word: str, timeout_s: float, dial: Dial = _dial_here
) -> str:
    """Send one of ZooKeeper's four-letter words and return the whole answer."""
    with dial((host, port), timeout_s) as s:
        s.settimeout(timeout_s)
        s.sendall(word.encode("ascii"))
        chunks: list[bytes] = []
        size = 0
        while size < limits.zk_four_letter_reply_bytes_max:
            chunk = s.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def mode_of(srvr_reply: str) -> str | None:
    for line in srvr_reply.splitlines():
        if line.startswith("Mode:"):
            return line.partition(":")[2].strip()
    return None


class Ensemble:
    """``servers`` ZooKeeper servers on ``host`` (or server ``n`` on ``hosts[n - 1]``),
    ports from ``base_port``; ``spawn`` starts them and ``dial`` reaches them (see the
    module's invariants)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        base_port: int,
        servers: int = 3,
        host: str | None = None,
        *,
        hosts: Sequence[str] | None = None,
        spawn: Spawn = _spawn_here,
        dial: Dial = _dial_here,
    ) -> None:
        if servers not in SERVER_COUNTS:
            raise ValueError(
                f"servers={servers!r}: an ensemble has 1 or 3 servers "
                "(an even count tolerates no more failures than one fewer)"
            )
        last_port = base_port + servers * PORTS_PER_SERVER - 1
        if not (1024 <= base_port and last_port <= 65535):
            raise ValueError(
                f"base_port={base_port!r}: ports {base_port}..{last_port} must lie in 1024..65535"
            )
        if hosts is None:
            addresses = (host or "127.0.0.1",) * servers
        elif host is not None:
            raise ValueError("give host (every server on it) or hosts (one per server)")
        elif len(hosts) != servers:
            raise ValueError(f"hosts={list(hosts)!r}: one address per server ({servers})")
        else:
            addresses = tuple(hosts)
        for a in addresses:
            try:
                ipaddress.ip_address(a)
            except ValueError:
                raise ValueError(f"host={a!r}: an IP address is needed, e.g. 127.0.0.1") from None
        self.data_dir = Path(data_dir)
        self.base_port = base_port
        self.servers = servers
        self.addresses = addresses
        # the one address of every server, None when they are on several
        self.host: str | None = addresses[0] if len(set(addresses)) == 1 else None
        self.spawn = spawn
        self.dial = dial
        self.procs: dict[int, subprocess.Popen[Any]] = {}

    # --- layout ---------------------------------------------------------------------

    def client_port(self, n: int) -> int:
        return self.base_port + (self._checked(n) - 1) * PORTS_PER_SERVER

    def address(self, n: int) -> str:
        """The IP address server ``n`` binds (all three of its ports)."""
        return self.addresses[self._checked(n) - 1]

    def server_dir(self, n: int) -> Path:
        return self.data_dir / f"zk{self._checked(n)}"

    def log_path(self, n: int) -> Path:
        return self.server_dir(n) / "zookeeper.log"

    def connect_string(self, servers: Iterable[int] | None = None) -> str:
        """The client address of ``servers`` (default: every server), for a client."""
        numbers = self._numbers() if servers is None else servers
        return ",".join(f"{self.address(n)}:{self.client_port(n)}" for n in numbers)

    def quorum(self) -> int:
        return self.servers // 2 + 1

    def _numbers(self) -> range:
        return range(1, self.servers + 1)

    def _checked(self, n: int) -> int:
        if n not in self._numbers():
            raise ValueError(f"server {n!r}: this ensemble has servers 1..{self.servers}")
        return n

    def zoo_cfg(self, n: int) -> str:
        port = self.client_port(n)
        lines = [
            f"tickTime={TICK_TIME_MS}",
            f"initLimit={INIT_LIMIT_TICKS}",
            f"syncLimit={SYNC_LIMIT_TICKS}",
            f"dataDir={self.server_dir(n) / 'data'}",
            f"clientPort={port}",
            f"clientPortAddress={self.address(n)}",
            f"maxClientCnxns={limits.zk_client_connections_per_host_max}",
            "4lw.commands.whitelist=srvr,ruok,mntr",
            "admin.enableServer=false",
            f"autopurge.snapRetainCount={limits.zk_snapshots_retained}",
            f"autopurge.purgeInterval={AUTOPURGE_INTERVAL_H}",
        ]
        for m in self._numbers():
            peer = self.client_port(m) + 1
            lines.append(f"server.{m}={self.address(m)}:{peer}:{peer + 1}")
        return "\n".join(lines) + "\n"

    def log4j_properties(self, n: int) -> str:
        lines = [
            "log4j.rootLogger=INFO, FILE",
            "log4j.appender.FILE=org.apache.log4j.RollingFileAppender",
            f"log4j.appender.FILE.File={self.log_path(n)}",
            f"log4j.appender.FILE.MaxFileSize={limits.zk_server_log_bytes_max}",
            "log4j.appender.FILE.MaxBackupIndex=1",
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout",
            f"log4j.appender.FILE.layout.ConversionPattern={LOG_PATTERN}",
        ]
        return "\n".join(lines) + "\n"

    def write_config(self, n: int) -> Path:
        """Write server ``n``'s zoo.cfg, log4j.properties and myid; return zoo.cfg's path."""
        d = self.server_dir(n)
        (d / "data").mkdir(parents=True, exist_ok=True)
        (d / "data" / "myid").write_text(f"{n}\n")
        (d / "log4j.properties").write_text(self.log4j_properties(n))
        cfg = d / "zoo.cfg"
        cfg.write_text(self.zoo_cfg(n))
        return cfg

    # --- processes ------------------------------------------------------------------

    def command(self, n: int) -> list[str]:
        java = shutil.which("java")
        if not ZOOKEEPER_JAR.exists():
            raise FileNotFoundError(
                f"ZooKeeper is not installed (no {ZOOKEEPER_JAR}); {SETUP_HINT}"
            )
        if java is None:
            raise FileNotFoundError("java is not on PATH; ZooKeeper needs Java 17")
        classpath = [str(ZOOKEEPER_JAR)] + [str(j) for j in LOGGING_JARS if j.exists()]
        return [
            java,
            f"-Xmx{limits.zk_server_heap_mb_max}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # start fast; these servers do little work
            f"-Dlog4j.configuration=file:{self.server_dir(n) / 'log4j.properties'}",
            "-Dzookeeper.jmx.log4j.disable=true",
            # one request may carry a whole batch (txn_library.limits checks it fits)
            f"-Djute.maxbuffer={limits.zk_node_bytes_max}",
            "-cp",
            os.pathsep.join(classpath),
            MAIN_CLASS,
            str(self.server_dir(n) / "zoo.cfg"),
        ]

    def server_command(self, n: int) -> list[str]:
        """Write server ``n``'s configuration and return the command that runs it, for a
        caller that starts it itself (e.g. ``Hosts.run(host, argv)``; ``start_server``
        does the same through ``spawn`` and tracks the process)."""
        cmd = self.command(n)
        self.write_config(n)
        return cmd

    def start(self) -> Ensemble:
        """Write every configuration and start every server (see ``wait_ready``)."""
        for n in self._numbers():
            self.start_server(n)
        return self

    def start_server(self, n: int) -> int:
        """Start server ``n`` (again, after ``kill``) on its data directory; its pid."""
        if self.is_alive(n):
            raise ValueError(f"server {n} is already running (pid {self.procs[n].pid})")
        cmd = self.server_command(n)
        # stdout catches what log4j does not: JVM errors before logging starts
        with open(self.server_dir(n) / "stdout.log", "ab") as out:
            self.procs[n] = self.spawn(
                n,
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self.procs[n].pid

    def is_alive(self, n: int) -> bool:
        p = self.procs.get(self._checked(n))
        return p is not None and p.poll() is None

    def pid(self, n: int) -> int | None:
        p = self.procs.get(self._checked(n))
        return None if p is None else p.pid

    def kill(self, n: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default: kill -9) to server ``n``, wait for it and forget it."""
        self._checked(n)
        if n not in self.procs:
            raise ValueError(f"server {n} is not running")
        kill_process(self.procs.pop(n), sig)

    def stop(self) -> None:
        """Stop every server: SIGTERM, then SIGKILL after processes.STOP_GRACE_S."""
        stop_processes(list(self.procs.values()))
        self.procs.clear()

    def __enter__(self) -> Ensemble:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- health ---------------------------------------------------------------------

    def mode(self, n: int) -> str | None:
        """Server ``n``'s mode from ``srvr``, None if it does not answer."""
        try:
            reply = four_letter_word(
                self.address(n),
                self.client_port(n),
                "srvr",
                timeout_s=FOUR_LETTER_TIMEOUT_S,
                dial=self.dial,
            )
        except OSError:
            return None
        return mode_of(reply)

    def status(self, servers: Iterable[int] | None = None) -> list[ServerStatus]:
        """The status of ``servers`` (default: every server), in their order."""
        numbers = self._numbers() if servers is None else [self._checked(n) for n in servers]
        return [
            ServerStatus(
                n,
                self.pid(n),
                self.is_alive(n),
                self.mode(n) if self.is_alive(n) else None,
            )
            for n in numbers
        ]

    def check_alive(self) -> None:
        """Raise if a server this ensemble started (and did not kill) has exited."""
        for n, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper server {n} exited with {p.returncode}; "
                    f"see {self.log_path(n)} and {self.server_dir(n) / 'stdout.log'}"
                )

    def wait_ready(
        self, timeout_s: float = READY_TIMEOUT_S, servers: Iterable[int] | None = None
    ) -> list[ServerStatus]:
        """Wait until every running server of ``servers`` (default: all; name a subset to
        leave out one that runs but is cut off) serves (leader, follower or standalone),
        at least a quorum of them runs, one leads, and a client of theirs completes a round
        trip through the leader (sync, then a read). Returns their status."""
        numbers = list(self._numbers() if servers is None else servers)
        deadline = time.monotonic() + timeout_s
        last = "no server answered"
        while time.monotonic() < deadline:
            self.check_alive()
            st = self.status(numbers)
            running = [s for s in st if s.alive]
            modes = [s.mode for s in running]
            if len(running) < self.quorum():
                raise RuntimeError(
                    f"only {len(running)} of servers {numbers} run; a quorum is "
                    f"{self.quorum()}: start more with start_server(n)"
                )
            if all(m in SERVING_MODES for m in modes) and (
                modes.count("leader") == 1 or modes == ["standalone"]
            ):
                problem = self._client_round_trip(deadline - time.monotonic(), numbers)
                if problem is None:
                    return st
                last = problem
            else:
                last = f"modes {[(s.server, s.mode) for s in st]}"
            time.sleep(READY_POLL_S)
        raise TimeoutError(
            f"ZooKeeper ensemble not ready after {timeout_s}s ({last}); logs in {self.data_dir}"
        )

    def client(self, timeout_s: float = 10.0, servers: Iterable[int] | None = None) -> KazooClient:
        """A kazoo client (not started) of ``servers`` (default: all) with session timeout
        ``timeout_s``, its connections opened through ``dial``."""
        hosts = self.connect_string(servers)
        if self.dial is _dial_here:
            return KazooClient(hosts=hosts, timeout=timeout_s)
        return KazooClient(hosts=hosts, timeout=timeout_s, handler=DialingHandler(self.dial))

    def _client_round_trip(self, timeout_s: float, servers: Iterable[int]) -> str | None:
        """None if a client connects, syncs and reads; else what went wrong."""
        client = self.client(max(1.0, timeout_s), servers)
        try:
            client.start(timeout=max(0.1, timeout_s))
            client.sync("/")
            client.get_children("/")
            return None
        except (KazooException, KazooTimeoutError) as e:
            return f"client: {type(e).__name__}: {e}"
        finally:
            client.stop()
            client.close()
