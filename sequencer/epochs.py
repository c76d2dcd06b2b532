"""Epochs and batches: cut a batch from the pending calls, stamp it, make it durable in
the command log, hand it out; flow control; checkpoint flags; the log service; stopping
(fail-stop when the log fails, step-down when another sequencer leads).

Owner of the epoch, the txn ids, the batch timestamp and digest chain, the command
log's writes, the published-but-unapplied bytes, and ``failed`` / ``deposed`` (which
intake.py reads to refuse calls). It takes each batch from the pending calls that
intake.py owns, adds the batch's calls to the in-flight table that results.py owns
(and bounds its backlog), and reads the partitions' reports that results.py records
(flow control). Fail-stop and step-down empty the pending calls, the in-flight table
and the query table (queries.py), and answer every call in them.

Invariants:
- Epochs are consecutive; each batch carries (epoch, prev_epoch) and consecutive txn
  ids, and is at most ``batch_bytes_max`` bytes (calls that do not fit wait for the
  next epoch, in order). A batch is appended to the command log and synced *before*
  ``tick`` returns it, so nothing is published (hence executed or acknowledged)
  before it is durable. With a replicated ordering layer the command log is a
  ``sequencer.replication.ReplicatedLog``: appending commits the batch to the quorum
  store under this leader's ``term`` (carried in every batch) first; when that fails
  (``NotLeader``) the sequencer steps down for good: the batch is not published, and
  every call not yet answered gets ERR_NOT_LEADER, so its client resends it, same
  ids, to the new leader. Flow control: no batch is cut while the partitions' fastest
  live replicas are ``unapplied_bytes_max`` behind (a slow replica never holds back
  the others).
- Each batch takes the pending calls round robin between connections, a quantum per
  round, so one client's flood delays another's calls by at most a quantum per round
  (sequencer.fair).
- Within a batch, multi-partition calls come after single-partition ones (they hold
  their locks until peers' reads arrive); a connection's calls keep the order it sent
  them in, unless it sent them as unordered (REQ_CALLS_UNORDERED): sequencer.batch_order.
- A batch is its calls' bytes, each encoded once when it was accepted (intake.py),
  joined under a batch header (byte-identical to packing the batch as a whole).
- The batch fixes every source of nondeterminism: one timestamp and one seed per
  batch (a txn's own seed is derived from the batch seed and its txn id). Batch
  timestamps never decrease along the log, across restarts and leaders.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable

import msgpack

from sequencer.batch_order import multi_partition_last
from sequencer.calls import InFlight, PendingCall, parse_log_fetch, serve_log_fetch
from sequencer.deploys import Deploys
from sequencer.fair import FairQueues
from sequencer.log import CommandLog
from sequencer.outbox import Outbox
from sequencer.queries import Queries
from sequencer.replication import NotLeader, ReplicatedLog
from sequencer.status import PARTITION_SILENT_S, SequencerStats
from txn_library import limits
from txn_library.errors import ERR_NOT_LEADER, ERR_UNAVAILABLE, ERROR, invariant
from txn_library.wire.sequencer import (
    FLAG_CHECKPOINT,
    FLAG_CHECKPOINT_REQUESTED,
    FLAG_DEPLOY,
    FLAG_DERIVED_UNLOGGED,
    batch_digest,
    decode_batch,
)

log = logging.getLogger("ordo.sequencer")


class Epochs:
    def __init__(
        self,
        command_log: CommandLog | ReplicatedLog,
        pending: FairQueues[PendingCall],
        inflight: OrderedDict[int, InFlight],
        queries: Queries,
        outbox: Outbox,
        stats: SequencerStats,
        heard_at: dict[tuple[int, int], float],
        *,
        partitions: int,
        checkpoint_every_epochs: int,
        checkpoint_every_s: float,
        clock: Callable[[], float],
        seed_source: Callable[[], int],
        term: int,
        dataflow_recovery: str = "strong",
    ) -> None:
        invariant(dataflow_recovery in ("strong", "weak"), "dataflow recovery: strong or weak")
        # strong: a batch logs what its pushes derive after its calls; weak: it logs
        # their count only (FLAG_DERIVED_UNLOGGED) and every reader derives them
        self.weak_dataflows = dataflow_recovery == "weak"
        self.log = command_log
        self.term = term  # the leader term every batch carries (0: no replication)
        self.partitions = partitions
        self.checkpoint_every_epochs = checkpoint_every_epochs
        self.checkpoint_every_s = checkpoint_every_s
        self.clock = clock
        self.seed_source = seed_source
        self._pending = pending
        self._inflight = inflight
        self._queries = queries
        self._reply = outbox.reply
        self.stats = stats
        self._heard_at = heard_at
        self._checkpoint_requested = False
        # A new leader's first batch goes out at once, even empty (Raft's no-op entry):
        # it commits the term, so partitions and followers learn it from the log.
        self._term_batch_due = term > 0
        self._last_checkpoint_ms: int | None = None
        # Fail-stop: once the log cannot be written or synced, nothing is accepted.
        self.failed: str | None = None
        # Stepped down: another sequencer leads (or the store is unreachable).
        self.deposed: str | None = None
        self.epoch = command_log.last_epoch
        self.next_txn_id = self._next_txn_id_from_log()
        self._last_timestamp_ms = (
            decode_batch(self.log.read(self.epoch)).timestamp_ms if self.epoch else 0
        )
        # batch_digest of the last logged batch: the next batch records it (wire doc)
        self._prev_digest = batch_digest(self.log.read(self.epoch)) if self.epoch else 0
        self._published: deque[tuple[int, int]] = deque()  # (epoch, bytes) not yet applied
        self._published_bytes = 0
        self._packer = msgpack.Packer(autoreset=True)
        self.deploys: Deploys | None = None  # the Sequencer sets it (sequencer.deploys)

    def _next_txn_id_from_log(self) -> int:
        if self.log.last_epoch == 0:
            return 0
        return decode_batch(self.log.read(self.log.last_epoch)).next_txn_id

    def has_pending(self) -> bool:
        return bool(self._pending)

    def batch_full(self) -> bool:
        """A whole batch is waiting: cut it now rather than at the end of the epoch."""
        p = self._pending
        return len(p) >= limits.batch_txns_max or p.total_bytes >= limits.batch_bytes_max

    def request_checkpoint(self) -> int:
        """Flag the next batch (sent even if empty); returns the epoch it will carry."""
        self._checkpoint_requested = True
        return self.epoch + 1

    def _checkpoint_flag(self, epoch: int, now_ms: int) -> int:
        """FLAG_CHECKPOINT at a periodic boundary; with FLAG_CHECKPOINT_REQUESTED when a
        client asked for it (every partition writes that one: wire.py)."""
        requested = due = self._checkpoint_requested
        if self.checkpoint_every_epochs and epoch % self.checkpoint_every_epochs == 0:
            due = True
        if self.checkpoint_every_s:
            if self._last_checkpoint_ms is None:
                self._last_checkpoint_ms = now_ms
            elif now_ms - self._last_checkpoint_ms >= self.checkpoint_every_s * 1000:
                due = True
        if due:
            self._checkpoint_requested = False
            self._last_checkpoint_ms = now_ms
            return FLAG_CHECKPOINT | (FLAG_CHECKPOINT_REQUESTED if requested else 0)
        return 0

    def tick(self, now_ms: int) -> bytes | None:
        """Cut one batch from the pending calls, make it durable, return its bytes.

        The batch takes calls round robin between clients, up to ``batch_txns_max``
        calls and ``batch_bytes_max`` bytes; the rest wait for the next epoch, in
        order. Within the batch, multi-partition calls go last, except that a
        connection's ordered calls keep their order (sequencer.batch_order). Returns
        None when there is nothing to send or the log has failed (fail-stop: the calls
        of a batch that could not be made durable are answered ``unavailable``,
        outcome unknown, and nothing more is accepted).
        """
        if self.failed is not None or self.deposed is not None:
            return None
        forced = self._checkpoint_requested or self._term_batch_due
        if not (self._pending or forced):
            return None
        if not forced and self.unapplied_bytes() >= limits.unapplied_bytes_max:
            return None  # flow control: the replicas are behind; calls wait here, fairly
        calls = self._pending.take(
            limits.batch_quantum_calls,
            limits.batch_txns_max,
            limits.batch_bytes_max - limits.batch_overhead_bytes_max,
        )
        calls = multi_partition_last(calls)  # sequencer.batch_order: why, and what it keeps
        deploys = self.deploys.in_batch(calls) if self.deploys is not None else []
        first = self.next_txn_id
        epoch = self.epoch + 1
        for i, c in enumerate(calls):
            self._inflight[first + i] = InFlight(c)
            c.epoch = epoch  # its answer names it (the client's read-your-writes token)
        # Batch time never goes back, even when a new leader's clock is behind.
        now_ms = max(now_ms, self._last_timestamp_ms)
        flags = self._checkpoint_flag(epoch, now_ms)
        # What the batch's pushes derive (txn_library.streams): after every call.
        derived = [c for c in calls if c.derived_txns]
        n_derived = sum(c.derived_txns for c in derived)
        logged_derived = [c.derived for c in derived] if not self.weak_dataflows else []
        if n_derived and self.weak_dataflows:
            flags |= FLAG_DERIVED_UNLOGGED
        if deploys:
            flags |= FLAG_DEPLOY
        unlogged = n_derived if self.weak_dataflows else 0
        p = self._packer
        data = b"".join(
            [
                p.pack_array_header(10 if unlogged else 9),
                p.pack(epoch),
                p.pack(self.epoch),
                p.pack(first),
                p.pack(now_ms),
                p.pack(self.seed_source()),  # logged: replay sees the same
                p.pack_array_header(len(calls) + (n_derived if logged_derived else 0)),
                *[c.encoded for c in calls],
                *logged_derived,
                p.pack(flags),
                p.pack(self._prev_digest),
                p.pack(self.term),
                *([p.pack(unlogged)] if unlogged else []),
            ]
        )
        invariant(len(data) <= limits.batch_bytes_max, f"batch of {len(data)} bytes over bound")
        try:
            self.log.append(epoch, data)
            if deploys:
                self.log.mark(epoch)  # found at the next start (sequencer.deploys)
            self.log.sync()
        except OSError as e:
            self._fail(f"command log write/sync failed at epoch {epoch}: {e}", first)
            return None
        except NotLeader as e:
            self.step_down(f"commit of epoch {epoch} refused: {e}")
            return None
        _release_logged(calls)
        self.epoch = epoch
        self._published.append((epoch, len(data)))
        self._published_bytes += len(data)
        self._prev_digest = batch_digest(data)
        self._last_timestamp_ms = now_ms
        self._term_batch_due = False
        self.next_txn_id = first + len(calls) + n_derived
        self.stats.epochs += 1
        self.stats.txns_sequenced += len(calls)
        self.stats.txns_derived += n_derived
        while len(self._inflight) > limits.result_backlog_txns_max:
            self._inflight.popitem(last=False)
        if deploys:  # in the log: installed here, waiting calls checked again
            assert self.deploys is not None
            self.deploys.logged(epoch, deploys)
        return data

    def unapplied_bytes(self) -> int:
        """Bytes of published batches not yet applied everywhere it counts: for each
        partition, by its fastest live replica (a slow or recovering replica must not
        stop the others). Partitions nobody has heard from recently do not count."""
        applied = self._applied_everywhere()
        q = self._published
        while q and q[0][0] <= applied:
            self._published_bytes -= q.popleft()[1]
        return self._published_bytes

    def _applied_everywhere(self) -> int:
        now = self.clock()
        fastest: dict[int, int] = {}
        for (r, p), st in self.stats.partitions.items():
            if now - self._heard_at.get((r, p), now) > PARTITION_SILENT_S:
                continue
            if st.catching_up:
                continue  # catching up from the log: it reads batches at its own pace
            fastest[p] = max(fastest.get(p, 0), st.last_epoch)
        if len(fastest) < self.partitions:
            return self.epoch  # a partition with no live replica: nothing to wait for
        return min(fastest.values())

    def log_fetch_reply(self, frame: bytes) -> bytes | None:
        """The log service's answer to a raw LOG_FETCH frame (None: malformed, or
        fail-stopped; ``parse_log_fetch`` tells which)."""
        request = parse_log_fetch(frame)
        return None if request is None else self.log_reply(*request)

    def log_reply(self, first: int, last: int) -> bytes | None:
        """The log service's answer to LOG_FETCH(first, last): LOG_BATCHES with the
        batches from ``first`` on, at most ``log_service_epochs_per_reply_max`` of them
        and ``log_service_reply_bytes_max`` bytes (at least one), and the last epoch on
        disk. None once fail-stopped: the log refuses reads until a restart."""
        if self.failed is not None:
            return None
        return serve_log_fetch(self.log, first, last)

    def step_down(self, reason: str) -> None:
        """Stop leading for good (this object is discarded; the process follows).

        Every call not yet answered was not sequenced by us, or was committed and will
        be answered by the next leader: either way its client resends it with the same
        ids, and the next leader's retry cache (rebuilt from the log) runs it once."""
        if self.deposed is not None:
            return
        self.deposed = reason
        log.warning("stepping down as leader (term %d): %s", self.term, reason)
        doomed = [f.call for f in self._inflight.values()] + self._pending.drain()
        doomed += self._queries.drain()
        self._inflight.clear()
        for call in doomed:
            self._reply(call.identity, call.req_id, ERROR, (ERR_NOT_LEADER, reason))

    def _fail(self, reason: str, first_txn_id: int) -> None:
        """Stop for good: never acknowledge what might not be durable."""
        self.failed = reason
        log.critical("FAIL-STOP: %s; refusing all calls until restarted", reason)
        doomed = [f.call for t, f in self._inflight.items() if t >= first_txn_id]
        doomed += self._pending.drain()
        for t in [t for t in self._inflight if t >= first_txn_id]:
            del self._inflight[t]
        for call in doomed:
            self._reply(
                call.identity, call.req_id, ERROR, (ERR_UNAVAILABLE, f"outcome unknown: {reason}")
            )


def _release_logged(calls: list[PendingCall]) -> None:
    """Drop what a logged call no longer needs: its encoded txn and derived steps (the
    log holds them), and its arguments unless a restart may re-sequence it (a dependent
    call's new prediction replaces its last argument: results.py). Its call object
    waits in the in-flight table until every replica answered, which with a replica
    down is ``result_backlog_txns_max`` calls: without this each kept a second copy of
    its arguments, a 0.9 MB kv.put two."""
    for c in calls:
        c.encoded = c.derived = b""
        if not c.proc.dependent:
            c.args = ()
