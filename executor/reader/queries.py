"""A reader's queries: snapshot and read-committed queries answered from the state of
every partition held in one process (docs/QUERIES.md, "Readers").

The role owns no socket: ``on_client_frame`` takes a client's REQ_QUERY frame (the
frame a partition's query socket takes, txn_library.wire.sequencer.QueryRequest) and replies
accumulate in ``replies`` by client identity; ``tick()`` retries the queries that
wait for an epoch, and the owner calls it after every batch it applies too.

A snapshot across partitions is a local read: the body runs once, each key read from
the partition that holds it (``Snapshot`` at the query's epoch: the reader's applied
epoch, or the one named within the retention). No fan-out, no watermark, no merge.
Read committed reads the state now, which on a reader is the state at the end of its
applied epoch (batches are applied whole between queries).

Invariants:
- An answer names the epoch it reflects, and is the serial history's prefix up to it.
- A query at an epoch the reader has not applied yet waits, at most
  ``limits.query_watermark_wait_s``, then gets ``not_ready``; one older than the
  versions kept gets ``bad_arguments`` naming the retention.
- A reader that has not caught up since it started answers only queries naming an
  epoch it has applied (``not_ready`` otherwise: the client moves on).
- At most ``limits.queries_waiting_max`` queries wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_body
from executor.deterministic.snapshot import (
    NO_EPOCH,
    READ_COMMITTED,
    SNAPSHOT,
    Snapshot,
    query_procedure,
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
    brief,
)
from txn_library.procedure import Procedure
from txn_library.wire import sequencer as wire

Reply = tuple[int, int, bytes, int]  # (query id, status, value packed, epoch)


@dataclass(eq=False)
class _Waiting:
    identity: bytes
    qid: int
    proc: Procedure
    args: tuple
    epoch: int
    deadline: float


def run_at(
    proc: Procedure, args: Sequence[Any], snaps: Sequence[Snapshot], partitions: int
) -> tuple[int, Any, bytes]:
    """Run a read-only body over every partition's snapshot. A key is only ever written
    at the partition that holds it (a replicated table's rows are the same at every
    partition), so a read takes the first partition that has the row: no placement is
    computed per key. A scan reads the partition its prefix is placed at."""
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

    fp = proc.footprint(*args)
    ctx = TxnContext(-1, 0, 0, cover_set(fp.reads), frozenset(), get, scan)
    return run_body(proc, tuple(args), ctx)


class ReaderQueries:
    def __init__(self, follower: Follower, name: str, clock: Callable[[], float]) -> None:
        self.follower = follower
        self.name = name  # "reader 0": how errors name this reader
        self.clock = clock
        self.replies: dict[bytes, list[Reply]] = {}
        self._waiting: list[_Waiting] = []
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
        for qid, proc_name, args, isolation, at_epoch in msg[2]:
            self._start(identity, qid, proc_name, args, isolation, at_epoch)

    def _start(
        self, identity: bytes, qid: int, proc_name: str, args: tuple, isolation: str, at: int
    ) -> None:
        f = self.follower
        try:
            proc, _ = query_procedure(proc_name, args, f.partitions)
        except BadRequest as e:
            self._error(identity, qid, e.code, e.message)
            return
        if isolation not in (SNAPSHOT, READ_COMMITTED):
            self._error(
                identity,
                qid,
                ERR_BAD_ARGUMENTS,
                f"isolation {brief(isolation)} is not served here: snapshot or read_committed "
                f"(strict goes through the sequencer, ordered with the transactions)",
            )
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
        epoch = at if named else f.applied_epoch
        self._run(_Waiting(identity, qid, proc, args, epoch, 0.0))

    def _run(self, job: _Waiting) -> None:
        f = self.follower
        if job.epoch > f.applied_epoch:
            if not job.deadline:
                if len(self._waiting) >= limits.queries_waiting_max:
                    self._error(job.identity, job.qid, ERR_OVERLOADED, "too many queries waiting")
                    return
                job.deadline = self.clock() + limits.query_watermark_wait_s
            if self.clock() < job.deadline:
                self._waiting.append(job)
                return
            self._error(
                job.identity,
                job.qid,
                ERR_NOT_READY,
                f"epoch {job.epoch} is not applied at {self.name} yet (applied: {f.applied_epoch})",
            )
            return
        oldest = f.versions_oldest
        if job.epoch < oldest:
            self._error(
                job.identity,
                job.qid,
                ERR_BAD_ARGUMENTS,
                f"epoch {job.epoch} is older than the versions kept at {self.name} (from "
                f"epoch {oldest}: limits.reader_versions_epochs_max = "
                f"{limits.reader_versions_epochs_max} epochs, versions_bytes_max = "
                f"{limits.versions_bytes_max} bytes per partition); "
                f"`ordo replay state --epoch` reaches any epoch",
            )
            return
        # At the applied epoch the state now is the snapshot: no version is probed.
        at = None if job.epoch == f.applied_epoch else job.epoch
        snaps = [Snapshot(s, at) for s in f.storages]
        status, _, packed = run_at(job.proc, job.args, snaps, f.partitions)
        self.replies.setdefault(job.identity, []).append((job.qid, status, packed, job.epoch))
        self.served += 1

    def _error(self, identity: bytes, qid: int, code: str, message: str) -> None:
        self.refused += 1
        self.replies.setdefault(identity, []).append(
            (qid, ERROR, msgpack.packb([code, message]), NO_EPOCH)
        )

    def tick(self) -> None:
        """Retry the queries waiting for an epoch (answered, or refused past their wait)."""
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for job in waiting:
                self._run(job)

    def take_replies(self) -> dict[bytes, list[Reply]]:
        out, self.replies = self.replies, {}
        return out

    @property
    def waiting(self) -> int:
        return len(self._waiting)
