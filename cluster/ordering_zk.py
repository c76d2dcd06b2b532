"""The replicated ordering layer's store on ZooKeeper (kazoo): terms, the committed
tail of the log, leader election, members' progress.

Nodes under the cluster's root (``config.zookeeper_root``), every one created with a
digest ACL when the cluster has a ZooKeeper secret (``keys/zookeeper.secret``):
  term            the current leader term (decimal); its *version* fences commits
  last            the newest committed epoch (decimal)
  first           the oldest epoch the tail still holds (decimal)
  log/<epoch:013> one committed batch's bytes
  election/m-NNN  ephemeral sequential, one per live sequencer; data: its member id.
                  The lowest sequence number leads. A follower that saw the leader's
                  process die (its connections closed, its address refusing new
                  ones: sequencer.member) deletes the leader's node rather than wait
                  for its session to expire (``remove_dead_leader``).
  progress/<id>   the member's last local epoch (trimming waits for it)

Invariants (what makes the store an ``OrderingStore``):
- A commit is one ZooKeeper multi-op: check(term, version of our claim), create
  log/<epoch>, set_data(last, epoch, version seen). ZooKeeper applies it atomically on
  a quorum (each server fsyncs its transaction log before acknowledging), or not at
  all. A newer term's claim bumps ``term``'s version, so an older leader's commit
  fails from then on; the version check on ``last`` makes epochs consecutive.
- A commit whose server goes away (ConnectionLoss, or no answer within
  ``limits.zk_commit_timeout_s``) is resolved once the session reaches another
  server: the batch node is read after a ``sync``; committed -> done, absent with
  the term still ours -> committed again, anything else -> Deposed. Unresolved
  within a session timeout (or the session lost) -> CommitUnknown: it may have
  happened; the caller never publishes it and steps down.
- Leadership needs a live session: on SUSPENDED or LOST the process stops cutting
  batches; after LOST it rejoins the election as a new candidate.
- Only the lowest election node, and only if it names the member said to be dead, is
  ever deleted by another member. A member whose node was deleted while it lives
  (``take_removed``) stops leading and joins again; its term is fenced by the next
  claim anyway.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from cluster.config import ClusterConfig
from cluster.metrics.buckets import LATENCY_BOUNDS_S, Buckets
from cluster.zookeeper import Ensemble
from sequencer.member import Election
from sequencer.replication import CommitUnknown, Deposed, OrderingStore
from txn_library import limits

log = logging.getLogger("ordo.ordering")

ZK_USER = "ordo"
SECRET_FILE = "zookeeper.secret"
_EPOCH_DIGITS = 13


def ensemble_of(config: ClusterConfig) -> Ensemble:
    """The cluster's ZooKeeper ensemble, each server on the host cluster.json names."""
    return Ensemble(
        config.zookeeper_dir,
        config.zookeeper_base_port,
        servers=config.zookeeper_servers,
        hosts=[config.zookeeper_host(n) for n in range(1, config.zookeeper_servers + 1)],
    )


def secret_path(config: ClusterConfig) -> Path:
    return Path(config.data_dir) / "keys" / SECRET_FILE


def ensure_secret(config: ClusterConfig) -> Path:
    """Create the cluster's ZooKeeper password (mode 0600) if it is missing."""
    path = secret_path(config)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(24) + "\n")
    return path


def _read_secret(config: ClusterConfig) -> str | None:
    path = secret_path(config)
    if not path.exists():
        return None
    if path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others; chmod 600 it")
    return path.read_text().strip()


def _int(data: bytes) -> int:
    return int(data.decode("ascii"))


def _enc(n: int) -> bytes:
    return str(n).encode("ascii")


class ZooKeeperStore:
    """One sequencer's connection to the ensemble: an OrderingStore
    (sequencer.replication) and an Election (sequencer.member) for its OrderingMember."""

    def __init__(self, config: ClusterConfig, member: int) -> None:
        self.member = member
        self.root = config.zookeeper_root.rstrip("/")
        secret = _read_secret(config)
        auth = [("digest", f"{ZK_USER}:{secret}")] if secret else None
        self.acl = [make_digest_acl(ZK_USER, secret, all=True)] if secret else None
        self.zk = KazooClient(
            hosts=config.zookeeper_connect,
            timeout=limits.zk_session_timeout_s,
            auth_data=auth,
            default_acl=self.acl,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.25),
            randomize_hosts=True,
        )
        self.session_lost = False  # set from kazoo's thread; the owner rejoins
        self.connected = False
        self.disconnected_at: float | None = None  # monotonic time of SUSPENDED
        self.zk.add_listener(self._on_state)
        self._term_version: dict[int, int] = {}  # claimed term -> version of ``term``
        self._last_version = -1
        self.commit_seconds = Buckets(LATENCY_BOUNDS_S)  # committed batches (cluster.metrics)
        self._election_node: str | None = None
        # Set (from kazoo's thread) when the election's members change: a follower
        # looks at the election then, not on every check (sequencer_election_check_s).
        self.election_changed = threading.Event()
        self.election_changed.set()
        self._maybe_removed = threading.Event()  # our node missed from a children list

    # Connection ---------------------------------------------------------------------
    def start(self, timeout_s: float) -> None:
        self.zk.start(timeout=timeout_s)
        for name, value in (("term", 0), ("last", 0), ("first", 1)):
            self._ensure(f"{self.root}/{name}", _enc(value))
        for name in ("log", "election", "progress"):
            self._ensure(f"{self.root}/{name}", b"")
        self.zk.ChildrenWatch(f"{self.root}/election", self._on_election)

    def _on_election(self, children: list[str]) -> bool:
        node = self._election_node
        if node is not None and node.rsplit("/", 1)[-1] not in children:
            self._maybe_removed.set()  # or a stale list: take_removed looks again
        self.election_changed.set()
        return True  # keep watching

    def _ensure(self, path: str, value: bytes) -> None:
        try:
            self.zk.create(path, value, makepath=True)
        except NodeExistsError:
            pass

    def _on_state(self, state: str) -> None:
        self.connected = state == KazooState.CONNECTED
        if self.connected:
            self.disconnected_at = None
        elif self.disconnected_at is None:
            self.disconnected_at = time.monotonic()
        if state == KazooState.LOST:
            self.session_lost = True

    def surely_expired(self, now: float) -> bool:
        """Disconnected for a whole session timeout: the ensemble has ended our session
        (and our leadership) even if we cannot hear it say so."""
        since = self.disconnected_at
        return since is not None and now - since >= limits.zk_session_timeout_s

    def close(self) -> None:
        try:
            self.zk.stop()
            self.zk.close()
        except KazooException:
            pass

    # Election -----------------------------------------------------------------------
    def join_election(self) -> None:
        """Become a candidate (again, after a lost session)."""
        self.session_lost = False
        self._election_node = self.zk.create(
            f"{self.root}/election/m-", _enc(self.member), ephemeral=True, sequence=True
        )

    def resign(self) -> None:
        """Leave the election and stand again at the back (a candidate that cannot
        catch up lets the next one lead)."""
        node, self._election_node = self._election_node, None
        if node is not None:
            try:
                self.zk.delete(node)
            except NoNodeError:
                pass
        self.join_election()

    def take_removed(self) -> bool:
        """Whether another member deleted this member's election node while its
        session lives (it was believed dead): then it must stop leading and join
        again. Looks at ZooKeeper only after the election's watch missed the node."""
        if not self._maybe_removed.is_set():
            return False
        self._maybe_removed.clear()
        node = self._election_node
        if node is None or self.session_lost:
            return False
        if self.zk.exists(node) is not None:
            return False
        log.warning("sequencer %d: our election node %s was removed", self.member, node)
        self._election_node = None
        return True

    def remove_dead_leader(self, member: int) -> bool:
        """Delete the lowest election node if it is ``member``'s (a leader whose process
        is gone, sequencer.member): the next member is named at once. False if the
        lowest node is another member's (or ours), or there is none."""
        election = f"{self.root}/election"
        children = sorted(self.zk.get_children(election), key=lambda c: c[-10:])
        if not children:
            return False
        path = f"{election}/{children[0]}"
        try:
            data, _stat = self.zk.get(path)
            if _int(data) != member or path == self._election_node:
                return False
            self.zk.delete(path)
        except NoNodeError:
            return False  # its session ended meanwhile, or another member deleted it
        log.info("deleted election node %s of member %d, whose process is gone", path, member)
        return True

    def take_election_change(self) -> bool:
        """Whether the election's members changed since the last call; cleared before
        the caller reads the election, so a later change sets it again."""
        if not self.election_changed.is_set():
            return False
        self.election_changed.clear()  # a change after this re-sets it
        return True

    @property
    def in_election(self) -> bool:
        return self._election_node is not None and not self.session_lost

    def leader(self) -> int | None:
        """The member whose election node is lowest, or None if nobody stands."""
        children = sorted(self.zk.get_children(f"{self.root}/election"), key=lambda c: c[-10:])
        for child in children:
            try:
                data, _stat = self.zk.get(f"{self.root}/election/{child}")
            except NoNodeError:
                continue  # its session ended between the two calls
            return _int(data)
        return None

    def i_lead(self) -> bool:
        if not self.in_election or not self.connected:
            return False
        children = sorted(self.zk.get_children(f"{self.root}/election"), key=lambda c: c[-10:])
        assert self._election_node is not None
        return bool(children) and self._election_node.endswith(children[0])

    # OrderingStore ------------------------------------------------------------------
    def claim_term(self) -> int:
        try:
            data, stat = self.zk.get(f"{self.root}/term")
            term = _int(data) + 1
            new = self.zk.set(f"{self.root}/term", _enc(term), version=stat.version)
            _data, last_stat = self.zk.get(f"{self.root}/last")
        except BadVersionError:
            raise Deposed("another sequencer claimed a term at the same time") from None
        except (KazooException, KazooTimeoutError) as e:
            raise CommitUnknown(f"claiming a term: {type(e).__name__}") from None
        self._term_version = {term: new.version}
        self._last_version = last_stat.version
        return term

    def current_term(self) -> int:
        """The term the ensemble holds now (a follower's view, for status)."""
        return _int(self._get(f"{self.root}/term"))

    def commit(self, term: int, epoch: int, data: bytes) -> None:
        version = self._term_version.get(term)
        if version is None:
            raise Deposed(f"term {term} was not claimed by this sequencer")
        t0 = time.monotonic()
        for _attempt in range(2):
            try:
                results = self._commit_once(version, epoch, data)
            except (ConnectionLoss, KazooTimeoutError) as e:
                # The server went away (or is slow): the session may live on at another
                # server. Find out whether the commit happened before giving up.
                done = self._resolve(version, epoch, data)
                if done is None:
                    raise CommitUnknown(f"commit of epoch {epoch}: {type(e).__name__}") from None
                if done:
                    return
                continue  # not committed, the term is still ours: commit it again
            except KazooException as e:  # session expired, closing, ...
                raise CommitUnknown(f"commit of epoch {epoch}: {type(e).__name__}") from None
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                raise Deposed(f"commit of epoch {epoch} refused: {type(failed[0]).__name__}")
            self._last_version = results[2].version
            self.commit_seconds.add(time.monotonic() - t0)
            return
        raise CommitUnknown(f"commit of epoch {epoch}: the connection failed twice")

    def _commit_once(self, version: int, epoch: int, data: bytes) -> list:
        t = self.zk.transaction()
        t.check(f"{self.root}/term", version)
        t.create(self._log_path(epoch), data, acl=self.acl)
        t.set_data(f"{self.root}/last", _enc(epoch), version=self._last_version)
        return list(t.commit_async().get(timeout=limits.zk_commit_timeout_s))

    def _resolve(self, version: int, epoch: int, data: bytes) -> bool | None:
        """After a lost connection: True if ``epoch`` was committed with ``data``,
        False if it was not and our term still stands, None if the ensemble cannot be
        reached within a session timeout (our session may have ended meanwhile).
        Raises Deposed if another term or batch took over."""
        deadline = time.monotonic() + limits.zk_session_timeout_s
        while time.monotonic() < deadline and not self.session_lost:
            if not self.connected:
                time.sleep(0.01)
                continue
            try:
                self.zk.sync(self.root)  # this server has every write the leader acked
                try:
                    got: bytes | None = self._get(self._log_path(epoch))
                except NoNodeError:
                    got = None
                _last, last_stat = self.zk.get(f"{self.root}/last")
                if got == data:
                    self._last_version = last_stat.version
                    return True
                _term, term_stat = self.zk.get(f"{self.root}/term")
            except (ConnectionLoss, KazooTimeoutError):
                time.sleep(0.01)
                continue
            if got is not None or term_stat.version != version:
                raise Deposed(f"epoch {epoch} was committed by another term")
            return False
        return None

    def last_epoch(self) -> int:
        return _int(self._get(f"{self.root}/last"))

    def read(self, epoch: int) -> bytes | None:
        try:
            return self._get(self._log_path(epoch))
        except NoNodeError:
            return None

    def tail_first_epoch(self) -> int:
        return _int(self._get(f"{self.root}/first"))

    def report_progress(self, member: int, last_epoch: int) -> None:
        path = f"{self.root}/progress/{member}"
        try:
            self.zk.set(path, _enc(last_epoch))
        except NoNodeError:
            self._ensure(path, _enc(last_epoch))

    def progress(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for child in self.zk.get_children(f"{self.root}/progress"):
            try:
                out[int(child)] = _int(self._get(f"{self.root}/progress/{child}"))
            except (NoNodeError, ValueError):
                continue
        return out

    def trim_through(self, epoch: int) -> int:
        """Delete tail batches up to ``epoch`` in bounded multi-ops, moving ``first``."""
        first = self.tail_first_epoch()
        last = min(epoch, self.last_epoch())
        dropped = 0
        while first <= last:
            upto = min(last, first + limits.zk_trim_batch_max - 1)
            t = self.zk.transaction()
            for e in range(first, upto + 1):
                t.delete(self._log_path(e))
            t.set_data(f"{self.root}/first", _enc(upto + 1))
            results = t.commit()
            if any(isinstance(r, Exception) for r in results):
                log.warning("trimming epochs %d..%d refused: %r", first, upto, results)
                break
            dropped += upto - first + 1
            first = upto + 1
        return dropped

    # Helpers ------------------------------------------------------------------------
    def _log_path(self, epoch: int) -> str:
        return f"{self.root}/log/{epoch:0{_EPOCH_DIGITS}d}"

    def _get(self, path: str) -> bytes:
        data: Any
        data, _stat = self.zk.get(path)
        return bytes(data)


def as_member_store(store: ZooKeeperStore) -> tuple[OrderingStore, Election]:
    """The two interfaces an OrderingMember uses, as mypy checks this class has them."""
    return store, store
