"""A sink never skips a batch silently (docs/STREAMS.md, "Sinks"), in process:
``Client.subscribe`` and ``ordo stream tail`` against a stand-in for the sequencer that
runs every call on a LocalReplica (the live ``stream.push`` and ``stream.read``).

A subscriber that falls behind the sink's retention gets BatchesGone naming the missing
ids and the oldest kept, on any page, not only the first; one that passes ``on_gap``
is told of every gap and goes on, so that what it was given and what it was told of
cover every batch pushed, once, in order (the checker of each test). A push through
``submit_push_with_id`` is logged under the id it returns."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner

from cluster.cli import main as cli_main
from cluster.config import ClusterConfig
from cluster.launcher import free_base_port
from executor.deterministic.replica import LocalReplica
from txn_library.client import Client
from txn_library.errors import OK, BadRequest, BatchesGone
from txn_library.procedure import lookup
from txn_library.streams import derived_txns, stream
from txn_library.wire import sequencer as wire
from txn_library.wire.sequencer import Batch, Txn

SINK = "gap_sink"
RETAIN = 20
stream(SINK, [("x", "int")], home=3, retain_batches=RETAIN)


class ReplicaSequencer(threading.Thread):
    """Answers the client port as the sequencer would, each call sequenced alone in a
    batch of its own and run on a one-partition LocalReplica. ``after_read[n]()`` runs
    (in this thread) once the n-th ``stream.read`` has been run, before it is answered:
    a sink that moves on while a subscriber holds a page."""

    def __init__(self, addr: str) -> None:
        super().__init__(daemon=True)
        self.addr = addr
        self.replica = LocalReplica(1)
        self.calls: list[tuple[bytes, int, str]] = []  # (client_id, req_id, procedure)
        self.reads = 0
        self.after_read: dict[int, Callable[[], None]] = {}
        self.stopping = threading.Event()
        self._lock = threading.Lock()  # the replica: this thread, or a test pushing
        self._next_txn = 0
        self._bound = threading.Event()

    def run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.addr)
        self._bound.set()
        try:
            while not self.stopping.is_set():
                if sock.poll(20):
                    identity, frame = sock.recv_multipart()
                    msg = wire.unpack(frame)
                    if msg[0] == wire.REQ_CLUSTER_INFO:  # a sequencer with no reader
                        reply = (wire.REP_CLUSTER_INFO, {})  # and no query address
                        sock.send_multipart([identity, wire.pack(reply)])
                        continue
                    kind, client_id, calls = msg
                    assert kind == wire.REQ_CALLS, kind
                    results = [self._answer(client_id, *call) for call in calls]
                    sock.send_multipart([identity, wire.pack((wire.REP_RESULTS, results))])
        finally:
            sock.close()

    def _answer(self, client_id: bytes, req_id: int, proc: str, args: list) -> tuple:
        self.calls.append((client_id, req_id, proc))
        status, value = self.run_call(proc, *args, client_id=client_id, req_id=req_id)
        if proc == "stream.read":
            self.reads += 1
            action = self.after_read.get(self.reads)
            if action is not None:
                action()
        return (req_id, status, value)

    def run_call(
        self, proc: str, *args: Any, client_id: bytes = b"test", req_id: int = 0
    ) -> tuple[int, Any]:
        """Sequence one call in a batch of its own; its (status, value)."""
        with self._lock:
            lookup(proc).validate(args)
            txn = Txn(proc, args, lookup(proc).participants_of(args, 1), client_id, req_id)
            txns = (txn, *derived_txns([txn], 1))
            e = self.replica.last_epoch + 1
            self.replica.apply(Batch(e, e - 1, self._next_txn, 1000 + e, e, txns))
            answer = self.replica.results[self._next_txn]
            self._next_txn += len(txns)
            return answer

    def push(self, first: int, last: int) -> None:
        """Push batches first..last (batch b holds the one tuple (b,))."""
        for b in range(first, last + 1):
            assert self.run_call("stream.push", SINK, b, [[b]]) == (OK, [b, 1])

    def kept(self) -> dict:
        """The sink's page from its oldest kept batch: "first", "dropped", ..."""
        status, page = self.run_call("stream.read", SINK, 0, 1)
        assert status == OK
        return page  # type: ignore[no-any-return]

    def wait_bound(self) -> None:
        assert self._bound.wait(10), "the stand-in did not bind"


@pytest.fixture
def config(tmp_path: Path) -> ClusterConfig:
    """A 1 x 1 cluster's config, saved (for ``ordo stream tail``); no process runs."""
    cfg = ClusterConfig(
        replicas=1, partitions=1, base_port=free_base_port(), data_dir=str(tmp_path / "d")
    )
    cfg.save()
    return cfg


@pytest.fixture
def fake(config: ClusterConfig) -> Iterator[ReplicaSequencer]:
    server = ReplicaSequencer(config.client_addr)
    server.start()
    server.wait_bound()
    try:
        yield server
    finally:
        server.stopping.set()
        server.join(timeout=5)


def _covered(batches: list[int], gaps: list[BatchesGone], last: int) -> None:
    """The checker: what a subscriber from batch 1 was given and what it was told of
    cover 1..last, each id once, in order; every gap ends before the next batch given."""
    pieces = [(b, b) for b in batches] + [(g.first_missing, g.last_missing) for g in gaps]
    ids = [i for lo, hi in sorted(pieces) for i in range(lo, hi + 1)]
    assert ids == list(range(1, last + 1)), (
        batches,
        [(g.first_missing, g.last_missing) for g in gaps],
    )
    for g in gaps:
        assert g.oldest_kept is not None and g.oldest_kept == g.last_missing + 1
        assert g.oldest_kept in batches  # the batch given right after the gap


def test_a_subscriber_that_falls_behind_gets_an_error_naming_the_missing_batches(
    fake: ReplicaSequencer,
) -> None:
    fake.push(1, 1)
    with Client(fake.addr, timeout_s=10) as c:
        sub = c.subscribe(SINK, from_batch=1)
        assert next(sub) == (1, [(1,)])
        fake.push(2, 31)  # the sink moves on while the subscriber holds batch 1
        now = fake.kept()
        assert now["dropped"] >= 2 and now["first"] == now["dropped"] + 1
        with pytest.raises(BatchesGone) as err:
            next(sub)  # not batch now["first"], silently
        gone = err.value
        assert isinstance(gone, BadRequest)  # callers that catch BadRequest still do
        assert (gone.stream, gone.first_missing, gone.last_missing, gone.oldest_kept) == (
            SINK,
            2,
            now["dropped"],
            now["first"],
        )
        assert f"no longer keeps batches 2..{now['dropped']}" in str(gone)
        assert f"the oldest batch kept is {now['first']}" in str(gone)
        with pytest.raises(StopIteration):
            next(sub)


def test_a_subscriber_from_a_batch_no_longer_kept_is_refused_or_told(
    fake: ReplicaSequencer,
) -> None:
    fake.push(1, 31)
    now = fake.kept()
    with Client(fake.addr, timeout_s=10) as c:
        with pytest.raises(BatchesGone) as err:
            next(c.subscribe(SINK, from_batch=3))
        assert (err.value.first_missing, err.value.last_missing) == (3, now["dropped"])
        gaps: list[BatchesGone] = []
        sub = c.subscribe(SINK, from_batch=1, on_gap=gaps.append)
        got = [next(sub)[0] for _ in range(31 - now["dropped"])]
    _covered(got, gaps, 31)
    assert len(gaps) == 1


def test_with_on_gap_a_subscriber_is_told_of_each_gap_and_goes_on(
    fake: ReplicaSequencer,
) -> None:
    fake.push(1, 1)
    gaps: list[BatchesGone] = []
    got: list[int] = []
    with Client(fake.addr, timeout_s=10) as c:
        sub = c.subscribe(SINK, from_batch=1, on_gap=gaps.append)
        last = 1
        got.append(next(sub)[0])
        for _ in range(3):  # three times: fall behind by 30 batches, catch up
            fake.push(last + 1, last + 30)
            last += 30
            while not got or got[-1] < last:
                got.append(next(sub)[0])
    assert len(gaps) == 3  # told each time
    _covered(got, gaps, last)


def test_a_subscriber_slowed_while_the_sink_moves_on_is_never_silent(
    fake: ReplicaSequencer,
) -> None:
    # The sink gets three batches while the subscriber takes one: each page it reads
    # is delivered whole (one read, one instant), and what the sink dropped meanwhile
    # is reported before the next page's first batch.
    fake.push(1, RETAIN)
    last = RETAIN
    gaps: list[BatchesGone] = []
    got: list[int] = []
    with Client(fake.addr, timeout_s=10) as c:
        for b, tuples in c.subscribe(SINK, from_batch=1, on_gap=gaps.append):
            assert tuples == [(b,)]
            got.append(b)
            if last < 300:
                fake.push(last + 1, last + 3)
                last += 3
            elif b == last:
                break
        assert len(gaps) >= 2
        _covered(got, gaps, last)

        # Without on_gap the same subscriber stops at its first gap, having been given
        # every batch before it.
        fake.push(last + 1, last + RETAIN)
        first, last = last + 1, last + RETAIN
        seen: list[int] = []
        with pytest.raises(BatchesGone) as err:
            for b, _ in c.subscribe(SINK, from_batch=first):
                seen.append(b)
                fake.push(last + 1, last + 3)
                last += 3
        assert seen == list(range(first, err.value.first_missing))
        assert err.value.oldest_kept == err.value.last_missing + 1


def test_from_the_oldest_kept_later_pages_are_checked_too(fake: ReplicaSequencer) -> None:
    fake.push(1, 31)
    now = fake.kept()
    with Client(fake.addr, timeout_s=10) as c:
        sub = c.subscribe(SINK)  # from the oldest kept: no gap on the first page
        got = [next(sub)[0] for _ in range(31 - now["dropped"])]
        assert got == list(range(now["first"], 32))
        fake.push(32, 61)
        with pytest.raises(BatchesGone) as err:
            next(sub)
        assert err.value.first_missing == 32 and err.value.last_missing == fake.kept()["dropped"]


def test_from_the_oldest_kept_of_an_empty_sink_a_later_gap_is_an_error(
    fake: ReplicaSequencer,
) -> None:
    fake.after_read[1] = lambda: fake.push(1, 31)  # after the first (empty) page
    with Client(fake.addr, timeout_s=10) as c:
        with pytest.raises(BatchesGone) as err:
            next(c.subscribe(SINK))
    assert err.value.last_missing == fake.kept()["dropped"] and err.value.first_missing == 0


def test_ordo_stream_tail_stops_at_a_gap_or_reports_it_and_goes_on(
    fake: ReplicaSequencer, config: ClusterConfig
) -> None:
    data = config.data_dir
    fake.push(1, 1)
    fake.after_read[fake.reads + 1] = lambda: fake.push(2, 31)  # while batch 1 prints
    run = CliRunner()
    out = run.invoke(cli_main, ["stream", "tail", SINK, "--from-batch", "1", "--data-dir", data])
    dropped, first = fake.kept()["dropped"], fake.kept()["first"]
    assert out.exit_code == 1, out.output
    assert out.stdout.splitlines() == ["1\t[1]"]
    assert f"no longer keeps batches 2..{dropped}" in out.stderr, out.stderr
    assert f"the oldest batch kept is {first}" in out.stderr and "--skip-gaps" in out.stderr

    fake.after_read[fake.reads + 1] = lambda: fake.push(32, 61)  # while 1.. prints
    count = (32 - first) + 4  # what it holds, the gap, then four more
    args = ["stream", "tail", SINK, "--from-batch", str(first), "--skip-gaps"]
    out = run.invoke(cli_main, [*args, "--count", str(count), "--data-dir", data])
    assert out.exit_code == 0, out.output
    printed = [int(line.split("\t")[0]) for line in out.stdout.splitlines()]
    now = fake.kept()
    assert printed == [*range(first, 32), *range(now["first"], now["first"] + 4)]
    [gap] = out.stderr.splitlines()
    assert gap.startswith(f"gap: stream {SINK} no longer keeps batches 32..{now['dropped']}")
    assert gap.endswith("; going on")


def test_a_push_names_its_request_id_before_its_answer(fake: ReplicaSequencer) -> None:
    with Client(fake.addr, timeout_s=10) as c:
        req_id, fut = c.submit_push_with_id(SINK, 1, [(1,)])
        assert list(fut.result(timeout=10).value) == [1, 1]
        assert (c.proto.client_id, req_id, "stream.push") in fake.calls
        again, fut = c.submit_with_id("stream.push", SINK, 2, [(2,)])
        assert again == req_id + 1 and fut.result(timeout=10).ok
        assert list(c.submit_push(SINK, 3, [(3,)]).result(timeout=10).value) == [3, 1]
        assert list(c.push(SINK, 4, [(4,)]).value) == [4, 1]


def test_ordo_stream_list_says_what_plus_means(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        data_dir=str(tmp_path / "d"),
        procedure_modules=("txn_library.workloads.builtin", "txn_library.workloads.leaderboard"),
    )
    cfg.save()
    out = CliRunner().invoke(cli_main, ["stream", "list", "--data-dir", cfg.data_dir])
    assert out.exit_code == 0, out.output
    assert "a+b: nested, one transaction" in out.output
    assert "-> lbn.validate+lbn.record+lbn.board+lbn.trending" in out.output  # nested=True
