"""The collector kept off a partition's long-lived state: a loaded database frozen once
(``settle_heap``), what outlives each turn of a partition's loop frozen
(``settle_turn``), and a finished task's state given back (``release_heap``,
``retire``, ``release_retired``). (``txn_library.heap.gc_paused`` holds the collector off
for one burst of allocations; this is the policy for a database that lives as long as
its process.)

Invariant: what is frozen is never scanned again, so a reference cycle that outlives a
turn is never collected: the engine makes none (``tests/heap_checks.no_cycles``).
"""

from __future__ import annotations

import gc
from typing import Any

# Gen0 allocations, gen1 and gen2 collection ratios (see settle_heap). A young
# collection walks every object it finds (~0.5 us each: rows survive until it untracks
# them), so its pause grows with the gen0 threshold: 50,000 paused a partition 20-30 ms
# every ~0.5 s under New Order (p99 at 50 terminals 44-46 ms); 5,000 gave pauses of
# ~2.5 ms for the same total work (p99 23-29 ms). Since settle_turn a young collection
# sees only objects made in the current turn of the loop.
GC_THRESHOLDS = (5_000, 20, 100)


def settle_heap() -> None:
    """Keep the collector off a loaded database (after a genesis or a checkpoint load).

    A TPC-C warehouse is ~560,000 rows that live as long as the process. With CPython's
    default thresholds the cyclic collector walks the big table dicts and index lists
    over and over (they are re-tracked on the first insert after every full
    collection), which cost about half of a partition's CPU under New Order. So:
    collect once, freeze the survivors (gc.freeze: never scanned again) and make
    collections of the older generations rare. Rows are tuples without cycles;
    collections still run. A process serving transactions then ends each turn of its
    loop with ``settle_turn``.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def settle_turn() -> None:
    """Freeze what survived a turn of a partition's loop (O(1): gc.freeze splices lists);
    deterministic and traditional partitions, and replay after each batch.

    What outlives a turn is rows just written (live until overwritten, then freed by
    reference counting) or a transaction still in flight (freed by reference counting
    when it finishes). A young collection walks each such object once or more and finds
    nothing: under New Order they cost a partition about 80 ms per second (young
    collections of ~2.5 ms, 33 a second), and with checkpoints about 100 ms, for zero
    objects collected. After a turn is frozen, collections still run within the next
    turn (GC_THRESHOLDS; freezing resets the allocation count), over that turn's objects.

    The price: a reference cycle that outlives a turn is never collected. The engine
    makes none: tests wrap its paths in ``tests/heap_checks.no_cycles`` (TPC-C's mix
    with a restart, bank transfers, aborts, failing and hostile calls, remote reads,
    checkpoints written, failed and loaded, replay, the traditional engine's wait-die),
    which runs them with the collector off and asserts a collection then finds nothing.
    A periodic full collection is no safety net here: over a busy partition's heap it
    takes about 1 s per 10 s of New Order (measured), a pause no client should see."""
    gc.freeze()


def release_heap() -> None:
    """The end of a task whose state is gone (a replay task in a Spark worker, which
    runs many): what ``settle_heap`` and ``settle_turn`` froze goes back to the
    collector, which collects once. A cycle frozen during the task (the engine makes
    none; a library might) is then not kept for the worker's life."""
    gc.unfreeze()
    gc.collect()


# Finished tasks' states not freed yet (``retire``): at most one per process.
_retired: list[Any] = []


def retire(state: Any) -> None:
    """Keep a finished task's ``state`` instead of freeing it now: freeing a replica
    of ~1M rows a partition took a Spark task 0.8-1.1 s before its rows went back.
    The state is freed, and the heap released (``release_heap``), when this process
    next starts a task that loads a state (``release_retired``), or never if it exits
    first (a Spark worker is killed with its session)."""
    release_retired()
    _retired.append(state)


def release_retired() -> None:
    """Free a retired state, if any, and release the heap (``retire``)."""
    if _retired:
        _retired.clear()
        release_heap()
