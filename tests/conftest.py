"""Shared fixtures (free port ranges, local clusters that are always torn down) and the
test kinds.

Tests live in one folder per kind, and each folder is a pytest marker of the same name:
unit (in-process, fast), sim (seeded whole-cluster simulations in one process), cluster
(real processes on 127.0.0.1, kill -9) and spark (PySpark replay). So
``scripts/test.sh -m "not spark"`` is the quick loop; CI runs everything.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import zmq

from cluster.config import ClusterConfig
from cluster.launcher import (
    PORT_WINDOW_ENV,
    LocalCluster,
    free_base_port,
    port_window,
    wait_quiescent,
)
from txn_library import native

__all__ = ["wait_quiescent", "free_base_port"]

KINDS = ("unit", "sim", "cluster", "spark")
RUN_ORDER = ("cluster", "sim", "spark", "unit")  # the kinds, slowest files first


def pytest_report_header() -> str:
    return f"ordo engine: {native.describe()}"


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker picks cluster ports in a window of its own (the
    processes it starts inherit it), so two workers never pick the same range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return
    low, high = port_window()
    width = (high - low) // count
    i = int(worker[2:])
    os.environ[PORT_WINDOW_ENV] = f"{low + i * width}-{low + (i + 1) * width}"


CLIENT_THREAD = "ordo-client"  # txn_library.client.Client's I/O thread
LEAK_WAIT_S = 6.0  # Client.close waits up to 5 s for its thread


def _client_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == CLIENT_THREAD and t.is_alive()}


def _open_sockets() -> int:
    ctx = zmq.Context._instance  # the shared context clients use, if made yet
    return 0 if ctx is None else sum(not s.closed for s in list(ctx._sockets))


@pytest.fixture(autouse=True)
def no_leaked_clients() -> Iterator[None]:
    """A test leaves no client running and no socket open in the process's shared
    ZeroMQ context. A worker runs hundreds of tests: what each leaks adds up to the
    context's socket limit (1023), and from then on no client in that worker can reach
    any cluster."""
    threads, sockets = _client_threads(), _open_sockets()
    yield
    deadline = time.monotonic() + LEAK_WAIT_S
    while time.monotonic() < deadline:
        left = _client_threads() - threads
        grown = _open_sockets() - sockets
        if not left and grown <= 0:
            return
        time.sleep(0.05)
    frames = sys._current_frames()
    stacks = "".join(
        f"\n{t.name} ({t.ident}):\n" + "".join(traceback.format_stack(frames[t.ident]))
        for t in left
        if t.ident in frames
    )
    pytest.fail(
        f"the test left {len(left)} client(s) running and {grown} more socket(s) open in "
        "zmq.Context.instance(): close every Client (a with block) and socket it makes" + stacks
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its kind, and order the files: by kind (RUN_ORDER: the slow
    integration kinds first), then within a kind the files with the most tests first.
    scripts/test.sh hands files to its two workers in this order (pytest-xdist
    --no-loadscope-reorder), so a run ends with short files and both workers finish
    at about the same time. (xdist's own order, most tests first over all kinds, left
    the single-test integration files, the slowest, for last: one worker ran them alone.)
    The sort is stable: a file's tests stay together and in their order."""
    for item in items:
        kind = item.path.parent.name
        if kind not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: a test file belongs in tests/<kind>/, {KINDS}")
        item.add_marker(getattr(pytest.mark, kind))
    per_file = Counter(item.path for item in items)
    items.sort(key=lambda item: (RUN_ORDER.index(item.path.parent.name), -per_file[item.path]))


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
