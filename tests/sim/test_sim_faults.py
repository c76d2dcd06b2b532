"""The replicated ordering layer under its harder faults (``ha_faults``; issue 49 items
2 and 3): a paused member (alive, silent past its session, resuming with its old
beliefs), one-way cuts (the leader's publication to some replicas, their reports to
it, some clients' calls to one sequencer), a follower crashing with a wiped disk, the
store losing a server or slow (some commits timing out after they were applied), clock
jumps; drawn per seed and overlapping, on top of the leader kills and cut-offs.

Every run ends with the simulator's checks (one batch per epoch, terms and batch
timestamps never decreasing, every acknowledged call logged once with the serial
replay's answer, replica hashes equal to the oracle's, partitions never following an
older term) plus: no call answered by a deposed leader after its successor committed.
Each planted bug is caught by a named seed, which passes without it.

Replay a seed with ``.venv/bin/python scripts/simulate.py --seed N --sequencers 3``
(add ``--plant NAME`` for a planted bug).
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from executor.deterministic.sim_options import SimResult
from executor.deterministic.simulator import run_seed

HA: dict[str, Any] = {"sequencers": 3, "ha_faults": True}
SEEDS = 240
FAULT_COUNTERS = (
    "pauses",
    "oneway_cuts",
    "wiped_followers",
    "store_faults",
    "clock_jumps",
    "sessions_lost",
    "failovers",
)
# planted bug -> (the seed that catches it, what its first failure says)
CAUGHT_BY = {
    "partition-accepts-old-term": (0, "follows term 1 (seq0) after term 2"),
    "no-exactly-once-rebuild": (3, "logged 2 times"),
    "client-new-ids-on-resend": (0, "logged 2 times"),
    "fenced-leader-serves-reads": (9, "after a newer term committed"),
}


def _run(seed: int) -> SimResult:
    return run_seed(seed, "bank", **HA)


def test_overlapping_faults_keep_every_guarantee() -> None:
    workers = min(2, os.cpu_count() or 1)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.map(_run, range(SEEDS), chunksize=8)
    bad = [r.summary() + "\n  " + r.first_failure for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    for name in FAULT_COUNTERS:  # every fault happened, many times over
        assert sum(r.counters[name] for r in results) >= SEEDS // 10, name
    assert sum(r.counters["store_timeouts"] for r in results) >= 1


def test_a_seed_with_ha_faults_replays_exactly() -> None:
    a, b = run_seed(11, "bank", **HA), run_seed(11, "bank", **HA)
    assert a.trace_digest == b.trace_digest
    assert a.counters["pauses"] + a.counters["oneway_cuts"] >= 1


def test_each_planted_bug_is_caught_by_its_seed() -> None:
    for plant, (seed, says) in CAUGHT_BY.items():
        planted = run_seed(seed, "bank", plant=plant, **HA)
        assert not planted.ok, f"{plant} not caught by seed {seed}"
        assert any(says in f for f in planted.failures), (plant, planted.failures[:3])
        assert run_seed(seed, "bank", **HA).ok, f"seed {seed} fails without {plant}"
