"""Results: the partitions' reports. Each sequenced call's answer goes to its client,
the replicas' answers are compared, a dependent call's restart is re-admitted, and each
query's answer is delivered (or becomes the dependent call's prediction).

Owner of the in-flight table (txn id -> the call and its replicas' answers so far):
epochs.py adds each batch's calls to it and bounds its backlog
(``result_backlog_txns_max``, oldest dropped), fail-stop and step-down empty it,
intake.py counts it; an entry leaves here once every replica answered. Also owns the
partitions' reports (``stats.partitions`` and ``heard_at``: epochs.py reads them for
flow control, the facade for status and pruning), the checkpoint boundaries' hashes,
and the txn ids of calls logged before a restart (``logged_txns``). It finishes the
retry cache's entries that intake.py started, and takes answers out of the query table
(queries.py). The in-flight table is never replaced (the others hold it).

Invariants:
- The first replica's result for a txn goes to the client; every later replica's
  result is compared with it; a mismatch is a determinism violation: counted and
  logged loudly. Replicas' state hashes at a checkpoint boundary are compared the
  same way.
- Dependent calls (procedure with ``recon``) first run their reconnaissance read at
  one replica; the prediction becomes the call's last argument. A RESTART result
  re-sequences the call with the fresh prediction, at most ``dependent_restarts_max``
  times.
- Nothing a partition sends raises out of ``on_results_frame`` /
  ``on_results_message``: a malformed report is counted and changes nothing.
- Every answer names the epoch its call was (last) sequenced in, the client's
  read-your-writes token (``PendingCall.epoch``, set when epochs.py cuts its batch);
  the retry cache keeps it for a retry's answer. Errors and calls never sequenced (a
  single-partition read answered through the query table) name 0.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgpack

from sequencer.calls import InFlight, PendingCall, results_problem, shown_value
from sequencer.intake import Intake
from sequencer.log import CommandLog
from sequencer.outbox import Outbox
from sequencer.queries import Queries
from sequencer.replication import ReplicatedLog
from sequencer.retry_cache import Logged, RetryCache, call_body, call_digest
from sequencer.status import SequencerStats
from txn_library import limits
from txn_library.errors import (
    ERR_PROCEDURE_FAILED,
    ERR_RESTARTS_EXHAUSTED,
    ERR_RETRY_EXPIRED,
    ERROR,
    OK,
    RESTART,
    BadRequest,
)
from txn_library.procedure import lookup, lookup_at
from txn_library.streams import DERIVED_CLIENT
from txn_library.wire.partition import PartitionStatus
from txn_library.wire.partition import Results as ResultsMessage
from txn_library.wire.sequencer import Packed, unpack

log = logging.getLogger("ordo.sequencer")


class Results:
    def __init__(
        self,
        intake: Intake,
        queries: Queries,
        inflight: OrderedDict[int, InFlight],
        retries: RetryCache,
        outbox: Outbox,
        stats: SequencerStats,
        heard_at: dict[tuple[int, int], float],
        *,
        replicas: int,
        partitions: int,
        clock: Callable[[], float],
    ) -> None:
        self.replicas = replicas
        self.partitions = partitions
        self.clock = clock
        self.stats = stats
        self.retries = retries
        self.inflight = inflight
        self.heard_at = heard_at  # clock time of each partition's last status
        # (partition, epoch) -> (replica, hash) at checkpoint boundaries, compared
        # across replicas.
        self._boundaries: OrderedDict[tuple[int, int], tuple[int, int]] = OrderedDict()
        self.logged_txns: dict[int, tuple[bytes, Any]] = {}  # txn id -> (client, req)
        self._query_table = queries.table
        # Bound once: each is called per result.
        self._reply = outbox.reply
        self._enqueue = intake.enqueue
        self._participants = intake.participants_of

    def remember_logged(self, command_log: CommandLog | ReplicatedLog) -> None:
        """Remember which (client, request) pairs the log already holds.

        After a restart, a retried call that was logged before the crash must not run
        again: it is answered with the original result (from the replicas' result
        cache, or from the result still on its way here).
        """
        last = command_log.last_epoch
        if not last:
            return
        first = max(command_log.first_epoch, last - limits.retry_rebuild_epochs_max)
        for epoch, data in command_log.read_range(first, last):
            for txn_id, key, digest in logged_calls(epoch, data):
                self.retries.log(key, Logged(txn_id, digest, epoch))
                self.logged_txns[txn_id] = key
        while len(self.logged_txns) > limits.pending_calls_max:
            self.logged_txns.pop(next(iter(self.logged_txns)))

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
        m = ResultsMessage._make(msg[1:])
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
        self.heard_at[(replica, partition)] = self.clock()
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
        f = self.inflight.get(txn_id)
        if f is None:
            key = self.logged_txns.pop(txn_id, None)
            if key is not None and status != RESTART:  # logged before our restart
                seen = self.retries.get(key)
                if isinstance(seen, PendingCall):
                    self._deliver(seen, status, Packed(packed))
                elif isinstance(seen, Logged):
                    self.retries.finish(key, status, Packed(packed), seen.digest, seen.epoch)
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
            del self.inflight[txn_id]

    def _deliver(self, call: PendingCall, status: int, value: Any) -> None:
        if status == RESTART and call.lookup:
            status, value = ERROR, (ERR_RETRY_EXPIRED, "outcome unknown: the call was restarted")
        elif status == RESTART and not call.proc.dependent:
            # Only a dependent call is re-sequenced (and keeps its arguments once logged:
            # epochs.py); any other procedure returning Restart is its own bug.
            status, value = (
                ERROR,
                (ERR_PROCEDURE_FAILED, f"{call.proc.name} returned Restart but has no recon"),
            )
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
                    call.proc = lookup(call.proc.name)  # the version in force (deploys)
                    if call.proc.dependent:
                        call.proc.validate(call.args[:-1])
                    call.participants = self._participants(call.proc, call.args)
                    self._enqueue(call)
                except BadRequest as e:  # a bad prediction is the procedure's bug, not ours
                    status, value = ERROR, (e.code, f"restart prediction invalid: {e.message}")
                else:
                    return
        epoch = call.epoch if status != ERROR else 0  # an error is no Result to read back
        self._reply(call.identity, call.req_id, status, value, epoch)
        if call.client_id:
            self.retries.finish((call.client_id, call.req_id), status, value, call.digest, epoch)

    def _on_query_result(self, qid: int, status: int, value: Any) -> None:
        entry = self._query_table.pop(qid, None)
        if entry is None:
            return
        call, recon = entry
        if not recon or status != OK:
            self._deliver(call, status, value)
            return
        call.args = call.args + (value,)
        try:
            call.proc = lookup(call.proc.name)  # the version in force (deploys)
            call.proc.validate(call.args[:-1])
            call.participants = self._participants(call.proc, call.args)
            self._enqueue(call)
        except BadRequest as e:
            self._deliver(call, ERROR, (e.code, e.message))


def logged_calls(epoch: int, data: bytes) -> Iterator[tuple[int, tuple[bytes, Any], int]]:
    """(txn id, (client id, request id), call digest) of each client call a logged batch
    holds, read from its bytes: a call's digest is that of its (procedure, arguments),
    which are the very bytes after the txn's array header (``Intake.enqueue``), so they
    are hashed where they lie instead of decoded and packed again (a new leader reads
    ``retry_rebuild_epochs_max`` epochs before it serves). A dependent call's logged
    arguments end with its prediction, which is not part of the call: those are decoded.
    Trusted bytes (this sequencer's own log)."""
    u = msgpack.Unpacker(use_list=False)
    u.feed(data)
    u.read_array_header()
    u.skip()  # epoch
    u.skip()  # prev_epoch
    txn_id = u.unpack()
    u.skip()  # timestamp
    u.skip()  # seed
    for _ in range(u.read_array_header()):
        u.read_array_header()
        start = u.tell()
        name = u.unpack()
        args_at = u.tell()
        u.skip()
        end = u.tell()
        u.skip()  # participants
        client_id = u.unpack()
        req_id = u.unpack()
        if client_id and client_id != DERIVED_CLIENT:
            body = data[start:end]
            try:
                if lookup_at(name, epoch).dependent:
                    args = msgpack.unpackb(data[args_at:end], use_list=False)
                    body = call_body(name, args[:-1])  # the prediction is not part of it
            except BadRequest:
                pass  # a procedure no longer registered: its digest is as logged
            yield txn_id, (client_id, req_id), call_digest(body)
        txn_id += 1
