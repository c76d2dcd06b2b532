"""A partition's query service: snapshot and read-committed queries from clients,
answered without the log and without locks (docs/QUERIES.md).

The role turns inputs into outputs and owns no socket: ``on_client_frame`` takes a
client's REQ_QUERY frame, ``on_peer`` a peer's query reads, their reply or its
watermark; ``tick(now)`` retries the queries waiting for an epoch and gossips this
partition's completed epoch. Replies to clients accumulate in ``replies`` (by client
identity) and messages to peers go out through ``send_peer``.

A query goes to one replica; its coordinator is the partition the client asked (a
client that knows the procedure asks the first partition its footprint touches). The
coordinator picks the epoch: the one named (time travel within retention), else for
``snapshot`` the smallest completed epoch it knows of the partitions the query touches
(its own, and its peers' from their MSG_WATERMARK), and asks each other participant
for its reads at that epoch (MSG_QUERY_READS); with all of them it runs the body
(executor.deterministic.snapshot) and answers [query_id, status, value, epoch].

Read-your-writes: a query naming ``after_epoch`` E (the epoch of the caller's last
committed call) is read at an epoch >= E: a snapshot's coordinator picks at least E
(and picks again, later, while it waits: the newest it may read then), read committed
reads at each participant once it has completed E (MSG_QUERY_READS carries E). Each
waits as for a named epoch, at most ``limits.query_after_epoch_wait_s``, then gets
``not_ready`` saying how far the partition got.

Invariants:
- A query never takes a lock, enters the lock manager or delays a batch: it reads the
  Storage and its versions between the role's other work.
- A snapshot is read at an epoch every participant has completed and still keeps
  (``snapshot.epoch_problem``): a participant that has not completed it yet holds the
  query (at most ``limits.query_watermark_wait_s``), never answers early; one that
  no longer keeps it refuses, naming the retention.
- A partition recovering from its log answers no snapshot (``live`` False): its
  versions start where it restarted, and its completed epoch lags the others'.
- Bounded: at most ``limits.queries_waiting_max`` queries wait here; a participant's
  reads of one query are at most ``limits.query_reads_bytes_max`` bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from executor.deterministic.partition import Partition
from executor.deterministic.snapshot import (
    NO_EPOCH,
    SNAPSHOT,
    Exact,
    Prefixes,
    Snapshot,
    entry_problem,
    epoch_problem,
    local_reads,
    query_procedure,
    run_query,
)
from txn_library import limits
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_NOT_READY,
    ERR_OVERLOADED,
    ERR_TOO_LARGE,
    ERR_UNAVAILABLE,
    ERROR,
    OK,
    BadRequest,
)
from txn_library.procedure import Procedure
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire

WATERMARK_EVERY_S = 0.001  # gossip the completed epoch at most this often
PEER_TIMEOUT_S = 2.0  # a coordinator waits this long for a participant's reads


@dataclass(eq=False)
class _Job:
    """A query this partition coordinates, or a participant's share of one."""

    identity: bytes | None  # the client's (coordinator); None: a peer's share
    qid: int  # the client's query id, or the coordinator's internal id (share)
    proc: Procedure
    args: tuple
    epoch: int | None  # None: read committed
    deadline: float
    parts: tuple = ()
    coordinator: int = -1  # a share: who asked
    remote: list[tuple[Exact, Prefixes]] = field(default_factory=list)
    waiting: set[int] = field(default_factory=set)
    own_read: bool = False  # this partition's reads are in ``remote`` (a fan-out)
    after: int = 0  # read at an epoch >= this (read-your-writes; 0: any)
    pick: bool = False  # a snapshot whose epoch the coordinator picks (none named)


def _packed(value: Any) -> bytes:
    return msgpack.packb(value)


class QueryService:
    def __init__(
        self,
        part: Partition,
        send_peer: Callable[[int, bytes], None],
        clock: Callable[[], float],
    ) -> None:
        self.part = part
        self.me = part.partition
        self.partitions = part.partitions
        self.send_peer = send_peer
        self.clock = clock
        self.live = False  # caught up with the log: snapshots are served
        self.peer_completed: dict[int, int] = {}
        self.replies: dict[bytes, list[tuple[int, int, bytes, int]]] = {}
        self._waiting: list[_Job] = []  # for an epoch (local, or a share)
        self._fanout: dict[int, _Job] = {}  # internal id -> job waiting for peers' reads
        self._next_id = 1
        self._sent_completed = -1
        self._sent_at = 0.0
        self.served = 0
        self.refused = 0

    # Clients ---------------------------------------------------------------------
    def on_client_frame(self, identity: bytes, frame: bytes) -> None:
        try:
            msg = wire.unpack(frame)
        except Exception:  # noqa: BLE001 - any undecodable frame is the client's
            self._error(identity, 0, ERR_MALFORMED, "undecodable query frame")
            return
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
        try:
            proc, parts = query_procedure(proc_name, args, self.partitions)
        except BadRequest as e:
            self._error(identity, qid, e.code, e.message)
            return
        problem = entry_problem(isolation, at, after)
        if problem is not None:
            self._error(identity, qid, ERR_BAD_ARGUMENTS, problem)
            return
        if isolation == SNAPSHOT and not self.live:
            self._error(
                identity,
                qid,
                ERR_NOT_READY,
                f"partition {self.me} is recovering from the log (completed epoch "
                f"{self.part.completed_epoch()}): ask another replica",
            )
            return
        if len(self._waiting) + len(self._fanout) >= limits.queries_waiting_max:
            self._error(identity, qid, ERR_OVERLOADED, "too many queries waiting here")
            return
        epoch: int | None = None
        pick = isolation == SNAPSHOT and at < 0
        if isolation == SNAPSHOT:
            epoch = max(after, self._snapshot_epoch(parts)) if pick else at
        named = isolation == SNAPSHOT and not pick
        wait_s = limits.query_watermark_wait_s if named else limits.query_after_epoch_wait_s
        job = _Job(identity, qid, proc, args, epoch, self.clock() + wait_s)
        job.parts, job.after, job.pick = parts, after, pick
        self._run(job)

    def _snapshot_epoch(self, parts: tuple) -> int:
        """The smallest completed epoch known of the partitions a query touches."""
        e = self.part.completed_epoch()
        for q in parts:
            if q != self.me:
                e = min(e, self.peer_completed.get(q, e))
        return e

    def _ready(self, job: _Job) -> bool:
        """Whether ``job`` can read here now; answers (and drops) it if it never can."""
        completed = self.part.completed_epoch()
        problem: tuple[str, str] | None
        if job.epoch is None:
            if job.after <= completed:
                return True
            problem = (
                ERR_NOT_READY,
                f"after_epoch {job.after} is not completed at partition {self.me} "
                f"(completed: {completed})",
            )
        else:
            if job.pick:  # the newest it may read now, at least the epoch waited for
                job.epoch = max(job.after, self._snapshot_epoch(job.parts))
            versions = self.part.storage.versions
            oldest = versions.oldest if versions is not None else completed
            problem = epoch_problem(job.epoch, oldest, completed, versions is not None)
            if problem is None:
                return True
        code, message = problem
        if code == ERR_NOT_READY and self.clock() < job.deadline:
            if job not in self._waiting:
                self._waiting.append(job)
            return False
        if code == ERR_NOT_READY and job.after and (job.pick or job.epoch is None):
            message += (
                f": after_epoch {job.after} not reached within "
                f"{limits.query_after_epoch_wait_s:g} s (limits.query_after_epoch_wait_s)"
            )
        self._fail(job, code, message)
        return False

    def _run(self, job: _Job) -> None:
        if not self._ready(job):
            return
        if job.identity is None:
            self._answer_share(job)
            return
        others = [q for q in job.parts if q != self.me]
        if not others:
            self._finish(job)
            return
        # Its own reads now, while the epoch is kept: the peers' may take a while, and
        # versions may be retired meanwhile (the body runs on reads, not on the store).
        job.remote.append(
            local_reads(job.proc, job.args, self._snap(job), self.me, self.partitions)
        )
        job.own_read = True
        iid = self._next_id
        self._next_id += 1
        job.waiting = set(others)
        job.deadline = self.clock() + PEER_TIMEOUT_S
        self._fanout[iid] = job
        epoch = NO_EPOCH if job.epoch is None else job.epoch
        msg = ewire.encode(
            ewire.QueryReads(self.me, iid, job.proc.name, job.args, epoch, job.after)
        )
        for q in others:
            self.send_peer(q, msg)

    def _snap(self, job: _Job) -> Snapshot:
        return Snapshot(self.part.storage, job.epoch)

    def _finish(self, job: _Job) -> None:
        status, _, packed = run_query(
            job.proc,
            job.args,
            self._snap(job),
            self.me,
            self.partitions,
            job.remote,
            local_read=job.own_read,
        )
        epoch = job.epoch if job.epoch is not None else self.part.completed_epoch()
        assert job.identity is not None
        self.replies.setdefault(job.identity, []).append((job.qid, status, packed, epoch))
        self.served += 1

    def _error(self, identity: bytes, qid: int, code: str, message: str) -> None:
        self.refused += 1
        self.replies.setdefault(identity, []).append(
            (qid, ERROR, _packed([code, message]), NO_EPOCH)
        )

    def _fail(self, job: _Job, code: str, message: str) -> None:
        if job.identity is not None:
            self._error(job.identity, job.qid, code, message)
        else:
            self.send_peer(
                job.coordinator,
                ewire.encode(ewire.QueryReadsReply(self.me, job.qid, ERROR, (code, message), ())),
            )

    # Peers -------------------------------------------------------------------------
    def on_query_reads(self, msg: ewire.QueryReads) -> None:
        """A coordinator asks for this partition's reads of a query."""
        q = msg.from_partition
        if q == self.me or not 0 <= q < self.partitions:
            return
        try:
            proc, _ = query_procedure(msg.proc_name, msg.args, self.partitions)
        except BadRequest as e:
            self.send_peer(
                q,
                ewire.encode(
                    ewire.QueryReadsReply(self.me, msg.query_id, ERROR, (e.code, e.message), ())
                ),
            )
            return
        epoch = None if msg.epoch == NO_EPOCH else msg.epoch
        wait_s = limits.query_watermark_wait_s
        if epoch is None and msg.after_epoch > 0:
            wait_s = limits.query_after_epoch_wait_s
        job = _Job(None, msg.query_id, proc, msg.args, epoch, self.clock() + wait_s)
        job.coordinator, job.after = q, msg.after_epoch
        if epoch is not None and not self.live:
            self._fail(job, ERR_NOT_READY, f"partition {self.me} is recovering from the log")
            return
        self._run(job)

    def _answer_share(self, job: _Job) -> None:
        exact, prefixes = local_reads(job.proc, job.args, self._snap(job), self.me, self.partitions)
        msg = ewire.encode(ewire.QueryReadsReply(self.me, job.qid, OK, exact, prefixes))
        if len(msg) > limits.query_reads_bytes_max:
            self._fail(
                job,
                ERR_TOO_LARGE,
                f"a query's reads at partition {self.me} are {len(msg)} bytes > "
                f"{limits.query_reads_bytes_max} (limits.query_reads_bytes_max)",
            )
            return
        self.send_peer(job.coordinator, msg)

    def on_query_reads_reply(self, msg: ewire.QueryReadsReply) -> None:
        job = self._fanout.get(msg.query_id)
        if job is None or msg.from_partition not in job.waiting:
            return  # late (timed out), duplicate or stray
        if msg.status != OK:
            del self._fanout[msg.query_id]
            code, message = msg.exact
            assert job.identity is not None
            self._error(
                job.identity, job.qid, str(code), f"partition {msg.from_partition}: {message}"
            )
            return
        job.waiting.discard(msg.from_partition)
        job.remote.append((msg.exact, msg.prefixes))
        if not job.waiting:
            del self._fanout[msg.query_id]
            self._finish(job)

    def on_watermark(self, msg: ewire.Watermark) -> None:
        q = msg.from_partition
        if q != self.me and 0 <= q < self.partitions:
            if msg.completed_epoch > self.peer_completed.get(q, -1):
                self.peer_completed[q] = msg.completed_epoch
                # keep versions back to the slowest peer's completed epoch (a snapshot
                # across partitions is read there), within the bytes bound
                if len(self.peer_completed) == self.partitions - 1:
                    self.part.versions_floor = min(self.peer_completed.values())

    # Time ----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Retry the queries waiting for an epoch; give up on silent peers; tell the
        peers this partition's completed epoch when it moved."""
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for job in waiting:
                self._run(job)
        if self._fanout:
            for iid in [i for i, j in self._fanout.items() if now >= j.deadline]:
                job = self._fanout.pop(iid)
                assert job.identity is not None
                self._error(
                    job.identity,
                    job.qid,
                    ERR_UNAVAILABLE,
                    f"no reads from partition(s) {sorted(job.waiting)} within {PEER_TIMEOUT_S:g} s",
                )
        completed = self.part.completed_epoch()
        if completed != self._sent_completed and now - self._sent_at >= WATERMARK_EVERY_S:
            self._sent_completed, self._sent_at = completed, now
            msg = ewire.encode(ewire.Watermark(self.me, completed))
            for q in range(self.partitions):
                if q != self.me:
                    self.send_peer(q, msg)

    def take_replies(self) -> dict[bytes, list[tuple[int, int, bytes, int]]]:
        out, self.replies = self.replies, {}
        return out

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._fanout)
