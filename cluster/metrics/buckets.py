"""A histogram's counts kept as plain Python numbers: what a role's loop adds to.

The loop thread adds; the scrape thread (cluster.metrics.endpoint) reads a copy. No
lock: ``add`` is a few list and float operations under the GIL, and a reader that
catches it half done sees a count already added to its bucket but not yet to ``sum``,
which Prometheus tolerates (its +Inf bucket is the buckets' total, read once).
``add`` takes a count, so a batch of answers with one latency costs one call.

Invariant: ``bounds`` is strictly increasing; ``counts`` has one slot per bound plus
one for values above the last (+Inf).
"""

from __future__ import annotations

from bisect import bisect_left

from txn_library.errors import invariant

# Seconds, for latencies from ~1 ms (one epoch is 10 ms) to a stalled minute.
LATENCY_BOUNDS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        invariant(
            all(a < b for a, b in zip(bounds, bounds[1:], strict=False)),
            "histogram bounds must increase",
        )
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def add(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """Prometheus's buckets, ``le`` -> count at or below, +Inf last; and the sum."""
        counts = list(self.counts)  # one copy: the loop thread may add meanwhile
        out, total = [], 0
        for bound, n in zip(self.bounds, counts, strict=False):
            total += n
            out.append((_le(bound), float(total)))
        out.append(("+Inf", float(total + counts[-1])))
        return out, self.sum


def _le(bound: float) -> str:
    return repr(float(bound))
