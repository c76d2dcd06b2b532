"""Give the C allocator's free memory back to the OS after a burst (a role process's
housekeeping, called once per loop turn).

Why. Python objects over 512 bytes (a client frame, a decoded 0.9 MB argument, an
encoded batch, a reply frame) come from glibc malloc. glibc serves a large block from
its own mapping at first, but once such a block is freed it raises its threshold to
that size, so later blocks of up to that size come from the heap and its per-thread
arenas (ZeroMQ's I/O thread has its own), and freed heap memory stays resident on
malloc's free lists. After a flood of hostile messages (scripts/fuzz_cluster.py,
40,000 of them) the sequencer's live objects were back near their size before it,
while ~20-50 MB of freed heap stayed resident; ``malloc_trim(0)`` returns it (every
arena, holes included). Objects of 512 bytes or less live in pymalloc's arenas, which
Python unmaps by itself once empty.

Policy: every ``limits.heap_check_s`` read the resident set size (/proc/self/statm, a
few microseconds); when it grew by ``limits.heap_trim_growth_bytes`` since the last
trim (or the start), trim, at most once per ``limits.heap_trim_interval_s_min``. A
trim walks the heap (~1-10 ms for a few hundred MB), so a process that holds more
live memory does not trim over and over: the RSS after a trim is the next floor.

Invariants: trims are at least ``heap_trim_interval_s_min`` apart; nothing here
allocates on the loop's path beyond reading one small file per check; where
malloc_trim does not exist (not glibc) the trimmer does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

from txn_library import limits
from txn_library.errors import invariant

log = logging.getLogger("ordo.heap")

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set size (/proc/self/statm; 0 where it does not exist)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def _glibc_malloc_trim() -> Callable[[], object] | None:
    """``malloc_trim(0)`` of the C library, or None if it has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        fn = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


MALLOC_TRIM = _glibc_malloc_trim()


class HeapTrim:
    """Decides when to return freed heap memory to the OS; ``turn(now)`` once per loop
    turn. Clock, RSS reader and trim function are handed in (tests)."""

    def __init__(
        self,
        rss: Callable[[], int] = rss_bytes,
        trim: Callable[[], object] | None = MALLOC_TRIM,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rss = rss
        self._trim = trim  # None: no malloc_trim here, nothing to do
        self._clock = clock
        self._floor = rss()  # RSS after the last trim (or at the start)
        self._next_check = 0.0
        self._last_trim_at: float | None = None
        self.trims = 0
        self.released_bytes = 0  # RSS given back by the trims, in total

    def turn(self, now: float) -> None:
        """Check (every ``heap_check_s``) and trim if the RSS grew enough since."""
        if now < self._next_check or self._trim is None:
            return
        self._next_check = now + limits.heap_check_s
        rss = self._rss()
        if rss < self._floor:
            self._floor = rss  # freed by itself (pymalloc arenas, unmapped blocks)
            return
        if rss - self._floor < limits.heap_trim_growth_bytes:
            return
        last = self._last_trim_at
        if last is not None and now - last < limits.heap_trim_interval_s_min:
            return
        self._trim_now(now, rss)

    def _trim_now(self, now: float, before: int) -> None:
        trim, last = self._trim, self._last_trim_at
        if trim is None:
            return
        invariant(last is None or now - last >= limits.heap_trim_interval_s_min, "trims are spaced")
        started = self._clock()
        trim()
        took_ms = (self._clock() - started) * 1000.0
        after = self._rss()
        self._last_trim_at = now
        self._floor = after
        self.trims += 1
        self.released_bytes += max(0, before - after)
        log.info(
            "returned freed heap memory to the OS: RSS %.0f -> %.0f MB in %.1f ms",
            before / 2**20,
            after / 2**20,
            took_ms,
        )
