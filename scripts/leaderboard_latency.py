"""``--latency`` of scripts/leaderboard.py: the saturating rate of the dataflow way, found
with an open loop, and the latency a user sees below it.

Why not the closed loop's figure: with ``--window`` pushes in flight on one connection,
pushes travel in convoys. A batch's acknowledgements come back together (the
partition answers at the end of its batch), the client refills the window at once, and
the refill lands in one epoch while the partition waits for it: the partition idles
for a round trip per convoy, and how long a run stays in that mode (one convoy, about
1,400 batches/s here) before a delay splits it in two (the partition always busy, about
2,300/s) is chance. So a closed-loop figure depends on how long it runs. An open loop
spreads pushes evenly over epochs and has no convoys.

The saturating rate: the highest open-loop rate that is sustained, found by probes of
``probe_s`` (after ``warmup_s``) on one cluster (``RateSearch``): up by ``STEP`` from a
first guess while sustained, down while not, then bisected until the bounds are within
``RESOLUTION`` (or ``PROBES_MAX`` probes). A probe is sustained when the sink received
at least ``KEPT_SHARE`` of the offered rate and its p99 push-to-acknowledged latency is
at most ``BACKLOG_P99_MS`` (a queue that grows for the whole probe shows there). Then
one open-loop run of ``seconds`` at each fraction of it (``--latency-at``, default 50%
and 80%): push-to-acknowledged and push-to-sink p50/p99.

Invariants: probes and runs share one cluster and one flow, batch ids continuing;
every run drains (each push answered and its sink batch seen, or counted undone)
before the next starts; the search only narrows: ``lo`` (sustained) only grows and
``hi`` (not sustained) only shrinks, and ``lo < hi`` whenever both are known.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txn_library.errors import invariant

STEP = 1.25  # a probe's rate against the previous one, until both bounds are known
RESOLUTION = 1.05  # the search stops when hi / lo is at most this
PROBES_MAX = 8
KEPT_SHARE = 0.95  # of the offered rate, received at the sink inside the probe's window
BACKLOG_P99_MS = 500.0  # a sustained probe's p99 push-to-acknowledged latency at most
FRACTIONS = (0.5, 0.8)


def sustained(row: dict[str, Any], rate: float) -> bool:
    """Whether a probe at ``rate`` (its summary ``row``, leaderboard_load.Run.summary)
    kept up: the sink received at least KEPT_SHARE of the rate and the p99 push to
    acknowledgement stayed within BACKLOG_P99_MS, with nothing left undone."""
    p99 = (row.get("ack_latency_ms") or {}).get("p99")
    return (
        row["batches_per_s"] >= KEPT_SHARE * rate
        and p99 is not None
        and p99 <= BACKLOG_P99_MS
        and row["undone"] == 0
        and not row["errors"]
    )


@dataclass
class RateSearch:
    """The highest sustained rate, probe by probe: ``next_rate`` says what to try (None:
    done), ``record`` what it did."""

    first: float
    step: float = STEP
    resolution: float = RESOLUTION
    probes_max: int = PROBES_MAX
    lo: float | None = None  # the highest rate sustained so far
    hi: float | None = None  # the lowest rate not sustained so far
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (self.first > 0 and self.step > 1 and self.resolution > 1 and self.probes_max > 0):
            raise ValueError("a rate search needs first > 0, step > 1, resolution > 1")

    def next_rate(self) -> float | None:
        if len(self.probes) >= self.probes_max:
            return None
        if not self.probes:
            return self.first
        if self.lo is None:
            assert self.hi is not None
            return self.hi / self.step
        if self.hi is None:
            return self.lo * self.step
        if self.hi / self.lo <= self.resolution:
            return None
        return math.sqrt(self.lo * self.hi)

    def record(self, rate: float, ok: bool) -> None:
        self.probes.append((rate, ok))
        if ok:
            if self.lo is None or rate > self.lo:
                self.lo = rate
        elif self.hi is None or rate < self.hi:
            self.hi = rate
        invariant(
            self.lo is None or self.hi is None or self.lo < self.hi,
            "a rate search probes only between its bounds",
        )

    @property
    def rate(self) -> float | None:
        """The saturating rate found: the highest sustained (None: none was)."""
        return self.lo


def parse_fractions(text: str) -> tuple[float, ...]:
    """``"0.5,0.8"`` as (0.5, 0.8): fractions of the saturating rate, each in (0, 1]."""
    out = []
    for part in text.split(","):
        f = float(part)
        if not 0 < f <= 1:
            raise ValueError(f"a fraction of the saturating rate is in (0, 1], not {part}")
        out.append(f)
    if not out:
        raise ValueError("no fractions")
    return tuple(out)


def latency_experiment(
    run_at: Callable[[float, float], dict[str, Any]],
    first_guess: float,
    *,
    probe_s: float,
    seconds: float,
    fractions: tuple[float, ...] = FRACTIONS,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The search, then a run at each fraction; ``run_at(rate, seconds)`` runs the open
    loop and returns its summary row."""
    search = RateSearch(first_guess)
    probes = []
    while (rate := search.next_rate()) is not None:
        row = run_at(rate, probe_s)
        ok = sustained(row, rate)
        search.record(rate, ok)
        lat = row.get("ack_latency_ms") or {}
        say(
            f"probe {rate:>7,.0f}/s: got {row['batches_per_s']:>7,.1f}/s, ack p99 "
            f"{lat.get('p99')} ms: {'sustained' if ok else 'not sustained'}"
        )
        probes.append({"rate_per_s": round(rate, 1), "sustained": ok, "row": row})
    result: dict[str, Any] = {
        "saturating_rate_per_s": None if search.rate is None else round(search.rate, 1),
        "not_sustained_per_s": None if search.hi is None else round(search.hi, 1),
        "probe_s": probe_s,
        "probes": probes,
        "at": [],
    }
    if search.rate is None:
        return result
    for f in fractions:
        row = run_at(f * search.rate, seconds)
        row["fraction"] = f
        result["at"].append(row)
        ack, sink = row.get("ack_latency_ms") or {}, row["latency_ms"]
        say(
            f"at {f:.0%} ({f * search.rate:,.0f}/s): got {row['batches_per_s']:,.1f}/s; "
            f"push to acknowledged p50/p99 {ack.get('p50')}/{ack.get('p99')} ms, "
            f"push to sink {sink['p50']}/{sink['p99']} ms"
        )
    return result
