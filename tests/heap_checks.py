"""Asserting that code makes no reference cycles (what lets partitions freeze each turn).

A partition's loop ends every turn with ``settle_turn`` (gc.freeze): an object that
outlives a turn is never scanned by the cyclic collector again, so a reference cycle
among such objects would never be freed. ``no_cycles`` runs a block with the collector
off and then asserts that a collection finds nothing the block left behind; tests wrap
the engine's paths in it (every TPC-C and bank procedure, aborts, restarts, failing and
hostile calls, remote reads, checkpoints written, loaded and failed).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cycles() -> Iterator[None]:
    """The block leaves no cyclic garbage. Inside it the collector is off, a collection
    the code under test runs keeps what it finds (DEBUG_SAVEALL), and ``gc.freeze`` does
    nothing: a freeze (settle_turn, settle_heap) would hide cycles from the check."""
    gc.collect()
    was_enabled = gc.isenabled()
    real_freeze = gc.freeze
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what any collection finds stays in gc.garbage
    gc.freeze = lambda: None
    found: list[object] = []
    try:
        yield
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.freeze = real_freeze
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    kinds = Counter(type(o).__qualname__ for o in found)
    assert not found, f"reference cycles left behind: {kinds.most_common(12)}"
