"""What a load run measured: per-kind answers and latencies in a window, a timeline,
the one percentile rule, and CPU seconds per process.

Percentiles: ``percentiles`` is the one method used by every caller (the TPC-C summary,
the bank runs, the paper experiments, the fuzz script): nearest rank without
interpolation, the sample at 0-based index ``min(n - 1, floor(q * n))`` of the sorted
values, i.e. the smallest sample with more than a q share of the samples at or below
it. It is the rule the TPC-C driver, the bank workload and the paper script used before
this module, so their numbers stay comparable across the change. (scripts/fuzz_cluster.py
used rank ceil(q * n); its quantiles move up by at most one sample, and only when q * n
is a whole number.)

Invariants: a Window counts only answers the cluster returned (or timeouts); latencies
kept per kind are bounded by ``limits.loadgen_latency_samples_max`` (the generator keeps
a uniform sample past it); a Timeline has at most ``limits.loadgen_timeline_buckets_max``
buckets.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from txn_library import limits

QUANTILES = (0.50, 0.95, 0.99)


def percentiles(values: Iterable[float], quantiles: Sequence[float]) -> list[float | None]:
    """The ``quantiles`` (each in [0, 1]) of ``values`` by nearest rank, no interpolation.

    For n values sorted ascending, quantile q is the value at 0-based index
    ``min(n - 1, floor(q * n))``: the smallest value with more than a q share of the
    values at or below it (q = 1 gives the maximum). None for every q when there are no
    values. Units are the caller's.
    """
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q!r} is not in [0, 1]")
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return [None] * len(quantiles)
    return [xs[min(n - 1, int(q * n))] for q in quantiles]


def quantile_key(q: float) -> str:
    """ "p50", "p95", "p99", "p99.9": how a quantile is named in results."""
    return f"p{q * 100:g}"


def latency_percentiles_ms(
    latencies_s: Iterable[float], quantiles: Sequence[float] = QUANTILES, digits: int = 2
) -> dict[str, float | None]:
    """``percentiles`` of latencies in seconds, as milliseconds rounded to ``digits``,
    keyed by ``quantile_key``."""
    values = percentiles(latencies_s, quantiles)
    return {
        quantile_key(q): None if v is None else round(1000.0 * v, digits)
        for q, v in zip(quantiles, values, strict=True)
    }


@dataclass
class KindStats:
    """Answers of one kind of call inside the window."""

    ok: int = 0
    aborted: int = 0
    errors: int = 0
    multi_partition: int = 0  # of the ok and aborted ones
    # of the ok and aborted ones, all of them or (past the bound) a uniform sample
    latencies_s: list[float] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return self.ok + self.aborted + self.errors

    def percentiles_ms(
        self, quantiles: Sequence[float] = QUANTILES, digits: int = 2
    ) -> dict[str, float | None]:
        return latency_percentiles_ms(self.latencies_s, quantiles, digits)


@dataclass
class Timeline:
    """Per ``bucket_s`` since the run's start (warm-up, window and drain alike).

    ``answers[b]``: answers (any outcome) that arrived in bucket b. ``submitted[b]``:
    calls first sent in bucket b, and ``late[b]`` those of them answered after more
    than ``late_after_s``, or never. ``samples[b]``: taken at about bucket b's end,
    (seconds since start, calls outstanding, of those outstanding for more than
    late_after_s).
    """

    bucket_s: float
    late_after_s: float
    answers: list[int]
    submitted: list[int]
    late: list[int]
    samples: list[tuple[float, int, int]] = field(default_factory=list)


@dataclass
class Window:
    """What one run measured; counts in ``kinds`` are answers inside the window."""

    kinds: dict[str, KindStats] = field(default_factory=dict)
    error_codes: Counter[str] = field(default_factory=Counter)  # "proc: code" -> n, window
    kinds_all: Counter[str] = field(default_factory=Counter)  # answers of any phase, by kind
    started_at: float = 0.0  # time.perf_counter() at the window's edges
    ended_at: float = 0.0
    sent: int = 0  # calls first sent inside the window
    skipped: int = 0  # open loop: due inside the window, not sent (in-flight bound)
    unanswered: int = 0  # outstanding when the drain ended
    status_start: dict | None = None  # the cluster's status at the edges, if asked for
    status_end: dict | None = None
    timeline: Timeline | None = None

    @property
    def measured_s(self) -> float:
        return max(1e-9, self.ended_at - self.started_at)

    @property
    def ok(self) -> int:
        return sum(k.ok for k in self.kinds.values())

    @property
    def aborted(self) -> int:
        return sum(k.aborted for k in self.kinds.values())

    @property
    def errors(self) -> int:
        return sum(k.errors for k in self.kinds.values())

    @property
    def answered(self) -> int:
        return sum(k.answered for k in self.kinds.values())

    @property
    def answered_all(self) -> int:
        return sum(self.kinds_all.values())

    def latencies_s(self) -> list[float]:
        """Every kind's latencies together."""
        return [x for k in self.kinds.values() for x in k.latencies_s]

    def percentiles_ms(
        self, quantiles: Sequence[float] = QUANTILES, digits: int = 2
    ) -> dict[str, float | None]:
        """Latency percentiles over every kind (ms, rounded to ``digits``)."""
        return latency_percentiles_ms(self.latencies_s(), quantiles, digits)


def new_timeline(
    warmup_s: float, duration_s: float | None, bucket_s: float, late_after_s: float
) -> Timeline:
    """Buckets over warm-up and window (+2: answers of the window's last instants)."""
    if duration_s is None or bucket_s <= 0:
        raise ValueError("a timeline needs duration_s and timeline_bucket_s > 0")
    n = int((warmup_s + duration_s) / bucket_s) + 2
    if n > limits.loadgen_timeline_buckets_max:
        raise ValueError(
            f"{n} timeline buckets; at most {limits.loadgen_timeline_buckets_max} "
            f"(limits.loadgen_timeline_buckets_max)"
        )
    return Timeline(bucket_s, late_after_s, [0] * n, [0] * n, [0] * n)


def timeline_answer(tl: Timeline, t0: float, first_sent: float, now: float) -> None:
    b = int((now - t0) / tl.bucket_s)
    if b < len(tl.answers):
        tl.answers[b] += 1
    sb = int((first_sent - t0) / tl.bucket_s)
    if sb < len(tl.submitted):
        tl.submitted[sb] += 1
        tl.late[sb] += now - first_sent > tl.late_after_s


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), None if unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by each process in ``pids`` and by this one ("driver") inside
    the window; pass ``edge`` as a run's ``on_edge``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start: dict[str, float | None] = {}
        self.used: dict[str, float] = {}

    def edge(self, edge: str) -> None:
        now = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        now["driver"] = time.process_time()
        if edge == "start":
            self.start = now
            return
        for name, value in now.items():
            before = self.start.get(name)
            if value is not None and before is not None:
                self.used[name] = round(value - before, 2)
