"""cluster.processes.CoreContention: the run-queue share that decides whether a
partition holds batches for its peers (executor.deterministic.delivery)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.processes import CoreContention


def test_core_contention_turns_on_and_off_with_a_gap(tmp_path: Path) -> None:
    """On at CONTENDED_ON, off below CONTENDED_OFF, unchanged between: holding lowers
    the wait it reacts to, and must not flip itself off."""
    stat = tmp_path / "schedstat"

    def waited(s: float) -> None:
        stat.write_text(f"123456 {int(s * 1e9)} 789\n")

    c = CoreContention(every_s=1.0, path=str(stat))
    waited(0.0)
    assert c.update(0.0) is False and c.share is None
    waited(0.05)
    assert c.update(0.5) is False and c.share is None  # the window is not over
    waited(0.20)
    assert c.update(1.0) is True and c.share == pytest.approx(0.20)
    waited(0.35)
    assert c.update(2.0) is True  # 15%: above CONTENDED_OFF, stays on
    waited(0.42)
    assert c.update(3.0) is False  # 7%
    waited(0.57)
    assert c.update(4.0) is False  # 15%: below CONTENDED_ON, stays off
    assert CoreContention.CONTENDED_OFF < 0.15 < CoreContention.CONTENDED_ON


def test_core_contention_is_off_where_schedstat_cannot_be_read(tmp_path: Path) -> None:
    c = CoreContention(every_s=1.0, path=str(tmp_path / "missing"))
    assert c.update(0.0) is False
    assert c.update(5.0) is False and c.share is None
    (tmp_path / "garbled").write_text("no numbers here")
    assert CoreContention(path=str(tmp_path / "garbled")).update(0.0) is False
