"""The participant role of the traditional baseline: other coordinators' branches here.

A participant serves the lock and read requests (LockRequest) of other partitions'
coordinators in the order each coordinator sent them, under the same wait-die policy
as local locks, votes on PrepareRequest, and applies or discards the writes on the
decision. A transaction's share at this partition is its *branch*:
  ACTIVE    taking locks; requests queue behind the one waiting in the lock table
  PREPARED  PrepareRecord logged (forced before the YES vote), holding its exclusive
            locks until CommitDecision / AbortDecision
  DEAD      died under wait-die; kept until the coordinator's AbortDecision, so stray
            requests of that attempt are refused
A branch this partition does not know (lost in a restart, or dropped) refuses every
request but the first (n == 0) and votes NO.

Termination and recovery: a prepared branch with no decision after
prepare_timeout_ms asks its coordinator (OutcomeQuery) and again every
query_every_ms; after a restart, prepared branches with no OutcomeRecord are *in
doubt*: they re-take their exclusive locks and ask until told. An unprepared branch
whose coordinator has been silent for branch_idle_timeout_ms is dropped.

Invariants (InvariantViolation is a bug):
- a participant votes YES only for a branch it still holds and has logged, and only
  if it holds every written key exclusively and every written key lives here;
- a prepared branch has no queued requests, and an in-doubt aid always has a branch;
- COMMIT arrives only for a prepared branch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from executor.traditional.messages import (
    OP_GET,
    OP_SCAN,
    VOTE_NO,
    VOTE_YES,
    AbortDecision,
    Aid,
    CommitAck,
    CommitDecision,
    LockReply,
    LockRequest,
    OutcomeQuery,
    OutcomeRecord,
    PrepareRecord,
    PrepareRequest,
    Prio,
    VoteReply,
    Write,
)
from executor.traditional.options import FAULT_SILENT, PrepareFault
from executor.traditional.shared import T_QUERY, T_SWEEP, PartitionState, lock_name
from scheduler.twopl import DIE, EV_GRANTED, EXCLUSIVE, GRANTED
from txn_library import placement
from txn_library.errors import invariant

# Branch states
B_ACTIVE, B_PREPARED, B_DEAD = 0, 1, 2


class Branch:
    __slots__ = ("aid", "prio", "coord", "state", "queue", "waiting", "writes", "touched_us")

    def __init__(self, aid: Aid, prio: Prio, coord: int, now_us: int) -> None:
        self.aid = aid
        self.prio = prio
        self.coord = coord
        self.state = B_ACTIVE
        self.queue: deque[LockRequest] = deque()  # pending requests, one in the table
        self.waiting = False
        self.writes: Sequence[Write] = ()
        self.touched_us = now_us


class Participant:
    """Branches of other partitions' transactions at this partition."""

    def __init__(self, state: PartitionState, prepare_fault: PrepareFault | None) -> None:
        self.state = state
        self.fault = prepare_fault
        self.branches: dict[Aid, Branch] = {}
        self.in_doubt: set[Aid] = set()

    def start_sweeping(self) -> None:
        """Arm the periodic drop of branches whose coordinator went silent."""
        st = self.state
        st.add_timer(st.clock() + 1000 * st.options.branch_idle_timeout_ms, T_SWEEP, None)

    # Inputs: coordinators -----------------------------------------------------------------
    def on_lock(self, src: int, m: LockRequest) -> None:
        st = self.state
        br = self.branches.get(m.aid)
        if br is None:
            if m.n != 0:  # we lost this branch (restart) or dropped it: its locks are gone
                st.send(src, LockReply(m.aid, m.n, False, None))
                return
            br = self.branches[m.aid] = Branch(m.aid, m.prio, src, st.clock())
        if br.state != B_ACTIVE:
            invariant(br.state == B_DEAD, f"{m.aid}: lock request after prepare")
            st.send(src, LockReply(m.aid, m.n, False, None))
            return
        br.touched_us = st.clock()
        br.queue.append(m)
        if not br.waiting:
            self._branch_next(br)
        st.pump()

    def _branch_next(self, br: Branch) -> None:
        """Serve the branch's queued requests in order until one has to wait."""
        while br.queue and not br.waiting and br.state == B_ACTIVE:
            m = br.queue[0]
            name = lock_name(m.table, m.key)
            decision = self.state.locks.acquire(br.aid, br.prio, name, m.mode)
            if decision == GRANTED:
                self._branch_reply(br)
            elif decision == DIE:
                self._branch_die(br)
            else:
                br.waiting = True

    def _branch_reply(self, br: Branch) -> None:
        m = br.queue.popleft()
        storage = self.state.storage
        if m.op == OP_GET:
            data: Any = storage.get(m.table, m.key)
        elif m.op == OP_SCAN:
            data = storage.scan(m.table, m.key)
        else:
            data = None
        self.state.send(br.coord, LockReply(br.aid, m.n, True, data))

    def _branch_die(self, br: Branch) -> None:
        if br.queue:
            self.state.send(br.coord, LockReply(br.aid, br.queue[0].n, False, None))
        br.queue.clear()
        br.waiting = False
        br.state = B_DEAD  # kept until the coordinator's ABORT, to refuse stray requests
        self.state.locks.release_all(br.aid)

    def on_prepare(self, src: int, m: PrepareRequest) -> None:
        st = self.state
        aid = m.aid
        br = self.branches.get(aid)
        if br is None or br.state != B_ACTIVE or br.queue:
            st.send(src, VoteReply(aid, VOTE_NO))
            return
        fault = self.fault(aid) if self.fault is not None else None
        if fault == FAULT_SILENT:
            return
        if fault is not None:
            self._branch_die(br)
            st.send(src, VoteReply(aid, VOTE_NO))
            st.pump()
            return
        me, n = st.partition, st.partitions
        for t, key, _row in m.writes:
            invariant(placement.partition_of(t, key, n) == me, f"{aid}: write {t}{key!r} not here")
            invariant(
                st.locks.mode_held(aid, lock_name(t, key)) == EXCLUSIVE,
                f"{aid}: write {t}{key!r} without an exclusive lock",
            )
        st.log_out.append(PrepareRecord(aid, src, br.prio, m.writes))
        br.state = B_PREPARED
        br.writes = m.writes
        st.stats.prepares += 1
        st.send(src, VoteReply(aid, VOTE_YES))
        # Termination: if no decision comes (the coordinator may have crashed), ask.
        st.add_timer(st.clock() + 1000 * st.options.prepare_timeout_ms, T_QUERY, aid)

    def on_commit(self, src: int, m: CommitDecision) -> None:
        br = self.branches.get(m.aid)
        if br is not None:
            invariant(br.state == B_PREPARED, f"{m.aid}: COMMIT for an unprepared branch")
            self.state.apply(br.writes)
            self.state.log_out.append(OutcomeRecord(m.aid, True))
            self._drop_branch(br)
        self.state.send(src, CommitAck(m.aid))  # also for a branch committed before a restart

    def on_abort(self, src: int, m: AbortDecision) -> None:
        br = self.branches.get(m.aid)
        if br is None:
            return
        if br.state == B_PREPARED:
            self.state.log_out.append(OutcomeRecord(br.aid, False))
        self._drop_branch(br)

    def _drop_branch(self, br: Branch) -> None:
        del self.branches[br.aid]
        self.in_doubt.discard(br.aid)
        self.state.locks.release_all(br.aid)
        self.state.pump()

    def on_lock_event(self, kind: str, owner: Any) -> None:
        """A lock event of an owner that is not a local attempt: a branch, or gone."""
        br = self.branches.get(owner)
        if br is None or br.state != B_ACTIVE:
            self.state.locks.release_all(owner)  # it ended meanwhile: give it back
            return
        if kind == EV_GRANTED:
            br.waiting = False
            self._branch_reply(br)
            self._branch_next(br)
        else:
            self._branch_die(br)

    # Timers -------------------------------------------------------------------------------
    def on_query_timer(self, aid: Aid, now: int) -> None:
        br = self.branches.get(aid)
        if br is not None and br.state == B_PREPARED:
            self.state.send(br.coord, OutcomeQuery(aid))
            self.state.add_timer(now + 1000 * self.state.options.query_every_ms, T_QUERY, aid)

    def on_sweep(self, _: Any, now: int) -> None:
        """Drop branches whose coordinator went silent before they were prepared."""
        limit_us = 1000 * self.state.options.branch_idle_timeout_ms
        for br in list(self.branches.values()):
            if br.state == B_PREPARED or br.waiting or now - br.touched_us < limit_us:
                continue
            if br.state == B_ACTIVE:
                self._branch_die(br)
                br.touched_us = now
            else:
                del self.branches[br.aid]
        self.state.pump()
        self.state.add_timer(now + limit_us, T_SWEEP, None)

    # Recovery -----------------------------------------------------------------------------
    def redo(self, rec: PrepareRecord | OutcomeRecord, prepared: dict[Aid, PrepareRecord]) -> None:
        """Redo one of this participant's log records; ``prepared`` collects the branches
        with no outcome yet (in doubt at the end of the log)."""
        if isinstance(rec, PrepareRecord):
            prepared[rec.aid] = rec
            return
        prep = prepared.pop(rec.aid, None)
        invariant(prep is not None, f"outcome of {rec.aid} without its prepare record")
        assert prep is not None
        if rec.committed:
            self.state.apply(prep.writes)

    def resume_in_doubt(self, prepared: dict[Aid, PrepareRecord], now: int) -> None:
        """After redo: every prepared branch without an outcome re-takes its exclusive
        locks and asks its coordinator for the outcome."""
        locks = self.state.locks
        for aid, rec in prepared.items():
            br = self.branches[aid] = Branch(aid, rec.prio, rec.coordinator, now)
            br.state, br.writes = B_PREPARED, rec.writes
            for t, key, _row in rec.writes:
                got = locks.acquire(aid, rec.prio, lock_name(t, key), EXCLUSIVE)
                invariant(got == GRANTED, f"in-doubt {aid}: its lock on {t}{key!r} is taken")
            self.in_doubt.add(aid)
            self.state.add_timer(now, T_QUERY, aid)

    # Introspection ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        for aid, br in self.branches.items():
            invariant(br.state != B_PREPARED or not br.queue, f"{aid}: prepared with requests")
        for aid in self.in_doubt:
            invariant(aid in self.branches, f"in-doubt {aid} has no branch")
