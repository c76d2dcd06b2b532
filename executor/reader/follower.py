"""A reader's core: every partition of a replica in one process, following the history
by re-executing each batch in log order (determinism makes that enough: the state at
the end of every epoch is the replicas', without their lock manager or read exchange
crossing a socket).

``Follower`` owns no socket and no clock: its owner hands it batches' bytes (the
sequencer's publication, ``offer``; the log service's replies, ``log_reply``),
heartbeats, and the time (``repair``), and calls ``apply_ready`` to apply what is in
order. A batch runs serially, one transaction at a time in txn id order, as the serial
oracle runs it (executor.deterministic.oracle: no lock manager, no read exchange; on
bank transfers ~4x less CPU than the partitions' code in one process, on TPC-C, whose
bodies dominate, about the same), derived dataflow steps included (a
weak-recovery batch's steps are appended by ``batch_txns``); each write goes to the
storage of the partition its key is placed at (txn_library.placement), so every
partition's state, and its state hash, is the replicas' at every epoch. The reader is
thereby an independent check of the replicas' ordered locking and read exchange.

Invariants:
- Batches are applied strictly in epoch order, each whole: between two applies every
  partition's state is exactly its state at the end of ``applied_epoch``, and queries
  read only between applies.
- A row is written only to the storage of the partition its key is placed at, so a
  read finds a key's row at the first partition that has it.
- A published batch or heartbeat of a term older than the newest seen is ignored (a
  deposed leader); log-service batches are committed history and always taken.
- ``known_last_epoch`` only grows. At most ``limits.reader_held_batches_max`` batches
  wait ahead of a gap; newer published ones are dropped (the log gives them again).
- ``hashes`` holds each partition's state hash at the end of each of the last
  ``limits.reader_hashes_epochs_max`` applied epochs; ``compare`` checks the
  replicas' hashes against it, and every disagreement is a determinism violation.
- Retention is measured in the batches' logged time (``Batch.timestamp_ms``, the
  sequencer's), never this process's clock, so every reader with the same history
  serves the same window. A snapshot is served at every epoch from
  ``versions_oldest`` to ``applied_epoch``: the state at the end of epoch X lasted
  until the batch of X + 1, and X is served while that batch was logged at most
  ``retention_s`` before the newest applied batch (the applied epoch always), unless
  ``limits.versions_bytes_max`` bytes of a partition's versions retired older epochs
  early. ``epoch_ends`` holds (X, the time its state ended) for exactly the served
  epochs before the applied one, consecutive, oldest first; batch times are taken
  as never decreasing (one older than the newest seen counts as the newest), so the
  window never moves back.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_txn
from executor.core.state_hash import MASK64
from executor.core.storage import Storage
from executor.core.versions import Versions
from txn_library import limits, placement
from txn_library.catalog import REPLICATED
from txn_library.deployed import Deploy, install, records_in_batch
from txn_library.errors import invariant
from txn_library.procedure import lookup_at
from txn_library.streams import batch_txns
from txn_library.wire import sequencer as swire


@dataclass(frozen=True)
class Violation:
    """A replica's state hash that is not the reader's at the same epoch."""

    replica: int
    partition: int
    epoch: int
    replica_hash: int
    reader_hash: int

    def __str__(self) -> str:
        return (
            f"DETERMINISM VIOLATION: partition {self.partition} at epoch {self.epoch}: "
            f"replica {self.replica} hash {self.replica_hash:016x}, reader hash "
            f"{self.reader_hash:016x}"
        )


@dataclass(frozen=True)
class Restored:
    """Where a partition's loaded state stands: the end of ``epoch`` (a checkpoint's)."""

    epoch: int
    next_txn_id: int


class Follower:
    def __init__(
        self,
        partitions: int,
        storages: list[Storage] | None = None,
        restored: Sequence[Restored] | None = None,
        retention_s: float = limits.reader_retention_s_default,
    ) -> None:
        """``storages``: every partition's state at the start (default: empty tables),
        at genesis or, with ``restored``, at the end of one checkpointed epoch.
        ``retention_s``: how far back snapshots are served, in batch time
        (``ClusterConfig.reader_retention_s``)."""
        invariant(0 < retention_s <= limits.reader_retention_s_max, "reader retention")
        self.retention_s = retention_s
        self._retention_ms = retention_s * 1000
        # (epoch, when its state ended: the next batch's time, ms) of each epoch
        # before the applied one that a snapshot is served at, oldest first.
        self.epoch_ends: deque[tuple[int, int]] = deque()
        self.newest_batch_ms = 0  # the newest batch time applied (never decreases)
        self.partitions = partitions
        self.storages = storages if storages is not None else [Storage() for _ in range(partitions)]
        # Given a FLAG_DEPLOY batch's deploys before it is applied (the process keeps
        # them durable: txn_library.deployed.CodeStore); None: in memory only.
        self.on_deploy: Callable[[list[Deploy]], None] | None = None
        invariant(len(self.storages) == partitions, "one storage per partition")
        self.applied_epoch = 0
        self.next_txn_id = 0
        self.txns_applied = 0
        if restored is not None:
            invariant(
                len(restored) == partitions and len({r.epoch for r in restored}) == 1,
                "a reader starts from one epoch of every partition",
            )
            self.applied_epoch = restored[0].epoch
            self.next_txn_id = restored[0].next_txn_id
        for s in self.storages:  # versions from the start: a snapshot reads no older epoch
            s.versions = Versions(self.applied_epoch)
        self.held: dict[int, swire.Batch] = {}
        self.known_last_epoch = 0
        self.heard = False  # a heartbeat or a log reply said where the log ends
        self.live = False  # caught up once since the start (stays so)
        self.term = 0
        self.leader = 0
        self.stale_dropped = 0
        self.held_dropped = 0
        self.started_epoch = self.applied_epoch
        self.hashes: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._note_hashes()
        self.hashes_checked = 0
        self.violations: list[Violation] = []  # the newest (at most 100)
        self.violations_count = 0
        self._reported: set[tuple[int, int, int]] = set()  # (replica, partition, epoch)
        self._repair_sent_at: float | None = None

    # State ---------------------------------------------------------------------------
    def state_hashes(self) -> tuple[int, ...]:
        return tuple(s.state_hash for s in self.storages)

    @property
    def state_hash(self) -> int:
        """The sum of the partitions' hashes: the serial oracle's after the same log."""
        return sum(self.state_hashes()) & MASK64

    @property
    def versions_oldest(self) -> int:
        """The oldest epoch a snapshot can be read at (every partition keeps it)."""
        oldest = 0
        for s in self.storages:
            v = s.versions
            invariant(v is not None, "a reader's partitions keep versions")
            assert v is not None
            oldest = max(oldest, v.oldest)
        return oldest

    def behind(self) -> int:
        return self.known_last_epoch - self.applied_epoch

    # Inputs --------------------------------------------------------------------------
    def offer(self, data: bytes, published: bool = False, publisher: int | None = None) -> None:
        """A batch's bytes, from the publication (``published``; ``publisher``: the
        sequencer it came from) or the log service. Applied later, by ``apply_ready``."""
        batch = swire.decode_batch(data)
        if published:
            if batch.term < self.term:
                self.stale_dropped += 1
                return
            self.term = batch.term
            if publisher is not None:
                self.leader = publisher
        epoch = batch.epoch
        self.known_last_epoch = max(self.known_last_epoch, epoch)
        if epoch <= self.applied_epoch or epoch in self.held:
            return
        if len(self.held) >= limits.reader_held_batches_max and (
            published or epoch > min(self.held)
        ):
            self.held_dropped += 1  # fetched from the log once the gap before it closes
            return
        self.held[epoch] = batch

    def heartbeat(self, last_epoch: int, term: int = 0, leader: int | None = None) -> bool:
        """A leader's heartbeat; False if a deposed leader's (ignored)."""
        if term < self.term:
            self.stale_dropped += 1
            return False
        self.term = term
        if leader is not None:
            self.leader = leader
        self.heard = True
        self.known_last_epoch = max(self.known_last_epoch, last_epoch)
        return True

    def log_reply(self, batches: Sequence[bytes], last_on_disk: int) -> None:
        self.heard = True
        self.known_last_epoch = max(self.known_last_epoch, last_on_disk)
        for data in batches:
            self.offer(data)
        self._repair_sent_at = None  # ask for the next chunk at once if still behind

    def requested(self, now: float) -> None:
        """The owner asked the log service itself (the catch-up at start)."""
        self._repair_sent_at = now

    def repair(self, now: float, retry_s: float) -> tuple[int, int] | None:
        """The epochs to fetch from the log service now, or None (at most one ask per
        ``retry_s`` unless a reply came)."""
        want = self.applied_epoch + 1
        if self.known_last_epoch < want or want in self.held:
            return None
        sent = self._repair_sent_at
        if sent is not None and now - sent < retry_s:
            return None
        last = self.known_last_epoch
        if self.held:
            last = min(self.held) - 1
        self._repair_sent_at = now
        return want, last

    # Applying ------------------------------------------------------------------------
    def apply_ready(self, max_batches: int) -> int:
        """Apply up to ``max_batches`` batches that are next in order; how many."""
        n = 0
        held = self.held
        while n < max_batches and self.applied_epoch + 1 in held:
            self.apply(held.pop(self.applied_epoch + 1))
            n += 1
        if not self.live and self.heard and self.behind() <= 0:
            self.live = True
        return n

    def apply(self, batch: swire.Batch) -> None:
        """Apply one batch, the next in epoch order, serially, to every partition."""
        epoch = batch.epoch
        invariant(
            epoch == self.applied_epoch + 1 and batch.prev_epoch == self.applied_epoch,
            f"reader: batch {epoch} (prev {batch.prev_epoch}) after {self.applied_epoch}",
        )
        invariant(batch.first_txn_id >= self.next_txn_id, "txn ids went backwards")
        if batch.flags & swire.FLAG_DEPLOY:  # its modules run from epoch + 1
            records = records_in_batch(epoch, batch.txns)
            if self.on_deploy is not None:
                self.on_deploy(records)
            for record in records:
                install(record)
        storages, n = self.storages, self.partitions
        for s in storages:
            assert s.versions is not None
            s.versions.epoch = epoch  # the rows a write overwrites were those before it
        gets = [s.get for s in storages]

        def get(t: str, key: tuple) -> tuple | None:
            for g in gets:  # a row lives at its partition only (replicated: at each)
                row = g(t, key)
                if row is not None:
                    return row
            return None

        def scan(t: str, prefix: tuple) -> list:
            p = placement.partition_of(t, prefix, n)
            return storages[0 if p == REPLICATED else p].scan(t, prefix)

        ts, seed = batch.timestamp_ms, batch.seed
        txn_id = batch.first_txn_id
        txns = batch_txns(batch, n)
        for txn in txns:
            proc = lookup_at(txn.proc, epoch)
            fp = proc.footprint(*txn.args)
            reads, writes_fp = cover_set(fp.reads), cover_set(fp.writes)
            if len(txn.participants) == 1:
                # Everything it touches is at its one partition (a replicated table's
                # rows too): read and write there directly, as a partition does.
                home = storages[txn.participants[0]]
                ctx = TxnContext(txn_id, ts, seed, reads, writes_fp, home.get, home.scan)
                _, _, _, writes = run_txn(proc, txn.args, ctx, home)
                if writes:
                    home.apply(writes)
            else:
                ctx = TxnContext(txn_id, ts, seed, reads, writes_fp, get, scan)
                _, _, _, writes = run_txn(proc, txn.args, ctx, storages[0])
                if writes:
                    self._apply_writes(writes)
            txn_id += 1
        self.applied_epoch = epoch
        self.next_txn_id = txn_id
        self.txns_applied += len(txns)
        self._retain(epoch, batch.timestamp_ms)
        self._note_hashes()

    def _retain(self, epoch: int, timestamp_ms: int) -> None:
        """Retire the row versions no snapshot within the retention needs, now that
        ``epoch`` (its batch logged at ``timestamp_ms``) is applied."""
        ends = self.epoch_ends
        now_ms = self.newest_batch_ms = max(self.newest_batch_ms, timestamp_ms)
        ends.append((epoch - 1, now_ms))  # the state of epoch - 1 lasted until now
        cutoff = now_ms - self._retention_ms
        while ends and ends[0][1] < cutoff:
            ends.popleft()
        horizon = ends[0][0] if ends else epoch
        for s in self.storages:
            assert s.versions is not None
            # Versions.bound(c) retires up to c - versions_epochs_max, then the oldest
            # epochs while the partition's versions are over versions_bytes_max.
            s.versions.bound(horizon + limits.versions_epochs_max)
        oldest = self.versions_oldest
        while ends and ends[0][0] < oldest:
            ends.popleft()
        invariant(
            len(ends) == epoch - oldest and (not ends or ends[0][0] == oldest),
            f"reader retention: {len(ends)} epochs kept before {epoch}, versions from {oldest}",
        )

    def _apply_writes(self, writes: list) -> None:
        storages, n = self.storages, self.partitions
        if n == 1:
            storages[0].apply(writes)
            return
        by_home: dict[int, list] = {}
        for w in writes:
            p = placement.partition_of(w[0], w[1], n)
            if p == REPLICATED:
                for q in range(n):
                    by_home.setdefault(q, []).append(w)
            else:
                by_home.setdefault(p, []).append(w)
        for p in sorted(by_home):
            storages[p].apply(by_home[p])

    def _note_hashes(self) -> None:
        hashes = self.hashes
        hashes[self.applied_epoch] = self.state_hashes()
        while len(hashes) > limits.reader_hashes_epochs_max:
            hashes.popitem(last=False)

    # Checking the replicas -----------------------------------------------------------
    def compare(self, replica: int, partition: int, epoch: int, h: int) -> Violation | None:
        """A replica's state hash of ``partition`` at the end of ``epoch``, against this
        reader's; a disagreement is a violation (each reported once), None otherwise
        (or if the reader does not keep that epoch's hash)."""
        mine = self.hashes.get(epoch)
        if mine is None or not 0 <= partition < self.partitions:
            return None
        self.hashes_checked += 1
        if mine[partition] == h:
            return None
        key = (replica, partition, epoch)
        if key in self._reported:
            return None
        self._reported.add(key)
        v = Violation(replica, partition, epoch, h, mine[partition])
        self.violations.append(v)
        del self.violations[:-100]
        self.violations_count += 1
        return v

    def compare_status(self, partitions: Sequence[dict]) -> list[Violation]:
        """The replicas' partition reports of a sequencer's status (``ordo status``'s
        rows): a partition at a checkpoint boundary reports its hash there, and an idle
        one (no active transaction) its hash at the end of its last epoch."""
        out = []
        for p in partitions:
            if p.get("down") or p.get("catching_up"):
                continue
            checks = []
            if p.get("boundary_epoch") and "boundary_hash" in p:
                checks.append((p["boundary_epoch"], int(p["boundary_hash"], 16)))
            if p.get("active") == 0:
                checks.append((p["last_epoch"], int(p["state_hash"], 16)))
            for epoch, h in checks:
                v = self.compare(p["replica"], p["partition"], epoch, h)
                if v is not None:
                    out.append(v)
        return out

    def hashes_at(self, epochs: Sequence[int]) -> list[tuple[int, list[str]]]:
        return [(e, [f"{h:016x}" for h in self.hashes[e]]) for e in epochs if e in self.hashes]
