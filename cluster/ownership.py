"""One live process owns each piece of a cluster's on-disk state, and the processes a
launcher starts do not outlive it.

Owners. Before a process touches state that it writes, it takes an exclusive lock
(``flock``) on that state's lock file in ``<data dir>/owners/``:

  launcher.lock            ``ordo up``, ``ordo tpcc up``, ``ordo tpcc run --data-dir``,
                           scripts/demo.py: cluster.json, and ``--fresh`` (which
                           deletes the rest)
  sequencer-<m>.lock       sequencer member m: its command log
  r<R>p<P>.lock            partition P of replica R: its checkpoint files
  traditional-p<P>.lock    partition P of the 2PL + 2PC mode
  zookeeper-<n>.lock       ZooKeeper server n started by ``ordo zookeeper`` (held by
                           the JVM it execs; a launcher's servers are under its claim)

The file holds the owner's pid, for messages only: the lock is the truth. The kernel
drops a lock when its process exits, however it exits (kill -9 included), so a restart
after a crash is never refused. While the owner lives, another claimant waits up to
``limits.owner_wait_s`` (the owner may be on its way out: its launcher died, or it was
just stopped), then gets ``StateInUse`` naming the owner, and has touched nothing.
Without this, a second ``ordo up`` on a running cluster's directory had its sequencer
open the command log, cutting what it took for a torn tail while the live sequencer
was appending, before it failed on the port; and ``--fresh`` deleted a live cluster.

Lifeline. A launcher gives every child it starts (``cluster.processes.spawn_python``)
the read end of one pipe whose write end only the launcher holds (``LIFELINE_ENV``
names the descriptor). The child watches it (``watch_lifeline``): end of file means
the launcher has exited, whatever ended it, and the child stops as on SIGTERM (a hard
exit if that has not ended it after ``limits.lifeline_stop_grace_s``). So kill -9 of
``ordo up`` brings its cluster down as Ctrl-C does, instead of leaving processes that
hold its ports and its state. A role started by hand (a multi-host cluster) has no
lifeline and watches nothing. ZooKeeper servers (Java) cannot watch it: the kernel's
parent-death signal ties them instead (cluster.zookeeper._spawn_here).

Invariants: a role holds its claim from before it opens its state until it exits
(roles never release one); a lock file is never deleted while its directory exists
(``clear_except_owners`` keeps ``owners/``): a second claimant could otherwise lock
a new file of the same name while the first holds the old one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from txn_library import limits
from txn_library.errors import invariant

log = logging.getLogger("ordo.ownership")

OWNERS_DIR = "owners"
LIFELINE_ENV = "ORDO_LIFELINE_FD"
CLAIM_POLL_S = 0.05  # between attempts while the owner may be exiting
_PID_BYTES_MAX = 32  # of a lock file read for the owner's pid


class StateInUse(Exception):
    """Another live process owns this state; nothing was touched."""

    def __init__(self, what: str, path: Path, pid: int | None) -> None:
        owner = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"{what} is in use by {owner} (lock {path}); stop it first, or choose another "
            f"data directory"
        )
        self.pid = pid


class Claim:
    """A held lock on one owner file: held until ``release`` or this process exits."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def keep_across_exec(self) -> None:
        """Let the program this process execs next hold the lock (``ordo zookeeper``
        execs the JVM: the server owns its data for as long as it runs)."""
        invariant(self._fd is not None, "a released claim cannot be kept")
        assert self._fd is not None
        os.set_inheritable(self._fd, True)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def owner_file(data_dir: str | Path, name: str) -> Path:
    return Path(data_dir) / OWNERS_DIR / f"{name}.lock"


def partition_owner(replica: int, partition: int) -> str:
    return f"r{replica}p{partition}"


def _owner_pid(fd: int) -> int | None:
    text = os.pread(fd, _PID_BYTES_MAX, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def claim(
    data_dir: str | Path,
    name: str,
    what: str,
    wait_s: float | None = None,
    *,
    on_wait: Callable[[int | None], None] | None = None,
) -> Claim:
    """Lock ``name``'s owner file in ``data_dir`` for this process, waiting up to
    ``wait_s`` (default ``limits.owner_wait_s``) while another holds it; raise
    StateInUse past that. ``on_wait(pid)`` is called once if it has to wait."""
    path = owner_file(data_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + (limits.owner_wait_s if wait_s is None else wait_s)
    waited = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StateInUse(what, path, _owner_pid(fd)) from None
                if not waited and on_wait is not None:
                    on_wait(_owner_pid(fd))
                waited = True
                time.sleep(CLAIM_POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return Claim(path, fd)


def held_owners(data_dir: str | Path) -> list[tuple[str, int | None]]:
    """(name, pid) of every owner file in ``data_dir`` that a live process holds now."""
    found = []
    directory = Path(data_dir) / OWNERS_DIR
    for path in sorted(directory.glob("*.lock")) if directory.is_dir() else []:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            found.append((path.stem, _owner_pid(fd)))
        finally:
            os.close(fd)  # a shared lock taken to probe goes with it
    return found


def wait_unowned(data_dir: str | Path, launcher: Claim, wait_s: float | None = None) -> None:
    """Wait until no process but this one owns anything in ``data_dir`` (the roles of a
    launcher that died are exiting on their lifeline); StateInUse past ``wait_s``."""
    invariant(launcher.held, "wait_unowned needs the launcher's claim held")
    deadline = time.monotonic() + (limits.owner_wait_s if wait_s is None else wait_s)
    while True:
        others = [(n, pid) for n, pid in held_owners(data_dir) if pid != os.getpid()]
        if not others:
            return
        if time.monotonic() >= deadline:
            name, pid = others[0]
            what = f"{name} of the cluster in {data_dir}"
            raise StateInUse(what, owner_file(data_dir, name), pid)
        time.sleep(CLAIM_POLL_S)


def clear_except_owners(data_dir: str | Path) -> None:
    """Delete everything in ``data_dir`` but its owner files (``--fresh``); the caller
    holds the launcher's claim and has seen no other owner (``wait_unowned``)."""
    for entry in Path(data_dir).iterdir() if Path(data_dir).is_dir() else []:
        if entry.name == OWNERS_DIR:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def claim_cluster_dir(
    data_dir: str | Path, fresh: bool = False, on_wait: Callable[[int | None], None] | None = None
) -> Claim:
    """The launcher's claim on a cluster directory: no other launcher holds it and no
    process owns anything in it (a dead launcher's roles are given time to exit); with
    ``fresh``, everything in it but the owner files is then deleted."""
    launcher = claim(data_dir, "launcher", f"cluster directory {data_dir}", on_wait=on_wait)
    try:
        wait_unowned(data_dir, launcher)
        if fresh:
            clear_except_owners(data_dir)
    except BaseException:
        launcher.release()
        raise
    return launcher


EXIT_STATE_IN_USE = 4  # a role's exit code when another process owns its state


def start_role(data_dir: str | Path, name: str, what: str) -> Claim:
    """A role's start: watch the lifeline (if started by a launcher), then claim its
    state, or log why not and exit with ``EXIT_STATE_IN_USE`` having touched nothing."""
    watch_lifeline()

    def waiting(pid: int | None) -> None:
        log.warning("%s is held by process %s: waiting for it to exit", what, pid)

    try:
        return claim(data_dir, name, what, on_wait=waiting)
    except StateInUse as e:
        log.critical("refusing to start: %s", e)
        raise SystemExit(EXIT_STATE_IN_USE) from None


# Lifeline --------------------------------------------------------------------------------
_lifeline_write_fd: int | None = None
_lifeline_read_fd: int | None = None
_lifeline_lock = threading.Lock()


def lifeline_fd() -> int:
    """The read end of this process's lifeline, made on first use. Its write end stays
    open (and private: not inherited) until this process exits."""
    global _lifeline_read_fd, _lifeline_write_fd
    with _lifeline_lock:
        if _lifeline_read_fd is None:
            _lifeline_read_fd, _lifeline_write_fd = os.pipe()  # both close on exec
        return _lifeline_read_fd


def watch_lifeline(environ: dict[str, str] | None = None) -> bool:
    """If this process was started with a lifeline, watch it: when the launcher exits,
    stop as on SIGTERM, and exit hard if still running ``limits.lifeline_stop_grace_s``
    later. False when there is no lifeline to watch."""
    env = os.environ if environ is None else environ
    value = env.pop(LIFELINE_ENV, None)
    if value is None or not value.isdigit():
        return False
    fd = int(value)
    try:
        os.set_inheritable(fd, False)  # this process's own children get their own
    except OSError:
        return False  # not open here: started by something that copied the variable
    threading.Thread(target=_watch, args=(fd,), name="ordo-lifeline", daemon=True).start()
    return True


def _watch(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 1):
                break  # end of file: the launcher's write end is closed
        except InterruptedError:
            continue
        except OSError:
            return
    log.warning("the launcher exited: stopping")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(limits.lifeline_stop_grace_s)
    log.error("still running %.0f s after the launcher exited", limits.lifeline_stop_grace_s)
    os._exit(1)
