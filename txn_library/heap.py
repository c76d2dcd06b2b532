"""The cyclic garbage collector, held off where a burst of acyclic objects is made.

Decoding a big msgpack frame or loading a checkpoint allocates many tuples, bytes and
ints that hold no reference cycles. With the collector on, every 700 allocations start
a young collection that walks all of them again: a 10,000-call client frame took the
sequencer 12-14 ms to decode instead of 1.7-2.6 ms (docs/BENCHMARKS.md, "Hostile
input"), and a load paid it per row. ``gc_paused`` turns the collector off for the
burst; reference counting still frees what the burst drops.

Invariant: the collector is enabled on the way out exactly when it was on the way in,
whatever the body raised.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
    """No cyclic collection in the body. With ``freeze`` what was allocated is frozen
    on the way out (gc.freeze, as ``executor.core.heap.settle_heap`` does), so the
    first collection after it does not walk the loaded rows either."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if freeze:
            gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
