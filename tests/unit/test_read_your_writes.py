"""Read-your-writes and the readers' retention by batch time (issue 46 item 2), in
process: a call's result names the epoch it was committed in (retries and answers
after a sequencer restart too), the client keeps the highest of its own and sends it
with ``read_your_writes``; a reader parks a query until it has applied that epoch and
answers it as it applies (never looking at it before), refuses it with ``not_ready``
saying how far it got once its wait is over, and refuses hostile epochs at once; a
replica's partitions honour the same field; a reader serves snapshots back a
retention measured in the batches' logged time and refuses older ones naming the
oldest epoch it serves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

import txn_library.workloads.builtin  # noqa: F401  (registers kv and the bank)
from cluster.config import ClusterConfig
from cluster.launcher import free_base_port
from executor.deterministic.oracle import SerialExecutor
from executor.reader.follower import Follower
from executor.reader.queries import ReaderQueries
from sequencer.calls import make_batch
from sequencer.log import CommandLog
from sequencer.sequencer import Sequencer
from tests.unit.test_queries import _replica_with_history, _service_mesh
from txn_library import limits
from txn_library.client import Client
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_NOT_READY,
    ERR_OVERLOADED,
    ERROR,
    OK,
    BadRequest,
)
from txn_library.procedure import lookup
from txn_library.wire import sequencer as wire
from txn_library.wire.partition import PartitionStatus
from txn_library.workloads.bank import make_transfers

PARTITIONS = 2
ACCOUNTS = 60
START = 1_000
TOTAL = ACCOUNTS * START
STATUS = PartitionStatus(1, 1, 0, 0, 1, 0, 0, 0, False, 1, 0, 0, 0, 0, -1)


def timed_history(tmp: Path, times_ms: list[int], seed: int = 1) -> list[bytes]:
    """A sequencer's batches as published, the accounts opened in the first, then five
    transfers (most across partitions) in each; batch i logged at ``times_ms[i]``."""
    seq = Sequencer(CommandLog(tmp / "log", fsync=False), 1, PARTITIONS, seed_source=lambda: 7)
    seq.on_calls(b"c", b"client", ((0, "bank.open", (0, ACCOUNTS, START)),))
    transfers = make_transfers(len(times_ms) * 5, ACCOUNTS, PARTITIONS, 0.8, seed)
    out = []
    for e, now in enumerate(times_ms):
        data = seq.tick(now)
        assert data is not None
        out.append(data)
        calls = tuple(
            (e * 5 + i + 1, "bank.transfer", t) for i, t in enumerate(transfers[e * 5 : e * 5 + 5])
        )
        seq.on_calls(b"c", b"client", calls)
    return out


ABSENT = object()


def _query(
    qid: int, proc: str, args: tuple, after: Any = ABSENT, isolation: str = "snapshot", at: int = -1
) -> list:
    """A query entry; ``after`` (anything msgpack encodes) as its after_epoch."""
    entry = [qid, proc, list(args), isolation, at]
    if after is not ABSENT:
        entry.append(after)
    return entry


def send(q: ReaderQueries, *entries: list) -> list:
    q.on_client_frame(b"id", msgpack.packb([wire.REQ_QUERY, b"me", list(entries)]))
    return q.take_replies().get(b"id", [])


def _oracle_states(batches: list[bytes]) -> dict[int, dict[int, int]]:
    """Every account's balance at the end of each epoch (the serial oracle's)."""
    oracle = SerialExecutor()
    states = {}
    for data in batches:
        b = wire.decode_batch(data)
        oracle.apply(b)
        rows = oracle.storage.whole_tables().get("account", {})
        states[b.epoch] = {k[0]: r[0] for k, r in rows.items()}
    return states


# Result.epoch: the sequencer names it, the client keeps the highest -------------------
def test_results_name_the_epoch_their_call_was_committed_in_retries_and_restarts_too(
    tmp_path: Path,
) -> None:
    s = Sequencer(CommandLog(tmp_path), replicas=1, partitions=1)
    s.on_calls(b"id", b"cl", ((1, "kv.put", ("a", 1)),))
    s.tick(1_000)
    s.on_calls(b"id", b"cl", ((2, "kv.put", ("b", 2)), (3, "kv.put", ("c", 3))))
    s.tick(1_010)
    ok = msgpack.packb(None)
    s.on_results(0, 0, ((0, OK, ok), (1, OK, ok), (2, OK, ok)), (), STATUS)
    out, epochs = s.take_client_replies()
    assert [r[0] for r in out[b"id"]] == [1, 2, 3] and epochs[b"id"] == [1, 2, 2]
    # On the wire: the entries as they were, and the epochs' trailer beside them.
    msg = wire.unpack(wire.encode_results_reply(out[b"id"], epochs[b"id"]))
    assert [e[0] for e in msg[1]] == [1, 2, 3]
    assert wire.results_epochs(msg, 3) == (1, 2, 2)
    # A retry of call 2 (same ids) is answered from the cache with its epoch.
    s.on_calls(b"id", b"cl", ((2, "kv.put", ("b", 2)),))
    out, epochs = s.take_client_replies()
    assert out[b"id"] == [(2, OK, None)] and epochs[b"id"] == [2]
    # An error names none, and a reply of errors alone has no trailer (two fields).
    s.on_calls(b"id", b"cl", ((4, "no.such", ()),))
    out, epochs = s.take_client_replies()
    assert out[b"id"][0][1] == ERROR and epochs[b"id"] == [0]
    assert len(wire.unpack(wire.encode_results_reply(out[b"id"], epochs[b"id"]))) == 2
    # After a restart, a retry of a call logged before it: fetched, with its epoch.
    s.log.close()
    s = Sequencer(CommandLog(tmp_path), replicas=1, partitions=1)
    s.on_calls(b"id", b"cl", ((1, "kv.put", ("a", 1)),))
    [(qid, *_)] = next(iter(s.take_query_out().values()))
    s.on_results(0, 0, (), ((qid, 0, OK, None),), STATUS)
    out, epochs = s.take_client_replies()
    assert out[b"id"] == [(1, OK, None)] and epochs[b"id"] == [1]
    # take_client_out (the simulator's) drops the epochs with the results.
    s.on_calls(b"id", b"cl", ((1, "kv.put", ("a", 1)),))
    assert s.take_client_out()[b"id"] == [(1, OK, None)]
    assert s.take_client_replies() == ({}, {})


@pytest.fixture
def routers() -> Iterator[tuple[zmq.Socket, str, zmq.Socket, str]]:
    """A ROUTER standing in for the sequencer and one for a reader."""
    out: list[Any] = []
    for _ in range(2):
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        port = free_base_port(1)
        sock.bind(f"tcp://127.0.0.1:{port}")
        out += [sock, f"tcp://127.0.0.1:{port}"]
    try:
        yield tuple(out)  # type: ignore[misc]
    finally:
        out[0].close()
        out[2].close()


def _receive(sock: zmq.Socket) -> tuple[bytes, Any]:
    assert sock.poll(10_000), "no frame from the client"
    identity, frame = sock.recv_multipart()
    return identity, wire.unpack(frame)


def test_the_client_keeps_its_highest_epoch_and_sends_it_with_read_your_writes(
    routers: tuple[zmq.Socket, str, zmq.Socket, str],
) -> None:
    seq, seq_addr, reader, reader_addr = routers
    with Client(seq_addr, timeout_s=20, reader_addresses=[reader_addr]) as c:
        assert c.last_epoch == 0
        futures = [c.submit("kv.put", f"k{i}", i) for i in range(3)]
        identity, msg = _receive(seq)
        ids = [call[0] for call in msg[2]]
        while len(ids) < 3:
            ids += [call[0] for call in _receive(seq)[1][2]]
        answers = [(r, OK, None) for r in ids]
        seq.send_multipart([identity, wire.encode_results_reply(answers, [5, 3, 0])])
        assert [f.result(timeout=10).epoch for f in futures] == [5, 3, 0]
        assert c.last_epoch == 5
        # Monotone: a later answer of an older epoch does not lower it; a newer raises it.
        for epoch, expected in ((4, 5), (7, 7), (6, 7)):
            fut = c.submit("kv.put", "x", epoch)
            identity, msg = _receive(seq)
            reply = [(msg[2][0][0], OK, None)]
            seq.send_multipart([identity, wire.encode_results_reply(reply, [epoch])])
            assert fut.result(timeout=10).epoch == epoch and c.last_epoch == expected
        # A server that names no epoch (two fields), and one whose trailer is junk:
        # the value stands, its epoch is 0, the junk is counted.
        for frame_of in (
            lambda r: wire.encode_results_reply([(r, OK, "v")]),
            lambda r: msgpack.packb([wire.REP_RESULTS, [[r, OK, "v"]], ["junk"]]),
        ):
            fut = c.submit("kv.get", "x")
            identity, msg = _receive(seq)
            seq.send_multipart([identity, frame_of(msg[2][0][0])])
            r = fut.result(timeout=10)
            assert (r.value, r.epoch) == ("v", 0) and c.last_epoch == 7
        assert c.malformed_replies == 1
        # The query carries the epoch to wait for: last_epoch, or a later one named.
        for kwargs, after in (
            ({"read_your_writes": True}, 7),
            ({"read_your_writes": True, "after_epoch": 3}, 7),
            ({"read_your_writes": True, "after_epoch": 9}, 9),
            ({"after_epoch": 3}, 3),
            ({"isolation": "read_committed", "read_your_writes": True}, 7),
            ({}, None),
        ):
            fut = c.submit_query("kv.get", "x", **kwargs)  # type: ignore[arg-type]
            identity, msg = _receive(reader)
            [entry] = msg[2]
            assert (entry[5] if len(entry) == 6 else None) == after, kwargs
            reply = [(entry[0], OK, msgpack.packb("v"), max(after or 0, 7))]
            reader.send_multipart([identity, wire.encode_query_reply(reply)])
            assert fut.result(timeout=10).value == "v"
        # Hostile epochs are refused in the caller's thread; nothing is sent.
        for bad in (-1, 1 << 63, "5", 5.0, True):
            with pytest.raises(BadRequest) as err:
                c.submit_query("kv.get", "x", after_epoch=bad)  # type: ignore[arg-type]
            assert err.value.code == ERR_BAD_ARGUMENTS
        with pytest.raises(BadRequest, match="at_epoch 2 is before after_epoch 7"):
            c.submit_query("kv.get", "x", at_epoch=2, read_your_writes=True)
        with pytest.raises(BadRequest):
            c.submit_query("kv.get", "x", read_your_writes=1)  # type: ignore[arg-type]
        assert not reader.poll(200)


# A reader parks a query until it has applied its epoch ----------------------------------
def _live_reader(batches: list[bytes], applied: int, clock: list[float]) -> ReaderQueries:
    f = Follower(PARTITIONS)
    for data in batches[:applied]:
        f.offer(data, published=True)
    f.heartbeat(applied)
    f.apply_ready(10_000)
    assert f.live and f.applied_epoch == applied
    return ReaderQueries(f, "reader 0", lambda: clock[0])


def _count_bodies(
    names: tuple[str, ...],
    runs: list[int],
    epoch: Callable[[], int],
    request: pytest.FixtureRequest,
) -> None:
    """Append ``epoch()`` to ``runs`` at every run of these procedures' bodies, until the
    test ends (Procedure is frozen: the test sets and restores the attribute itself)."""
    for name in names:
        proc = lookup(name)
        body = proc.body

        def counted(ctx: Any, *args: Any, _body: Callable[..., Any] = body) -> Any:
            runs.append(epoch())
            return _body(ctx, *args)

        object.__setattr__(proc, "body", counted)
        request.addfinalizer(lambda proc=proc, body=body: object.__setattr__(proc, "body", body))


def test_a_reader_parks_a_query_until_its_epoch_is_applied_and_answers_as_it_applies(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    batches = timed_history(tmp_path, [1_000 + 10 * e for e in range(40)])
    states = _oracle_states(batches)
    clock = [0.0]
    q = _live_reader(batches, 20, clock)
    f = q.follower
    runs: list[int] = []  # every body run: a parked query is run once, when answered
    # The bodies counted where they run (the reader's modules may be compiled, and call
    # run_at directly: a module attribute patched there would never be seen).
    _count_bodies(("bank.balance", "bank.total"), runs, lambda: f.applied_epoch, request)
    a = 7  # an account whose balance moves
    replies = send(
        q,
        _query(1, "bank.balance", (a,), after=25),
        _query(2, "bank.total", (0, ACCOUNTS), after=23),
        _query(3, "bank.balance", (a,), after=21, isolation="read_committed"),
        _query(4, "bank.balance", (a,), after=20),  # applied already: answered now
        _query(5, "bank.balance", (a,), after=22, at=24),  # the named epoch, once applied
    )
    assert [(r[0], r[3]) for r in replies] == [(4, 20)] and runs == [20]
    assert q.waiting == 4
    clock[0] += limits.query_after_epoch_wait_s / 2  # waiting changes nothing
    q.tick()
    assert q.take_replies() == {} and q.waiting == 4 and len(runs) == 1
    answered = []
    for data in batches[20:26]:
        f.offer(data, published=True)
    while f.apply_ready(1):  # as the reader's loop applies: one batch, then on_applied
        q.on_applied()
        for qid, status, packed, epoch in q.take_replies().get(b"id", []):
            assert status == OK
            answered.append((qid, epoch, f.applied_epoch, msgpack.unpackb(packed)))
    assert [x[:3] for x in answered] == [(3, 21, 21), (2, 23, 23), (5, 24, 24), (1, 25, 25)]
    for qid, epoch, _, value in answered:  # the serial history's state at that epoch
        assert value == (TOTAL if qid == 2 else states[epoch][a]), (qid, epoch)
    assert q.waiting == 0 and runs == [20, 21, 23, 24, 25]


def test_a_query_past_the_wait_gets_not_ready_saying_how_far_the_reader_got(
    tmp_path: Path,
) -> None:
    batches = timed_history(tmp_path, [1_000 + 10 * e for e in range(30)])
    clock = [0.0]
    q = _live_reader(batches, 20, clock)
    q.follower.heartbeat(30)  # the cluster has sequenced up to 30; 21.. not offered here
    assert send(q, _query(1, "bank.total", (0, ACCOUNTS), after=25)) == []
    assert send(q, _query(2, "bank.total", (0, ACCOUNTS), after=10**15)) == []
    assert q.waiting == 2
    clock[0] += limits.query_after_epoch_wait_s + 0.01
    q.tick()
    by_qid = {r[0]: r for r in q.take_replies()[b"id"]}
    for qid in (1, 2):
        status, packed = by_qid[qid][1:3]
        code, message = msgpack.unpackb(packed)
        assert status == ERROR and code == ERR_NOT_READY, message
        assert "applied: 20, newest known sequenced: 30" in message
        assert "limits.query_after_epoch_wait_s" in message
    assert "no epoch 1000000000000000 is known to be sequenced" in msgpack.unpackb(by_qid[2][2])[1]
    assert "known to be sequenced" not in msgpack.unpackb(by_qid[1][2])[1]
    assert q.waiting == 0


def test_hostile_epochs_get_a_clear_error_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = timed_history(tmp_path, [1_000 + 10 * e for e in range(25)])
    clock = [0.0]
    q = _live_reader(batches, 20, clock)
    f = q.follower
    before = (f.applied_epoch, f.state_hashes(), f.versions_oldest)
    for qid, bad in enumerate((-1, 1 << 63, (1 << 64) - 1, "5", 5.0, True, None, [5]), start=1):
        [(got, status, packed, _)] = send(q, _query(qid, "bank.total", (0, 10), after=bad))
        code, message = msgpack.unpackb(packed)
        assert (got, status, code) == (qid, ERROR, ERR_BAD_ARGUMENTS) and "after_epoch" in message
    [(_, status, packed, _)] = send(q, _query(20, "bank.total", (0, 10), after=12, at=10))
    assert status == ERROR and "at_epoch 10 is before after_epoch 12" in msgpack.unpackb(packed)[1]
    frame = msgpack.packb(
        [wire.REQ_QUERY, b"me", [[21, "bank.total", [0, 10], "snapshot", -1, 1, 2]]]
    )
    q.on_client_frame(b"id", frame)
    [(qid, status, packed, _)] = q.take_replies()[b"id"]
    assert (qid, status, msgpack.unpackb(packed)[0]) == (0, ERROR, ERR_MALFORMED)
    assert q.waiting == 0 and (f.applied_epoch, f.state_hashes(), f.versions_oldest) == before
    # Bounded: past queries_waiting_max a parked query is refused `overloaded`; queries
    # refused at their deadline leave nothing behind.
    monkeypatch.setattr(limits, "queries_waiting_max", 100)
    replies = send(q, *[_query(100 + i, "bank.total", (0, 10), after=10**9) for i in range(101)])
    assert [msgpack.unpackb(r[2])[0] for r in replies] == [ERR_OVERLOADED] and q.waiting == 100
    clock[0] += limits.query_after_epoch_wait_s + 1
    q.tick()
    assert len(q.take_replies()[b"id"]) == 100 and q.waiting == 0
    assert len(q._by_epoch) + len(q._by_deadline) <= 64


# The same field on a replica's partitions (no reader configured) ------------------------
def test_a_replicas_partitions_wait_for_the_epoch_named_then_answer_at_it_or_later() -> None:
    r, states = _replica_with_history(2, seed=8)
    services = _service_mesh(r)
    clock = [0.0]
    for svc in services:
        svc.clock = lambda: clock[0]
        svc.tick(0.0)  # watermarks
    last = max(states)
    total = sum(row[0] for row in states[last].values())

    def ask(svc: Any, qid: int, isolation: str, after: Any) -> None:
        entry = _query(qid, "bank.total", (0, 200), after=after, isolation=isolation)
        svc.on_client_frame(b"id", msgpack.packb([wire.REQ_QUERY, b"c", [entry]]))

    for qid, isolation in ((1, "snapshot"), (2, "read_committed")):
        ask(services[0], qid, isolation, last + 2)
    assert services[0].take_replies() == {} and services[0].waiting == 2
    for e in (last + 1, last + 2):
        first = r.parts[0].next_txn_id
        r.apply(make_batch(e, first, 1_000 + e, 1, [("bank.transfer", (1, 2, 5))], 2))
        for svc in services:
            svc.tick(0.1)
    replies = {x[0]: x for x in services[0].take_replies()[b"id"]}
    for qid in (1, 2):
        _, status, packed, epoch = replies[qid]
        assert (status, msgpack.unpackb(packed)) == (OK, total) and epoch >= last + 2, replies
    # Past its wait: not_ready, saying how far the partition got.
    ask(services[1], 3, "snapshot", last + 100)
    ask(services[1], 4, "read_committed", last + 100)
    clock[0] += limits.query_after_epoch_wait_s + 0.1
    services[1].tick(clock[0])
    for _, status, packed, _ in services[1].take_replies()[b"id"]:
        code, message = msgpack.unpackb(packed)
        assert status == ERROR and code == ERR_NOT_READY and f"{last + 2}" in message, message
        assert "after_epoch" in message
    # Hostile: refused at once, nothing waits.
    for bad in (-3, 1 << 63, "x"):
        ask(services[0], 5, "snapshot", bad)
        [(_, status, packed, _)] = services[0].take_replies()[b"id"]
        assert status == ERROR and msgpack.unpackb(packed)[0] == ERR_BAD_ARGUMENTS
    assert services[0].waiting == 0


# Retention by batch time ---------------------------------------------------------------
def test_a_reader_serves_snapshots_back_its_retention_in_batch_time(tmp_path: Path) -> None:
    """Batches 100 ms apart (a 10 s idle gap before the last): epoch X is served while
    the batch after it was logged at most retention_s before the newest; older
    snapshots are refused naming the oldest epoch served. The reader's own clock
    plays no part (its queries' clock is stopped at 0)."""
    times = [1_000 + 100 * e for e in range(80)]
    times.append(times[-1] + 10_000)  # idle for 10 s, then one more batch
    batches = timed_history(tmp_path, times)
    states = _oracle_states(batches)
    clock = [0.0]
    q = _live_reader(batches, 80, clock)
    f = q.follower
    assert f.retention_s == limits.reader_retention_s_default == 5.0
    # Epoch 80's batch at 8,900 ms: X + 1's batch at >= 3,900 ms, so X >= 29.
    assert f.versions_oldest == 29 == f.epoch_ends[0][0]
    a = 11
    for e in (29, 50, 80):
        [(_, status, packed, epoch)] = send(q, _query(1, "bank.balance", (a,), at=e))
        assert (status, msgpack.unpackb(packed), epoch) == (OK, states[e][a], e)
    [(_, status, packed, _)] = send(q, _query(1, "bank.total", (0, ACCOUNTS), at=28))
    code, message = msgpack.unpackb(packed)
    assert status == ERROR and code == ERR_BAD_ARGUMENTS
    assert "oldest epoch reader 0 still serves, 29" in message and "5 s of batch time" in message
    # Another reader fed the same history from the log keeps the same window.
    other = Follower(PARTITIONS)
    for data in batches[:80]:
        other.offer(data)
    other.apply_ready(10_000)
    assert other.versions_oldest == f.versions_oldest
    # After the idle gap only the epoch before the newest batch is served, and it.
    f.offer(batches[80], published=True)
    f.apply_ready(1)
    assert f.versions_oldest == 80 and f.applied_epoch == 81
    [(_, status, packed, _)] = send(q, _query(1, "bank.balance", (a,), at=80))
    assert (status, msgpack.unpackb(packed)) == (OK, states[80][a])
    [(_, status, packed, _)] = send(q, _query(1, "bank.balance", (a,), at=79))
    assert status == ERROR and "still serves, 80" in msgpack.unpackb(packed)[1]
    # A shorter retention, as ClusterConfig sets it.
    short = Follower(
        PARTITIONS, retention_s=ClusterConfig(reader_retention_s=0.25).reader_retention_s
    )
    for data in batches[:80]:
        short.offer(data)
    short.apply_ready(10_000)
    assert short.versions_oldest == 77  # X + 1's batch at >= 8,650 ms


def test_the_retention_setting_is_checked_and_recorded_in_cluster_json() -> None:
    cfg = ClusterConfig(readers=1, reader_retention_s=30, base_port=20_000)
    assert ClusterConfig.from_json(cfg.to_json()).reader_retention_s == 30
    assert ClusterConfig().reader_retention_s == limits.reader_retention_s_default
    for bad in (0, -1, limits.reader_retention_s_max + 1, float("nan"), "5", True):
        with pytest.raises(ValueError, match="reader_retention_s"):
            ClusterConfig(reader_retention_s=bad)  # type: ignore[arg-type]


def test_a_reader_keeps_its_versions_within_the_bytes_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past versions_bytes_max the oldest epochs go early, and the oldest epoch served
    (what a refusal names) says so."""
    batches = timed_history(tmp_path, [1_000 + 10 * e for e in range(60)])
    monkeypatch.setattr(limits, "versions_bytes_max", 4_000)
    f = Follower(PARTITIONS)
    for data in batches:
        f.offer(data)
        f.apply_ready(1)
        assert all(s.versions.bytes <= 4_000 for s in f.storages)  # type: ignore[union-attr]
    assert 1 < f.versions_oldest < 60  # 5 s would keep all of these 0.6 s
    assert f.epoch_ends[0][0] == f.versions_oldest
    assert len(f.epoch_ends) == f.applied_epoch - f.versions_oldest


def test_the_window_depends_on_the_history_alone(tmp_path: Path) -> None:
    """Two followers of one history, one applying each batch as it comes, the other
    all of them at once later, keep the same window (a Follower has no clock)."""
    times = [1_000 + 37 * e for e in range(300)]
    batches = timed_history(tmp_path, times)
    a, b = Follower(PARTITIONS, retention_s=2.0), Follower(PARTITIONS, retention_s=2.0)
    for data in batches:
        a.offer(data)
        a.apply_ready(1)
        b.offer(data)
    b.apply_ready(len(batches))
    assert a.versions_oldest == b.versions_oldest == 300 - 2_000 // 37 - 1
    assert list(a.epoch_ends) == list(b.epoch_ends)
