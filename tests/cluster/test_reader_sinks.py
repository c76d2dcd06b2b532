"""Sinks pushed from readers, end to end (issue 46 item 4): a client that knows one
sequencer address subscribes to a sink; the cluster's readers push each new batch as
they apply it (no ``stream.read`` polled through a partition's lock manager); a kill -9
of the reader it listens to moves it to the other reader, from the batch after the
last it took; it sees every batch once, in order, equal to what was pushed.

The cluster: 1 replica x 2 partitions, two readers, the one-step dataflow of
tests/cluster/sink_flow.py (sink_in -> sink_out, keeping 20 batches)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.config import ClusterConfig
from cluster.launcher import LocalCluster, free_base_port, reader_report
from txn_library.client import Client

pytestmark = pytest.mark.cluster

MODULES = ("txn_library.workloads.builtin", "tests.cluster.sink_flow")
SINK_IN, SINK_OUT = "sink_in", "sink_out"  # as tests/cluster/sink_flow.py declares them
BATCHES = 60
LAG_MAX = 8  # pushes ahead of what the subscriber took (the sink keeps 20)
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cfg = ClusterConfig(
        replicas=1,
        partitions=2,
        readers=2,
        procedure_modules=MODULES,
        base_port=free_base_port(),
        data_dir=str(tmp_path_factory.mktemp("reader-sinks") / "data"),
    )
    lc = LocalCluster(cfg)
    try:
        lc.start()
        yield lc
    finally:
        lc.stop()


def _pushed_by(cfg: ClusterConfig, reader: int) -> int:
    rep = reader_report(cfg, reader, timeout_s=2.0)
    return -1 if rep is None else int(rep["sink_batches_pushed"])


def test_a_subscriber_moves_to_another_reader_after_a_kill9_and_misses_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cfg = cluster.config
    got: list[tuple[int, list]] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def subscriber() -> None:
        deadline = time.monotonic() + WAIT_S
        try:
            with Client(cfg.client_addr, timeout_s=10) as sub:
                for b, tuples in sub.subscribe(
                    SINK_OUT, 1, stop=lambda: time.monotonic() > deadline or done.is_set()
                ):
                    got.append((b, tuples))
                    if b >= BATCHES:
                        return
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failed.append(e)

    t = threading.Thread(target=subscriber)
    t.start()
    killed = False
    victim = 0
    try:
        with Client(cfg.client_addr, timeout_s=10) as c:
            for b in range(1, BATCHES + 1):
                deadline = time.monotonic() + WAIT_S
                while len(got) < b - LAG_MAX and not failed:  # keep within the retention
                    assert time.monotonic() < deadline, f"the subscriber stalled at {len(got)}"
                    time.sleep(0.005)
                assert not failed, failed
                r = c.push(SINK_IN, b, [(b,)])
                assert r.ok, r
                if b == BATCHES // 2 and not killed:
                    while len(got) < b - LAG_MAX // 2:  # a reader is pushing to it now
                        assert time.monotonic() < deadline and not failed, failed
                        time.sleep(0.005)
                    # The one it listens to (a reader still catching up when it subscribed
                    # refused it, and it moved on): the one that has pushed.
                    victim = max(range(2), key=lambda r: _pushed_by(cfg, r))
                    assert _pushed_by(cfg, victim) > 0, "no reader pushed"
                    cluster.kill(f"reader-{victim}")  # SIGKILL
                    killed = True
        t.join(timeout=WAIT_S)
    finally:
        done.set()
        t.join(timeout=10)
    assert not failed, failed
    assert [b for b, _ in got] == list(range(1, BATCHES + 1))  # each once, in order
    assert all(tuples == [(b,)] for b, tuples in got)
    assert _pushed_by(cfg, 1 - victim) > 0, "the other reader took the subscription over"
    cluster.start_reader(victim)  # for the tests after this one


def test_a_subscribe_to_no_such_stream_fails_clearly(cluster: LocalCluster) -> None:
    from txn_library.errors import BadRequest

    with Client(cluster.config.client_addr, timeout_s=10) as c:
        with pytest.raises(BadRequest, match="no stream named"):
            next(iter(c.subscribe("no_such_stream", 1)))
