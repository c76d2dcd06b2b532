"""The sequencer role: validate calls, fix their order in epochs, log, hand out batches.

No sockets, clock or entropy of its own: ``on_frame`` takes one raw client frame,
``run_intake`` validates queued calls, ``on_results_message`` takes a partition's
report, ``tick`` cuts a batch; replies and queries accumulate in outboxes that the
process loop sends. The clock and the seed source are parameters.

Invariants:
- A call is validated (request shape, procedure exists, arguments match its schema
  and encode, footprint well formed, size bounds) before it is accepted; a rejected
  call gets an ERROR reply and never reaches the log. Nothing a client sends raises
  out of ``on_frame`` / ``run_intake``.
- Work is shared fairly: decoded calls wait in per-connection queues and are
  validated round robin, a bounded amount per turn; accepted calls wait in
  per-connection queues and each batch takes from them round robin, so one client's
  flood delays another's calls by at most a quantum per round (sequencer.fair).
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
- Within a batch, multi-partition calls come after single-partition ones (they hold
  their locks until peers' reads arrive); a connection's calls keep the order it sent
  them in, unless it sent them as unordered (REQ_CALLS_UNORDERED): sequencer.batch_order.
- Each call is encoded once, when it is accepted; a batch is those bytes joined
  under a batch header (byte-identical to packing the batch as a whole).
- The batch fixes every source of nondeterminism: one timestamp and one seed per
  batch (a txn's own seed is derived from the batch seed and its txn id). Batch
  timestamps never decrease along the log, across restarts and leaders.
- The first replica's result for a txn goes to the client; every later replica's
  result is compared with it; a mismatch is a determinism violation: counted and
  logged loudly.
- Dependent calls (procedure with ``recon``) first run their reconnaissance read at
  one replica; the prediction becomes the call's last argument. A RESTART result
  re-sequences the call with the fresh prediction, at most ``dependent_restarts_max``
  times.
- Exactly once: a (client_id, req_id) is sequenced at most once; a retry gets the
  original answer, and a different call reusing the ids gets ERR_REQUEST_ID_REUSED
  (sequencer.retry_cache).
- Bounded: queued, pending and in-flight calls and their bytes stay under the bounds
  in cluster/limits.py, per client and in total; above them a call gets
  ERR_OVERLOADED.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from sequencer.batch_order import multi_partition_last
from sequencer.calls import (
    InFlight,
    PendingCall,
    is_req_id,
    os_seed,
    parse_log_fetch,
    participants,
    results_problem,
    serve_log_fetch,
    shown_value,
)
from sequencer.fair import FairQueues
from sequencer.log import CommandLog
from sequencer.replication import NotLeader, ReplicatedLog
from sequencer.retry_cache import (
    Done,
    Logged,
    RetryCache,
    call_body,
    call_digest,
)
from sequencer.status import PARTITION_SILENT_S, SequencerStats, status_report
from txn_library import limits, placement, wire
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_NOT_LEADER,
    ERR_OVERLOADED,
    ERR_RESTARTS_EXHAUSTED,
    ERR_RETRY_EXPIRED,
    ERR_TOO_LARGE,
    ERR_UNAVAILABLE,
    ERROR,
    OK,
    RESTART,
    BadRequest,
    brief,
    invariant,
)
from txn_library.heap import gc_paused
from txn_library.partition_wire import RESULT_LOOKUP, PartitionStatus, Results
from txn_library.procedure import Procedure, lookup
from txn_library.wire import (
    FLAG_CHECKPOINT,
    FLAG_CHECKPOINT_REQUESTED,
    CallsRequest,
    ErrorReply,
    OkReply,
    Packed,
    PruneRequest,
    StatusReply,
    Txn,
    batch_digest,
    decode_batch,
    unpack,
)

HEARTBEAT_MS = 100  # an idle sequencer publishes its last epoch this often

log = logging.getLogger("ordo.sequencer")

# A partition reports at least every 0.2 s; silent this long, it is shown as down.
_TXN_HEADER = msgpack.packb([None] * 5)[:1]  # fixarray of the txn's 5 fields
_ARCHIVE_PATH_MAX = 4096


class Sequencer:
    def __init__(
        self,
        command_log: CommandLog | ReplicatedLog,
        replicas: int,
        partitions: int,
        *,
        checkpoint_every_epochs: int = 0,
        checkpoint_every_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        seed_source: Callable[[], int] = os_seed,
        term: int = 0,
    ) -> None:
        self.log = command_log
        self.term = term  # the leader term every batch carries (0: no replication)
        self.replicas = replicas
        self.partitions = partitions
        self.checkpoint_every_epochs = checkpoint_every_epochs
        self.checkpoint_every_s = checkpoint_every_s
        self.clock = clock
        self.seed_source = seed_source
        self._checkpoint_requested = False
        # A new leader's first batch goes out at once, even empty (Raft's no-op entry):
        # it commits the term, so partitions and followers learn it from the log.
        self._term_batch_due = term > 0
        self._last_checkpoint_ms: int | None = None
        # Fail-stop: once the log cannot be written or synced, nothing is accepted.
        self.failed: str | None = None
        # Stepped down: another sequencer leads (or the store is unreachable).
        self.deposed: str | None = None
        # (partition, epoch) -> (replica, hash) at checkpoint boundaries, compared
        # across replicas.
        self._boundaries: OrderedDict[tuple[int, int], tuple[int, int]] = OrderedDict()
        self._logged_txns: dict[int, tuple[bytes, Any]] = {}  # txn id -> (client, req)
        self._heard_at: dict[tuple[int, int], float] = {}  # clock time of last status
        self.epoch = command_log.last_epoch
        self.next_txn_id = self._next_txn_id_from_log()
        self._last_timestamp_ms = (
            decode_batch(self.log.read(self.epoch)).timestamp_ms if self.epoch else 0
        )
        # batch_digest of the last logged batch: the next batch records it (wire doc)
        self._prev_digest = batch_digest(self.log.read(self.epoch)) if self.epoch else 0
        self.stats = SequencerStats()
        # The process adds who it is to every status report (role, member, pid, ...).
        self.status_extra: Callable[[], dict] | None = None
        # (identity, client_id, calls, unordered): a slice of one client frame
        self._intake: FairQueues[tuple[bytes, bytes, tuple, bool]] = FairQueues()
        self._pending: FairQueues[PendingCall] = FairQueues()
        self._inflight: OrderedDict[int, InFlight] = OrderedDict()
        self._published: deque[tuple[int, int]] = deque()  # (epoch, bytes) not yet applied
        self._published_bytes = 0
        self._queries: dict[int, tuple[PendingCall, bool]] = {}  # query id -> (call, is_recon)
        # Query ids start at a random point in each incarnation: a partition's answer to
        # a query of a previous incarnation must never match a new query.
        self._next_query_id = self.seed_source() >> 2
        self._query_rr = 0
        self.retries = RetryCache()
        self._packer = msgpack.Packer(autoreset=True)
        self.client_out: dict[bytes, list] = {}
        self.control_out: list[tuple[bytes, OkReply | ErrorReply | StatusReply]] = []
        self.query_out: dict[tuple[int, int], list] = {}
        self._rebuild_retries()

    # Startup ------------------------------------------------------------------
    def _next_txn_id_from_log(self) -> int:
        if self.log.last_epoch == 0:
            return 0
        return decode_batch(self.log.read(self.log.last_epoch)).next_txn_id

    def _rebuild_retries(self) -> None:
        """Remember which (client, request) pairs the log already holds.

        After a restart, a retried call that was logged before the crash must not run
        again: it is answered with the original result (from the replicas' result
        cache, or from the result still on its way here).
        """
        last = self.log.last_epoch
        if not last:
            return
        first = max(self.log.first_epoch, last - limits.retry_rebuild_epochs_max)
        for _epoch, data in self.log.read_range(first, last):
            batch = decode_batch(data)
            txn_id = batch.first_txn_id
            for txn in batch.txns:
                if txn.client_id:
                    key = (txn.client_id, txn.req_id)
                    args = txn.args
                    try:
                        if lookup(txn.proc).dependent:
                            args = args[:-1]  # the prediction is not part of the call
                    except BadRequest:
                        pass  # a procedure no longer registered: its digest is as logged
                    digest = call_digest(call_body(txn.proc, args))
                    self.retries.log(key, Logged(txn_id, digest, _epoch))
                    self._logged_txns[txn_id] = key
                txn_id += 1
        while len(self._logged_txns) > limits.pending_calls_max:
            self._logged_txns.pop(next(iter(self._logged_txns)))

    # Client frames ------------------------------------------------------------
    def reply(self, identity: bytes, req_id: Any, status: int, value: Any) -> None:
        self.client_out.setdefault(identity, []).append((req_id, status, value))

    def _error(self, identity: bytes, req_id: Any, code: str, message: str) -> None:
        self.stats.calls_rejected += 1
        if code == ERR_OVERLOADED:
            self.stats.calls_overloaded += 1
        self.reply(identity, req_id, ERROR, (code, message))

    def on_frame(self, identity: bytes, frame: bytes) -> None:
        """One raw client frame: decode, check its shape, queue its calls or answer it.

        Never raises for anything a client can send; every problem is an ERROR reply.
        """
        if len(frame) > limits.request_bytes_max:
            self._error(
                identity,
                None,
                ERR_TOO_LARGE,
                f"frame of {len(frame)} bytes exceeds {limits.request_bytes_max}",
            )
            return
        try:
            with gc_paused():  # up to 10,000 calls of acyclic tuples (txn_library.heap)
                msg = unpack(frame)
        except (ValueError, TypeError) as e:  # msgpack's errors (format, depth, extra
            # data, non-string map keys) are ValueErrors; an unhashable key a TypeError
            self._error(identity, None, ERR_MALFORMED, f"not msgpack: {type(e).__name__}")
            return
        if not isinstance(msg, tuple) or not msg or type(msg[0]) is not int:
            self._error(identity, None, ERR_MALFORMED, "a request is [kind:int, ...]")
            return
        kind = msg[0]
        if kind in wire.CALLS_KINDS:
            if len(msg) != 3:
                self._error(
                    identity, None, ERR_MALFORMED, "REQ_CALLS is [kind, client_id, [calls]]"
                )
                return
            request = CallsRequest._make(msg[1:])  # fields checked by _queue_calls
            unordered = kind == wire.REQ_CALLS_UNORDERED
            self._queue_calls(identity, request.client_id, request.calls, len(frame), unordered)
        elif kind == wire.REQ_STATUS:
            self.control_out.append((identity, StatusReply(self.status_report())))
        elif kind == wire.REQ_CHECKPOINT:
            self.control_out.append((identity, OkReply(self.request_checkpoint())))
        elif kind == wire.REQ_PRUNE:
            self.control_out.append((identity, self._prune_request(msg)))
        else:
            self._error(identity, None, ERR_MALFORMED, f"unknown request kind {kind}")

    def _prune_request(self, msg: tuple) -> OkReply | ErrorReply:
        if len(msg) != 2:
            return ErrorReply("REQ_PRUNE is [kind, archive_dir or None]")
        archive = PruneRequest._make(msg[1:]).archive_dir  # checked below
        if archive is not None and (
            not isinstance(archive, str) or not archive or len(archive) > _ARCHIVE_PATH_MAX
        ):
            return ErrorReply("archive must be a directory path (a string) or None")
        try:
            return OkReply(self.prune_log(archive))
        except BadRequest as e:
            return ErrorReply(e.message)
        except OSError as e:
            return ErrorReply(f"pruning failed: {e.strerror or e}")

    def _queue_calls(
        self, identity: bytes, client_id: Any, calls: Any, nbytes: int, unordered: bool
    ) -> None:
        if not isinstance(client_id, bytes) or len(client_id) > limits.client_id_bytes_max:
            self._error(
                identity,
                None,
                ERR_MALFORMED,
                f"client_id must be bytes (<= {limits.client_id_bytes_max})",
            )
            return
        if not isinstance(calls, tuple) or len(calls) > limits.calls_per_frame_max:
            self._error(
                identity,
                None,
                ERR_MALFORMED,
                f"calls must be an array of at most {limits.calls_per_frame_max} calls",
            )
            return
        if not calls:
            return
        intake = self._intake
        if intake.bytes_of(identity) + nbytes > limits.intake_client_bytes_max:
            for call in calls:
                req_id = call[0] if isinstance(call, tuple) and call else None
                self._error(
                    identity,
                    req_id if is_req_id(req_id) else None,
                    ERR_OVERLOADED,
                    "too many calls waiting for validation; retry later",
                )
            return
        # Slices of a quantum each: the unit of round-robin service (one per client per
        # round), and cheap to queue however many calls a frame holds.
        q, n = limits.intake_quantum_calls, len(calls)
        for i in range(0, n, q):
            part = calls[i : i + q]
            item = (identity, client_id, part, unordered)
            intake.push(identity, item, max(1, nbytes * len(part) // n))

    def has_intake(self) -> bool:
        return bool(self._intake)

    def intake_room(self) -> bool:
        """Whether another client frame may be read now (else it waits in ZeroMQ)."""
        return self._intake.total_bytes + limits.request_bytes_max <= limits.intake_bytes_max

    def run_intake(self, deadline: float | None = None) -> int:
        """Validate queued calls round robin between connections until ``deadline``
        (clock time; None: all of them). Returns how many were handled."""
        done = 0
        intake = self._intake
        on_call = self._on_call
        while intake:
            for identity, client_id, calls, unordered in intake.take(1, 4):
                for call in calls:
                    on_call(identity, client_id, call, unordered)
                done += len(calls)
            if deadline is not None and self.clock() >= deadline:
                break
        return done

    def on_calls(
        self, identity: bytes, client_id: Any, calls: Any, unordered: bool = False
    ) -> None:
        """Validate and accept a client's calls at once (in-process callers, tests)."""
        if not isinstance(client_id, bytes) or len(client_id) > limits.client_id_bytes_max:
            self._error(identity, None, ERR_MALFORMED, "client_id must be bytes (<= 64)")
            return
        if not isinstance(calls, tuple) or len(calls) > limits.calls_per_frame_max:
            self._error(identity, None, ERR_MALFORMED, "calls must be an array of calls")
            return
        for call in calls:
            self._on_call(identity, client_id, call, unordered)

    def _on_call(self, identity: bytes, client_id: bytes, call: Any, unordered: bool) -> None:
        if not isinstance(call, tuple) or len(call) not in (3, 4):
            self._error(
                identity, None, ERR_MALFORMED, "a call is [req_id, procedure, args(, replica)]"
            )
            return
        req_id, name, args = call[:3]
        if not is_req_id(req_id):
            self._error(identity, None, ERR_MALFORMED, "req_id must be an int64 >= 0")
            return
        replica = call[3] if len(call) == 4 else None
        if replica is not None and (type(replica) is not int or not 0 <= replica < self.replicas):
            self._error(identity, req_id, ERR_BAD_ARGUMENTS, f"no replica {brief(replica)}")
            return
        try:
            self._accept(identity, client_id, req_id, name, args, replica, unordered)
        except BadRequest as e:
            self._error(identity, req_id, e.code, e.message)

    def _accept(
        self,
        identity: bytes,
        client_id: bytes,
        req_id: int,
        name: Any,
        args: Any,
        replica: int | None = None,
        unordered: bool = False,
    ) -> None:
        proc = lookup(name)
        proc.validate(args)
        args = tuple(args)
        body = call_body(proc.name, args)
        digest = call_digest(body)
        key = (client_id, req_id)
        if client_id:
            seen = self.retries.retry_of(key, digest)
            if seen is not None:
                self._on_retry(identity, key, seen)
                return
        if self.deposed is not None:
            raise BadRequest(ERR_NOT_LEADER, f"not the leader: {self.deposed}")
        if self.failed is not None:
            raise BadRequest(ERR_UNAVAILABLE, f"sequencer stopped: {self.failed}")
        self._check_load(identity, len(body))
        call = PendingCall(identity, client_id, req_id, proc, args, (), digest)
        call.ordered = not unordered
        if proc.dependent:
            self._send_query(call, lookup(proc.recon), call.args, recon=True)
        elif proc.read_only:
            parts = self._participants(proc, call.args)
            if len(parts) == 1:
                self._send_query(
                    call, proc, call.args, recon=False, partition=parts[0], replica=replica
                )
            else:
                call.participants = parts
                self._enqueue(call, body)
        else:
            call.participants = self._participants(proc, call.args)
            self._enqueue(call, body)
        if client_id:
            self.retries.start(key, call)
        self.stats.calls_accepted += 1

    def _on_retry(self, identity: bytes, key: tuple[bytes, int], seen: Any) -> None:
        self.stats.duplicate_calls += 1
        if isinstance(seen, Done):
            self.reply(identity, key[1], seen.status, seen.value)
        elif isinstance(seen, Logged):
            # Logged before a restart: fetch the original result, never re-execute (a
            # fail-stopped sequencer cannot read its log: the client retries elsewhere).
            if self.failed is not None:
                raise BadRequest(ERR_UNAVAILABLE, f"sequencer stopped: {self.failed}")
            self._lookup_logged(identity, key, seen)
        else:
            seen.identity = identity  # in flight: answer the retry's connection
            if seen.query is not None:
                self._requery(seen)

    def _check_load(self, identity: bytes, nbytes: int) -> None:
        pending = self._pending
        if (
            len(pending) + len(self._inflight) + len(self._queries) >= limits.pending_calls_max
            or pending.total_bytes + nbytes > limits.pending_bytes_max
        ):
            raise BadRequest(ERR_OVERLOADED, "too many calls in flight; retry later")
        if (
            pending.count_of(identity) >= limits.client_pending_calls_max
            or pending.bytes_of(identity) + nbytes > limits.client_pending_bytes_max
        ):
            raise BadRequest(ERR_OVERLOADED, "this client has too many calls waiting; retry later")

    def _participants(self, proc: Procedure, args: tuple) -> tuple:
        return participants(proc, args, self.partitions)

    def _enqueue(self, call: PendingCall, body: bytes | None = None) -> None:
        """Encode the call as the txn the log will hold and queue it for a batch."""
        if body is None:
            body = call_body(call.proc.name, call.args)
        p = self._packer
        parts, client, req = call.participants, call.client_id, call.req_id
        encoded = b"".join((_TXN_HEADER, body, p.pack(parts), p.pack(client), p.pack(req)))
        if len(encoded) > limits.txn_bytes_max:
            raise BadRequest(
                ERR_TOO_LARGE, f"call encodes to {len(encoded)} bytes > {limits.txn_bytes_max}"
            )
        call.encoded = encoded
        self._pending.push(call.identity, call, len(encoded))

    def _send_query(
        self,
        call: PendingCall,
        proc: Procedure,
        args: tuple,
        *,
        recon: bool,
        partition: int | None = None,
        replica: int | None = None,
    ) -> None:
        if partition is None:
            parts = self._participants(proc, args)
            if len(parts) != 1:
                raise BadRequest(ERR_BAD_ARGUMENTS, f"{proc.name} must touch one partition")
            partition = parts[0]
        if replica is None:
            replica = self._next_replica()
        self.stats.queries += 1
        self._query(call, recon, replica, partition, (proc.name, args, self.next_txn_id - 1))

    def _next_replica(self) -> int:
        replica = self._query_rr % self.replicas
        self._query_rr += 1
        return replica

    def _query(
        self, call: PendingCall, recon: bool, replica: int, partition: int, body: tuple
    ) -> None:
        """Send one query (proc name, args, min txn id) and remember it on the call, so
        that a retry of the call can send it again if the answer never comes."""
        qid = self._next_query_id
        self._next_query_id += 1
        self._queries[qid] = (call, recon)
        call.query = (qid, recon, partition, body)
        self.query_out.setdefault((replica, partition), []).append((qid, replica, *body))

    def _requery(self, call: PendingCall) -> None:
        """The client retried a call whose query is unanswered: the partition it went to
        may have crashed with it, so ask again (the next replica in turn)."""
        invariant(call.query is not None, "requery of a call that sent no query")
        assert call.query is not None  # for mypy: invariant() raised otherwise
        qid, recon, partition, body = call.query
        if self._queries.pop(qid, None) is None:
            return  # answered meanwhile: the call is past its query
        self._query(call, recon, self._next_replica(), partition, body)

    def _lookup_logged(self, identity: bytes, key: tuple[bytes, int], entry: Logged) -> None:
        txn = self._logged_txn(entry)
        proc = lookup(txn.proc)
        args = txn.args
        fp = proc.footprint(*args)
        reporter = placement.reporter(fp.writes, txn.participants, self.partitions)
        call = PendingCall(identity, key[0], key[1], proc, args, txn.participants, entry.digest)
        call.lookup = True
        self.retries.start(key, call)
        body = (RESULT_LOOKUP, (entry.txn_id,), entry.txn_id)
        self._query(call, False, self._next_replica(), reporter, body)

    def _logged_txn(self, entry: Logged) -> Txn:
        batch = decode_batch(self.log.read(entry.epoch))
        txn = batch.txns[entry.txn_id - batch.first_txn_id]
        invariant(
            call_digest(call_body(txn.proc, txn.args)) == entry.digest
            or lookup(txn.proc).dependent,
            f"logged txn {entry.txn_id} is not the call the retry cache remembered",
        )
        return txn

    # Epochs -------------------------------------------------------------------
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
        first = self.next_txn_id
        epoch = self.epoch + 1
        for i, c in enumerate(calls):
            self._inflight[first + i] = InFlight(c)
        # Batch time never goes back, even when a new leader's clock is behind.
        now_ms = max(now_ms, self._last_timestamp_ms)
        flags = self._checkpoint_flag(epoch, now_ms)
        p = self._packer
        data = b"".join(
            [
                p.pack_array_header(9),
                p.pack(epoch),
                p.pack(self.epoch),
                p.pack(first),
                p.pack(now_ms),
                p.pack(self.seed_source()),  # logged: replay sees the same
                p.pack_array_header(len(calls)),
                *[c.encoded for c in calls],
                p.pack(flags),
                p.pack(self._prev_digest),
                p.pack(self.term),
            ]
        )
        invariant(len(data) <= limits.batch_bytes_max, f"batch of {len(data)} bytes over bound")
        try:
            self.log.append(epoch, data)
            self.log.sync()
        except OSError as e:
            self._fail(f"command log write/sync failed at epoch {epoch}: {e}", first)
            return None
        except NotLeader as e:
            self.step_down(f"commit of epoch {epoch} refused: {e}")
            return None
        self.epoch = epoch
        self._published.append((epoch, len(data)))
        self._published_bytes += len(data)
        self._prev_digest = batch_digest(data)
        self._last_timestamp_ms = now_ms
        self._term_batch_due = False
        self.next_txn_id = first + len(calls)
        self.stats.epochs += 1
        self.stats.txns_sequenced += len(calls)
        while len(self._inflight) > limits.result_backlog_txns_max:
            self._inflight.popitem(last=False)
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
        doomed += [call for call, _recon in self._queries.values()]
        self._inflight.clear()
        self._queries.clear()
        for call in doomed:
            self.reply(call.identity, call.req_id, ERROR, (ERR_NOT_LEADER, reason))

    def _fail(self, reason: str, first_txn_id: int) -> None:
        """Stop for good: never acknowledge what might not be durable."""
        self.failed = reason
        log.critical("FAIL-STOP: %s; refusing all calls until restarted", reason)
        doomed = [f.call for t, f in self._inflight.items() if t >= first_txn_id]
        doomed += self._pending.drain()
        for t in [t for t in self._inflight if t >= first_txn_id]:
            del self._inflight[t]
        for call in doomed:
            self.reply(
                call.identity, call.req_id, ERROR, (ERR_UNAVAILABLE, f"outcome unknown: {reason}")
            )

    # Results ------------------------------------------------------------------
    def on_results_frame(self, data: bytes) -> bool:
        """A partition's raw MSG_RESULTS bytes; False (nothing changed) if malformed."""
        try:
            msg = unpack(data)
        except (ValueError, TypeError):  # every msgpack decode failure
            self.stats.bad_partition_messages += 1
            return False
        return self.on_results_message(msg)

    def on_results_message(self, msg: Any) -> bool:
        """A decoded MSG_RESULTS from a partition, checked field by field first.

        Returns False (and changes nothing) for anything malformed: the results socket
        must not be a way to crash or confuse the sequencer.
        """
        problem = results_problem(msg, self.replicas, self.partitions)
        if problem is not None:
            self.stats.bad_partition_messages += 1
            return False
        m = Results._make(msg[1:])
        self.on_results(
            m.replica, m.partition, m.results, m.query_results, PartitionStatus._make(m.status)
        )
        return True

    def on_results(
        self,
        replica: int,
        partition: int,
        results: Sequence[Any],
        query_results: Sequence[Any],
        status: PartitionStatus,
    ) -> None:
        self.stats.partitions[(replica, partition)] = status
        self._heard_at[(replica, partition)] = self.clock()
        if status.boundary_epoch:
            self._check_boundary(replica, partition, status.boundary_epoch, status.boundary_hash)
        for txn_id, st, value in results:
            self._on_txn_result(replica, txn_id, st, value)
        for qid, _tag, st, value in query_results:
            self._on_query_result(qid, st, value)

    def _check_boundary(self, replica: int, partition: int, epoch: int, h: int) -> None:
        key = (partition, epoch)
        seen = self._boundaries.get(key)
        if seen is None:
            self._boundaries[key] = (replica, h)
            while len(self._boundaries) > 64 * self.partitions:
                self._boundaries.popitem(last=False)
        elif seen[1] != h and seen[0] != replica:
            self.stats.determinism_violations += 1
            log.error(
                "DETERMINISM VIOLATION: partition %d at epoch %d: replica %d hash %016x, "
                "replica %d hash %016x",
                partition,
                epoch,
                seen[0],
                seen[1],
                replica,
                h,
            )
            self._boundaries[key] = (replica, h)  # report each disagreement once

    def _on_txn_result(self, replica: int, txn_id: int, status: int, packed: bytes) -> None:
        """One replica's result; ``packed``: its value as the partition packed it. Values
        are compared, kept and forwarded as those bytes (wire.Packed); only a restart's
        prediction is decoded (results_problem checked that it decodes)."""
        f = self._inflight.get(txn_id)
        if f is None:
            key = self._logged_txns.pop(txn_id, None)
            if key is not None and status != RESTART:  # logged before our restart
                seen = self.retries.get(key)
                if isinstance(seen, PendingCall):
                    self._deliver(seen, status, Packed(packed))
                elif isinstance(seen, Logged):
                    self.retries.finish(key, status, Packed(packed), seen.digest)
            return  # all replicas answered long ago, or evicted from the backlog
        bit = 1 << replica
        if f.answered & bit:
            return  # this replica answered already (it replayed after a restart)
        f.answered |= bit
        if f.first is None:
            f.first = (status, packed, replica)
            value = unpack(packed) if status == RESTART else Packed(packed)
            self._deliver(f.call, status, value)
        elif (status, packed) != f.first[:2]:  # the same value packs to the same bytes
            self.stats.determinism_violations += 1
            log.error(
                "DETERMINISM VIOLATION: txn %d (%s) replica %d answered %r, replica %d %r",
                txn_id,
                f.call.proc.name,
                f.first[2],
                (f.first[0], shown_value(f.first[1])),
                replica,
                (status, shown_value(packed)),
            )
        if f.answered == (1 << self.replicas) - 1:
            del self._inflight[txn_id]

    def _deliver(self, call: PendingCall, status: int, value: Any) -> None:
        if status == RESTART and call.lookup:
            status, value = ERROR, (ERR_RETRY_EXPIRED, "outcome unknown: the call was restarted")
        if status == RESTART:
            self.stats.restarts += 1
            call.restarts += 1
            if call.restarts > limits.dependent_restarts_max:
                status, value = (
                    ERROR,
                    (
                        ERR_RESTARTS_EXHAUSTED,
                        f"{call.proc.name} restarted {call.restarts - 1} times",
                    ),
                )
            else:
                call.args = call.args[:-1] + (value,)
                try:
                    if call.proc.dependent:
                        call.proc.validate(call.args[:-1])
                    call.participants = self._participants(call.proc, call.args)
                    self._enqueue(call)
                except BadRequest as e:  # a bad prediction is the procedure's bug, not ours
                    status, value = ERROR, (e.code, f"restart prediction invalid: {e.message}")
                else:
                    return
        self.reply(call.identity, call.req_id, status, value)
        if call.client_id:
            self.retries.finish((call.client_id, call.req_id), status, value, call.digest)

    def _on_query_result(self, qid: int, status: int, value: Any) -> None:
        entry = self._queries.pop(qid, None)
        if entry is None:
            return
        call, recon = entry
        if not recon or status != OK:
            self._deliver(call, status, value)
            return
        call.args = call.args + (value,)
        try:
            call.proc.validate(call.args[:-1])
            call.participants = self._participants(call.proc, call.args)
            self._enqueue(call)
        except BadRequest as e:
            self._deliver(call, ERROR, (e.code, e.message))

    def prune_log(self, archive_dir: str | None) -> list[str]:
        """Drop log segments older than every partition's newest checkpoint."""
        want = self.replicas * self.partitions
        parts = self.stats.partitions
        if len(parts) < want:
            raise BadRequest(ERR_UNAVAILABLE, f"only {len(parts)} of {want} partitions reported")
        bound = min(st.newest_checkpoint_epoch for st in parts.values())
        if bound <= 0:
            raise BadRequest(ERR_UNAVAILABLE, "some partition has no checkpoint yet")
        archive = Path(archive_dir) if archive_dir else None
        return [str(p) for p in self.log.delete_segments_before(bound + 1, archive)]

    # Outboxes -----------------------------------------------------------------
    def take_client_out(self) -> dict[bytes, list]:
        out, self.client_out = self.client_out, {}
        return out

    def take_control_out(self) -> list[tuple[bytes, OkReply | ErrorReply | StatusReply]]:
        out, self.control_out = self.control_out, []
        return out

    def take_query_out(self) -> dict[tuple[int, int], list]:
        out, self.query_out = self.query_out, {}
        return out

    def status_report(self, now: float | None = None) -> dict:
        """Counters and every partition's last status; ``down`` if it went quiet."""
        report = status_report(
            self.stats,
            self._heard_at,
            self.clock() if now is None else now,
            epoch=self.epoch,
            term=self.term,
            next_txn_id=self.next_txn_id,
            failed=self.failed,
            deposed=self.deposed,
            log_first_epoch=self.log.first_epoch,
            intake_slices_queued=len(self._intake),  # of up to intake_quantum_calls
            pending=len(self._pending),
            pending_bytes=self._pending.total_bytes,
            in_flight=len(self._inflight),
            retry_cache_entries=len(self.retries),
            retry_cache_bytes=self.retries.answered_bytes,
        )
        if self.status_extra is not None:
            report.update(self.status_extra())
        return report
