"""The traditional baseline: strict two-phase locking, wait-die, two-phase commit.

One ``TraditionalPartition`` per partition plays two roles at once. As *coordinator*
it runs the stored procedures its clients send it, each in its own greenlet, taking
locks at the moment the body touches a record (local keys in its own lock table,
remote keys by a LOCK message to the owning partition) and commits with two-phase
commit when more than one partition writes. As *participant* it serves the lock and
read requests of other coordinators, votes, and applies or discards their writes.
Same Storage, same procedures, same footprint checks as the deterministic mode; no
sequencer, no global order. Like executor.deterministic.partition, the role has no sockets: inputs
are ``on_calls`` / ``on_peer`` / ``tick``; outputs are taken with ``take_outputs``.

The one rule of the outputs: log records first. ``take_outputs`` returns the log
records of the turn, the peer messages and the client replies; the caller appends
the records as one frame, syncs (group commit), and only then sends anything. So a
vote, a decision or an acknowledged result never leaves before the records it
depends on are durable, and a transaction may see data committed earlier in the same
turn (early lock release): any output that depends on it waits for the same sync.

Deadlocks: wait-die (scheduler.twopl), with the priority fixed at the first attempt
and kept across restarts. A transaction can only die while it waits for a lock, so
never after its body finished: prepare, commit and abort never wait. A body that
called ``ctx.hold_locks(ms)`` (benchmark hook) stays suspended for ms after it
returns, holding its locks, while the partition serves everything else.

Wire contract (peer messages; a turn's messages to one partition travel as one
batch ``[from_partition, [msg, ...]]``, positional msgpack, decoded with use_list=False):
  [K_LOCK, aid, prio, n, op, table, key, mode]   lock (and for GET/SCAN read) at the
        owner; n counts the coordinator's requests to that participant from 0, so a
        participant that lost a branch (restart) refuses n > 0 instead of serving a
        branch that silently lost its earlier locks
  [K_LOCK_REPLY, aid, n, granted, data]           data: row (GET), [[key,row],...] (SCAN)
  [K_PREPARE, aid, [[table, key, row|None], ...]] only to partitions with writes
  [K_VOTE, aid, vote]                             VOTE_YES / VOTE_NO
  [K_COMMIT, aid]    -> [K_ACK, aid]
  [K_ABORT, aid]     also the release of a read-only branch (no reply)
  [K_QUERY, aid]     an in-doubt participant asks its coordinator for the outcome
  [K_STATUS, status] gossip, so that every partition can answer ``ordo status``
  aid = (coordinator, seq), unique per attempt; prio = (start_us, coordinator, seq0).

Log records (presumed abort; one CommandLog frame per turn holds a list of them):
  [R_COMMIT,  aid, writes, client_id, req_id, value, digest]   one writing site: commit
  [R_DECIDE,  aid, participants, writes, client_id, req_id, value, digest]  coordinator's
        commit decision, forced before COMMIT is sent; aborts are never logged
  [R_END,     aid]                               every participant acknowledged
  [R_PREPARE, aid, coordinator, prio, writes]    forced before voting YES
  [R_OUTCOME, aid, committed]                    a prepared branch's outcome
Recovery (``recover``) replays them from the start: redo of committed writes, the
unacknowledged R_DECIDEs resend COMMIT, and prepared branches with no outcome are in
doubt: they re-take their exclusive locks and ask the coordinator (K_QUERY) until
it answers (no decision on record = abort). A live prepared branch that hears no
decision within prepare_timeout_ms asks too (its coordinator may have crashed), and
a coordinator resends COMMIT until every participant acknowledged.

Invariants (InvariantViolation is a bug):
- a transaction holds every lock it took until its commit or abort (strict 2PL); the
  only early release is a read-only branch after the lock point (standard PA);
- every write of a committed transaction is covered by an exclusive lock at its
  partition, taken before the write was buffered;
- a participant votes YES only for a branch it still holds and has logged;
- a coordinator decides COMMIT only after a YES from every partition with writes;
- a body's whole write set is validated (executor.core.execution.run_txn) before any of
  it is locked for commit, logged, sent or applied: a write that cannot be stored
  (bad key, unencodable or oversized row) makes the call ERROR, applied nowhere.
"""

from __future__ import annotations

import heapq
import json
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import greenlet
import msgpack

from executor.core.context import TxnContext, cover_set, covered
from executor.core.execution import run_txn
from executor.core.storage import MASK64, PreparedWrite, Storage, key_parts_problem
from scheduler.twopl import DIE, EV_GRANTED, EXCLUSIVE, GRANTED, SHARED, LockTable
from sequencer.retry_cache import Done, RetryCache, call_body, call_digest
from txn_library import catalog, limits, placement
from txn_library.errors import (
    ABORTED,
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_OVERLOADED,
    ERR_RESTARTS_EXHAUSTED,
    ERR_UNAVAILABLE,
    ERROR,
    OK,
    RESTART,
    BadRequest,
    FootprintViolation,
    invariant,
)
from txn_library.procedure import Procedure, lookup

REPLICATED = catalog.REPLICATED

# Peer message kinds
K_LOCK, K_LOCK_REPLY, K_PREPARE, K_VOTE, K_COMMIT, K_ABORT, K_ACK, K_QUERY, K_STATUS = range(1, 10)
OP_GET, OP_SCAN, OP_LOCK = 0, 1, 2
VOTE_YES, VOTE_NO = 0, 1
# Log record kinds
R_COMMIT, R_DECIDE, R_END, R_PREPARE, R_OUTCOME = range(1, 6)

# Injected prepare faults (tests, fault runs): what a participant does with a PREPARE.
FAULT_VOTE_NO = "vote_no"
FAULT_SILENT = "silent"  # never answers (a hang or a crash before voting)
FAULT_CRASH = "crash"  # the process exits before voting (server only)

# Bounds of this mode: cluster/limits.py (traditional_*, dependent_restarts_max).

Aid = tuple  # (coordinator, seq)
Prio = tuple  # (start_us, coordinator, seq of the first attempt)
Write = tuple  # (table, key, row | None)
PrepareFault = Callable[[Aid], "str | None"]


@dataclass(frozen=True)
class TraditionalOptions:
    """Knobs of the traditional mode; saved as data_dir/traditional.json by the launcher."""

    # Take the exclusive lock at the first read of a key the footprint says will be
    # written (SELECT ... FOR UPDATE), instead of shared-then-upgrade.
    update_locks: bool = True
    # Admission control (multiprogramming level): calls a coordinator runs at once,
    # counting those waiting to restart; the rest wait in FIFO order. 2PL thrashes
    # when far more transactions than records-in-conflict run together.
    active_max: int = 128
    prepare_timeout_ms: int = 2_000  # coordinator: votes not all in -> abort
    remote_timeout_ms: int = 10_000  # coordinator: no lock/read reply -> abort
    branch_idle_timeout_ms: int = 30_000  # participant: silent coordinator -> drop branch
    # A prepared participant with no decision after prepare_timeout_ms asks its
    # coordinator, then again every query_every_ms; a coordinator resends COMMIT to
    # participants that have not acknowledged at the same pace.
    query_every_ms: int = 200
    restart_delay_base_us: int = 1_000  # wait-die restart backoff: uniform(0, base * 2^k)
    restart_delay_cap_us: int = 100_000
    restarts_max: int = 10_000  # per call; wait-die cannot starve, so this is a backstop
    status_every_ms: int = 200  # status gossip to peers (0: off)
    # Fault injection at one partition's prepares: FAULT_* and which prepares
    # (every Nth, 1 = all of them); None = no fault.
    fault_prepare: str | None = None
    fault_partition: int = -1
    fault_every: int = 1

    def __post_init__(self) -> None:
        if self.fault_prepare not in (None, FAULT_VOTE_NO, FAULT_SILENT, FAULT_CRASH):
            raise ValueError(f"unknown fault {self.fault_prepare!r}")
        if min(self.prepare_timeout_ms, self.remote_timeout_ms, self.query_every_ms) < 1:
            raise ValueError("timeouts must be >= 1 ms")
        if self.restart_delay_cap_us < self.restart_delay_base_us or self.fault_every < 1:
            raise ValueError("bad restart delay or fault_every")
        if not 1 <= self.active_max <= limits.traditional_calls_max:
            raise ValueError(f"active_max must be in 1..{limits.traditional_calls_max}")

    FILE = "traditional.json"

    def save(self, data_dir: str | Path) -> Path:
        path = Path(data_dir) / self.FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))
        return path

    @classmethod
    def load(cls, data_dir: str | Path) -> TraditionalOptions:
        path = Path(data_dir) / cls.FILE
        return cls(**json.loads(path.read_text())) if path.exists() else cls()


@dataclass
class HistoryEntry:
    """One transaction at its lock point (all locks held), for serializability checks.

    Under 2PL the order of lock points is a serialization order, so replaying the
    committed and logically aborted entries serially in list order must reproduce
    every result and the final state. ``outcome`` is set when the outcome is known.
    """

    aid: Aid
    proc: str
    args: tuple
    status: int
    value: Any
    ts_ms: int  # what the body saw as ctx.timestamp_ms and ctx.rng's seed
    seed: int
    outcome: str = "pending"  # committed | aborted (logical) | failed (2PC/timeout)


@dataclass
class TraditionalStats:
    committed: int = 0
    committed_multi: int = 0  # with two-phase commit
    aborted: int = 0  # logical aborts (status ABORTED), rolled back everywhere
    failed: int = 0  # errors, vote NO, timeouts
    deaths: int = 0  # attempts that died under wait-die and restarted
    prepares: int = 0  # as participant
    log_records: int = 0
    dependent_restarts: int = 0
    duplicate_calls: int = 0


class _Killed(BaseException):
    """Thrown into a suspended body to unwind it (wait-die death, timeout).

    A BaseException so that run_body and procedure code that catches Exception do
    not swallow it.
    """


class _Call:
    __slots__ = (
        "identity",
        "client_id",
        "req_id",
        "proc",
        "args",
        "prio",
        "seed",
        "ts_ms",
        "restarts",
        "recon",
        "dep_restarts",
        "digest",
    )
    identity: bytes
    client_id: bytes
    req_id: int
    proc: Procedure
    args: tuple
    prio: Prio
    seed: int
    ts_ms: int
    restarts: int
    recon: bool
    dep_restarts: int
    digest: int  # of (procedure, arguments): a retry must be the same call


class _Attempt:
    __slots__ = (
        "aid",
        "call",
        "proc",
        "args",
        "reads",
        "writes",
        "glet",
        "suspended",
        "wake",
        "waiting_on",
        "doomed",
        "kill_reason",
        "parts",
        "remote_locks",
        "rows",
        "scans",
        "acks_pending",
        "outcome",
        "state",
        "deadline_us",
        "votes",
        "yes",
        "local_writes",
        "local_prepared",
        "hist",
    )
    aid: Aid
    call: _Call
    proc: Procedure
    args: tuple
    reads: frozenset
    writes: frozenset
    glet: greenlet.greenlet | None
    suspended: bool
    wake: int
    waiting_on: Any
    doomed: bool
    kill_reason: tuple | None
    parts: dict[int, int]  # participant -> lock requests sent to it
    remote_locks: dict[tuple, int]  # lock name -> strongest mode asked for
    rows: dict[tuple, Any]
    scans: dict[tuple, Any]
    acks_pending: int
    outcome: tuple | None
    state: int
    deadline_us: int
    votes: set[int]
    yes: list[int]
    local_writes: tuple
    local_prepared: list[PreparedWrite]  # local_writes with their row digests
    hist: HistoryEntry | None


# Attempt states
S_RUN, S_WAIT_ACKS, S_PREPARING = 0, 1, 2
# Branch states
B_ACTIVE, B_PREPARED, B_DEAD = 0, 1, 2


class _Branch:
    __slots__ = ("aid", "prio", "coord", "state", "queue", "waiting", "writes", "touched_us")

    def __init__(self, aid: Aid, prio: Prio, coord: int, now_us: int) -> None:
        self.aid = aid
        self.prio = prio
        self.coord = coord
        self.state = B_ACTIVE
        self.queue: deque[tuple] = deque()  # pending K_LOCK requests, one in the table
        self.waiting = False
        self.writes: tuple = ()
        self.touched_us = now_us


class _LockingContext(TxnContext):
    """TxnContext whose put/delete take the exclusive lock as the write happens."""

    __slots__ = ("_on_write",)

    def __init__(self, *args: Any, on_write: Callable[[str, tuple], None]) -> None:
        super().__init__(*args)
        self._on_write = on_write

    def put(self, table: str, key: tuple, row: tuple) -> None:
        super().put(table, key, row)  # footprint check and buffering
        self._on_write(table, key)

    def delete(self, table: str, key: tuple) -> None:
        super().delete(table, key)
        self._on_write(table, key)


def _lock_name(table: str, key: tuple) -> tuple:
    if len(key) < catalog.table(table).lock_prefix:
        raise FootprintViolation(
            f"{table}{key!r} is coarser than a lock: the traditional mode locks whole "
            f"lock_len prefixes only (no range locks)"
        )
    return placement.lock_name(table, key)


def _wall_clock_us() -> int:
    return time.time_ns() // 1000


class TraditionalPartition:
    """Coordinator and participant of one partition. One thread; not thread-safe."""

    def __init__(
        self,
        partition: int,
        partitions: int,
        storage: Storage | None = None,
        *,
        options: TraditionalOptions | None = None,
        clock: Callable[[], int] = _wall_clock_us,
        rng: random.Random | None = None,
        prepare_fault: PrepareFault | None = None,
        history: list[HistoryEntry] | None = None,
    ) -> None:
        self.partition = partition
        self.partitions = partitions
        self.storage = storage if storage is not None else Storage()
        self.options = options or TraditionalOptions()
        self._clock = clock
        self._rng = rng or random.Random()
        self._fault = prepare_fault
        self.history = history
        self.locks = LockTable()
        self.stats = TraditionalStats()
        self._seq = clock()  # attempt ids stay unique across restarts of the process
        self._attempts: dict[Aid, _Attempt] = {}
        self._restarting = 0  # calls waiting for their restart timer
        self._in_system = 0  # admitted calls not yet answered
        self._admission: deque[_Call] = deque()  # accepted, waiting for a slot
        self._branches: dict[Aid, _Branch] = {}
        self._decisions: dict[Aid, set[int]] = {}  # committed, acks outstanding
        self._in_doubt: set[Aid] = set()
        self._ready: deque[tuple[_Attempt, int, Any]] = deque()  # (attempt, wake, value)
        self._timers: list[tuple[int, int, int, Any]] = []
        self._timer_seq = 0
        self._pumping = False
        self.retries = RetryCache()  # exactly-once retries, as at the sequencer
        self.peer_status: dict[int, tuple] = {}
        self._peer_heard_us: dict[int, int] = {}
        self.pid: int | None = None  # set by the process that runs this role (status only)
        self.log_out: list[tuple] = []
        self.peer_out: dict[int, list[tuple]] = {}
        self.client_out: dict[bytes, list[tuple]] = {}
        self._add_timer(clock() + 1000 * self.options.branch_idle_timeout_ms, T_SWEEP, None)
        if self.options.status_every_ms and partitions > 1:
            self._add_timer(clock(), T_STATUS, None)

    # Outputs --------------------------------------------------------------------
    def take_outputs(self) -> tuple[list[tuple], dict[int, list[tuple]], dict[bytes, list[tuple]]]:
        """(log records, peer messages by partition, client replies by identity).

        The caller must make the records durable before sending anything else.
        """
        out = (self.log_out, self.peer_out, self.client_out)
        self.log_out, self.peer_out, self.client_out = [], {}, {}
        self.stats.log_records += len(out[0])
        return out

    def _send(self, p: int, msg: tuple) -> None:
        self.peer_out.setdefault(p, []).append(msg)

    def _reply(self, call: _Call, status: int, value: Any) -> None:
        """The call's final answer: frees its admission slot."""
        self.client_out.setdefault(call.identity, []).append((call.req_id, status, value))
        if call.client_id:
            self.retries.finish((call.client_id, call.req_id), status, value, call.digest)
        self._in_system -= 1
        invariant(self._in_system >= 0, "more answers than admitted calls")
        while self._admission and self._in_system < self.options.active_max:
            self._admit(self._admission.popleft())

    def _admit(self, call: _Call) -> None:
        self._in_system += 1
        self._start(call)

    # Inputs: clients ---------------------------------------------------------------
    def on_calls(self, identity: bytes, client_id: Any, calls: Any) -> None:
        """A client's REQ_CALLS frame (decoded): validate, dedup, start each call."""
        if not isinstance(client_id, bytes) or len(client_id) > 64:
            self._error(identity, None, ERR_MALFORMED, "client_id must be bytes (<= 64)")
            return
        if not isinstance(calls, (tuple, list)) or len(calls) > limits.calls_per_frame_max:
            self._error(identity, None, ERR_MALFORMED, "calls must be an array of calls")
            return
        for c in calls:
            if not isinstance(c, (tuple, list)) or len(c) not in (3, 4):
                self._error(identity, None, ERR_MALFORMED, "a call is [req_id, procedure, args]")
                continue
            req_id, name, args = c[:3]
            if not isinstance(req_id, int) or isinstance(req_id, bool):
                self._error(identity, None, ERR_MALFORMED, "req_id must be an integer")
                continue
            try:
                self._accept(identity, client_id, req_id, name, args)
            except BadRequest as e:
                self._error(identity, req_id, e.code, e.message)
        self._run_ready()

    def _error(self, identity: bytes, req_id: Any, code: str, message: str) -> None:
        self.client_out.setdefault(identity, []).append((req_id, ERROR, (code, message)))

    def _accept(self, identity: bytes, client_id: bytes, req_id: int, name: Any, args: Any) -> None:
        proc = lookup(name)
        proc.validate(args)
        args = tuple(args)
        digest = call_digest(call_body(proc.name, args))
        key = (client_id, req_id)
        seen = self.retries.retry_of(key, digest) if client_id else None
        if seen is not None:
            self.stats.duplicate_calls += 1
            if isinstance(seen, Done):
                self.client_out.setdefault(identity, []).append((req_id, seen.status, seen.value))
            else:
                seen.identity = identity  # in flight: answer the retry's connection
            return
        if self._in_system + len(self._admission) >= limits.traditional_calls_max:
            raise BadRequest(ERR_OVERLOADED, "too many calls in flight; retry later")
        call = _Call()
        call.identity, call.client_id, call.req_id = identity, client_id, req_id
        call.proc, call.args, call.digest = proc, args, digest
        self._seq += 1
        now = self._clock()
        call.prio = (now, self.partition, self._seq)
        call.ts_ms = now // 1000
        call.seed = self._rng.getrandbits(63)
        call.restarts = call.dep_restarts = 0
        call.recon = proc.recon is not None
        if client_id:
            self.retries.start(key, call)
        if self._in_system < self.options.active_max and not self._admission:
            self._admit(call)
        else:
            self._admission.append(call)

    @staticmethod
    def _footprint(proc: Procedure, args: tuple) -> Any:
        try:
            return proc.footprint_of(args)
        except BadRequest:
            raise
        except Exception as e:
            raise BadRequest(ERR_BAD_ARGUMENTS, f"footprint of {proc.name} failed: {e}") from None

    # Coordinator: running bodies -------------------------------------------------------
    def _start(self, call: _Call) -> None:
        proc = lookup(call.proc.recon) if call.recon else call.proc
        try:
            fp = self._footprint(proc, call.args)
        except BadRequest as e:  # the caller's error: nothing was locked or changed
            self._reply(call, ERROR, (e.code, e.message))
            return
        self._seq += 1
        att = _Attempt()
        att.aid = (self.partition, self._seq)
        att.call, att.proc, att.args = call, proc, call.args
        att.reads, att.writes = cover_set(fp.reads), cover_set(fp.writes)
        att.suspended, att.waiting_on, att.doomed, att.kill_reason = True, None, False, None
        att.wake = 0
        att.parts = {}
        att.remote_locks = {}
        att.rows, att.scans = {}, {}
        att.acks_pending = 0
        att.outcome = None
        att.state = S_RUN
        att.deadline_us = 0
        att.votes, att.yes = set(), []
        att.local_writes = ()
        att.local_prepared = []
        att.hist = None
        att.glet = greenlet.greenlet(lambda _v: self._body(att))
        self._attempts[att.aid] = att
        self._ready.append((att, 0, None))

    def _body(self, att: _Attempt) -> Any:
        call = att.call
        ctx = _LockingContext(
            att.aid[1],
            call.ts_ms,
            call.seed,
            att.reads,
            att.writes,
            lambda t, k: self._get(att, t, k),
            lambda t, p: self._scan(att, t, p),
            on_write=lambda t, k: self._on_write(att, t, k),
        )
        try:
            status, value, writes = run_txn(att.proc, att.args, ctx, self.storage)
            if ctx.hold_ms:  # benchmark hook: keep every lock taken so far, loop goes on
                self._add_timer(self._clock() + 1000 * ctx.hold_ms, T_HOLD, (att, att.wake + 1))
                self._suspend(att, HOLD)
            return (status, value), writes
        except _Killed:
            return None

    def _run_ready(self) -> None:
        """Resume runnable bodies until none is left. Only ever called from outside bodies."""
        ready = self._ready
        while ready:
            att, wake, value = ready.popleft()
            if wake != att.wake or not att.suspended or self._attempts.get(att.aid) is not att:
                continue  # stale: that wait is over, or the attempt ended
            att.suspended = False
            att.waiting_on = None
            g = att.glet
            assert g is not None  # suspended bodies have a live greenlet
            g.parent = greenlet.getcurrent()
            out = g.throw(_Killed()) if att.doomed else g.switch(value)
            if g.dead:
                att.glet = None
                self._on_body_exit(att, out)

    def _suspend(self, att: _Attempt, waiting_on: Any) -> Any:
        att.suspended = True
        att.waiting_on = waiting_on
        att.wake += 1
        parent = greenlet.getcurrent().parent
        invariant(parent is not None, "a body must run in its own greenlet")
        return parent.switch()

    def _doom(self, att: _Attempt, reason: tuple | None) -> None:
        """End an attempt that cannot continue: None = die and restart, else reply reason."""
        if att.doomed or self._attempts.get(att.aid) is not att:
            return
        att.doomed = True
        att.kill_reason = reason
        if att.suspended:
            self._ready.append((att, att.wake, None))  # unwinds the body, then _on_body_exit
        elif att.glet is None:
            self._abort(att, reason)
        # else: the body is running right now (it will see doomed at its next lock)

    def _get(self, att: _Attempt, table: str, key: tuple) -> tuple | None:
        p = placement.partition_of(table, key, self.partitions)
        if p == REPLICATED:
            return self.storage.get(table, key)
        mode = self._read_mode(att, table, key)
        if p == self.partition:
            self._lock_local(att, _lock_name(table, key), mode)
            return self.storage.get(table, key)
        return self._remote(att, p, OP_GET, table, key, mode)

    def _scan(self, att: _Attempt, table: str, prefix: tuple) -> list:
        p = placement.partition_of(table, prefix, self.partitions)
        if p == REPLICATED:
            return self.storage.scan(table, prefix)
        mode = self._read_mode(att, table, prefix)
        if p == self.partition:
            self._lock_local(att, _lock_name(table, prefix), mode)
            return self.storage.scan(table, prefix)
        return list(self._remote(att, p, OP_SCAN, table, prefix, mode))

    def _read_mode(self, att: _Attempt, table: str, key: tuple) -> int:
        if self.options.update_locks and covered(att.writes, table, key):
            return EXCLUSIVE
        return SHARED

    def _on_write(self, att: _Attempt, table: str, key: tuple) -> None:
        p = placement.partition_of(table, key, self.partitions)
        name = _lock_name(table, key)
        if p == self.partition:
            self._lock_local(att, name, EXCLUSIVE)
            return
        if att.remote_locks.get(name) == EXCLUSIVE:
            return
        # A write returns nothing, so its remote lock is not waited for here: the body
        # goes on and the grant (or death) is collected before the commit.
        self._send_lock(att, p, OP_LOCK, table, key, EXCLUSIVE, name)
        att.acks_pending += 1

    def _lock_local(self, att: _Attempt, name: tuple, mode: int) -> None:
        if att.doomed:
            raise _Killed()
        decision = self.locks.acquire(att.aid, att.call.prio, name, mode)
        self._pump()
        if decision == GRANTED:
            return
        if decision == DIE:
            att.doomed = True
            raise _Killed()
        self._suspend(att, name)

    def _remote(self, att: _Attempt, p: int, op: int, table: str, key: tuple, mode: int) -> Any:
        if att.doomed:
            raise _Killed()
        name = _lock_name(table, key)
        cache = att.rows if op == OP_GET else att.scans
        held = att.remote_locks.get(name)
        if held is not None and held >= mode and (table, key) in cache:
            return cache[(table, key)]  # locked, so it cannot have changed
        n = self._send_lock(att, p, op, table, key, mode, name)
        self._set_deadline(att, self.options.remote_timeout_ms)
        data = self._suspend(att, (p, n))
        att.deadline_us = 0
        cache[(table, key)] = data
        return data

    def _send_lock(
        self, att: _Attempt, p: int, op: int, table: str, key: tuple, mode: int, name: tuple
    ) -> int:
        problem = key_parts_problem(key)  # runs in the body: raising fails the call only
        if problem is not None:
            raise ValueError(f"{table} key cannot be sent to partition {p}: {problem}")
        n = att.parts.get(p, 0)
        att.parts[p] = n + 1
        if att.remote_locks.get(name, -1) < mode:
            att.remote_locks[name] = mode
        self._send(p, (K_LOCK, att.aid, att.call.prio, n, op, table, key, mode))
        return n

    def _set_deadline(self, att: _Attempt, ms: int) -> None:
        att.deadline_us = self._clock() + 1000 * ms
        self._add_timer(att.deadline_us, T_DEADLINE, att.aid)

    def _on_body_exit(self, att: _Attempt, out: Any) -> None:
        if out is None or att.doomed:
            self._abort(att, att.kill_reason)
            return
        (status, value), writes = out
        att.outcome = (status, value, writes)
        if att.acks_pending:
            att.state = S_WAIT_ACKS
            self._set_deadline(att, self.options.remote_timeout_ms)
            return
        self._lock_point(att)

    # Coordinator: commit and abort --------------------------------------------------
    def _lock_point(self, att: _Attempt) -> None:
        """Every lock is held and the body is done: decide how to finish."""
        assert att.outcome is not None  # set when the body exited
        status, value, writes = att.outcome
        call = att.call
        att.deadline_us = 0
        if self.history is not None and not call.recon:
            att.hist = HistoryEntry(
                att.aid, call.proc.name, call.args, status, value, call.ts_ms, call.seed
            )
            self.history.append(att.hist)
        if call.recon and status == OK:
            self._release_everywhere(att, "done")
            call.args = call.args + (value,)
            call.recon = False
            self._start(call)
            return
        if status == RESTART:
            self._release_everywhere(att, "failed")
            self.stats.dependent_restarts += 1
            call.dep_restarts += 1
            if call.dep_restarts > limits.dependent_restarts_max:
                msg = f"{call.proc.name} restarted {call.dep_restarts - 1} times"
                self._reply(call, ERROR, (ERR_RESTARTS_EXHAUSTED, msg))
            else:
                call.args = call.args[:-1] + (value,)
                self._start(call)
            return
        if status != OK:  # logical abort or a procedure error: roll back everywhere
            self._release_everywhere(att, "aborted")
            if status == ABORTED:
                self.stats.aborted += 1
            else:
                self.stats.failed += 1
            self._reply(call, status, value)
            return
        me, n = self.partition, self.partitions
        local: list[Write] = []
        remote: dict[int, list[Write]] = {}
        local_prepared: list[PreparedWrite] = []
        for w in writes:  # validated as a whole by run_txn: none of them can fail
            t, key, row, _digest = w
            p = placement.partition_of(t, key, n)
            if p == me:
                local.append((t, key, row))
                local_prepared.append(w)
            else:
                remote.setdefault(p, []).append((t, key, row))
        att.local_writes = tuple(local)
        att.local_prepared = local_prepared
        for p in att.parts:
            if p not in remote:
                self._send(p, (K_ABORT, att.aid))  # read-only branch: release its locks
        if not remote:
            self._commit(att, ())
            return
        for p, ws in remote.items():
            invariant(p in att.parts, f"write at partition {p} without a lock there")
            self._send(p, (K_PREPARE, att.aid, ws))
        att.votes = set(remote)
        att.state = S_PREPARING
        self._set_deadline(att, self.options.prepare_timeout_ms)

    def _commit(self, att: _Attempt, participants: tuple[int, ...]) -> None:
        call = att.call
        assert att.outcome is not None
        status, value, _ = att.outcome
        cid, rid = call.client_id, call.req_id
        if participants:
            self.log_out.append(
                (R_DECIDE, att.aid, participants, att.local_writes, cid, rid, value, call.digest)
            )
            self._decisions[att.aid] = set(participants)
            for p in participants:
                self._send(p, (K_COMMIT, att.aid))
            due = self._clock() + 1000 * self.options.prepare_timeout_ms
            self._add_timer(due, T_RESEND, att.aid)
            self.stats.committed_multi += 1
        elif att.local_writes:
            self.log_out.append((R_COMMIT, att.aid, att.local_writes, cid, rid, value, call.digest))
        self.storage.apply(att.local_prepared)
        self.stats.committed += 1
        if att.hist is not None:
            att.hist.outcome = "committed"
        self._finish(att)
        self._reply(call, status, value)

    def _release_everywhere(self, att: _Attempt, outcome: str) -> None:
        for p in att.parts:
            self._send(p, (K_ABORT, att.aid))
        if att.hist is not None:
            att.hist.outcome = outcome
        self._finish(att)

    def _finish(self, att: _Attempt) -> None:
        del self._attempts[att.aid]
        att.deadline_us = 0
        self.locks.release_all(att.aid)
        self._pump()

    def _abort(self, att: _Attempt, reason: tuple | None) -> None:
        """Abort an attempt (body no longer running). reason None: wait-die restart."""
        self._release_everywhere(att, "failed")
        call = att.call
        if reason is not None:
            self.stats.failed += 1
            self._reply(call, *reason)
            return
        self.stats.deaths += 1
        call.restarts += 1
        if call.restarts > self.options.restarts_max:
            self.stats.failed += 1
            msg = f"{call.proc.name} died {call.restarts - 1} times under wait-die"
            self._reply(call, ERROR, (ERR_RESTARTS_EXHAUSTED, msg))
            return
        o = self.options
        span = min(o.restart_delay_cap_us, o.restart_delay_base_us << min(call.restarts, 30))
        self._restarting += 1
        self._add_timer(self._clock() + self._rng.randrange(span + 1), T_RESTART, call)

    def _apply(self, writes: Iterable[Write]) -> None:
        put = self.storage.put
        for t, key, row in writes:
            put(t, key, row)

    # Inputs: peers ----------------------------------------------------------------------
    def on_peer(self, src: int, msgs: Iterable[tuple]) -> None:
        """One batch of messages from partition ``src``, in the order it sent them."""
        handlers = self._handlers
        for m in msgs:
            handlers[m[0]](self, src, m)
        self._run_ready()

    def _on_lock_reply(self, src: int, m: tuple) -> None:
        _, aid, n, granted, data = m
        att = self._attempts.get(aid)
        if att is None or att.doomed:
            return  # an attempt that already ended
        if not granted:
            self._doom(att, None)
            return
        if att.suspended and att.waiting_on == (src, n):
            self._ready.append((att, att.wake, data))
            return
        att.acks_pending -= 1
        invariant(att.acks_pending >= 0, f"{aid}: more lock grants than requests")
        if att.acks_pending == 0 and att.state == S_WAIT_ACKS:
            self._lock_point(att)

    def _on_vote(self, src: int, m: tuple) -> None:
        _, aid, vote = m
        att = self._attempts.get(aid)
        if att is None or att.state != S_PREPARING or src not in att.votes:
            return  # already aborted (its ABORT is on the way to src)
        if vote != VOTE_YES:
            self._abort(att, (ERROR, (ERR_UNAVAILABLE, f"partition {src} voted no")))
            return
        att.votes.discard(src)
        att.yes.append(src)
        if not att.votes:
            self._commit(att, tuple(sorted(att.yes)))

    def _on_ack(self, src: int, m: tuple) -> None:
        aid = m[1]
        waiting = self._decisions.get(aid)
        if waiting is None:
            return
        waiting.discard(src)
        if not waiting:
            del self._decisions[aid]
            self.log_out.append((R_END, aid))

    def _on_query(self, src: int, m: tuple) -> None:
        aid = m[1]
        if aid in self._decisions:
            self._send(src, (K_COMMIT, aid))
        elif aid not in self._attempts:
            self._send(src, (K_ABORT, aid))  # presumed abort
        # else: still deciding; the decision itself will reach src

    def _on_status(self, src: int, m: tuple) -> None:
        self.peer_status[src] = m[1]
        self._peer_heard_us[src] = self._clock()

    # Participant ------------------------------------------------------------------------
    def _on_lock(self, src: int, m: tuple) -> None:
        aid, prio, n = m[1], m[2], m[3]
        br = self._branches.get(aid)
        if br is None:
            if n != 0:  # we lost this branch (restart) or dropped it: its locks are gone
                self._send(src, (K_LOCK_REPLY, aid, n, False, None))
                return
            br = self._branches[aid] = _Branch(aid, prio, src, self._clock())
        if br.state != B_ACTIVE:
            invariant(br.state == B_DEAD, f"{aid}: lock request after prepare")
            self._send(src, (K_LOCK_REPLY, aid, n, False, None))
            return
        br.touched_us = self._clock()
        br.queue.append(m)
        if not br.waiting:
            self._branch_next(br)
        self._pump()

    def _branch_next(self, br: _Branch) -> None:
        """Serve the branch's queued requests in order until one has to wait."""
        while br.queue and not br.waiting and br.state == B_ACTIVE:
            m = br.queue[0]
            name = _lock_name(m[5], m[6])
            decision = self.locks.acquire(br.aid, br.prio, name, m[7])
            if decision == GRANTED:
                self._branch_reply(br)
            elif decision == DIE:
                self._branch_die(br)
            else:
                br.waiting = True

    def _branch_reply(self, br: _Branch) -> None:
        m = br.queue.popleft()
        op, table, key = m[4], m[5], m[6]
        if op == OP_GET:
            data: Any = self.storage.get(table, key)
        elif op == OP_SCAN:
            data = self.storage.scan(table, key)
        else:
            data = None
        self._send(br.coord, (K_LOCK_REPLY, br.aid, m[3], True, data))

    def _branch_die(self, br: _Branch) -> None:
        if br.queue:
            self._send(br.coord, (K_LOCK_REPLY, br.aid, br.queue[0][3], False, None))
        br.queue.clear()
        br.waiting = False
        br.state = B_DEAD  # kept until the coordinator's ABORT, to refuse stray requests
        self.locks.release_all(br.aid)

    def _on_prepare(self, src: int, m: tuple) -> None:
        _, aid, writes = m
        br = self._branches.get(aid)
        if br is None or br.state != B_ACTIVE or br.queue:
            self._send(src, (K_VOTE, aid, VOTE_NO))
            return
        fault = self._fault(aid) if self._fault is not None else None
        if fault == FAULT_SILENT:
            return
        if fault is not None:
            self._branch_die(br)
            self._send(src, (K_VOTE, aid, VOTE_NO))
            self._pump()
            return
        me, n = self.partition, self.partitions
        for t, key, _row in writes:
            invariant(placement.partition_of(t, key, n) == me, f"{aid}: write {t}{key!r} not here")
            invariant(
                self.locks.mode_held(aid, _lock_name(t, key)) == EXCLUSIVE,
                f"{aid}: write {t}{key!r} without an exclusive lock",
            )
        self.log_out.append((R_PREPARE, aid, src, br.prio, writes))
        br.state = B_PREPARED
        br.writes = writes
        self.stats.prepares += 1
        self._send(src, (K_VOTE, aid, VOTE_YES))
        # Termination: if no decision comes (the coordinator may have crashed), ask.
        self._add_timer(self._clock() + 1000 * self.options.prepare_timeout_ms, T_QUERY, aid)

    def _on_commit(self, src: int, m: tuple) -> None:
        aid = m[1]
        br = self._branches.get(aid)
        if br is not None:
            invariant(br.state == B_PREPARED, f"{aid}: COMMIT for an unprepared branch")
            self._apply(br.writes)
            self.log_out.append((R_OUTCOME, aid, True))
            self._drop_branch(br)
        self._send(src, (K_ACK, aid))  # also for a branch committed before a restart

    def _on_abort(self, src: int, m: tuple) -> None:
        br = self._branches.get(m[1])
        if br is None:
            return
        if br.state == B_PREPARED:
            self.log_out.append((R_OUTCOME, br.aid, False))
        self._drop_branch(br)

    def _drop_branch(self, br: _Branch) -> None:
        del self._branches[br.aid]
        self._in_doubt.discard(br.aid)
        self.locks.release_all(br.aid)
        self._pump()

    # Lock events ------------------------------------------------------------------------
    def _pump(self) -> None:
        """Turn lock-table events into resumptions and replies (never switches greenlets)."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while self.locks.has_events():
                for kind, owner, _name, _mode in self.locks.take_events():
                    att = self._attempts.get(owner)  # type: ignore[call-overload]
                    if att is not None:
                        if kind == EV_GRANTED:
                            self._ready.append((att, att.wake, None))
                        else:
                            self._doom(att, None)
                        continue
                    br = self._branches.get(owner)  # type: ignore[call-overload]
                    if br is None or br.state != B_ACTIVE:
                        self.locks.release_all(owner)  # it ended meanwhile: give it back
                        continue
                    if kind == EV_GRANTED:
                        br.waiting = False
                        self._branch_reply(br)
                        self._branch_next(br)
                    else:
                        self._branch_die(br)
        finally:
            self._pumping = False

    # Timers -----------------------------------------------------------------------------
    def _add_timer(self, due_us: int, kind: int, obj: Any) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (due_us, self._timer_seq, kind, obj))

    def next_deadline_us(self) -> int | None:
        return self._timers[0][0] if self._timers else None

    def tick(self) -> None:
        """Fire due timers: restarts, timeouts, in-doubt queries, sweeps, status gossip."""
        now = self._clock()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, obj = heapq.heappop(timers)
            self._timer_handlers[kind](self, obj, now)
        self._run_ready()

    def _on_hold_timer(self, obj: tuple, now: int) -> None:
        att, wake = obj
        if att.suspended and att.wake == wake and att.waiting_on == HOLD:
            self._ready.append((att, wake, None))

    def _on_restart_timer(self, call: _Call, now: int) -> None:
        self._restarting -= 1
        self._start(call)

    def _on_deadline(self, aid: Aid, now: int) -> None:
        att = self._attempts.get(aid)
        if att is None or not att.deadline_us or att.deadline_us > now:
            return
        if att.state == S_PREPARING:
            waiting = sorted(att.votes)
            self._abort(att, (ERROR, (ERR_UNAVAILABLE, f"no vote from partitions {waiting}")))
        else:
            self._doom(att, (ERROR, (ERR_UNAVAILABLE, "a participant did not answer")))

    def _on_query_timer(self, aid: Aid, now: int) -> None:
        br = self._branches.get(aid)
        if br is not None and br.state == B_PREPARED:
            self._send(br.coord, (K_QUERY, aid))
            self._add_timer(now + 1000 * self.options.query_every_ms, T_QUERY, aid)

    def _on_resend_timer(self, aid: Aid, now: int) -> None:
        waiting = self._decisions.get(aid)
        if waiting:
            for p in sorted(waiting):
                self._send(p, (K_COMMIT, aid))
            self._add_timer(now + 1000 * self.options.query_every_ms, T_RESEND, aid)

    def _on_sweep(self, _: Any, now: int) -> None:
        """Drop branches whose coordinator went silent before they were prepared."""
        limit_us = 1000 * self.options.branch_idle_timeout_ms
        for br in list(self._branches.values()):
            if br.state == B_PREPARED or br.waiting or now - br.touched_us < limit_us:
                continue
            if br.state == B_ACTIVE:
                self._branch_die(br)
                br.touched_us = now
            else:
                del self._branches[br.aid]
        self._pump()
        self._add_timer(now + limit_us, T_SWEEP, None)

    def _on_status_timer(self, _: Any, now: int) -> None:
        st = self.status()
        for q in range(self.partitions):
            if q != self.partition:
                self._send(q, (K_STATUS, st))
        self._add_timer(now + 1000 * self.options.status_every_ms, T_STATUS, None)

    # Recovery ---------------------------------------------------------------------------
    def recover(self, frames: Iterable[bytes]) -> int:
        """Redo the log of this partition (before going live). Returns records replayed."""
        invariant(not self._attempts and not self._branches, "recover() on a live partition")
        prepared: dict[Aid, tuple] = {}
        n = 0
        for data in frames:
            for r in msgpack.unpackb(data, use_list=False):
                n += 1
                kind = r[0]
                if kind == R_COMMIT:
                    self._apply(r[2])
                    self._recovered_result(r[3], r[4], r[5], r[6] if len(r) > 6 else None)
                elif kind == R_DECIDE:
                    self._apply(r[3])
                    self._decisions[r[1]] = set(r[2])
                    self._recovered_result(r[4], r[5], r[6], r[7] if len(r) > 7 else None)
                elif kind == R_END:
                    self._decisions.pop(r[1], None)
                elif kind == R_PREPARE:
                    prepared[r[1]] = r
                elif kind == R_OUTCOME:
                    rec = prepared.pop(r[1], None)
                    invariant(rec is not None, f"outcome of {r[1]} without its prepare record")
                    assert rec is not None
                    if r[2]:
                        self._apply(rec[4])
                else:
                    invariant(False, f"unknown log record kind {kind!r}")
                if r[1][0] == self.partition:
                    self._seq = max(self._seq, r[1][1])
        now = self._clock()
        for aid, (_, _, coord, prio, writes) in prepared.items():
            br = self._branches[aid] = _Branch(aid, prio, coord, now)
            br.state, br.writes = B_PREPARED, writes
            for t, key, _row in writes:
                got = self.locks.acquire(aid, prio, _lock_name(t, key), EXCLUSIVE)
                invariant(got == GRANTED, f"in-doubt {aid}: its lock on {t}{key!r} is taken")
            self._in_doubt.add(aid)
            self._add_timer(now, T_QUERY, aid)
        for aid, parts in self._decisions.items():
            for p in sorted(parts):
                self._send(p, (K_COMMIT, aid))
            self._add_timer(now + 1000 * self.options.query_every_ms, T_RESEND, aid)
        return n

    def _recovered_result(
        self, client_id: bytes, req_id: int, value: Any, digest: int | None
    ) -> None:
        if client_id:
            self.retries.finish((client_id, req_id), OK, value, digest)

    # Introspection ----------------------------------------------------------------------
    def status(self) -> tuple:
        s = self.stats
        return (
            self.partition,
            s.committed,
            self.storage.state_hash,
            self._in_system + len(self._admission),
            len(self._branches),
            s.aborted,
            s.failed,
            s.deaths,
            len(self._in_doubt),
            self.pid,
            self.locks.waits,
            self.locks.blocked,
        )

    def status_report(self) -> dict:
        """The REQ_STATUS answer; shaped like the sequencer's so ``ordo status`` works."""
        rows = dict(self.peer_status)
        rows[self.partition] = self.status()
        now = self._clock()
        silent_us = 5 * 1000 * max(self.options.status_every_ms, 200)
        parts = []
        for p in sorted(rows):
            row = rows[p]
            _, committed, h, active, branches, aborted, failed, deaths, in_doubt, pid = row[:10]
            waits, blocked = row[10:12] if len(row) >= 12 else (0, 0)
            heard = self._peer_heard_us.get(p, now)
            parts.append(
                {
                    "down": now - heard > silent_us,
                    "pid": pid,
                    "newest_checkpoint_epoch": 0,  # no checkpoints in this mode
                    "catching_up": False,
                    "replica": 0,
                    "partition": p,
                    "last_epoch": 0,
                    "txns_applied": committed,
                    "state_hash": f"{h:016x}",
                    "active": active + branches,
                    "aborted": aborted,
                    "failed": failed,
                    "deaths": deaths,
                    "in_doubt": in_doubt,
                    "lock_waits": waits,  # lock requests queued (local and for branches)
                    "blocked": blocked,  # owners waiting for a lock now
                }
            )
        s = self.stats
        return {
            "mode": "traditional",
            "epoch": 0,
            "next_txn_id": 0,
            "calls_accepted": 0,
            "calls_rejected": 0,
            "txns_sequenced": sum(x["txns_applied"] for x in parts),
            "restarts": sum(x["deaths"] for x in parts),
            "queries": 0,
            "duplicate_calls": s.duplicate_calls,
            "determinism_violations": 0,
            "failed": sum(x["failed"] for x in parts),
            "log_first_epoch": 0,
            "pending": self._in_system + len(self._admission),
            "in_flight": self._in_system,
            "partitions": parts,
        }

    def idle(self) -> bool:
        return not self._in_system and not self._admission and not self._branches

    def check_invariants(self) -> None:
        self.locks.check_invariants()
        invariant(
            self._in_system <= self.options.active_max
            and len(self._attempts) + self._restarting <= self._in_system,
            "admission bound broken",
        )
        for aid, br in self._branches.items():
            invariant(br.state != B_PREPARED or not br.queue, f"{aid}: prepared with requests")
        for aid in self._in_doubt:
            invariant(aid in self._branches, f"in-doubt {aid} has no branch")

    _handlers: dict[int, Callable[[TraditionalPartition, int, tuple], None]] = {}
    _timer_handlers: dict[int, Callable[[TraditionalPartition, Any, int], None]] = {}


T_RESTART, T_DEADLINE, T_QUERY, T_SWEEP, T_STATUS, T_RESEND, T_HOLD = range(7)
HOLD = ("hold",)  # what a body suspended by ctx.hold_locks waits on
TraditionalPartition._handlers = {
    K_LOCK: TraditionalPartition._on_lock,
    K_LOCK_REPLY: TraditionalPartition._on_lock_reply,
    K_PREPARE: TraditionalPartition._on_prepare,
    K_VOTE: TraditionalPartition._on_vote,
    K_COMMIT: TraditionalPartition._on_commit,
    K_ABORT: TraditionalPartition._on_abort,
    K_ACK: TraditionalPartition._on_ack,
    K_QUERY: TraditionalPartition._on_query,
    K_STATUS: TraditionalPartition._on_status,
}
TraditionalPartition._timer_handlers = {
    T_RESTART: TraditionalPartition._on_restart_timer,
    T_DEADLINE: TraditionalPartition._on_deadline,
    T_QUERY: TraditionalPartition._on_query_timer,
    T_SWEEP: TraditionalPartition._on_sweep,
    T_STATUS: TraditionalPartition._on_status_timer,
    T_RESEND: TraditionalPartition._on_resend_timer,
    T_HOLD: TraditionalPartition._on_hold_timer,
}


def home_partition(proc: str, args: Iterable[Any], partitions: int) -> int:
    """Where a client should send a call (placement.home of its footprint, or of its
    reconnaissance's for a dependent procedure). Any partition can coordinate any call;
    sending it home saves remote lock requests."""
    p_ = lookup(proc)
    if p_.recon is not None:
        p_ = lookup(p_.recon)
    fp = p_.footprint_of(tuple(args))
    return placement.home(fp.reads, fp.writes, partitions)


def every_nth_prepare(kind: str, n: int) -> PrepareFault:
    """A prepare fault that strikes the n-th, 2n-th, ... prepare (n = 1: every one)."""
    count = 0

    def fault(_aid: Aid) -> str | None:
        nonlocal count
        count += 1
        return kind if count % n == 0 else None

    return fault


def pack_records(records: list[tuple]) -> bytes:
    return msgpack.packb(records)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False)


class LocalTraditionalCluster:
    """Every partition of a traditional cluster in one process, with a simulated network.

    Delivery is FIFO per (sender, receiver) channel, like a TCP connection, and
    randomly interleaved across channels and partitions (seeded), with a virtual
    clock. Messages and log frames go through msgpack exactly as on the wire. A
    partition's log is a list of frames; ``crash`` drops a partition's memory and
    in-flight messages and rebuilds it from its log.
    """

    def __init__(
        self,
        partitions: int,
        *,
        seed: int = 0,
        options: TraditionalOptions | None = None,
        faults: dict[int, PrepareFault] | None = None,
        record_history: bool = True,
        deliver_max: int = 4,
        storages: list[Storage] | None = None,
    ) -> None:
        self.partitions = partitions
        self.options = options or TraditionalOptions(status_every_ms=0)
        self.rng = random.Random(seed)
        self.seed = seed
        self.now_us = 1_000_000
        self.history: list[HistoryEntry] | None = [] if record_history else None
        self.faults = dict(faults or {})
        self.logs: list[list[bytes]] = [[] for _ in range(partitions)]
        self._genesis = storages
        self.parts = [self._make(p) for p in range(partitions)]
        self.channels: dict[tuple[int, int], deque[bytes]] = {
            (s, d): deque() for s in range(partitions) for d in range(partitions) if s != d
        }
        self.client_inbox: list[deque[tuple]] = [deque() for _ in range(partitions)]
        self.results: dict[int, tuple[int, Any]] = {}
        self.deliver_max = deliver_max
        self.steps = 0
        self._next_req = 0

    def _make(self, p: int) -> TraditionalPartition:
        storage = None
        if self._genesis is not None:  # a crash restarts from a copy of the genesis state
            storage = Storage()
            storage.load(self._genesis[p].rows())
        return TraditionalPartition(
            p,
            self.partitions,
            storage,
            options=self.options,
            clock=lambda: self.now_us,
            rng=random.Random(self.seed * 7919 + p + 100 * len(self.logs[p])),
            prepare_fault=self.faults.get(p),
            history=self.history,
        )

    # Clients --------------------------------------------------------------------------
    def submit(self, proc: str, *args: Any, at: int | None = None) -> int:
        self._next_req += 1
        p = home_partition(proc, args, self.partitions) if at is None else at
        self.client_inbox[p].append((self._next_req, proc, list(args)))
        return self._next_req

    # Stepping --------------------------------------------------------------------------
    def _sources(self, p: int) -> list[Any]:
        srcs: list[Any] = [c for c in self.channels if c[1] == p and self.channels[c]]
        if self.client_inbox[p]:
            srcs.append("client")
        return srcs

    def step(self) -> bool:
        """Deliver a few messages to one random partition, run its turn. False if idle."""
        busy = [p for p in range(self.partitions) if self._sources(p)]
        if not busy:
            due = [d for d in (x.next_deadline_us() for x in self.parts) if d is not None]
            if not due:
                return False
            self.now_us = max(self.now_us, min(due))
            for p in range(self.partitions):
                self._turn(p)
            return True
        p = self.rng.choice(busy)
        self.deliver(p, self.rng.randint(1, self.deliver_max))
        self.now_us += self.rng.randint(0, 200)
        self._turn(p)
        return True

    def deliver(self, p: int, count: int) -> None:
        """Hand ``count`` random inputs to partition p (FIFO per channel), no turn end."""
        part = self.parts[p]
        for _ in range(count):
            srcs = self._sources(p)
            if not srcs:
                return
            src = self.rng.choice(srcs)
            if src == "client":
                inbox = self.client_inbox[p]
                k = self.rng.randint(1, max(1, len(inbox)))
                calls = [inbox.popleft() for _ in range(min(k, len(inbox)))]
                part.on_calls(b"sim", b"sim-client", _unpack(_pack(calls)))
            else:
                sender, msgs = _unpack(self.channels[src].popleft())
                part.on_peer(sender, msgs)

    def deliver_channel(self, src: int, dst: int) -> None:
        sender, msgs = _unpack(self.channels[(src, dst)].popleft())
        self.parts[dst].on_peer(sender, msgs)
        self._turn(dst)

    def deliver_clients(self, p: int) -> None:
        inbox = self.client_inbox[p]
        calls = [inbox.popleft() for _ in range(len(inbox))]
        self.parts[p].on_calls(b"sim", b"sim-client", _unpack(_pack(calls)))
        self._turn(p)

    def _turn(self, p: int) -> None:
        part = self.parts[p]
        part.tick()
        records, peer_out, client_out = part.take_outputs()
        if records:
            self.logs[p].append(pack_records(records))  # "synced" before anything leaves
        for q, msgs in peer_out.items():
            self.channels[(p, q)].append(_pack((p, msgs)))
        for _identity, replies in client_out.items():
            for req_id, status, value in _unpack(_pack(replies)):
                invariant(req_id not in self.results, f"request {req_id} answered twice")
                self.results[req_id] = (status, value)
        self.steps += 1

    def run(self, max_steps: int = 1_000_000) -> None:
        """Step until no message, call or transaction is left anywhere."""
        for _ in range(max_steps):
            if self.quiet():
                return
            self.step()
        raise RuntimeError(
            f"not quiet after {max_steps} steps: {len(self.results)}/{self._next_req} answered"
        )

    def quiet(self) -> bool:
        return (
            all(not c for c in self.channels.values())
            and all(not i for i in self.client_inbox)
            and all(x.idle() for x in self.parts)
        )

    # Faults ------------------------------------------------------------------------------
    def crash(self, p: int) -> None:
        """Partition p loses its memory and connections; it restarts from its log."""
        for (s, d), ch in self.channels.items():
            if p in (s, d):
                ch.clear()
        part = self._make(p)
        part.recover(self.logs[p])
        self.parts[p] = part
        self._turn(p)

    # Checks ------------------------------------------------------------------------------
    @property
    def state_hash(self) -> int:
        return sum(x.storage.state_hash for x in self.parts) & MASK64

    def check_invariants(self) -> None:
        for x in self.parts:
            x.check_invariants()


@dataclass
class SerialCheck:
    """Outcome of replaying a history serially (see ``replay_history``)."""

    replayed: int = 0
    mismatches: list[str] = field(default_factory=list)
    state_hash: int = 0


def replay_history(
    history: list[HistoryEntry], storage: Storage | None = None, *, max_report: int = 10
) -> SerialCheck:
    """Run committed and logically aborted entries one at a time in lock-point order.

    Each must give the status and value it gave live; the final state hash is returned
    for comparison with the live cluster's.
    """
    s = storage if storage is not None else Storage()
    check = SerialCheck()
    for h in history:
        if h.outcome not in ("committed", "aborted"):
            continue
        proc = lookup(h.proc)
        fp = proc.footprint(*h.args)
        reads, writes = cover_set(fp.reads), cover_set(fp.writes)
        ctx = TxnContext(h.aid[1], h.ts_ms, h.seed, reads, writes, s.get, s.scan)
        status, value, prepared = run_txn(proc, h.args, ctx, s)
        if (status, value) != (h.status, h.value) and len(check.mismatches) < max_report:
            check.mismatches.append(
                f"{h.aid} {h.proc}{h.args}: live {(h.status, h.value)}, serial {(status, value)}"
            )
        s.apply(prepared)
        check.replayed += 1
    check.state_hash = s.state_hash
    return check


__all__ = [
    "HistoryEntry",
    "LocalTraditionalCluster",
    "TraditionalOptions",
    "TraditionalPartition",
    "every_nth_prepare",
    "home_partition",
    "replay_history",
]
