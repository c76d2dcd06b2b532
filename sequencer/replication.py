"""The replicated ordering layer: batches committed to a quorum store before publication.

Calvin replicates its input log through ZooKeeper; Ordo does the same and never runs a
consensus protocol of its own. N sequencers share one ``OrderingStore`` (ZooKeeper in
a cluster: cluster.ordering_zk; ``MemoryStore`` here for tests and the simulator).
One of them leads at a time. This module holds the logic every member runs, with the
store and the local command log handed in:

- ``claim_term``: a new leader raises the store's term. From that moment every commit
  under an older term fails (fencing), so a deposed leader that still runs, cut off or
  paused, can never commit again.
- ``ReplicatedLog``: the leader's command log. ``append`` commits the batch to the
  store (one atomic operation that checks the term and that the epoch is the next one)
  and only then appends it to the local log. The Sequencer publishes a batch after
  ``append`` and ``sync`` return, so *a batch any partition executes is committed*:
  no replica ever executes a history that is later replaced.
- ``copy_committed``: a follower (and a new leader, before it serves) copies
  committed batches into its own local log, so every sequencer can serve the log
  service and replay. The store holds only a bounded tail; what it has trimmed comes
  from a peer sequencer's log service instead (``CopyProgress.gap``).
- ``trim_point``: the tail is trimmed once every sequencer has the batches locally,
  and in any case to ``limits.zk_tail_epochs_max`` epochs.

Invariants:
- Terms only grow; a batch carries the term of the leader that committed it, and the
  terms along the log never decrease.
- Epochs in the store are consecutive: a commit of epoch e succeeds only if e - 1 is
  the store's last epoch (and the term is current). So there is exactly one committed
  batch per epoch, whoever tried to commit it.
- A local log holds only committed batches, in epoch order (a leader appends after
  the commit; a follower copies from the store or from a peer's committed log).
- A member reports as progress only epochs its local log has synced, so the store
  trims nothing a member could still lose in a crash.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sequencer.log import CommandLog
from txn_library import limits
from txn_library.errors import invariant
from txn_library.wire.sequencer import FLAG_DEPLOY, decode_batch


class NotLeader(Exception):
    """This sequencer may not (or may no longer) commit batches; it must step down."""


class Deposed(NotLeader):
    """The store's term is newer than ours: another sequencer leads. Nothing of the
    refused commit was written."""


class CommitUnknown(NotLeader):
    """The store did not answer (connection lost, session expired): the batch may or
    may not be committed. It is never published by us; the next leader finds it."""


class OrderingStore(Protocol):
    """The quorum-replicated store of terms and the committed tail of the log."""

    def claim_term(self) -> int:
        """Raise the term by one and return it (linearizable: every commit of an older
        term that had not succeeded before this returns fails from now on)."""
        ...

    def commit(self, term: int, epoch: int, data: bytes) -> None:
        """Commit ``data`` as ``epoch`` iff ``term`` is the current term and ``epoch``
        is last_epoch() + 1; raise Deposed if not, CommitUnknown if unsure."""
        ...

    def last_epoch(self) -> int:
        """The newest committed epoch (0: none)."""
        ...

    def read(self, epoch: int) -> bytes | None:
        """A committed batch still held in the tail, else None."""
        ...

    def tail_first_epoch(self) -> int:
        """The oldest epoch the tail still holds (last_epoch() + 1 when it is empty)."""
        ...

    def report_progress(self, member: int, last_epoch: int) -> None:
        """Member ``member`` holds every committed batch up to ``last_epoch`` locally."""
        ...

    def progress(self) -> dict[int, int]:
        """Every member's last reported local epoch."""
        ...

    def trim_through(self, epoch: int) -> int:
        """Drop tail batches up to ``epoch``; returns how many were dropped."""
        ...


@dataclass(frozen=True)
class CopyProgress:
    copied: int  # batches appended to the local log this round
    local_last_epoch: int
    store_last_epoch: int
    # Epochs the store no longer holds and the local log lacks: fetch them from a
    # peer's log service (first, last), then copy again.
    gap: tuple[int, int] | None = None

    @property
    def caught_up(self) -> bool:
        return self.gap is None and self.local_last_epoch >= self.store_last_epoch


def copy_committed(local: CommandLog, store: OrderingStore, max_batches: int) -> CopyProgress:
    """Append the store's committed batches after ``local.last_epoch`` (at most
    ``max_batches``), then sync the local log once."""
    last = store.last_epoch()
    have = local.last_epoch
    if have >= last:
        return CopyProgress(0, have, last)
    first_held = store.tail_first_epoch()
    if have + 1 < first_held:
        return CopyProgress(0, have, last, gap=(have + 1, first_held - 1))
    copied = 0
    while copied < max_batches and local.last_epoch < last:
        epoch = local.last_epoch + 1
        data = store.read(epoch)
        if data is None:  # trimmed meanwhile: from a peer
            break
        append_committed(local, epoch, data)
        copied += 1
    if copied:
        local.sync()
    have = local.last_epoch
    gap = None
    if have < last and store.read(have + 1) is None:
        gap = (have + 1, max(have + 1, store.tail_first_epoch() - 1))
    return CopyProgress(copied, have, last, gap)


def append_committed(local: CommandLog, epoch: int, data: bytes) -> None:
    """Append one committed batch copied from the store or a peer (checked first)."""
    batch = decode_batch(data)
    invariant(batch.epoch == epoch, f"committed batch at epoch {epoch} says {batch.epoch}")
    if local.last_epoch == 0 and epoch > 1:
        local.start_at(epoch)  # a peer's log pruned before this: begin where it begins
    local.append(epoch, data)
    if batch.flags & FLAG_DEPLOY:
        local.mark(epoch)  # its deploys are installed when this member leads


def copy_from_peer(local: CommandLog, batches: Iterable[bytes]) -> int:
    """Append a peer log service's batches that extend the local log; returns how many
    (those at or below the local last epoch are already here)."""
    copied = 0
    for data in batches:
        epoch = decode_batch(data).epoch
        if epoch <= local.last_epoch:
            continue
        if local.last_epoch and epoch != local.last_epoch + 1:
            break  # not contiguous: ask again from our last epoch
        append_committed(local, epoch, data)
        copied += 1
    if copied:
        local.sync()
    return copied


class ReplicatedLog:
    """The leader's view of its command log: every append is a commit to the store
    first, under the leader's term; reads come from the local log."""

    def __init__(self, local: CommandLog, store: OrderingStore, term: int) -> None:
        invariant(term > 0, "a replicated log needs a claimed term")
        invariant(
            local.last_epoch >= store.last_epoch(),
            f"leader's local log ends at {local.last_epoch}, store at {store.last_epoch()}: "
            "copy the committed batches first",
        )
        self.local = local
        self.store = store
        self.term = term

    @property
    def last_epoch(self) -> int:
        return self.local.last_epoch

    @property
    def first_epoch(self) -> int:
        return self.local.first_epoch

    def append(self, epoch: int, data: bytes) -> None:
        self.store.commit(self.term, epoch, data)  # Deposed / CommitUnknown: step down
        self.local.append(epoch, data)

    def mark(self, epoch: int) -> None:
        self.local.mark(epoch)

    def sync(self) -> None:
        """The Sequencer's per-epoch durability point. Here the batch is durable once
        ``append`` returns (a ZooKeeper quorum fsynced it), so the local log is not
        fdatasynced per epoch: its owner syncs it every ``limits.sequencer_local_sync_s``
        and before it reports progress (which decides what the store may trim), and
        reads of the newest frames flush the buffer themselves."""

    def read(self, epoch: int) -> bytes:
        return self.local.read(epoch)

    def read_range(self, first: int, last: int) -> list[tuple[int, bytes]]:
        return self.local.read_range(first, last)

    def delete_segments_before(self, epoch: int, archive_dir: object = None) -> list:
        return self.local.delete_segments_before(epoch, archive_dir)  # type: ignore[arg-type]

    def close(self) -> None:
        self.local.close()


def trim_point(last_epoch: int, progress: dict[int, int], members: int) -> int:
    """The newest epoch the tail may drop: every member has it locally, and the tail
    keeps at most ``limits.zk_tail_epochs_max`` epochs whatever a lagging member says
    (that member then copies from a peer's log service)."""
    every = min(progress.get(m, 0) for m in range(members)) if members else last_epoch
    return max(min(every, last_epoch), last_epoch - limits.zk_tail_epochs_max)


class MemoryStore:
    """An OrderingStore in memory: the simulator's and the unit tests' ZooKeeper.

    ``available`` False makes every call raise CommitUnknown (a store cut off)."""

    def __init__(self) -> None:
        self.term = 0
        self.batches: dict[int, bytes] = {}
        self.last = 0
        self.first = 1
        self.members: dict[int, int] = {}
        self.available = True

    def _check(self) -> None:
        if not self.available:
            raise CommitUnknown("ordering store unreachable")

    def claim_term(self) -> int:
        self._check()
        self.term += 1
        return self.term

    def commit(self, term: int, epoch: int, data: bytes) -> None:
        self._check()
        if term != self.term:
            raise Deposed(f"term {term} is not the current term {self.term}")
        if epoch != self.last + 1:
            raise Deposed(f"epoch {epoch} is not the next epoch {self.last + 1}")
        self.batches[epoch] = data
        self.last = epoch

    def last_epoch(self) -> int:
        self._check()
        return self.last

    def read(self, epoch: int) -> bytes | None:
        self._check()
        return self.batches.get(epoch)

    def tail_first_epoch(self) -> int:
        self._check()
        return self.first

    def report_progress(self, member: int, last_epoch: int) -> None:
        self._check()
        self.members[member] = last_epoch

    def progress(self) -> dict[int, int]:
        self._check()
        return dict(self.members)

    def trim_through(self, epoch: int) -> int:
        self._check()
        dropped = 0
        while self.first <= min(epoch, self.last):
            del self.batches[self.first]
            self.first += 1
            dropped += 1
        return dropped
