"""What the coordinator and the participant of one partition share, and nothing more.

One ``PartitionState`` per partition: its identity and options, its storage, one lock
table for both roles, its counters, the outputs of the current turn and the timer
heap. The coordinator and the participant (executor.traditional.coordinator,
.participant) each hold a reference to it and to nothing of each other;
TraditionalPartition (executor.traditional.partition) wires them together.

Invariants:
- the clock and the randomness are handed in (the process server gives the wall
  clock, the simulator a virtual one and a seeded Random): nothing in this mode's
  roles reads time or entropy itself, so a simulation is reproducible from its seed;
- a lock owner is an attempt of this partition's coordinator or a branch held here
  for another coordinator, never both (a coordinator locks its own keys directly and
  never sends itself a LOCK), so each lock event belongs to exactly one role;
- timers fire in (due time, insertion) order;
- ``pump`` never re-enters itself and never switches greenlets: it only turns lock
  events into resumptions and replies.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from typing import Any

from executor.core.storage import Storage
from executor.traditional.messages import LogRecord, PeerMessage, Write
from executor.traditional.options import TraditionalOptions, TraditionalStats
from scheduler.twopl import LockTable
from txn_library import catalog, placement
from txn_library.errors import FootprintViolation, invariant

# Timer kinds (the heap holds (due_us, insertion seq, kind, object))
T_RESTART, T_DEADLINE, T_QUERY, T_SWEEP, T_STATUS, T_RESEND, T_HOLD = range(7)

Clock = Callable[[], int]  # microseconds
LockEventSink = Callable[[str, Any], None]  # (event kind, owner)


def lock_name(table: str, key: tuple) -> tuple:
    """The lock covering ``key``; a key coarser than a lock is refused (no range locks)."""
    if len(key) < catalog.table(table).lock_prefix:
        raise FootprintViolation(
            f"{table}{key!r} is coarser than a lock: the traditional mode locks whole "
            f"lock_len prefixes only (no range locks)"
        )
    return placement.lock_name(table, key)


def _unwired(kind: str, owner: Any) -> None:
    invariant(False, f"lock event {kind} for {owner!r} before the roles were wired")


class PartitionState:
    """One partition's shared state. One thread; not thread-safe."""

    def __init__(
        self,
        partition: int,
        partitions: int,
        storage: Storage,
        options: TraditionalOptions,
        *,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self.partition = partition
        self.partitions = partitions
        self.storage = storage
        self.options = options
        self.clock = clock
        self.rng = rng
        self.locks = LockTable()
        self.stats = TraditionalStats()
        # The turn's outputs (TraditionalPartition.take_outputs hands them out).
        self.log_out: list[LogRecord] = []
        self.peer_out: dict[int, list[PeerMessage]] = {}
        self.client_out: dict[bytes, list[tuple]] = {}
        # Where lock events go: set once by TraditionalPartition.
        self.on_lock_event: LockEventSink = _unwired
        self._timers: list[tuple[int, int, int, Any]] = []
        self._timer_seq = 0
        self._pumping = False

    # Outputs ------------------------------------------------------------------------------
    def send(self, p: int, msg: PeerMessage) -> None:
        self.peer_out.setdefault(p, []).append(msg)

    def take_outputs(
        self,
    ) -> tuple[list[LogRecord], dict[int, list[PeerMessage]], dict[bytes, list[tuple]]]:
        out = (self.log_out, self.peer_out, self.client_out)
        self.log_out, self.peer_out, self.client_out = [], {}, {}
        self.stats.log_records += len(out[0])
        return out

    # Storage ------------------------------------------------------------------------------
    def apply(self, writes: Iterable[Write]) -> None:
        put = self.storage.put
        for t, key, row in writes:
            put(t, key, row)

    # Timers -------------------------------------------------------------------------------
    def add_timer(self, due_us: int, kind: int, obj: Any) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (due_us, self._timer_seq, kind, obj))

    def next_deadline_us(self) -> int | None:
        return self._timers[0][0] if self._timers else None

    def pop_due_timer(self, now: int) -> tuple[int, Any] | None:
        """(kind, object) of the earliest timer due at ``now``, removed; else None."""
        timers = self._timers
        if not timers or timers[0][0] > now:
            return None
        _, _, kind, obj = heapq.heappop(timers)
        return kind, obj

    # Lock events --------------------------------------------------------------------------
    def pump(self) -> None:
        """Hand every pending lock-table event to its owner's role."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while self.locks.has_events():
                for kind, owner, _name, _mode in self.locks.take_events():
                    self.on_lock_event(kind, owner)
        finally:
            self._pumping = False
