"""cluster.processes.SpareCores: the host's idle share that decides whether a partition
spends CPU for latency (results mid-batch, batches run ahead of peers' reads) or saves
it (executor.deterministic.delivery holds batches for peers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.processes import SpareCores


def _stat(path: Path, idle: int, busy: int) -> None:
    """A /proc/stat whose CPUs spent ``idle`` ticks idle (half in iowait) and ``busy``
    ticks working, since boot."""
    path.write_text(
        f"cpu  {busy // 2} 0 {busy - busy // 2} {idle // 2} {idle - idle // 2} 0 0 0 0 0\n"
        "cpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2 3\n"
    )


def test_spare_cores_turn_on_and_off_with_a_gap(tmp_path: Path) -> None:
    """Saving until a loaded window says otherwise; on at SPARE_ON, off below SPARE_OFF,
    unchanged between: spending CPU lowers the idle share it reacts to, and must not
    flip itself off."""
    stat = tmp_path / "stat"
    c = SpareCores(every_s=1.0, path=str(stat))
    _stat(stat, 0, 0)
    assert c.update(0.0, 0) is False and c.idle is None
    _stat(stat, 50, 50)
    assert c.update(0.5, 10) is False and c.idle is None  # the window is not over
    _stat(stat, 30, 70)
    assert c.update(1.0, 10) is False and c.idle == pytest.approx(0.30)  # one window
    _stat(stat, 60, 140)
    assert c.update(2.0, 15) is True  # two in a row (SPARE_WINDOWS)
    _stat(stat, 66, 234)
    assert c.update(3.0, 20) is True  # 6%: above SPARE_OFF, stays on
    _stat(stat, 68, 332)
    assert c.update(4.0, 30) is False and c.idle == pytest.approx(0.02)
    _stat(stat, 98, 402)
    assert c.update(5.0, 40) is False  # 30%, once: stays off
    _stat(stat, 104, 496)
    assert c.update(6.0, 50) is False  # 6%: below SPARE_ON, stays off
    assert SpareCores.SPARE_OFF < 0.06 < SpareCores.SPARE_ON and SpareCores.SPARE_WINDOWS == 2


def test_only_a_window_with_work_decides(tmp_path: Path) -> None:
    """An idle host before a load says nothing about the load: a window in which the
    caller's work did not grow leaves the decision as it was."""
    stat = tmp_path / "stat"
    c = SpareCores(every_s=1.0, path=str(stat))
    _stat(stat, 0, 0)
    c.update(0.0, 5)
    _stat(stat, 95, 5)
    assert c.update(1.0, 5) is False and c.idle is None  # 95% idle, but no work done
    _stat(stat, 125, 75)
    assert c.update(2.0, 9) is False  # 30% idle under load, once
    _stat(stat, 220, 80)
    assert c.update(3.0, 9) is False  # idle, no work: neither counts nor breaks the run
    _stat(stat, 250, 150)
    assert c.update(4.0, 12) is True  # 30% under load again: two loaded windows in a row
    _stat(stat, 345, 155)
    assert c.update(5.0, 12) is True  # idle again: still what the last load said
    _stat(stat, 346, 254)
    assert c.update(6.0, 15) is False


def test_spare_cores_where_proc_stat_cannot_be_read(tmp_path: Path) -> None:
    """Another platform: a partition behaves as on an idle host."""
    c = SpareCores(every_s=1.0, path=str(tmp_path / "missing"))
    assert c.update(0.0, 0) is True
    assert c.update(5.0, 1) is True and c.idle is None
    (tmp_path / "garbled").write_text("no numbers here")
    assert SpareCores(path=str(tmp_path / "garbled")).update(0.0, 0) is True
    (tmp_path / "short").write_text("cpu 1 2\n")
    assert SpareCores(path=str(tmp_path / "short")).update(0.0, 0) is True
