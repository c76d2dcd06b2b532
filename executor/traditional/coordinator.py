"""The coordinator role of the traditional baseline: run calls under strict 2PL, commit.

A coordinator runs the stored procedures its clients send it (accepted and admitted
by its Intake, executor.traditional.intake), each in its own greenlet, taking locks
at the moment the body touches a record: local keys in its own lock table, remote
keys by a LockRequest to the owning partition (a read waits for the row; a write
goes on and its grant is collected before the commit). When the body has returned
and every lock is granted (the lock point) it finishes:
- a logical abort or an error: AbortDecision to every partition it touched, nothing
  logged (presumed abort), nothing applied anywhere (writes are buffered);
- only this partition writes: read-only branches are released (AbortDecision), one
  CommitRecord, apply, release;
- remote writes: PrepareRequest to each partition with writes; on a YES from all of
  them one DecideRecord (forced before CommitDecision is sent), apply, release, answer;
  a CommitAck from every participant ends it (EndRecord). A NO vote or no vote within
  prepare_timeout_ms aborts.
A prepared participant may ask for the outcome (OutcomeQuery): a decision on record is
resent, no decision on record means abort.

Deadlocks: wait-die (scheduler.twopl), with the priority fixed at the first attempt
and kept across restarts (randomized exponential backoff). A transaction can only die
while it waits for a lock, so never after its body finished: prepare, commit and abort
never wait. A body that called ``ctx.hold_locks(ms)`` (benchmark hook) stays suspended
for ms after it returns, holding its locks, while the partition serves everything
else.

Invariants (InvariantViolation is a bug):
- a transaction holds every lock it took until its commit or abort (strict 2PL); the
  only early release is a read-only branch after the lock point (standard PA);
- every write of a committed transaction is covered by an exclusive lock at its
  partition, taken before the write was buffered;
- a coordinator decides COMMIT only after a YES from every partition with writes;
- a body's whole write set is validated (executor.core.execution.run_txn) before any of
  it is locked for commit, logged, sent or applied: a write that cannot be stored
  (bad key, unencodable or oversized row) makes the call ERROR, applied nowhere;
- live attempts plus calls waiting to restart never exceed the admitted calls.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import greenlet

from executor.core.context import TxnContext, cover_set, covered
from executor.core.execution import run_txn
from executor.core.rows import PreparedWrite, key_parts_problem
from executor.traditional.attempt import (
    HOLD,
    S_PREPARING,
    S_WAIT_ACKS,
    Attempt,
    Call,
    Killed,
)
from executor.traditional.intake import Intake
from executor.traditional.messages import (
    OP_GET,
    OP_LOCK,
    OP_SCAN,
    VOTE_YES,
    AbortDecision,
    Aid,
    CommitAck,
    CommitDecision,
    CommitRecord,
    DecideRecord,
    EndRecord,
    LockReply,
    LockRequest,
    OutcomeQuery,
    PrepareRequest,
    VoteReply,
    Write,
)
from executor.traditional.options import HistoryEntry
from executor.traditional.shared import (
    T_DEADLINE,
    T_HOLD,
    T_RESEND,
    T_RESTART,
    PartitionState,
    lock_name,
)
from scheduler.twopl import DIE, EV_GRANTED, EXCLUSIVE, GRANTED, SHARED
from txn_library import catalog, limits, placement
from txn_library.errors import (
    ABORTED,
    ERR_BAD_ARGUMENTS,
    ERR_RESTARTS_EXHAUSTED,
    ERR_UNAVAILABLE,
    ERROR,
    OK,
    RESTART,
    BadRequest,
    invariant,
)
from txn_library.procedure import Procedure, lookup

REPLICATED = catalog.REPLICATED


class Coordinator:
    """Runs this partition's client calls and commits them (2PL, wait-die, 2PC)."""

    def __init__(self, state: PartitionState, history: list[HistoryEntry] | None) -> None:
        self.state = state
        self.history = history
        # Numbers calls (their priority) and attempts (their aid): starting at the clock,
        # they stay unique across restarts of the process.
        self.seq = state.clock()
        self.intake = Intake(state, next_seq=self._next_seq, start=self._start)
        self.attempts: dict[Aid, Attempt] = {}
        self.restarting = 0  # calls waiting for their restart timer
        self.decisions: dict[Aid, set[int]] = {}  # committed, acks outstanding
        self._ready: deque[tuple[Attempt, int, Any]] = deque()  # (attempt, wake, value)

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    @staticmethod
    def _footprint(proc: Procedure, args: tuple) -> Any:
        try:
            return proc.footprint_of(args, limits.footprint_entries_max)
        except BadRequest:
            raise
        except Exception as e:  # the procedure's own footprint function failed on these args
            raise BadRequest(ERR_BAD_ARGUMENTS, f"footprint of {proc.name} failed: {e}") from None

    # Running bodies -----------------------------------------------------------------------
    def _start(self, call: Call) -> None:
        proc = lookup(call.proc.recon) if call.recon else call.proc
        try:
            fp = self._footprint(proc, call.args)
        except BadRequest as e:  # the caller's error: nothing was locked or changed
            self.intake.reply(call, ERROR, (e.code, e.message))
            return
        att = Attempt(
            (self.state.partition, self._next_seq()),
            call,
            proc,
            cover_set(fp.reads),
            cover_set(fp.writes),
        )
        att.glet = greenlet.greenlet(lambda _v: self._body(att))
        self.attempts[att.aid] = att
        self._ready.append((att, 0, None))

    def _body(self, att: Attempt) -> Any:
        call = att.call
        ctx = TxnContext(
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
            status, value, _, writes = run_txn(att.proc, att.args, ctx, self.state.storage)
            if ctx.hold_ms:  # benchmark hook: keep every lock taken so far, loop goes on
                due = self.state.clock() + 1000 * ctx.hold_ms
                self.state.add_timer(due, T_HOLD, (att, att.wake + 1))
                self._suspend(att, HOLD)
            return (status, value), writes
        except Killed:
            return None

    def run_ready(self) -> None:
        """Resume runnable bodies until none is left. Only ever called from outside bodies."""
        ready = self._ready
        while ready:
            att, wake, value = ready.popleft()
            if wake != att.wake or not att.suspended or self.attempts.get(att.aid) is not att:
                continue  # stale: that wait is over, or the attempt ended
            att.suspended = False
            att.waiting_on = None
            g = att.glet
            assert g is not None  # suspended bodies have a live greenlet
            g.parent = greenlet.getcurrent()
            out = g.throw(Killed()) if att.doomed else g.switch(value)
            if g.dead:
                att.glet = None
                self._on_body_exit(att, out)

    def _suspend(self, att: Attempt, waiting_on: Any) -> Any:
        att.suspended = True
        att.waiting_on = waiting_on
        att.wake += 1
        parent = greenlet.getcurrent().parent
        invariant(parent is not None, "a body must run in its own greenlet")
        return parent.switch()

    def _doom(self, att: Attempt, reason: tuple | None) -> None:
        """End an attempt that cannot continue: None = die and restart, else reply reason."""
        if att.doomed or self.attempts.get(att.aid) is not att:
            return
        att.doomed = True
        att.kill_reason = reason
        if att.suspended:
            self._ready.append((att, att.wake, None))  # unwinds the body, then _on_body_exit
        elif att.glet is None:
            self._abort(att, reason)
        # else: the body is running right now (it will see doomed at its next lock)

    # Locking as the body touches records ----------------------------------------------------
    def _get(self, att: Attempt, table: str, key: tuple) -> tuple | None:
        st = self.state
        p = placement.partition_of(table, key, st.partitions)
        if p == REPLICATED:
            return st.storage.get(table, key)
        mode = self._read_mode(att, table, key)
        if p == st.partition:
            self._lock_local(att, lock_name(table, key), mode)
            return st.storage.get(table, key)
        return self._remote(att, p, OP_GET, table, key, mode)

    def _scan(self, att: Attempt, table: str, prefix: tuple) -> list:
        st = self.state
        p = placement.partition_of(table, prefix, st.partitions)
        if p == REPLICATED:
            return st.storage.scan(table, prefix)
        mode = self._read_mode(att, table, prefix)
        if p == st.partition:
            self._lock_local(att, lock_name(table, prefix), mode)
            return st.storage.scan(table, prefix)
        return list(self._remote(att, p, OP_SCAN, table, prefix, mode))

    def _read_mode(self, att: Attempt, table: str, key: tuple) -> int:
        if self.state.options.update_locks and covered(att.writes, table, key):
            return EXCLUSIVE
        return SHARED

    def _on_write(self, att: Attempt, table: str, key: tuple) -> None:
        p = placement.partition_of(table, key, self.state.partitions)
        name = lock_name(table, key)
        if p == self.state.partition:
            self._lock_local(att, name, EXCLUSIVE)
            return
        if att.remote_locks.get(name) == EXCLUSIVE:
            return
        # A write returns nothing, so its remote lock is not waited for here: the body
        # goes on and the grant (or death) is collected before the commit.
        self._send_lock(att, p, OP_LOCK, table, key, EXCLUSIVE, name)
        att.acks_pending += 1

    def _lock_local(self, att: Attempt, name: tuple, mode: int) -> None:
        if att.doomed:
            raise Killed()
        decision = self.state.locks.acquire(att.aid, att.call.prio, name, mode)
        self.state.pump()
        if decision == GRANTED:
            return
        if decision == DIE:
            att.doomed = True
            raise Killed()
        self._suspend(att, name)

    def _remote(self, att: Attempt, p: int, op: int, table: str, key: tuple, mode: int) -> Any:
        if att.doomed:
            raise Killed()
        name = lock_name(table, key)
        cache = att.rows if op == OP_GET else att.scans
        held = att.remote_locks.get(name)
        if held is not None and held >= mode and (table, key) in cache:
            return cache[(table, key)]  # locked, so it cannot have changed
        n = self._send_lock(att, p, op, table, key, mode, name)
        self._set_deadline(att, self.state.options.remote_timeout_ms)
        data = self._suspend(att, (p, n))
        att.deadline_us = 0
        cache[(table, key)] = data
        return data

    def _send_lock(
        self, att: Attempt, p: int, op: int, table: str, key: tuple, mode: int, name: tuple
    ) -> int:
        problem = key_parts_problem(key)  # runs in the body: raising fails the call only
        if problem is not None:
            raise ValueError(f"{table} key cannot be sent to partition {p}: {problem}")
        n = att.parts.get(p, 0)
        att.parts[p] = n + 1
        if att.remote_locks.get(name, -1) < mode:
            att.remote_locks[name] = mode
        self.state.send(p, LockRequest(att.aid, att.call.prio, n, op, table, key, mode))
        return n

    def _set_deadline(self, att: Attempt, ms: int) -> None:
        att.deadline_us = self.state.clock() + 1000 * ms
        self.state.add_timer(att.deadline_us, T_DEADLINE, att.aid)

    def _on_body_exit(self, att: Attempt, out: Any) -> None:
        if out is None or att.doomed:
            self._abort(att, att.kill_reason)
            return
        (status, value), writes = out
        att.outcome = (status, value, writes)
        if att.acks_pending:
            att.state = S_WAIT_ACKS
            self._set_deadline(att, self.state.options.remote_timeout_ms)
            return
        self._lock_point(att)

    # Commit and abort ---------------------------------------------------------------------
    def _lock_point(self, att: Attempt) -> None:
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
            self._restart_dependent(att, value)
            return
        if status != OK:  # logical abort or a procedure error: roll back everywhere
            self._release_everywhere(att, "aborted")
            if status == ABORTED:
                self.state.stats.aborted += 1
            else:
                self.state.stats.failed += 1
            self.intake.reply(call, status, value)
            return
        remote = self._split_writes(att, writes)
        for p in att.parts:
            if p not in remote:
                self.state.send(p, AbortDecision(att.aid))  # read-only branch: release it
        if not remote:
            self._commit(att, ())
            return
        for p, ws in remote.items():
            invariant(p in att.parts, f"write at partition {p} without a lock there")
            self.state.send(p, PrepareRequest(att.aid, ws))
        att.votes = set(remote)
        att.state = S_PREPARING
        self._set_deadline(att, self.state.options.prepare_timeout_ms)

    def _restart_dependent(self, att: Attempt, prediction: Any) -> None:
        """A dependent call's prediction was stale: run it again with the fresh one."""
        call = att.call
        self._release_everywhere(att, "failed")
        self.state.stats.dependent_restarts += 1
        call.dep_restarts += 1
        if call.dep_restarts > limits.dependent_restarts_max:
            msg = f"{call.proc.name} restarted {call.dep_restarts - 1} times"
            self.intake.reply(call, ERROR, (ERR_RESTARTS_EXHAUSTED, msg))
        else:
            call.args = call.args[:-1] + (prediction,)
            self._start(call)

    def _split_writes(self, att: Attempt, writes: Any) -> dict[int, list[Write]]:
        """Keep this partition's writes on the attempt; return the others by partition."""
        me, n = self.state.partition, self.state.partitions
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
        return remote

    def _commit(self, att: Attempt, participants: tuple[int, ...]) -> None:
        st = self.state
        call = att.call
        assert att.outcome is not None
        status, value, _ = att.outcome
        cid, rid = call.client_id, call.req_id
        if participants:
            st.log_out.append(
                DecideRecord(att.aid, participants, att.local_writes, cid, rid, value, call.digest)
            )
            self.decisions[att.aid] = set(participants)
            for p in participants:
                st.send(p, CommitDecision(att.aid))
            due = st.clock() + 1000 * st.options.prepare_timeout_ms
            st.add_timer(due, T_RESEND, att.aid)
            st.stats.committed_multi += 1
        elif att.local_writes:
            st.log_out.append(CommitRecord(att.aid, att.local_writes, cid, rid, value, call.digest))
        st.storage.apply(att.local_prepared)
        st.stats.committed += 1
        if att.hist is not None:
            att.hist.outcome = "committed"
        self._finish(att)
        self.intake.reply(call, status, value)

    def _release_everywhere(self, att: Attempt, outcome: str) -> None:
        for p in att.parts:
            self.state.send(p, AbortDecision(att.aid))
        if att.hist is not None:
            att.hist.outcome = outcome
        self._finish(att)

    def _finish(self, att: Attempt) -> None:
        del self.attempts[att.aid]
        att.deadline_us = 0
        self.state.locks.release_all(att.aid)
        self.state.pump()

    def _abort(self, att: Attempt, reason: tuple | None) -> None:
        """Abort an attempt (body no longer running). reason None: wait-die restart."""
        st = self.state
        self._release_everywhere(att, "failed")
        call = att.call
        if reason is not None:
            st.stats.failed += 1
            self.intake.reply(call, *reason)
            return
        st.stats.deaths += 1
        call.restarts += 1
        if call.restarts > st.options.restarts_max:
            st.stats.failed += 1
            msg = f"{call.proc.name} died {call.restarts - 1} times under wait-die"
            self.intake.reply(call, ERROR, (ERR_RESTARTS_EXHAUSTED, msg))
            return
        o = st.options
        span = min(o.restart_delay_cap_us, o.restart_delay_base_us << min(call.restarts, 30))
        self.restarting += 1
        st.add_timer(st.clock() + st.rng.randrange(span + 1), T_RESTART, call)

    # Inputs: participants -----------------------------------------------------------------
    def on_lock_reply(self, src: int, m: LockReply) -> None:
        att = self.attempts.get(m.aid)
        if att is None or att.doomed:
            return  # an attempt that already ended
        if not m.granted:
            self._doom(att, None)
            return
        if att.suspended and att.waiting_on == (src, m.n):
            self._ready.append((att, att.wake, m.data))
            return
        att.acks_pending -= 1
        invariant(att.acks_pending >= 0, f"{m.aid}: more lock grants than requests")
        if att.acks_pending == 0 and att.state == S_WAIT_ACKS:
            self._lock_point(att)

    def on_vote(self, src: int, m: VoteReply) -> None:
        att = self.attempts.get(m.aid)
        if att is None or att.state != S_PREPARING or src not in att.votes:
            return  # already aborted (its ABORT is on the way to src)
        if m.vote != VOTE_YES:
            self._abort(att, (ERROR, (ERR_UNAVAILABLE, f"partition {src} voted no")))
            return
        att.votes.discard(src)
        att.yes.append(src)
        if not att.votes:
            self._commit(att, tuple(sorted(att.yes)))

    def on_ack(self, src: int, m: CommitAck) -> None:
        waiting = self.decisions.get(m.aid)
        if waiting is None:
            return
        waiting.discard(src)
        if not waiting:
            del self.decisions[m.aid]
            self.state.log_out.append(EndRecord(m.aid))

    def on_query(self, src: int, m: OutcomeQuery) -> None:
        if m.aid in self.decisions:
            self.state.send(src, CommitDecision(m.aid))
        elif m.aid not in self.attempts:
            self.state.send(src, AbortDecision(m.aid))  # presumed abort
        # else: still deciding; the decision itself will reach src

    def on_lock_event(self, kind: str, owner: Any) -> bool:
        """A lock event of one of this coordinator's attempts; False if not ours."""
        att = self.attempts.get(owner)
        if att is None:
            return False
        if kind == EV_GRANTED:
            self._ready.append((att, att.wake, None))
        else:
            self._doom(att, None)
        return True

    # Timers -------------------------------------------------------------------------------
    def on_hold_timer(self, obj: tuple, now: int) -> None:
        att, wake = obj
        if att.suspended and att.wake == wake and att.waiting_on == HOLD:
            self._ready.append((att, wake, None))

    def on_restart_timer(self, call: Call, now: int) -> None:
        self.restarting -= 1
        self._start(call)

    def on_deadline(self, aid: Aid, now: int) -> None:
        att = self.attempts.get(aid)
        if att is None or not att.deadline_us or att.deadline_us > now:
            return
        if att.state == S_PREPARING:
            waiting = sorted(att.votes)
            self._abort(att, (ERROR, (ERR_UNAVAILABLE, f"no vote from partitions {waiting}")))
        else:
            self._doom(att, (ERROR, (ERR_UNAVAILABLE, "a participant did not answer")))

    def on_resend_timer(self, aid: Aid, now: int) -> None:
        waiting = self.decisions.get(aid)
        if waiting:
            for p in sorted(waiting):
                self.state.send(p, CommitDecision(aid))
            self.state.add_timer(now + 1000 * self.state.options.query_every_ms, T_RESEND, aid)

    # Recovery -----------------------------------------------------------------------------
    def redo(self, rec: CommitRecord | DecideRecord | EndRecord) -> None:
        """Redo one of this coordinator's log records (before going live)."""
        if isinstance(rec, EndRecord):
            self.decisions.pop(rec.aid, None)
            return
        self.state.apply(rec.writes)
        if isinstance(rec, DecideRecord):
            self.decisions[rec.aid] = set(rec.participants)
        # The retry table: a retried call is not executed twice.
        self.intake.recovered_result(rec.client_id, rec.req_id, rec.value, rec.digest)

    def resume_decisions(self, now: int) -> None:
        """After redo: resend COMMIT for every decision not acknowledged by all."""
        for aid, parts in self.decisions.items():
            for p in sorted(parts):
                self.state.send(p, CommitDecision(aid))
            self.state.add_timer(now + 1000 * self.state.options.query_every_ms, T_RESEND, aid)

    # Introspection ------------------------------------------------------------------------
    def idle(self) -> bool:
        return self.intake.idle()

    def check_invariants(self) -> None:
        self.intake.check_invariants()
        invariant(
            len(self.attempts) + self.restarting <= self.intake.in_system,
            "admission bound broken: more attempts than admitted calls",
        )
