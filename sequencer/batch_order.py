"""The order of the calls within one batch: multi-partition calls last.

Any order of one epoch's calls is a serial order that the log then fixes, so the
sequencer may choose one that runs faster, within what a client may rely on.

Why last: at each partition a multi-partition transaction holds its locks until its
peers' reads arrive, which is when they reach it in the same batch. Early in a batch
it makes every later transaction that shares a lock name with it (a TPC-C district)
queue behind it, and through their locks the ones behind those; they then run
through the lock table, not on the uncontended fast path. Last in the batch, the
single-partition transactions have run by then (2026-11-26, TPC-C New Order, 1%
remote lines: fast path 43% -> ~75% of transactions; docs/BENCHMARKS.md).

What a client may rely on: calls of one connection are ordered as it sent them
(``PendingCall.ordered``), unless it sent them as unordered
(``wire.REQ_CALLS_UNORDERED``: calls in flight together that are independent, as
the terminals of a load generator, each with at most one call out). So a connection
whose calls are ordered keeps them so: once one of its calls moves to the end, so do
its later calls in the batch, in order.

Invariants (``multi_partition_last``): the result is a permutation of the calls;
the calls that stay and the calls that move each keep their relative order; an
ordered connection's calls keep their relative order; a single-partition call of
an unordered connection never moves.
"""

from __future__ import annotations

from sequencer.calls import PendingCall


def multi_partition_last(calls: list[PendingCall]) -> list[PendingCall]:
    """The batch's order for ``calls`` (their order as taken from the queues)."""
    if not any(len(c.participants) > 1 for c in calls):
        return calls
    stay: list[PendingCall] = []
    move: list[PendingCall] = []
    moved_ordered: set[bytes] = set()  # ordered connections with a moved call
    for c in calls:
        if len(c.participants) > 1:
            move.append(c)
            if c.ordered:
                moved_ordered.add(c.identity)
        elif c.ordered and c.identity in moved_ordered:
            move.append(c)  # after its connection's earlier moved call, as sent
        else:
            stay.append(c)
    return stay + move
