"""Reliable, totally ordered batch delivery to one partition, without sockets.

Batches reach a partition over PUB/SUB, which may drop or (across a reconnect)
reorder them, and from the sequencer's log service on request. ``BatchFeed`` turns
both into what the Partition role needs: every batch exactly once, in epoch order.
The live partition process and the whole-cluster simulator drive the same object
(its owner moves the bytes and says what time it is).

Invariants:
- A batch reaches ``Partition.on_batch`` only when its epoch is ``last_epoch + 1``;
  a batch at or below ``last_epoch`` is dropped, one ahead of a gap is held back.
- Nothing is applied while the partition waits for a checkpoint (``checkpoint_due``);
  the owner calls ``apply_held`` once it has taken it.
- While the owner sets ``hold_for_peers``, the next batch is not applied while a
  multi-partition txn of an earlier one is unfinished here (``Partition.multi_waiting``);
  the owner calls ``apply_held`` when reads arrive or it clears the flag. This changes
  when a batch starts, never what it computes: the lock manager grants in the same
  serial order either way. Why hold: a batch run while such a txn waits for a slower
  peer puts every txn that shares a lock with it through the lock table (~10 us of CPU
  per txn more), which pays while the core would otherwise idle and costs throughput
  when cores are contended (the owner decides which: cluster.processes.SpareCores).
  Liveness: the lowest-numbered unfinished multi-partition txn has every lock at every
  participant (all earlier txns are done) and each participant has admitted it (a
  participant holds only batches after one with an unfinished earlier txn), so its
  reads are sent and it finishes. A peer that is down would hold it for good, so
  ``pace`` lets one batch wait at most ``peer_hold_max``, then runs ahead for
  ``peer_hold_retry`` (live: ``limits.peer_hold_s_max``, ``PEER_HOLD_RETRY_S``). Nor
  does it hold while more than ``BACKLOG_HOLD_MAX`` batches wait: a partition behind
  (catching up after a restart) would pay a round trip to its peers per batch.
- ``caught_up`` (the partition is live) once the log's end was heard, every epoch
  known is applied and every transaction of the epochs applied when that first held
  has finished; it does not wait for an idle moment, which continuous load never
  gives.
- ``known_last_epoch`` only grows: the highest epoch seen in a batch, a heartbeat or
  a log-service reply.
- ``term`` only grows: the newest leader term seen in a published batch or a
  heartbeat. A published batch or heartbeat of an older term (a deposed leader still
  talking) is ignored; ``leader`` is the sequencer that sent the newest term's
  heartbeat: results go there. Batches from the log service are committed history
  and are taken whatever their term. While it is above ``last_epoch`` the feed asks the log service
  for the gap (``repair``), at most once per ``repair_retry`` unless a reply came in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from executor.deterministic.partition import Partition
from txn_library.wire import sequencer as swire

STATUS_EVERY_S = 0.2  # a partition reports its status at least this often
REPAIR_RETRY_S = 0.5  # an unanswered log fetch is asked again after this long
# After one batch waited limits.peer_hold_s_max for peers, batches run ahead (as on idle
# cores) this long before holding again: a peer that is down costs a tenth of the time.
PEER_HOLD_RETRY_S = 1.0
# Batches known and not applied past which a partition runs ahead whatever its cores
# (pace): one catching up (after a restart, or behind a slow peer) would otherwise
# wait a round trip to its peers for every batch of its backlog.
BACKLOG_HOLD_MAX = 2


class BatchFeed:
    def __init__(
        self,
        part: Partition,
        repair_retry: float,
        on_offer: Callable[[swire.Batch], swire.Batch] | None = None,
        interleave: Callable[[], None] | None = None,
        peer_hold_max: float = 0.0,
        peer_hold_retry: float = 0.0,
    ) -> None:
        self.part = part
        # How long one batch may wait for peers, and how long batches then run ahead
        # (the owner's clock units; see pace). 0: never hold.
        self.peer_hold_max = peer_hold_max
        self.peer_hold_retry = peer_hold_retry
        self._held_since: tuple[int, float] | None = None  # (epoch held, since when)
        self._hold_again_at = 0.0
        self.peer_holds_expired = 0
        self.interleave = interleave  # passed to Partition.on_batch
        self.repair_retry = repair_retry  # in the owner's clock units
        # The simulator's hook to plant a bug in what one partition receives.
        self.on_offer = on_offer
        self.held: dict[int, swire.Batch] = {}  # epoch -> batch, arrived ahead of a gap
        self.hold_for_peers = False  # the owner's choice (module docstring)
        self.known_last_epoch = 0
        self.heard = False  # a heartbeat or log reply came: we know the sequencer's epoch
        self.term = 0
        self.leader = 0
        self.stale_dropped = 0  # published batches and heartbeats of an older term
        self._repair_sent_at: float | None = None
        self._head: int | None = None  # last_epoch when first nothing known was left

    def offer(self, data: bytes, published: bool = False, publisher: int | None = None) -> None:
        """A batch's bytes, from PUB/SUB (``published``; ``publisher``: the sequencer
        whose publication it came on) or the log service.

        A published batch of the newest term names its leader: results of the
        transactions in it go there at once. (Waiting for the leader's heartbeat would
        send them to the old leader: a busy leader publishes batches, not heartbeats,
        and results sent to a dead leader are lost for good.)"""
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
        if epoch <= self.part.last_epoch:
            return
        self.held[epoch] = batch if self.on_offer is None else self.on_offer(batch)
        self.apply_held()

    def apply_held(self) -> None:
        part, held = self.part, self.held
        while part.checkpoint_due is None and part.last_epoch + 1 in held:
            if self.hold_for_peers and part.multi_waiting:
                return
            part.on_batch(held.pop(part.last_epoch + 1), self.interleave)

    def pace(self, now: float, contended: bool) -> bool:
        """The owner's turn: hold batches for peers while ``contended`` (the owner's
        judgement of its cores), one batch at most ``peer_hold_max``; True when a hold
        just ran out (batches then run ahead for ``peer_hold_retry``)."""
        hold = (
            contended
            and self.peer_hold_max > 0
            and now >= self._hold_again_at
            and self.behind() <= BACKLOG_HOLD_MAX
        )
        expired = False
        if hold and self.held_for_peers():
            epoch = self.part.last_epoch + 1
            if self._held_since is None or self._held_since[0] != epoch:
                self._held_since = (epoch, now)
            elif now - self._held_since[1] >= self.peer_hold_max:
                hold, expired = False, True
                self._hold_again_at = now + self.peer_hold_retry
                self.peer_holds_expired += 1
        else:
            self._held_since = None
        if hold != self.hold_for_peers:
            self.hold_for_peers = hold
            if not hold:
                self.apply_held()
        return expired

    def after_reads(self) -> None:
        """Peers' reads reached the partition: a batch held for them may run now."""
        if self.hold_for_peers and self.held:
            self.apply_held()

    def held_for_peers(self) -> bool:
        """The next batch is here and, while ``hold_for_peers``, an unfinished
        multi-partition txn is what keeps it from running; False once it is applied."""
        part = self.part
        return (
            part.checkpoint_due is None and part.multi_waiting and part.last_epoch + 1 in self.held
        )

    def heartbeat(self, last_epoch: int, term: int = 0, leader: int | None = None) -> bool:
        """A leader's heartbeat (or a log reply's last epoch: ``leader`` None); False if
        it came from a deposed leader and was ignored."""
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
        """The owner asked the log service itself (e.g. a catch-up at start)."""
        self._repair_sent_at = now

    def repair(self, now: float) -> tuple[int, int] | None:
        """The epochs to fetch from the log service now, or None."""
        want = self.part.last_epoch + 1
        if self.known_last_epoch < want:
            return None
        sent = self._repair_sent_at
        if sent is not None and now - sent < self.repair_retry:
            return None
        last = self.known_last_epoch
        if self.held:
            last = min(self.held) - 1
            if last < want:
                return None
        self._repair_sent_at = now
        return want, last

    def caught_up(self) -> bool:
        """Whether the partition is live: it has heard where the log ends, applied every
        epoch known, and finished every transaction of the epochs it had applied when it
        first got there (the history it replayed, with the reads its peers resent).
        Not idle: under load a partition always has transactions of the newest epochs
        in flight, and one that waited for an idle moment could wait as long as the
        load lasts."""
        if not self.heard or self.behind() > 0:
            return False
        if self._head is None:
            self._head = self.part.last_epoch
        return self.part.completed_epoch() >= self._head

    def behind(self) -> int:
        """Epochs known to exist that are not applied yet."""
        return self.known_last_epoch - self.part.last_epoch
