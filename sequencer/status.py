"""The sequencer's status report: the human-facing map behind ``ordo status``.

Read-only: building it changes nothing. A partition is ``down`` when its last status
is older than PARTITION_SILENT_S by the sequencer's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txn_library.partition_wire import PartitionStatus

if TYPE_CHECKING:
    from sequencer.sequencer import Sequencer

PARTITION_SILENT_S = 1.5


@dataclass
class SequencerStats:
    calls_accepted: int = 0
    calls_rejected: int = 0
    calls_overloaded: int = 0
    txns_sequenced: int = 0
    epochs: int = 0
    restarts: int = 0
    queries: int = 0
    determinism_violations: int = 0
    duplicate_calls: int = 0
    bad_partition_messages: int = 0
    partitions: dict[tuple[int, int], PartitionStatus] = field(default_factory=dict)


def status_report(seq: Sequencer, now: float) -> dict:
    """Counters and every partition's last status."""
    s = seq.stats
    parts = []
    for (r, p), st in sorted(s.partitions.items()):
        parts.append(
            {
                "down": now - seq._heard_at.get((r, p), now) > PARTITION_SILENT_S,
                "pid": st.pid,
                "newest_checkpoint_epoch": st.newest_checkpoint_epoch,
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
            }
        )
    return {
        "epoch": seq.epoch,
        "next_txn_id": seq.next_txn_id,
        "calls_accepted": s.calls_accepted,
        "calls_rejected": s.calls_rejected,
        "calls_overloaded": s.calls_overloaded,
        "txns_sequenced": s.txns_sequenced,
        "restarts": s.restarts,
        "queries": s.queries,
        "duplicate_calls": s.duplicate_calls,
        "determinism_violations": s.determinism_violations,
        "bad_partition_messages": s.bad_partition_messages,
        "failed": seq.failed,
        "log_first_epoch": seq.log.first_epoch,
        "intake_slices_queued": len(seq._intake),  # of up to intake_quantum_calls
        "pending": len(seq._pending),
        "pending_bytes": seq._pending.total_bytes,
        "in_flight": len(seq._inflight),
        "retry_cache_entries": len(seq.retries),
        "retry_cache_bytes": seq.retries.answered_bytes,
        "partitions": parts,
    }
