"""The serial oracle of the traditional baseline: is a live history serializable?

Under strict 2PL the order of lock points is a serialization order. ``replay_history``
runs the committed and logically aborted HistoryEntry records of a live run one at a
time, in that order, on one Storage with no locks and no partitions.

Invariant: for a correct engine every replayed call gives the status and value it
gave live, and the final state hash equals the sum of the live partitions' hashes;
bodies run and write sets are validated with executor.core.execution.run_txn, as live.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_txn
from executor.core.storage import Storage
from executor.traditional.options import HistoryEntry
from txn_library.procedure import lookup


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
        status, value, _, prepared = run_txn(proc, h.args, ctx, s)
        if (status, value) != (h.status, h.value) and len(check.mismatches) < max_report:
            check.mismatches.append(
                f"{h.aid} {h.proc}{h.args}: live {(h.status, h.value)}, serial {(status, value)}"
            )
        s.apply(prepared)
        check.replayed += 1
    check.state_hash = s.state_hash
    return check
