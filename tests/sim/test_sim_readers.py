"""Readers in the seeded simulator (issue 46 item 6; executor/reader/sim_reader.py).

Readers follow the sequencer's publication over the simulated network (delays, drops)
and repair gaps from the log service; the fault plan kills and restarts them (empty:
they catch up from the log) while partitions and sequencers crash too. Clients send a
share of their read-only calls to readers as snapshot, at_epoch and read-committed
queries. Tests here prove:

- every reader answer equals the serial oracle's answer at the epoch it names, and
  every reader's partition hashes at every epoch it applied equal the oracle's and the
  replicas', under those faults and through failovers of a replicated ordering layer;
- the checks catch a reader that names the wrong epoch (``reader-ahead``) and one that
  skips a batch (``reader-skip``), each with a named seed that passes without it;
- readers do not change the history: a seed ends with the same replica hashes and the
  same answers to every call with readers as without;
- a seed with readers replays exactly, and scripts/simulate.py reports what it checked.

Replay a seed with ``.venv/bin/python scripts/simulate.py --readers 2 --seed N``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from executor.deterministic.sim_options import SimResult
from executor.deterministic.simulator import run_seed
from executor.reader.sim_reader import ReaderNode

pytestmark = pytest.mark.sim

REPO = Path(__file__).resolve().parents[2]
READERS = {"readers": 2, "reader_query_share": 1.0}
HA = {"sequencers": 3, "sequencer_crashes": 2, "calls": 300, "session_timeout_ms": 300}


def run(seed: int, **options: Any) -> SimResult:
    return run_seed(seed, "bank", reader_node=ReaderNode, **{**READERS, **options})


def _explain(results: list[SimResult]) -> str:
    return "\n".join(
        f"seed {r.seed}: {r.first_failure} (replay: scripts/simulate.py --readers 2 "
        f"--reader-query-share 1 --seed {r.seed})"
        for r in results
        if not r.ok
    )


def _totals(results: list[SimResult]) -> dict[str, int]:
    return {k: sum(r.counters.get(k, 0) for r in results) for k in results[0].counters}


def test_reader_answers_and_hashes_equal_the_oracle_under_crashes_and_lost_batches() -> None:
    results = [run(seed) for seed in range(16)]
    assert all(r.ok for r in results), _explain(results)
    t = _totals(results)
    assert t["reader_crashes"] >= 8 and t["reader_starts"] >= 40  # restarted, caught up
    assert t["partition_crashes"] >= 8 and t["sequencer_crashes"] >= 8
    assert t["pub_drops"] >= 100  # readers repaired their gaps from the log service
    assert t["reader_answers"] >= 400 and t["reader_at_epoch_queries"] >= 150
    assert t["reader_hashes_checked"] >= 1000 and t["reader_partition_hashes_checked"] >= 150


def test_readers_follow_failovers_beside_snapshot_queries_to_partitions() -> None:
    results = [run(seed, query_share=0.5, **HA) for seed in range(3)]
    assert all(r.ok for r in results), _explain(results)
    t = _totals(results)
    assert t["failovers"] >= 3 and t["reader_answers"] >= 100
    assert t["snapshot_answers"] >= 20  # the partitions' answers, checked the same way


def test_a_reader_naming_an_epoch_it_did_not_read_is_caught() -> None:
    """Reader 0 answers from its applied epoch but names the next one: its at_epoch
    answers name another epoch than asked, and its answers differ from the oracle's
    at the epoch they name."""
    planted = run(2, plant="reader-ahead")
    text = "\n".join(planted.failures)
    assert not planted.ok
    assert re.search(r"reader 0: query \S+ named epoch (\d+) and was answered at epoch", text)
    assert re.search(r"reader 0: query \S+ \(snapshot\) at epoch \d+: .*, oracle ", text)
    assert not re.search(r"reader 1", text), text
    assert run(2).ok


def test_a_reader_skipping_a_batch_is_caught_by_its_hashes_and_answers() -> None:
    """Reader 0 applies one batch as if it were empty: from that epoch on its hashes
    differ from the oracle's and, at checkpoint boundaries, the replicas', and its
    answers are wrong."""
    planted = run(0, plant="reader-skip")
    text = "\n".join(planted.failures)
    assert not planted.ok
    assert re.search(r"reader 0 at epoch \d+: state hash [0-9a-f]{16} != oracle ", text)
    assert re.search(r"reader 0 partition \d at epoch \d+: hash \S+ != replica \d's ", text)
    assert re.search(r"reader 0: query \S+ \(\w+\) at epoch \d+: .*, oracle ", text)
    assert not re.search(r"reader 1", text), text
    assert run(0).ok


@pytest.mark.parametrize("seed, options", [(seed, {}) for seed in range(4)] + [(4, HA), (49, {})])
def test_readers_do_not_change_the_history(seed: int, options: dict[str, Any]) -> None:
    """Seed 49: a reader still down when the clients finish keeps the run going past
    where it ends without readers (the sequencer's supervisor restarts it meanwhile);
    HA seed 4: a new leader's batch is cut meanwhile. The history is the same."""
    without = run_seed(seed, "bank", **options)
    with_readers = run(seed, **options)
    assert with_readers.ok, _explain([with_readers])
    assert with_readers.final_hashes == without.final_hashes
    assert with_readers.answers_digest == without.answers_digest
    for k in ("txns", "calls", "answered", "timeouts", "client_retries", "partition_crashes"):
        assert with_readers.counters[k] == without.counters[k], k


def test_a_seed_with_readers_replays_exactly() -> None:
    first, again = run(7), run(7)
    assert first.counters["reader_crashes"] and first.counters["reader_answers"]
    assert first.trace_digest == again.trace_digest and first.counters == again.counters


def test_readers_need_their_node_and_planted_reader_bugs_need_readers() -> None:
    with pytest.raises(ValueError, match="reader_node"):
        run_seed(0, "bank", readers=1)
    with pytest.raises(ValueError, match="needs readers"):
        run_seed(0, "bank", reader_node=ReaderNode, plant="reader-skip")


def test_simulate_script_reports_the_reader_answers_it_checked() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "simulate.py"), "--readers", "2", "--seeds", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "bank: 3 seeds from 0, 0 failed" in out.stdout
    assert " answers checked against the oracle at their epoch" in out.stdout
