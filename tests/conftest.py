"""Shared fixtures (free port ranges, local clusters that are always torn down) and the
test kinds.

Tests live in one folder per kind, and each folder is a pytest marker of the same name:
unit (in-process, fast), sim (seeded whole-cluster simulations in one process), cluster
(real processes on 127.0.0.1, kill -9) and spark (PySpark replay). So
``scripts/test.sh -m "not spark"`` is the quick loop; CI runs everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from cluster.config import ClusterConfig
from cluster.launcher import LocalCluster, free_base_port, wait_quiescent
from txn_library import native

__all__ = ["wait_quiescent", "free_base_port"]

KINDS = ("unit", "sim", "cluster", "spark")


def pytest_report_header() -> str:
    return f"ordo engine: {native.describe()}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = item.path.parent.name
        if kind not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: a test file belongs in tests/<kind>/, {KINDS}")
        item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture
def make_cluster(tmp_path) -> Iterator[Callable[..., LocalCluster]]:  # type: ignore[no-untyped-def]
    started: list[LocalCluster] = []

    def make(**kw: object) -> LocalCluster:
        cfg = ClusterConfig(base_port=free_base_port(), data_dir=str(tmp_path / "data"), **kw)  # type: ignore[arg-type]
        lc = LocalCluster(cfg)
        started.append(lc)
        lc.start()
        return lc

    yield make
    for lc in started:
        lc.stop()
