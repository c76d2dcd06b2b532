"""Hosts for tests on one machine: Linux network namespaces joined by one bridge.

Ordo's multi-host tests run each "host" (a ZooKeeper server, a sequencer, partitions, a
load generator) in a network namespace of its own, with an address of its own, so that
a host can be cut off the network (``link_down``) while its processes keep running.
Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ``ip`` binary of iproute2;
``check_available()`` says why not where they are missing.

Layout of one ``Hosts`` (prefix ``ordo-<pid>-<k>-``: unique per process and instance):
- namespace ``<prefix>sw`` holds the bridge ``br0`` (no address) and one port ``p<i>``
  per host;
- namespace ``<prefix><name>`` per host: ``lo`` up and ``eth0``, the veth peer of
  ``p<i>``, with address 198.18.0.<i>/24 (the benchmarking range 198.18.0.0/15), where
  ``i`` is the host's 1-based position.

Invariants:
- Nothing is added to the root namespace except the names under /run/netns that
  ``ip netns`` keeps. The hosts have no default route and the bridge no address, so
  nothing is routed outside 198.18.0.0/24.
- ``close()`` kills (SIGKILL to its process group) and reaps every process ``run()``
  started, kills any other process still inside its namespaces, and deletes every
  namespace this instance created, also when creation failed halfway.
- ``link_down(h)`` sets the bridge's port of ``h`` down: ``h``'s ``eth0`` loses its
  carrier, so no frame passes in either direction, while ``h`` keeps its address and
  its processes keep running. ``link_up(h)`` heals it.
- Namespaces left by a crashed earlier run (prefix ``ordo-<pid>-`` whose pid is dead)
  are swept (their processes killed, the namespaces deleted) whenever a ``Hosts`` starts.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from txn_library import limits
from txn_library.errors import invariant

NAME_PREFIX = "ordo-"
SWITCH = "sw"  # suffix of the bridge's namespace; no host may take this name
BRIDGE = "br0"
HOST_IFACE = "eth0"
SUBNET = ipaddress.ip_network("198.18.0.0/24")  # inside the benchmarking 198.18.0.0/15
HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
STALE_NAME = re.compile(r"^" + re.escape(NAME_PREFIX) + r"(\d+)-")
NETNS_DIR = "/run/netns"  # where ip netns keeps its names (a bind mount per namespace)
CLONE_NEWNET = 0x40000000

_instances = itertools.count(1)  # makes prefixes unique within one process
T = TypeVar("T")


class NetnsError(RuntimeError):
    """An ``ip`` command failed (the message carries the command and its stderr)."""


def _ip_bin() -> str:
    path = shutil.which("ip")
    if path is None:
        raise NetnsError("no `ip` binary on PATH (install iproute2)")
    return path


def _ip(*args: str) -> str:
    """Run ``ip ARGS``; its stdout, or NetnsError with its stderr."""
    cmd = [_ip_bin(), *args]
    try:
        r = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=limits.netns_command_timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise NetnsError(
            f"{' '.join(cmd)}: no answer within {limits.netns_command_timeout_s}s"
        ) from None
    if r.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {r.stderr.strip() or f'exit {r.returncode}'}")
    return r.stdout


def namespace_names() -> list[str]:
    """Every named network namespace on this machine (``ip netns list``)."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(name: str) -> None:
    """SIGKILL every process whose network namespace is ``name`` (never this one)."""
    for word in _ip("netns", "pids", name).split():
        pid = int(word)
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _destroy(name: str) -> None:
    """Kill what runs inside namespace ``name`` and delete it (its veth ends go with it
    once its last process is gone)."""
    _kill_inside(name)
    _ip("netns", "delete", name)


def sweep_stale() -> list[str]:
    """Delete the namespaces of earlier runs that died without closing their Hosts (named
    ``ordo-<pid>-...`` with ``pid`` no longer running); returns their names."""
    swept = []
    for name in namespace_names():
        m = STALE_NAME.match(name)
        if m is None:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        _destroy(name)
        swept.append(name)
    return swept


def _in_namespace(name: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` in a short-lived thread that joined namespace ``name`` (setns acts on
    the calling thread only, so this process's other threads stay where they are).
    Sockets ``fn`` creates belong to ``name`` for good, whichever thread uses them."""
    out: list[T] = []
    err: list[BaseException] = []

    def body() -> None:
        try:
            fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns({name}): {os.strerror(errno)}")
            finally:
                os.close(fd)
            out.append(fn())
        except BaseException as e:  # handed to the caller's thread unchanged
            err.append(e)

    t = threading.Thread(target=body, name=f"netns-{name}", daemon=True)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def _probe() -> str | None:
    """Make a namespace with a bridge and a veth pair, then delete it; None if it worked."""
    name = f"{NAME_PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", name)
    except NetnsError as e:
        return f"cannot create a network namespace: {e}"
    try:
        _ip("-n", name, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        _in_namespace(name, lambda: socket.socket().close())
    except (NetnsError, OSError) as e:
        return f"cannot build a bridge and veth pairs in a namespace: {e}"
    finally:
        _ip("netns", "delete", name)
    return None


@functools.cache
def check_available() -> str | None:
    """None if this machine can build ``Hosts``, else the reason it cannot."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return (
            f"not root (uid {os.geteuid()}): network namespaces need root "
            "(CAP_SYS_ADMIN and CAP_NET_ADMIN); run the tests as root or in a "
            "privileged container"
        )
    if shutil.which("ip") is None:
        return "no `ip` binary on PATH: install iproute2"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces (/proc/self/ns/net is missing)"
    return _probe()


class Hosts:
    """Hosts ``names`` (in this order: 198.18.0.1, .2, ...), each a network namespace on
    one bridge. Use as a context manager, or ``start()`` and ``close()``."""

    def __init__(self, names: Sequence[str]) -> None:
        names = list(names)
        if not 1 <= len(names) <= limits.netns_hosts_max:
            raise ValueError(f"{len(names)} hosts: 1..{limits.netns_hosts_max} are allowed")
        for name in names:
            if not HOST_NAME.match(name) or name == SWITCH:
                raise ValueError(
                    f"host name {name!r}: a lowercase letter, then up to 11 letters or "
                    f"digits, and not {SWITCH!r}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"host names repeat: {names}")
        self.names = names
        self.prefix = f"{NAME_PREFIX}{os.getpid()}-{next(_instances)}-"
        self.switch = self.prefix + SWITCH
        self._created: list[str] = []  # namespaces, in creation order
        self._procs: list[subprocess.Popen[Any]] = []
        self._closed = False

    # --- layout ---------------------------------------------------------------------

    def _index(self, host: str) -> int:
        try:
            return self.names.index(host) + 1
        except ValueError:
            raise ValueError(f"unknown host {host!r}; hosts are {self.names}") from None

    def namespace(self, host: str) -> str:
        self._index(host)
        return self.prefix + host

    def address(self, host: str) -> str:
        addr = SUBNET.network_address + self._index(host)
        invariant(addr in SUBNET and addr != SUBNET.broadcast_address, f"{addr} outside {SUBNET}")
        return str(addr)

    def port(self, host: str) -> str:
        """The bridge's port (in the switch namespace) that ``host`` hangs on."""
        return f"p{self._index(host)}"

    # --- building and tearing down --------------------------------------------------

    def start(self) -> Hosts:
        """Sweep stale namespaces, then build the bridge and every host. On failure,
        whatever was built is torn down before the error propagates."""
        if self._created or self._closed:
            raise ValueError("a Hosts is started once")
        try:
            sweep_stale()
            self._add_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", self.switch, "link", "set", BRIDGE, "up")
            for host in self.names:
                self._add_host(host)
        except BaseException:
            self.close()
            raise
        return self

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._created.append(ns)

    def _add_host(self, host: str) -> None:
        ns, port = self.namespace(host), self.port(host)
        self._add_namespace(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        veth = ("type", "veth", "peer", "name", port, "netns", self.switch)
        _ip("-n", ns, "link", "add", HOST_IFACE, *veth)
        addr = f"{self.address(host)}/{SUBNET.prefixlen}"
        _ip("-n", ns, "addr", "add", addr, "dev", HOST_IFACE)
        _ip("-n", ns, "link", "set", HOST_IFACE, "up")
        _ip("-n", self.switch, "link", "set", port, "master", BRIDGE, "up")

    def close(self) -> None:
        """Kill every process, then delete every namespace this instance created.
        Safe to call more than once; raises NetnsError, after trying everything, if some
        process could not be reaped or some namespace could not be deleted."""
        self._closed = True
        failures = []
        for p in self._procs:
            try:
                self.kill9(p)
            except subprocess.TimeoutExpired:  # left to the namespace sweep below
                failures.append(f"pid {p.pid} not reaped after SIGKILL")
        self._procs.clear()
        for ns in reversed(self._created):
            try:
                _destroy(ns)
            except NetnsError as e:
                failures.append(str(e))
        self._created.clear()
        if failures:
            raise NetnsError("; ".join(failures))

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- processes ------------------------------------------------------------------

    def run(self, host: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``'s namespace (``ip netns exec``, which execs it,
        so the Popen's pid is the command's) in a session of its own; ``close()`` kills it.
        ``popen_kwargs`` go to subprocess.Popen (stdout, env, cwd, ...)."""
        if self._closed or not self._created:
            raise ValueError("start the Hosts before running anything on them")
        if popen_kwargs.pop("start_new_session", True) is not True:
            raise ValueError("processes on Hosts run in a session of their own (to be killed)")
        if "process_group" in popen_kwargs or "preexec_fn" in popen_kwargs:
            raise ValueError("process_group and preexec_fn are not allowed (see kill9)")
        self._procs = [p for p in self._procs if p.returncode is None]
        if len(self._procs) >= limits.netns_processes_max:
            raise RuntimeError(
                f"{len(self._procs)} processes run on these hosts "
                f"(netns_processes_max={limits.netns_processes_max})"
            )
        cmd = [_ip_bin(), "netns", "exec", self.namespace(host), *argv]
        p: subprocess.Popen[Any] = subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)
        self._procs.append(p)
        return p

    @staticmethod
    def kill9(proc: subprocess.Popen[Any]) -> None:
        """SIGKILL the process group of ``proc`` (a process ``run()`` started) and reap it."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=limits.netns_process_exit_timeout_s)

    # --- the network ----------------------------------------------------------------

    def link_down(self, host: str) -> None:
        """Cut ``host`` off: no frame passes to or from it until ``link_up``."""
        _ip("-n", self.switch, "link", "set", self.port(host), "down")

    def link_up(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.port(host), "up")

    def connect(
        self, host: str, address: tuple[str, int], timeout_s: float | None = None
    ) -> socket.socket:
        """A TCP connection to ``address`` made from inside ``host`` (this process stays in
        its own namespace; only the socket lives in ``host``'s)."""
        return _in_namespace(
            self.namespace(host), lambda: socket.create_connection(address, timeout_s)
        )

    def dialer(self, host: str) -> Callable[[tuple[str, int], float | None], socket.socket]:
        """``connect`` from ``host``, as the ``dial`` of cluster.zookeeper.Ensemble."""
        return functools.partial(self.connect, host)
