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


def test_spare_cores_turn_off_and_on_with_a_gap(tmp_path: Path) -> None:
    """Off below SPARE_OFF, on at SPARE_ON, unchanged between: spending CPU lowers the
    idle share it reacts to, and must not flip itself off."""
    stat = tmp_path / "stat"
    c = SpareCores(every_s=1.0, path=str(stat))
    _stat(stat, 0, 0)
    assert c.update(0.0) is True and c.idle is None  # spare until a window says not
    _stat(stat, 50, 50)
    assert c.update(0.5) is True and c.idle is None  # the window is not over
    _stat(stat, 2, 98)
    assert c.update(1.0) is False and c.idle == pytest.approx(0.02)
    _stat(stat, 8, 192)
    assert c.update(2.0) is False  # 6%: below SPARE_ON, stays off
    _stat(stat, 38, 262)
    assert c.update(3.0) is True  # 30%
    _stat(stat, 44, 356)
    assert c.update(4.0) is True  # 6%: above SPARE_OFF, stays on
    assert SpareCores.SPARE_OFF < 0.06 < SpareCores.SPARE_ON


def test_spare_cores_where_proc_stat_cannot_be_read(tmp_path: Path) -> None:
    """Another platform: a partition behaves as on an idle host."""
    c = SpareCores(every_s=1.0, path=str(tmp_path / "missing"))
    assert c.update(0.0) is True
    assert c.update(5.0) is True and c.idle is None
    (tmp_path / "garbled").write_text("no numbers here")
    assert SpareCores(path=str(tmp_path / "garbled")).update(0.0) is True
    (tmp_path / "short").write_text("cpu 1 2\n")
    assert SpareCores(path=str(tmp_path / "short")).update(0.0) is True
