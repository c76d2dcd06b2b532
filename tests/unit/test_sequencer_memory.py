"""What the sequencer keeps after a flood, in-process: bounded in bytes, and what it
freed goes back to the OS.

After 40,000 hostile messages (scripts/fuzz_cluster.py) the sequencer grew from
33-41 MB to 150-270 MB and stayed there: the retry cache kept 64 MB of 0.9 MB answers
(and counted 64 bytes for a small entry that cost ~270), logged calls waiting for the
last replica's answer kept their encoded bytes and arguments, and glibc kept what the
flood freed. Each test here proves one of those bounds; no timing, a few seconds.
"""

from __future__ import annotations

import itertools
import tracemalloc
from pathlib import Path

import msgpack

import txn_library.workloads.builtin  # noqa: F401  (registers kv.* and bank.*)
from cluster.heap_trim import HeapTrim
from sequencer.log import CommandLog
from sequencer.retry_cache import ENTRY_OVERHEAD_BYTES, RetryCache
from sequencer.sequencer import Sequencer
from txn_library import limits
from txn_library.errors import OK
from txn_library.wire import sequencer as wire
from txn_library.wire.partition import MSG_RESULTS
from txn_library.wire.sequencer import Packed

STATUS = (1, 1, 0, 0, 1, 0, 0, 0, False, 1, 0, 0, 0, 0, -1)  # a well-formed partition status


def _seq(d: Path) -> Sequencer:
    return Sequencer(CommandLog(d, fsync=False), replicas=2, partitions=2)


def _frame(client: bytes, *calls: object) -> bytes:
    return msgpack.packb([wire.REQ_CALLS, client, list(calls)])


def test_a_flood_of_large_answers_holds_at_most_the_retry_caches_byte_bound(
    tmp_path: Path,
) -> None:
    """300 reads of a 0.9 MB value, each frame decoded as over the wire: what the
    sequencer still holds after them is the retry cache's bound, not 300 answers."""
    s = _seq(tmp_path)
    big = Packed(msgpack.packb(b"x" * 900_000))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for req in range(1, 301):
            s.on_frame(b"id", _frame(b"c1", [req, "kv.get", ["k"]]))
            s.run_intake()
            for (_r, p), queries in s.take_query_out().items():
                qres = tuple((q[0], q[1], OK, big) for q in queries)
                assert s.on_results_message((MSG_RESULTS, 0, p, (), qres, STATUS))
            s.take_client_out()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert s.retries.answered_bytes <= limits.retry_cache_bytes_max
    assert held <= limits.retry_cache_bytes_max + (2 << 20), held


def test_a_small_answer_costs_no_more_than_the_retry_cache_says(tmp_path: Path) -> None:
    """ENTRY_OVERHEAD_BYTES is what limits.py's docs promise per entry: measured, with a
    client id object per call (one call per frame, decoded as over the wire)."""
    cache = RetryCache()
    n = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            client = msgpack.unpackb(msgpack.packb(b"client-%d" % (i % 8)))
            cache.finish((client, 10**6 + i), OK, Packed(msgpack.packb(None)), 2**64 - 1, 7)
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    value_bytes = cache.answered_bytes / n
    assert per_entry <= ENTRY_OVERHEAD_BYTES + value_bytes, per_entry
    done = cache.get((b"client-3", 10**6 + 3))
    assert done.status == OK and done.value is None and done.digest == 2**64 - 1
    assert done.epoch == 7


def test_a_logged_call_keeps_no_copy_of_its_bytes_while_replicas_answer(tmp_path: Path) -> None:
    """A logged call waits in the in-flight table until every replica answered (with a
    replica down, up to result_backlog_txns_max of them): it keeps neither its encoded
    txn nor, unless it may restart, its arguments."""
    s = _seq(tmp_path)
    for i in range(4):
        s.on_frame(b"big", _frame(b"c1", [i, "kv.put", [f"k{i}", b"v" * 400_000]]))
    s.run_intake()
    assert s.tick(1) is not None
    waiting = [f.call for f in s.results.inflight.values()]
    assert len(waiting) == 4
    assert all(c.encoded == b"" and c.args == () for c in waiting)
    # The first replica's answers still reach the client and the retry cache.
    results = tuple((t, OK, msgpack.packb(None)) for t in s.results.inflight)
    assert s.on_results_message((MSG_RESULTS, 0, 0, results, (), STATUS))
    assert [r[1] for r in s.take_client_out()[b"big"]] == [OK] * 4
    s.on_frame(b"big", _frame(b"c1", [2, "kv.put", ["k2", b"v" * 400_000]]))  # a retry
    s.run_intake()
    assert s.take_client_out()[b"big"] == [(2, OK, None)]


class _Process:
    """A fake RSS and clock for HeapTrim: a trim gives back what the flood freed."""

    def __init__(self) -> None:
        self.now = 0.0
        self.rss = 40 << 20
        self.freed = 0
        self.trims: list[float] = []

    def trim(self) -> None:
        self.trims.append(self.now)
        self.rss -= self.freed
        self.freed = 0


def test_freed_heap_goes_back_after_a_burst_and_trims_are_spaced() -> None:
    p = _Process()
    heap = HeapTrim(rss=lambda: p.rss, trim=p.trim, clock=lambda: p.now)
    step = limits.heap_check_s
    p.rss += limits.heap_trim_growth_bytes // 2  # below the growth bound: no trim
    heap.turn(p.now)
    assert p.trims == []
    p.now += step
    p.rss += limits.heap_trim_growth_bytes  # a burst: freed, kept by malloc
    p.freed = limits.heap_trim_growth_bytes
    heap.turn(p.now)
    assert p.trims == [p.now] and heap.released_bytes == limits.heap_trim_growth_bytes
    # Live memory grows: one more trim at most per interval, and the floor rises.
    while p.now < 4 * limits.heap_trim_interval_s_min:
        p.now += step
        p.rss += limits.heap_trim_growth_bytes
        heap.turn(p.now)
    gaps = [b - a for a, b in itertools.pairwise(p.trims)]
    assert gaps and min(gaps) >= limits.heap_trim_interval_s_min
    assert heap.trims == len(p.trims)


def test_without_malloc_trim_the_trimmer_does_nothing() -> None:
    p = _Process()
    heap = HeapTrim(rss=lambda: p.rss, trim=None, clock=lambda: p.now)  # not glibc
    p.rss += 10 * limits.heap_trim_growth_bytes
    heap.turn(p.now)
    assert heap.trims == 0
