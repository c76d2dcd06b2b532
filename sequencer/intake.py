"""Intake: take client frames, validate their calls, admit them into per-connection
pending queues (or answer them: a rejection, a retry, a query).

``on_frame`` takes one raw client frame and queues its calls in slices; ``run_intake``
validates queued calls, a bounded amount per turn. An accepted call is encoded once
as the txn the log will hold and waits in the pending calls for a batch (epochs.py);
a dependent call first sends its reconnaissance query and a single-partition
read-only call is answered by a query alone (queries.py; results.py takes the
answers). Control requests (status, cluster info, checkpoint, prune) go to the facade.

Owner of the queued frame slices, the pending calls (epochs.py takes each batch from
them; results.py re-admits restarted calls through ``enqueue``) and the retry cache
(results.py finishes its entries with the answers). It reads, never changes, the
in-flight table and the query table (their sizes bound the load), and epochs.py's
``failed`` / ``deposed`` (nothing is accepted once either is set) and next txn id.

Invariants:
- A call is validated (request shape, procedure exists, arguments match its schema
  and encode, footprint well formed, size bounds) before it is accepted; a rejected
  call gets an ERROR reply and never reaches the log. Nothing a client sends raises
  out of ``on_frame`` / ``run_intake``.
- Work is shared fairly: decoded calls wait in per-connection queues and are
  validated round robin, a bounded amount per turn; accepted calls wait in
  per-connection queues (for epochs.py to take round robin), so one client's flood
  delays another's calls by at most a quantum per round (sequencer.fair).
- Each call is encoded once, when it is accepted (a batch joins those bytes).
- Exactly once: a (client_id, req_id) is sequenced at most once; a retry gets the
  original answer, and a different call reusing the ids gets ERR_REQUEST_ID_REUSED
  (sequencer.retry_cache).
- Bounded: queued, pending and in-flight calls and their bytes stay under the bounds
  in cluster/limits.py, per client and in total; above them a call gets
  ERR_OVERLOADED.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgpack

from sequencer.calls import InFlight, PendingCall, is_req_id, participants
from sequencer.deploys import Deploys
from sequencer.epochs import Epochs
from sequencer.fair import FairQueues
from sequencer.log import CommandLog
from sequencer.outbox import Outbox
from sequencer.queries import Queries
from sequencer.replication import ReplicatedLog
from sequencer.retry_cache import Done, Logged, RetryCache, call_body, call_digest
from sequencer.status import SequencerStats
from txn_library import limits, placement
from txn_library.deployed import DEPLOY_PROC
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_NOT_LEADER,
    ERR_OVERLOADED,
    ERR_TOO_LARGE,
    ERR_UNAVAILABLE,
    ERROR,
    BadRequest,
    brief,
    invariant,
)
from txn_library.heap import gc_paused
from txn_library.procedure import Procedure, lookup, lookup_at
from txn_library.streams import PUSH
from txn_library.streams.dataflow import encoded_derived
from txn_library.wire import sequencer as wire
from txn_library.wire.partition import RESULT_LOOKUP
from txn_library.wire.sequencer import CallsRequest, Txn, decode_batch, unpack

_TXN_HEADER = msgpack.packb([None] * 5)[:1]  # fixarray of the txn's 5 fields
_CONTROL_KINDS = (wire.REQ_STATUS, wire.REQ_CHECKPOINT, wire.REQ_PRUNE, wire.REQ_CLUSTER_INFO)


class Intake:
    def __init__(
        self,
        command_log: CommandLog | ReplicatedLog,
        epochs: Epochs,
        pending: FairQueues[PendingCall],
        inflight: OrderedDict[int, InFlight],
        queries: Queries,
        retries: RetryCache,
        outbox: Outbox,
        stats: SequencerStats,
        *,
        replicas: int,
        partitions: int,
        clock: Callable[[], float],
        on_control: Callable[[bytes, tuple], None],
        dataflow_recovery: str = "strong",
    ) -> None:
        self.log = command_log  # read only: a logged call's result is looked up
        self.dataflow_recovery = dataflow_recovery
        self.replicas = replicas
        self.partitions = partitions
        self.clock = clock
        self.stats = stats
        self.retries = retries
        self.pending = pending
        # (identity, client_id, calls, unordered): a slice of one client frame
        self.slices: FairQueues[tuple[bytes, bytes, tuple, bool]] = FairQueues()
        self._epochs = epochs
        self._inflight = inflight
        self._query_table = queries.table
        # Bound once: each is called per call.
        self.reply = outbox.reply
        self._query = queries.query
        self._requery = queries.requery
        self._next_replica = queries.next_replica
        self._on_control = on_control
        self._packer = msgpack.Packer(autoreset=True)
        # Deploy calls go through a module check first (sequencer.deploys; set by the
        # Sequencer, which builds it over this intake's enqueue).
        self.deploys: Deploys | None = None

    def error(self, identity: bytes, req_id: Any, code: str, message: str) -> None:
        """Refuse a call (or a frame: ``req_id`` None) with an ERROR reply, counted."""
        self.stats.calls_rejected += 1
        if code == ERR_OVERLOADED:
            self.stats.calls_overloaded += 1
        self.reply(identity, req_id, ERROR, (code, message))

    def on_frame(self, identity: bytes, frame: bytes) -> None:
        """One raw client frame: decode, check its shape, queue its calls or answer it.

        Never raises for anything a client can send; every problem is an ERROR reply.
        """
        if len(frame) > limits.request_bytes_max:
            self.error(
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
            self.error(identity, None, ERR_MALFORMED, f"not msgpack: {type(e).__name__}")
            return
        if not isinstance(msg, tuple) or not msg or type(msg[0]) is not int:
            self.error(identity, None, ERR_MALFORMED, "a request is [kind:int, ...]")
            return
        kind = msg[0]
        if kind in wire.CALLS_KINDS:
            if len(msg) != 3:
                self.error(identity, None, ERR_MALFORMED, "REQ_CALLS is [kind, client_id, [calls]]")
                return
            request = CallsRequest._make(msg[1:])  # fields checked by _queue_calls
            unordered = kind == wire.REQ_CALLS_UNORDERED
            self._queue_calls(identity, request.client_id, request.calls, len(frame), unordered)
        elif kind in _CONTROL_KINDS:
            self._on_control(identity, msg)
        else:
            self.error(identity, None, ERR_MALFORMED, f"unknown request kind {kind}")

    def _queue_calls(
        self, identity: bytes, client_id: Any, calls: Any, nbytes: int, unordered: bool
    ) -> None:
        if not isinstance(client_id, bytes) or len(client_id) > limits.client_id_bytes_max:
            self.error(
                identity,
                None,
                ERR_MALFORMED,
                f"client_id must be bytes (<= {limits.client_id_bytes_max})",
            )
            return
        if not isinstance(calls, tuple) or len(calls) > limits.calls_per_frame_max:
            self.error(
                identity,
                None,
                ERR_MALFORMED,
                f"calls must be an array of at most {limits.calls_per_frame_max} calls",
            )
            return
        if not calls:
            return
        intake = self.slices
        if intake.bytes_of(identity) + nbytes > limits.intake_client_bytes_max:
            for call in calls:
                req_id = call[0] if isinstance(call, tuple) and call else None
                self.error(
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
        return bool(self.slices)

    def intake_room(self) -> bool:
        """Whether another client frame may be read now (else it waits in ZeroMQ)."""
        return self.slices.total_bytes + limits.request_bytes_max <= limits.intake_bytes_max

    def run_intake(self, deadline: float | None = None) -> int:
        """Validate queued calls round robin between connections until ``deadline``
        (clock time; None: all of them). Returns how many were handled."""
        done = 0
        intake = self.slices
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
            self.error(identity, None, ERR_MALFORMED, "client_id must be bytes (<= 64)")
            return
        if not isinstance(calls, tuple) or len(calls) > limits.calls_per_frame_max:
            self.error(identity, None, ERR_MALFORMED, "calls must be an array of calls")
            return
        for call in calls:
            self._on_call(identity, client_id, call, unordered)

    def _on_call(self, identity: bytes, client_id: bytes, call: Any, unordered: bool) -> None:
        if not isinstance(call, tuple) or len(call) not in (3, 4):
            self.error(
                identity, None, ERR_MALFORMED, "a call is [req_id, procedure, args(, replica)]"
            )
            return
        req_id, name, args = call[:3]
        if not is_req_id(req_id):
            self.error(identity, None, ERR_MALFORMED, "req_id must be an int64 >= 0")
            return
        replica = call[3] if len(call) == 4 else None
        if replica is not None and (type(replica) is not int or not 0 <= replica < self.replicas):
            self.error(identity, req_id, ERR_BAD_ARGUMENTS, f"no replica {brief(replica)}")
            return
        try:
            self._accept(identity, client_id, req_id, name, args, replica, unordered)
        except BadRequest as e:
            self.error(identity, req_id, e.code, e.message)

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
        try:
            proc = lookup(name)
            proc.validate(args)
        except BadRequest:  # a retry of a call logged before its procedure changed?
            if client_id and self._retry_of_changed(identity, client_id, req_id, name, args):
                return
            raise
        args = tuple(args)
        body = call_body(proc.name, args)
        digest = call_digest(body)
        key = (client_id, req_id)
        if client_id:
            seen = self.retries.retry_of(key, digest)
            if seen is not None:
                self._on_retry(identity, key, seen)
                return
        epochs = self._epochs
        if epochs.deposed is not None:
            raise BadRequest(ERR_NOT_LEADER, f"not the leader: {epochs.deposed}")
        if epochs.failed is not None:
            raise BadRequest(ERR_UNAVAILABLE, f"sequencer stopped: {epochs.failed}")
        self._check_load(identity, len(body))
        call = PendingCall(identity, client_id, req_id, proc, args, (), digest)
        call.ordered = not unordered
        if proc is DEPLOY_PROC:  # its module is checked before it is queued
            if self.deploys is None:
                raise BadRequest(ERR_UNAVAILABLE, "this sequencer takes no deploys")
            self.deploys.submit(call, body)
            if client_id:
                self.retries.start(key, call)
            self.stats.calls_accepted += 1
            return
        if proc.dependent:
            self._send_query(call, lookup(proc.recon), call.args, recon=True)
        elif proc.read_only:
            parts = self.participants_of(proc, call.args)
            if len(parts) == 1:
                self._send_query(
                    call, proc, call.args, recon=False, partition=parts[0], replica=replica
                )
            else:
                call.participants = parts
                self.enqueue(call, body)
        else:
            call.participants = self.participants_of(proc, call.args)
            self.enqueue(call, body)
        if client_id:
            self.retries.start(key, call)
        self.stats.calls_accepted += 1

    def _retry_of_changed(
        self, identity: bytes, client_id: bytes, req_id: int, name: Any, args: Any
    ) -> bool:
        """Answer a retry of a call whose procedure was retired or redeployed with
        another schema since it was logged (txn_library.deployed) with its original
        outcome; False if it is no such retry."""
        key = (client_id, req_id)
        seen = self.retries.get(key)
        if seen is None or not isinstance(args, (list, tuple)):
            return False
        try:
            digest = call_digest(call_body(name, tuple(args)))
        except (TypeError, ValueError, OverflowError):
            return False
        if seen.digest != digest:
            return False
        self._on_retry(identity, key, seen)
        return True

    def _on_retry(self, identity: bytes, key: tuple[bytes, int], seen: Any) -> None:
        self.stats.duplicate_calls += 1
        if isinstance(seen, Done):
            self.reply(identity, key[1], seen.status, seen.value, seen.epoch)
        elif isinstance(seen, Logged):
            # Logged before a restart: fetch the original result, never re-execute (a
            # fail-stopped sequencer cannot read its log: the client retries elsewhere).
            failed = self._epochs.failed
            if failed is not None:
                raise BadRequest(ERR_UNAVAILABLE, f"sequencer stopped: {failed}")
            self._lookup_logged(identity, key, seen)
        else:
            seen.identity = identity  # in flight: answer the retry's connection
            if seen.query is not None:
                self._requery(seen)

    def _check_load(self, identity: bytes, nbytes: int) -> None:
        pending = self.pending
        if (
            len(pending) + len(self._inflight) + len(self._query_table) >= limits.pending_calls_max
            or pending.total_bytes + nbytes > limits.pending_bytes_max
        ):
            raise BadRequest(ERR_OVERLOADED, "too many calls in flight; retry later")
        if (
            pending.count_of(identity) >= limits.client_pending_calls_max
            or pending.bytes_of(identity) + nbytes > limits.client_pending_bytes_max
        ):
            raise BadRequest(ERR_OVERLOADED, "this client has too many calls waiting; retry later")

    def participants_of(self, proc: Procedure, args: tuple) -> tuple:
        return participants(proc, args, self.partitions)

    def enqueue(self, call: PendingCall, body: bytes | None = None) -> None:
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
        size = len(encoded)
        if call.proc.name == PUSH:  # its dataflow's steps (txn_library.streams)
            call.derived, call.derived_txns = encoded_derived(call.args, self.partitions)
            if self.dataflow_recovery == "strong":
                size += len(call.derived)  # logged with the batch
        self.pending.push(call.identity, call, size)

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
            parts = self.participants_of(proc, args)
            if len(parts) != 1:
                raise BadRequest(ERR_BAD_ARGUMENTS, f"{proc.name} must touch one partition")
            partition = parts[0]
        if replica is None:
            replica = self._next_replica()
        self.stats.queries += 1
        body = (proc.name, args, self._epochs.next_txn_id - 1)
        self._query(call, recon, replica, partition, body)

    def _lookup_logged(self, identity: bytes, key: tuple[bytes, int], entry: Logged) -> None:
        txn = self._logged_txn(entry)
        proc = lookup_at(txn.proc, entry.epoch)  # the version it ran with (deploys)
        args = txn.args
        fp = proc.footprint(*args)
        reporter = placement.reporter(fp.writes, txn.participants, self.partitions)
        call = PendingCall(identity, key[0], key[1], proc, args, txn.participants, entry.digest)
        call.lookup = True
        call.epoch = entry.epoch
        self.retries.start(key, call)
        body = (RESULT_LOOKUP, (entry.txn_id,), entry.txn_id)
        self._query(call, False, self._next_replica(), reporter, body)

    def _logged_txn(self, entry: Logged) -> Txn:
        batch = decode_batch(self.log.read(entry.epoch))
        txn = batch.txns[entry.txn_id - batch.first_txn_id]
        invariant(
            call_digest(call_body(txn.proc, txn.args)) == entry.digest
            or lookup_at(txn.proc, entry.epoch).dependent,
            f"logged txn {entry.txn_id} is not the call the retry cache remembered",
        )
        return txn
