"""The simulator with a replicated ordering layer (``sequencers=3``; issue 12): three
sequencer members over a simulated quorum store, the leader killed (kill -9, restarted
later as a follower) or cut off the network while it keeps running, an election after
its session expires, clients and partitions moving to the new leader.

Every run ends with the simulator's checks (no acknowledged call lost, none applied
twice, replicas equal to the serial replay of the *committed* log) plus the replicated
layer's own: every member's local log is a prefix of the committed log, and terms never
decrease along it. The planted bugs ``publish-before-commit`` (a leader that hands a
batch to the partitions before the store commits it) and ``results-to-old-leader``
(partitions that send a new leader's first results to the deposed one) must be caught.

Replay a seed with ``.venv/bin/python scripts/simulate.py --seed N --sequencers 3``.
"""

from __future__ import annotations

from executor.deterministic.simulator import run_seed

HA = {"sequencers": 3, "sequencer_crashes": 2, "calls": 600, "session_timeout_ms": 300}


def test_leader_kills_and_cutoffs_keep_every_guarantee() -> None:
    results = [run_seed(seed, "bank", **HA) for seed in range(12)]
    bad = [r.summary() + "\n  " + r.first_failure for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    assert sum(r.counters["failovers"] for r in results) >= 12
    assert sum(r.counters["leader_cutoffs"] for r in results) >= 4
    assert sum(r.counters["sequencer_crashes"] for r in results) >= 4
    assert all(not r.stalls for r in results)


def test_tpcc_survives_failover() -> None:
    r = run_seed(1, "tpcc", **{**HA, "calls": 150})  # TPC-C's genesis dominates: one seed
    assert r.ok, r.first_failure
    assert r.counters["failovers"] >= 2


def test_a_replicated_seed_replays_exactly() -> None:
    a, b = run_seed(5, "bank", **HA), run_seed(5, "bank", **HA)
    assert a.trace_digest == b.trace_digest and a.counters["failovers"] >= 1


def test_publishing_before_the_commit_is_caught() -> None:
    caught = [
        not run_seed(seed, "bank", plant="publish-before-commit", **HA).ok for seed in range(6)
    ]
    assert sum(caught) >= 4, caught
    assert run_seed(caught.index(True), "bank", **HA).ok


def test_results_sent_to_the_deposed_leader_are_caught_by_seed_4() -> None:
    """The cause of the client hangs that got the client rule of 54a0fcf reverted (issue
    49 item 4; fixed live by 7981127): partitions learned a new leader from its
    heartbeats only, so the results of its first batches went to the deposed leader, and
    the calls in them stayed in the new leader's in-flight table, every retry attached
    to them, until their clients timed out. The simulator's partitions send results to
    the leader they believe in, as live ones do, so the planted bug strands calls."""
    planted = run_seed(4, "bank", plant="results-to-old-leader", strict_liveness=True, **HA)
    assert not planted.ok and planted.stalls, planted.summary()
    assert "never answered" in planted.stalls[0]
    assert run_seed(4, "bank", strict_liveness=True, **HA).ok
