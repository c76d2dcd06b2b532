"""Shared fixtures: free port ranges, and local clusters that are always torn down."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from cluster.config import ClusterConfig
from cluster.launcher import LocalCluster, free_base_port, wait_quiescent

__all__ = ["wait_quiescent", "free_base_port"]


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
