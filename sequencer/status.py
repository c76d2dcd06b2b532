"""The sequencer's status report: the human-facing map behind ``ordo status``.

Read-only: building it changes nothing. A partition is ``down`` when its last status
is older than PARTITION_SILENT_S by the sequencer's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from txn_library.wire.partition import PartitionStatus

PARTITION_SILENT_S = 1.5


@dataclass
class SequencerStats:
    calls_accepted: int = 0
    calls_rejected: int = 0
    calls_overloaded: int = 0
    txns_sequenced: int = 0
    txns_derived: int = 0  # a dataflow's steps, derived from pushes (txn_library.streams)
    epochs: int = 0
    restarts: int = 0
    queries: int = 0
    determinism_violations: int = 0
    duplicate_calls: int = 0
    bad_partition_messages: int = 0
    partitions: dict[tuple[int, int], PartitionStatus] = field(default_factory=dict)


def status_report(
    stats: SequencerStats, heard_at: dict[tuple[int, int], float], now: float, **role: Any
) -> dict:
    """The sequencer's counters, ``role``'s values (epoch, queue lengths, ...) and every
    partition's last status; ``heard_at`` is when each partition last reported."""
    parts = []
    for (r, p), st in sorted(stats.partitions.items()):
        parts.append(
            {
                "down": now - heard_at.get((r, p), now) > PARTITION_SILENT_S,
                "pid": st.pid,
                "newest_checkpoint_epoch": st.newest_checkpoint_epoch,
                # the last checkpoint boundary applied, and the one being written (-1:
                # none): a boundary passed while nothing is written and newer than the
                # newest durable one was skipped or its writer failed
                "boundary_epoch": st.boundary_epoch,
                "boundary_hash": f"{st.boundary_hash:016x}",  # compared by readers
                "checkpoint_writing": st.checkpoint_writing,
                "catching_up": bool(st.catching_up),
                "replica": r,
                "partition": p,
                "last_epoch": st.last_epoch,
                "txns_applied": st.txns_applied,
                "state_hash": f"{st.state_hash:016x}",
                "active": st.active_txns,
                # contention: lock requests that waited, txns that waited, blocked now
                "lock_waits": st.lock_waits,
                "txn_waits": st.txn_waits,
                "blocked": st.blocked,
                "bypassed": st.bypassed,  # ran on the uncontended fast path, so far
            }
        )
    counters = {f.name: getattr(stats, f.name) for f in fields(stats) if f.name != "partitions"}
    return {**role, **counters, "partitions": parts}
