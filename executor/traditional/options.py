"""Knobs, counters and history of the traditional baseline, and its injected faults.

``TraditionalOptions`` is what the launcher saves as data_dir/traditional.json and
every partition process loads; it checks its own values when built. The bounds of
this mode live in txn_library/limits.py (traditional_*, dependent_restarts_max).

Injected prepare faults (tests, fault runs) decide what a participant does with a
PREPARE: vote NO, stay silent (a hang or a crash before voting), or (process server
only) exit before voting.

Invariant: a HistoryEntry is appended at a transaction's lock point (all its locks
held); under 2PL the order of lock points is a serialization order (executor.
traditional.oracle replays it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from executor.traditional.messages import Aid
from txn_library import limits

FAULT_VOTE_NO = "vote_no"
FAULT_SILENT = "silent"  # never answers (a hang or a crash before voting)
FAULT_CRASH = "crash"  # the process exits before voting (server only)

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


def every_nth_prepare(kind: str, n: int) -> PrepareFault:
    """A prepare fault that strikes the n-th, 2n-th, ... prepare (n = 1: every one)."""
    count = 0

    def fault(_aid: Aid) -> str | None:
        nonlocal count
        count += 1
        return kind if count % n == 0 else None

    return fault
