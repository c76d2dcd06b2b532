"""The Leaderboard benchmark's measuring parts, without a cluster (issue 47 items 2, 4):
its options, the open loop's schedule, the percentiles and timeline of a run, the search
for the saturating rate, and the profile's arithmetic. Nothing here times anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import leaderboard  # noqa: E402
import profile_leaderboard  # noqa: E402
from leaderboard_cluster import Numbers, chain_flow  # noqa: E402
from leaderboard_latency import RateSearch, latency_experiment, parse_fractions, sustained  # noqa: E402
from leaderboard_load import OpenLoop, Run, timeline  # noqa: E402


# Options -------------------------------------------------------------------------------
def test_rate_alone_is_an_open_loop_of_the_dataflow_way() -> None:
    a = leaderboard.parse(["--mode", "dataflow", "--rate", "800"])
    assert a.rate == 800.0 and not a.latency and a.mode == ["dataflow"]


def test_latency_alone_measures_the_dataflow_way_at_half_and_four_fifths() -> None:
    a = leaderboard.parse(["--latency"])
    assert a.mode == ["dataflow"] and a.latency_at == (0.5, 0.8)


def test_all_includes_the_latency_experiment() -> None:
    a = leaderboard.parse(["--all"])
    assert a.latency and "dataflow" in a.mode


@pytest.mark.parametrize(
    "argv",
    [
        ["--latency", "--rate", "100"],  # it finds its own rates
        ["--mode", "chained", "--latency"],  # the dataflow way only
        ["--latency", "--latency-at", "0.5,1.5"],  # a fraction above the rate
        ["--latency", "--latency-at", "0"],
        ["--rate", "-1"],
        ["--latency", "--probe-seconds", "0"],
    ],
)
def test_bad_latency_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        leaderboard.parse(argv)
    assert e.value.code == 2


def test_fractions_parse_in_order() -> None:
    assert parse_fractions("0.8,0.5,1") == (0.8, 0.5, 1.0)
    with pytest.raises(ValueError):
        parse_fractions("0.5,x")


# The open loop ---------------------------------------------------------------------------
def test_open_loop_pushes_are_due_evenly_from_the_start() -> None:
    s = OpenLoop(rate=400.0, start=10.0)
    assert [s.due(i) for i in range(4)] == [10.0, 10.0025, 10.005, 10.0075]
    assert s.due(400) == pytest.approx(11.0)  # fixed in advance: a late push moves none


def test_open_loop_needs_a_rate() -> None:
    with pytest.raises(ValueError):
        OpenLoop(rate=0.0, start=0.0)


# A run's figures -------------------------------------------------------------------------
def _run(submitted: dict[int, float], acked: dict[int, float], done: dict[int, float]) -> Run:
    run = Run("dataflow", chain_flow(1, True), Numbers(1), 1, rate=100.0)
    run.submitted, run.acked, run.done = submitted, acked, done
    run.window = (0.0, 10.0)
    run.began = 0.0
    return run


def test_summary_gives_sink_and_ack_percentiles_of_pushes_due_in_the_window() -> None:
    # 100 pushes due at 0.0 .. 9.9 s, acknowledged after b ms, in the sink 10 ms later;
    # one more due after the window is not counted.
    submitted = {b: (b - 1) / 10 for b in range(1, 102)}
    acked = {b: t + b / 1000 for b, t in submitted.items()}
    done = {b: t + 0.010 for b, t in acked.items()}
    row = _run(submitted, acked, done).summary()
    # nearest rank (cluster.measure.percentiles): p50 is the 51st of 100, p99 the 100th
    assert row["ack_latency_ms"] == {"p50": 51.0, "p99": 100.0}
    assert row["latency_ms"] == {"p50": 61.0, "p99": 110.0}
    assert row["latency_samples"] == 100
    assert row["pushes_late"] == 0 and row["undone"] == 0


def test_summary_counts_a_push_never_in_the_sink_as_undone_not_as_a_latency() -> None:
    row = _run({1: 1.0, 2: 2.0}, {1: 1.1, 2: 2.1}, {1: 1.2}).summary()
    assert row["undone"] == 1 and row["latency_samples"] == 1


def test_timeline_counts_each_second_from_the_start() -> None:
    assert timeline([0.1, 0.9, 1.0, 3.5, -0.5], start=0.0) == [2, 1, 0, 1]
    assert timeline([], start=5.0) == []


# The saturating rate ---------------------------------------------------------------------
def _search(capacity: float, first: float, **kw: float) -> RateSearch:
    s = RateSearch(first, **kw)  # type: ignore[arg-type]
    while (rate := s.next_rate()) is not None:
        s.record(rate, rate <= capacity)
    return s


@pytest.mark.parametrize("first", [300.0, 1_000.0, 2_000.0, 9_000.0])
def test_search_brackets_the_capacity_within_its_resolution(first: float) -> None:
    s = _search(2_000.0, first, probes_max=20)
    assert s.lo is not None and s.hi is not None
    assert s.lo <= 2_000.0 < s.hi and s.hi / s.lo <= 1.05
    assert s.rate == s.lo


def test_search_stops_after_its_probes() -> None:
    s = _search(2_000.0, 10.0, probes_max=3)
    assert len(s.probes) == 3 and s.rate == 10.0 * 1.25**2 and s.hi is None


def test_search_that_sustains_nothing_has_no_rate() -> None:
    s = _search(0.0, 100.0, probes_max=4)
    assert s.rate is None and s.hi == pytest.approx(100.0 / 1.25**3)


def _row(got: float, p99: float | None, undone: int = 0) -> dict:
    return {
        "batches_per_s": got,
        "ack_latency_ms": {"p50": 1.0, "p99": p99},
        "undone": undone,
        "errors": {},
    }


def test_a_probe_is_sustained_when_the_sink_keeps_up_and_no_queue_grows() -> None:
    assert sustained(_row(960.0, 40.0), 1_000.0)
    assert not sustained(_row(940.0, 40.0), 1_000.0)  # the sink fell behind
    assert not sustained(_row(1_000.0, 900.0), 1_000.0)  # a queue grew
    assert not sustained(_row(1_000.0, None), 1_000.0)  # nothing acknowledged
    assert not sustained(_row(1_000.0, 40.0, undone=3), 1_000.0)


def test_latency_experiment_runs_each_fraction_of_the_rate_found() -> None:
    ran: list[tuple[float, float]] = []

    def run_at(rate: float, seconds: float) -> dict:
        ran.append((rate, seconds))
        ok = rate <= 1_000.0
        row = _row(rate if ok else rate / 2, 20.0 if ok else 900.0)
        return {**row, "latency_ms": {"p50": 5.0, "p99": 30.0}}

    out = latency_experiment(
        run_at, 800.0, probe_s=2.0, seconds=7.0, fractions=(0.5, 0.8), say=lambda _: None
    )
    rate = out["saturating_rate_per_s"]
    assert 1_000.0 / 1.05 <= rate <= 1_000.0
    measured = [r for r, s in ran if s == 7.0]
    assert measured == pytest.approx([0.5 * rate, 0.8 * rate], rel=1e-3)
    assert [r["fraction"] for r in out["at"]] == [0.5, 0.8]


# The profile -------------------------------------------------------------------------------
STACKS = """\
main (a.py:1);run (b.py:10);step (c.py:5) 6
main (a.py:1);run (b.py:11);step (c.py:7);pack (d.py:2) 3
main (a.py:1);poll (e.py:3) 1
not a stack line
"""


def test_collapsed_stacks_give_inclusive_and_own_samples_per_function() -> None:
    total, inclusive, own = profile_leaderboard.collapsed_costs(STACKS)
    assert total == 10
    assert inclusive["main (a.py)"] == 10 and inclusive["step (c.py)"] == 9
    assert own["step (c.py)"] == 6 and own["pack (d.py)"] == 3 and own["poll (e.py)"] == 1


def test_a_functions_cost_per_batch_is_its_share_of_the_roles_cpu() -> None:
    # 30% of 2 CPU-s over 1,000 batches: 600 us a batch
    assert profile_leaderboard.per_batch_us(3, 10, 2.0, 1_000) == 600.0
    assert profile_leaderboard.per_batch_us(3, 0, 2.0, 1_000) == 0.0
    s = profile_leaderboard.role_summary(STACKS, cpu_s=1.0, batches=100, top=2)
    assert s["us_per_batch"] == 10_000.0
    assert [e["function"] for e in s["own"]] == ["step (c.py)", "pack (d.py)"]
