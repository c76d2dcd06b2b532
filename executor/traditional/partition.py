"""The traditional baseline's partition role: strict 2PL, wait-die, two-phase commit.

One ``TraditionalPartition`` per partition plays two roles at once. As *coordinator*
(executor.traditional.coordinator) it runs the stored procedures its clients send
it, each in its own greenlet, taking locks at the moment the body touches a record
(local keys in its own lock table, remote keys by a LOCK message to the owning
partition) and commits with two-phase commit when more than one partition writes. As
*participant* (executor.traditional.participant) it serves the lock and read
requests of other coordinators, votes, and applies or discards their writes. The two
share only a PartitionState (executor.traditional.shared): storage, one lock table,
counters, outputs and timers; this class wires them together, routes inputs to the
role they belong to and answers status. Same Storage, same procedures, same footprint
checks as the deterministic mode; no sequencer, no global order. Like
executor.deterministic.partition, the role has no sockets, no clock and no entropy of
its own (both are handed in): inputs are ``on_calls`` / ``on_peer`` / ``tick``;
outputs are taken with ``take_outputs``. The wire contract and the log records are in
executor.traditional.messages.

The one rule of the outputs: log records first. ``take_outputs`` returns the log
records of the turn, the peer messages and the client replies; the caller appends
the records as one frame, syncs (group commit), and only then sends anything. So a
vote, a decision or an acknowledged result never leaves before the records it
depends on are durable, and a transaction may see data committed earlier in the same
turn (early lock release): any output that depends on it waits for the same sync.

Recovery (``recover``) replays the log from the start: redo of committed writes, the
unacknowledged decisions resend COMMIT, and prepared branches with no outcome are in
doubt: they re-take their exclusive locks and ask the coordinator (K_QUERY) until it
answers (no decision on record = abort). A live prepared branch that hears no
decision within prepare_timeout_ms asks too (its coordinator may have crashed), and a
coordinator resends COMMIT until every participant acknowledged.

Invariants (InvariantViolation is a bug): those of the two roles, the lock table's,
and: ``recover`` runs only before the partition goes live; after every input the
runnable bodies have run (no body is left runnable between turns).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

from executor.core.storage import Storage
from executor.traditional.coordinator import Coordinator
from executor.traditional.messages import (
    AbortDecision,
    Aid,
    CommitAck,
    CommitDecision,
    LockReply,
    LockRequest,
    LogRecord,
    OutcomeQuery,
    OutcomeRecord,
    PartitionStatus,
    PeerMessage,
    PrepareRecord,
    PrepareRequest,
    StatusGossip,
    VoteReply,
    unpack_records,
)
from executor.traditional.options import (
    HistoryEntry,
    PrepareFault,
    TraditionalOptions,
    TraditionalStats,
)
from executor.traditional.participant import Participant
from executor.traditional.shared import (
    T_DEADLINE,
    T_HOLD,
    T_QUERY,
    T_RESEND,
    T_RESTART,
    T_STATUS,
    T_SWEEP,
    Clock,
    PartitionState,
)
from scheduler.twopl import LockTable
from txn_library.errors import invariant

# A peer shown as down in status after this long without gossip (x status_every_ms,
# at least 200 ms).
SILENT_STATUS_PERIODS = 5


class TraditionalPartition:
    """Coordinator and participant of one partition. One thread; not thread-safe."""

    def __init__(
        self,
        partition: int,
        partitions: int,
        storage: Storage | None = None,
        *,
        clock: Clock,
        rng: random.Random,
        options: TraditionalOptions | None = None,
        prepare_fault: PrepareFault | None = None,
        history: list[HistoryEntry] | None = None,
    ) -> None:
        self.state = st = PartitionState(
            partition,
            partitions,
            storage if storage is not None else Storage(),
            options or TraditionalOptions(),
            clock=clock,
            rng=rng,
        )
        self.coordinator = Coordinator(st, history)
        self.participant = Participant(st, prepare_fault)
        st.on_lock_event = self._on_lock_event
        self.peer_status: dict[int, PartitionStatus] = {}
        self._peer_heard_us: dict[int, int] = {}
        self.pid: int | None = None  # set by the process that runs this role (status only)
        c, p = self.coordinator, self.participant
        self._peer_handlers: dict[type, Callable[[int, Any], None]] = {
            LockRequest: p.on_lock,
            LockReply: c.on_lock_reply,
            PrepareRequest: p.on_prepare,
            VoteReply: c.on_vote,
            CommitDecision: p.on_commit,
            AbortDecision: p.on_abort,
            CommitAck: c.on_ack,
            OutcomeQuery: c.on_query,
            StatusGossip: self._on_status,
        }
        self._timer_handlers: dict[int, Callable[[Any, int], None]] = {
            T_RESTART: c.on_restart_timer,
            T_DEADLINE: c.on_deadline,
            T_QUERY: p.on_query_timer,
            T_SWEEP: p.on_sweep,
            T_STATUS: self._on_status_timer,
            T_RESEND: c.on_resend_timer,
            T_HOLD: c.on_hold_timer,
        }
        p.start_sweeping()
        if st.options.status_every_ms and partitions > 1:
            st.add_timer(clock(), T_STATUS, None)

    # What tests, the simulator and the server read ---------------------------------------
    @property
    def partition(self) -> int:
        return self.state.partition

    @property
    def partitions(self) -> int:
        return self.state.partitions

    @property
    def options(self) -> TraditionalOptions:
        return self.state.options

    @property
    def storage(self) -> Storage:
        return self.state.storage

    @property
    def locks(self) -> LockTable:
        return self.state.locks

    @property
    def stats(self) -> TraditionalStats:
        return self.state.stats

    @property
    def history(self) -> list[HistoryEntry] | None:
        return self.coordinator.history

    # Inputs -------------------------------------------------------------------------------
    def on_calls(self, identity: bytes, client_id: Any, calls: Any) -> None:
        """A client's REQ_CALLS frame (decoded): validate, dedup, start each call."""
        self.coordinator.intake.on_calls(identity, client_id, calls)
        self.coordinator.run_ready()

    def reject(self, identity: bytes, code: str, message: str) -> None:
        """A frame-level error answer (req_id None) to a client, sent with the turn."""
        self.coordinator.intake.error(identity, None, code, message)

    def on_peer(self, src: int, msgs: Iterable[PeerMessage]) -> None:
        """One decoded batch of messages from partition ``src``, in the order it sent them."""
        handlers = self._peer_handlers
        for m in msgs:
            handlers[type(m)](src, m)
        self.coordinator.run_ready()

    def tick(self) -> None:
        """Fire due timers: restarts, timeouts, in-doubt queries, sweeps, status gossip."""
        st = self.state
        now = st.clock()
        while (due := st.pop_due_timer(now)) is not None:
            kind, obj = due
            self._timer_handlers[kind](obj, now)
        self.coordinator.run_ready()

    def _on_lock_event(self, kind: str, owner: Any) -> None:
        if not self.coordinator.on_lock_event(kind, owner):
            self.participant.on_lock_event(kind, owner)

    # Outputs ------------------------------------------------------------------------------
    def take_outputs(
        self,
    ) -> tuple[list[LogRecord], dict[int, list[PeerMessage]], dict[bytes, list[tuple]]]:
        """(log records, peer messages by partition, client replies by identity).

        The caller must make the records durable before sending anything else.
        """
        return self.state.take_outputs()

    def next_deadline_us(self) -> int | None:
        return self.state.next_deadline_us()

    # Recovery -----------------------------------------------------------------------------
    def recover(self, frames: Iterable[bytes]) -> int:
        """Redo the log of this partition (before going live). Returns records replayed."""
        c, p = self.coordinator, self.participant
        invariant(not c.attempts and not p.branches, "recover() on a live partition")
        prepared: dict[Aid, PrepareRecord] = {}
        n = 0
        for data in frames:
            for rec in unpack_records(data):
                n += 1
                if isinstance(rec, (PrepareRecord, OutcomeRecord)):
                    p.redo(rec, prepared)
                else:
                    c.redo(rec)
                if rec.aid[0] == self.partition:
                    c.seq = max(c.seq, rec.aid[1])
        now = self.state.clock()
        p.resume_in_doubt(prepared, now)
        c.resume_decisions(now)
        return n

    # Status -------------------------------------------------------------------------------
    def status(self) -> PartitionStatus:
        st, s = self.state, self.state.stats
        return PartitionStatus(
            partition=st.partition,
            committed=s.committed,
            state_hash=st.storage.state_hash,
            active=self.coordinator.intake.calls_in_flight,
            branches=len(self.participant.branches),
            aborted=s.aborted,
            failed=s.failed,
            deaths=s.deaths,
            in_doubt=len(self.participant.in_doubt),
            pid=self.pid,
            lock_waits=st.locks.waits,
            blocked=st.locks.blocked,
        )

    def _on_status(self, src: int, m: StatusGossip) -> None:
        self.peer_status[src] = m.status
        self._peer_heard_us[src] = self.state.clock()

    def _on_status_timer(self, _: Any, now: int) -> None:
        st = self.state
        gossip = StatusGossip(self.status())
        for q in range(st.partitions):
            if q != st.partition:
                st.send(q, gossip)
        st.add_timer(now + 1000 * st.options.status_every_ms, T_STATUS, None)

    def status_report(self) -> dict:
        """The REQ_STATUS answer; shaped like the sequencer's so ``ordo status`` works."""
        rows = dict(self.peer_status)
        rows[self.partition] = self.status()
        now = self.state.clock()
        silent_us = SILENT_STATUS_PERIODS * 1000 * max(self.options.status_every_ms, 200)
        parts = []
        for p in sorted(rows):
            row = rows[p]
            heard = self._peer_heard_us.get(p, now)
            parts.append(
                {
                    "down": now - heard > silent_us,
                    "pid": row.pid,
                    "newest_checkpoint_epoch": 0,  # no checkpoints in this mode
                    "catching_up": False,
                    "replica": 0,
                    "partition": p,
                    "last_epoch": 0,
                    "txns_applied": row.committed,
                    "state_hash": f"{row.state_hash:016x}",
                    "active": row.active + row.branches,
                    "aborted": row.aborted,
                    "failed": row.failed,
                    "deaths": row.deaths,
                    "in_doubt": row.in_doubt,
                    "lock_waits": row.lock_waits,  # lock requests queued (local and branches)
                    "blocked": row.blocked,  # owners waiting for a lock now
                }
            )
        intake = self.coordinator.intake
        return {
            "mode": "traditional",
            "epoch": 0,
            "next_txn_id": 0,
            "calls_accepted": 0,
            "calls_rejected": 0,
            "txns_sequenced": sum(x["txns_applied"] for x in parts),
            "restarts": sum(x["deaths"] for x in parts),
            "queries": 0,
            "duplicate_calls": self.stats.duplicate_calls,
            "determinism_violations": 0,
            "failed": sum(x["failed"] for x in parts),
            "log_first_epoch": 0,
            "pending": intake.calls_in_flight,
            "in_flight": intake.in_system,
            "partitions": parts,
        }

    # Checks -------------------------------------------------------------------------------
    def idle(self) -> bool:
        return self.coordinator.idle() and not self.participant.branches

    def check_invariants(self) -> None:
        self.state.locks.check_invariants()
        self.coordinator.check_invariants()
        self.participant.check_invariants()
