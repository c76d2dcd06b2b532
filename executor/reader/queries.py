"""A reader's queries: snapshot and read-committed queries answered from the state of
every partition held in one process (docs/QUERIES.md, "Readers").

The role owns no socket: ``on_client_frame`` takes a client's REQ_QUERY frame (the
frame a partition's query socket takes, txn_library.wire.sequencer.QueryRequest) and replies
accumulate in ``replies`` by client identity. A query whose epoch is not applied yet
(``at_epoch`` ahead, or ``after_epoch``: read-your-writes) is parked, keyed by that
epoch; the owner calls ``on_applied`` after each batch it applies, which answers the
parked queries the batch made ready, in epoch order, and ``tick`` now and then, which
also refuses those whose wait is over. No query is looked at again before its epoch
is applied or its wait ends.

A snapshot across partitions is a local read: the body runs once, each key read from
the partition that holds it (``Snapshot`` at the query's epoch: the reader's applied
epoch, or the one named within the retention). No fan-out, no watermark, no merge.
Read committed reads the state now, which on a reader is the state at the end of its
applied epoch (batches are applied whole between queries).

Invariants:
- An answer names the epoch it reflects, and is the serial history's prefix up to it;
  with ``after_epoch`` E that epoch is >= E.
- A query at an epoch the reader has not applied yet waits, at most
  ``limits.query_watermark_wait_s`` (``at_epoch``) or
  ``limits.query_after_epoch_wait_s`` (``after_epoch``), then gets ``not_ready`` saying
  how far the reader got; one older than the retention (``Follower.versions_oldest``)
  gets ``bad_arguments`` naming the oldest epoch served. A bad ``after_epoch``
  (negative, past int64, not an int, after a named ``at_epoch``) gets
  ``bad_arguments`` and waits for nothing.
- A reader that has not caught up since it started answers only queries naming an
  epoch it has applied (``not_ready`` otherwise: the client moves on).
- At most ``limits.queries_waiting_max`` queries wait; every one is answered exactly
  once (``waiting`` counts those not yet answered).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_body
from executor.deterministic.snapshot import (
    NO_EPOCH,
    SNAPSHOT,
    Snapshot,
    entry_problem,
    query_footprint,
)
from executor.reader.follower import Follower
from txn_library import limits, placement
from txn_library.catalog import REPLICATED
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_NOT_READY,
    ERR_OVERLOADED,
    ERROR,
    BadRequest,
    invariant,
)
from txn_library.procedure import Procedure
from txn_library.wire import sequencer as wire

Reply = tuple[int, int, bytes, int]  # (query id, status, value packed, epoch)


@dataclass(eq=False)
class _Waiting:
    """A query parked until ``wanted`` is applied (or ``deadline``)."""

    identity: bytes
    qid: int
    proc: Procedure
    args: tuple
    epoch: int | None  # the epoch to read at; None: the applied one when it runs
    wanted: int  # the epoch that must be applied first
    after: int  # the after_epoch it named (0: none)
    deadline: float
    done: bool = False
    reads: frozenset | None = None  # the footprint's read cover set, checked at intake


def run_at(
    proc: Procedure,
    args: Sequence[Any],
    snaps: Sequence[Snapshot],
    partitions: int,
    reads: frozenset | None = None,
) -> tuple[int, Any, bytes]:
    """Run a read-only body over every partition's snapshot. A key is only ever written
    at the partition that holds it (a replicated table's rows are the same at every
    partition), so a read takes the first partition that has the row: no placement is
    computed per key. A scan reads the partition its prefix is placed at. ``reads``:
    the footprint's read cover set, when the caller has it already."""
    getters = [s.storage.get if s.epoch is None else s.get for s in snaps]

    def get(t: str, key: tuple) -> tuple | None:
        for g in getters:
            row = g(t, key)
            if row is not None:
                return row
        return None

    def scan(t: str, prefix: tuple) -> list:
        p = placement.partition_of(t, prefix, partitions)
        return snaps[0 if p == REPLICATED else p].scan(t, prefix)

    if reads is None:
        reads = cover_set(proc.footprint(*args).reads)
    ctx = TxnContext(-1, 0, 0, reads, frozenset(), get, scan)
    return run_body(proc, tuple(args), ctx)


class ReaderQueries:
    def __init__(self, follower: Follower, name: str, clock: Callable[[], float]) -> None:
        self.follower = follower
        self.name = name  # "reader 0": how errors name this reader
        self.clock = clock
        self.replies: dict[bytes, list[Reply]] = {}
        # Parked queries, by the epoch they wait for and by deadline (heaps of
        # (key, seq, job); an answered job's other entry is dropped when it surfaces,
        # or when stale entries outnumber the waiting ones).
        self._by_epoch: list[tuple[int, int, _Waiting]] = []
        self._by_deadline: list[tuple[float, int, _Waiting]] = []
        self._seq = 0
        self._waiting = 0  # parked and not answered yet
        self.served = 0
        self.refused = 0

    def on_client_frame(self, identity: bytes, frame: bytes) -> None:
        try:
            msg = wire.unpack(frame)
        except Exception:  # noqa: BLE001 - any undecodable frame is the client's
            self._error(identity, 0, ERR_MALFORMED, "undecodable query frame")
            return
        self.on_client_message(identity, msg)

    def on_client_message(self, identity: bytes, msg: Any) -> None:
        """A decoded client frame (checked here: a malformed one is answered so)."""
        problem = wire.query_request_problem(msg)
        if problem is not None:
            self._error(identity, 0, ERR_MALFORMED, problem)
            return
        for qid, proc_name, args, isolation, at_epoch, after_epoch in wire.query_entries(msg):
            self._start(identity, qid, proc_name, args, isolation, at_epoch, after_epoch)

    def _start(
        self,
        identity: bytes,
        qid: int,
        proc_name: str,
        args: tuple,
        isolation: str,
        at: int,
        after: Any = 0,
    ) -> None:
        f = self.follower
        try:
            # Checked as the sequencer checks a call, but placed nowhere: every
            # partition is here.
            proc, fp = query_footprint(proc_name, args)
        except BadRequest as e:
            self._error(identity, qid, e.code, e.message)
            return
        problem = entry_problem(isolation, at, after)
        if problem is not None:
            self._error(identity, qid, ERR_BAD_ARGUMENTS, problem)
            return
        named = isolation == SNAPSHOT and at >= 0
        if not f.live and not (named and at <= f.applied_epoch):
            self._error(
                identity,
                qid,
                ERR_NOT_READY,
                f"{self.name} is catching up from the log (applied epoch {f.applied_epoch} "
                f"of {f.known_last_epoch}): ask another reader or replica",
            )
            return
        job = _Waiting(identity, qid, proc, args, at if named else None, 0, after, 0.0)
        job.reads = cover_set(fp.reads)
        job.wanted = max(at, after) if named else after
        if job.wanted <= f.applied_epoch:
            self._answer(job)
        else:
            self._park(
                job, limits.query_watermark_wait_s if named else limits.query_after_epoch_wait_s
            )

    def _park(self, job: _Waiting, wait_s: float) -> None:
        if self._waiting >= limits.queries_waiting_max:
            self._error(job.identity, job.qid, ERR_OVERLOADED, "too many queries waiting")
            return
        job.deadline = self.clock() + wait_s
        self._seq += 1
        heapq.heappush(self._by_epoch, (job.wanted, self._seq, job))
        heapq.heappush(self._by_deadline, (job.deadline, self._seq, job))
        self._waiting += 1

    def _unpark(self, job: _Waiting) -> None:
        job.done = True
        self._waiting -= 1
        invariant(self._waiting >= 0, "reader queries: waiting count")

    def _compact(self) -> None:
        """Drop answered jobs' entries once they outnumber the waiting ones (a query
        refused at its deadline may wait for an epoch that never comes)."""
        stale = len(self._by_epoch) + len(self._by_deadline) - 2 * self._waiting
        if stale > 2 * self._waiting + 64:
            self._by_epoch = [e for e in self._by_epoch if not e[2].done]
            self._by_deadline = [e for e in self._by_deadline if not e[2].done]
            heapq.heapify(self._by_epoch)
            heapq.heapify(self._by_deadline)

    def _answer(self, job: _Waiting) -> None:
        """Answer a query whose epoch is applied: at its named epoch, else the applied one."""
        f = self.follower
        epoch = f.applied_epoch if job.epoch is None else job.epoch
        invariant(job.wanted <= f.applied_epoch, "a query answered before its epoch")
        oldest = f.versions_oldest
        if epoch < oldest:
            self._error(
                job.identity,
                job.qid,
                ERR_BAD_ARGUMENTS,
                f"epoch {epoch} is older than the oldest epoch {self.name} still serves, "
                f"{oldest} (retention: {f.retention_s:g} s of batch time, within "
                f"limits.versions_bytes_max = {limits.versions_bytes_max} bytes of versions "
                f"per partition); `ordo replay state --epoch` reaches any epoch",
            )
            return
        # At the applied epoch the state now is the snapshot: no version is probed.
        at = None if epoch == f.applied_epoch else epoch
        snaps = [Snapshot(s, at) for s in f.storages]
        status, _, packed = run_at(job.proc, job.args, snaps, f.partitions, job.reads)
        self.replies.setdefault(job.identity, []).append((job.qid, status, packed, epoch))
        self.served += 1

    def _error(self, identity: bytes, qid: int, code: str, message: str) -> None:
        self.refused += 1
        self.replies.setdefault(identity, []).append(
            (qid, ERROR, msgpack.packb([code, message]), NO_EPOCH)
        )

    def on_applied(self) -> None:
        """A batch was applied: answer the parked queries it made ready, oldest epoch
        first (in arrival order within one)."""
        heap = self._by_epoch
        applied = self.follower.applied_epoch
        while heap and heap[0][0] <= applied:
            job = heapq.heappop(heap)[2]
            if not job.done:
                self._unpark(job)
                self._answer(job)
        self._compact()

    def tick(self) -> None:
        """Answer what is ready; refuse the parked queries whose wait is over."""
        self.on_applied()
        heap = self._by_deadline
        now = self.clock()
        while heap and heap[0][0] <= now:
            job = heapq.heappop(heap)[2]
            if not job.done:
                self._unpark(job)
                self._refuse_late(job)
        self._compact()

    def _refuse_late(self, job: _Waiting) -> None:
        f = self.follower
        how_far = f"applied: {f.applied_epoch}, newest known sequenced: {f.known_last_epoch}"
        if job.epoch is not None and job.epoch == job.wanted:
            message = f"epoch {job.wanted} is not applied at {self.name} yet ({how_far})"
        else:
            wait = limits.query_after_epoch_wait_s
            message = (
                f"after_epoch {job.after} is not applied at {self.name} within {wait:g} s "
                f"(limits.query_after_epoch_wait_s; {how_far})"
            )
            if job.after > f.known_last_epoch:
                message += f": no epoch {job.after} is known to be sequenced"
        self._error(job.identity, job.qid, ERR_NOT_READY, message)

    def take_replies(self) -> dict[bytes, list[Reply]]:
        out, self.replies = self.replies, {}
        return out

    @property
    def waiting(self) -> int:
        return self._waiting
