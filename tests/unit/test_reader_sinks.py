"""Sinks pushed from a reader (executor/reader/sinks.py): a subscriber of a stream gets
every batch once and in order as the reader applies the epochs that made them, equal to
what ``stream.read`` returns on the serial oracle; the window, the lease, a lost push,
and hostile subscribes."""

from __future__ import annotations

import msgpack
import pytest

import txn_library.workloads.leaderboard as lb
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.snapshot import Snapshot, query_procedure
from executor.reader.follower import Follower
from executor.reader.queries import run_at
from executor.reader.sinks import ReaderSinks
from tests.unit.test_streams import _leaderboard_log, _votes
from txn_library import limits
from txn_library.errors import ERR_BAD_ARGUMENTS, ERR_NOT_READY, ERR_OVERLOADED
from txn_library.wire import reader as rwire
from txn_library.wire import sequencer as wire

pytestmark = pytest.mark.unit

PARTITIONS = 2
BOARD = lb.VARIANT["lb"].names["board"]


def _log(batches: int = 200) -> list:
    return _leaderboard_log("lb", PARTITIONS, _votes(5, batches), weak=False).batches


def _follower(live: bool = True) -> Follower:
    f = Follower(PARTITIONS)
    f.live = live
    return f


def _subscribe(s: ReaderSinks, sub_id: int, nxt: int | None, now: float, who: bytes = b"c"):
    s.on_message(who, (rwire.REQ_SUBSCRIBE, sub_id, BOARD, nxt), now)
    return s.take().get(who, [])


def _taken(pushes: list, seen: dict[int, list]) -> int | None:
    """What a subscriber does: keep batches in order, drop repeats; its next id."""
    nxt = None
    for p in pushes:
        assert p.error is None, p
        for batch_id, tuples in p.page["batches"]:
            if batch_id in seen:
                continue
            assert not seen or batch_id == max(seen) + 1, (batch_id, max(seen))
            seen[batch_id] = tuples
        nxt = max(seen) + 1 if seen else nxt
    return nxt


def test_a_subscriber_gets_every_batch_once_in_order_as_the_oracle_reads_it() -> None:
    batches = _log()
    f = _follower()
    sinks = ReaderSinks(f, "reader 0")
    oracle = SerialExecutor()
    seen: dict[int, list] = {}
    pushes = _subscribe(sinks, 1, None, 0.0)
    assert pushes and pushes[0].page["batches"] == []  # nothing yet: the answer, empty
    nxt = None
    for i, b in enumerate(batches):
        f.offer(msgpack.packb(b), published=True)
        f.apply_ready(1)
        oracle.apply(b)
        sinks.after_apply(float(i) / 100)
        pushes = sinks.take().get(b"c", [])
        assert all(p.epoch == f.applied_epoch for p in pushes)
        nxt = _taken(pushes, seen) or nxt
        if i % 10 == 0 and nxt is not None:  # an acknowledgement now and then
            _taken(_subscribe(sinks, 1, nxt, float(i) / 100), seen)
    assert seen, "the board was written"
    # Every batch the stream keeps, as stream.read returns it on the serial oracle.
    args = (BOARD, 0, limits.stream_read_batches_max)
    proc, _ = query_procedure("stream.read", args, 1)
    _, expected, _ = run_at(proc, args, [Snapshot(oracle.storage, None)], 1)
    assert {b: [tuple(t) for t in ts] for b, ts in expected["batches"]} == {
        b: [tuple(t) for t in ts] for b, ts in seen.items()
    }
    assert sinks.pushed_batches == len(seen)


def test_the_window_holds_pushes_until_the_subscriber_acknowledges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "sink_window_batches", 3)
    f = _follower()
    sinks = ReaderSinks(f, "reader 0")
    _subscribe(sinks, 1, 1, 0.0)  # batch ids start at 1
    for b in _log(60):
        f.offer(msgpack.packb(b), published=True)
        f.apply_ready(1)
        sinks.after_apply(0.0)
    seen: dict[int, list] = {}
    nxt = _taken(sinks.take().get(b"c", []), seen)
    assert sorted(seen) == [1, 2, 3] and nxt == 4  # the window, then nothing
    sinks.after_apply(0.0)
    assert not sinks.take()
    nxt = _taken(_subscribe(sinks, 1, nxt, 0.1), seen)  # acknowledged: three more
    assert sorted(seen) == [1, 2, 3, 4, 5, 6] and nxt == 7


def test_a_push_never_acknowledged_is_pushed_again_and_a_silent_subscriber_dropped() -> None:
    f = _follower()
    sinks = ReaderSinks(f, "reader 0")
    _subscribe(sinks, 1, 0, 0.0)
    for b in _log(60):
        f.offer(msgpack.packb(b), published=True)
        f.apply_ready(1)
    sinks.after_apply(0.0)
    first = sinks.take()[b"c"]  # lost on the way
    assert first[0].page["batches"]
    again = _subscribe(sinks, 1, 0, limits.sink_resend_s / 2)  # too soon: only a heartbeat
    assert again[0].page["batches"] == []
    again = _subscribe(sinks, 1, 0, limits.sink_resend_s + 0.1)
    assert again[0].page["batches"] == first[0].page["batches"]
    sinks.after_apply(limits.sink_resend_s + 0.1 + limits.sink_lease_s)
    assert not sinks.subs  # its lease ran out


def test_hostile_or_early_subscribes_get_a_clear_error_and_change_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f = _follower(live=False)
    sinks = ReaderSinks(f, "reader 0")
    [p] = _subscribe(sinks, 1, 0, 0.0)
    assert p.error is not None and p.error[0] == ERR_NOT_READY and not sinks.subs
    f.live = True
    for bad in [
        (rwire.REQ_SUBSCRIBE, -1, BOARD, 0),
        (rwire.REQ_SUBSCRIBE, 1, BOARD, 1 << 70),
        (rwire.REQ_SUBSCRIBE, 1, "x" * 10_000, 0),
        (rwire.REQ_SUBSCRIBE, 1, BOARD),
        (rwire.REQ_SUBSCRIBE, 1, "no_such_stream", 0),
        (rwire.REQ_SUBSCRIBE, 1, ("nested", ("deep",)), 0),
        (99, 1),
        "junk",
    ]:
        sinks.on_message(b"c", bad, 0.0)
        [p] = sinks.take()[b"c"]
        assert p.error is not None and p.error[0] == ERR_BAD_ARGUMENTS, (bad, p)
    assert not sinks.subs
    monkeypatch.setattr(limits, "reader_subscriptions_per_client_max", 2)
    for sub_id in range(3):
        [p] = _subscribe(sinks, sub_id, 0, 0.0)
    assert p.error is not None and p.error[0] == ERR_OVERLOADED and len(sinks.subs) == 2
    [p] = _subscribe(sinks, 9, 0, 0.0, who=b"other")  # another client is not starved
    assert p.error is None
    sinks.on_message(b"c", (rwire.REQ_UNSUBSCRIBE, 0), 0.0)
    assert len(sinks.subs) == 2


def test_the_push_frames_round_trip_and_are_checked() -> None:
    push = rwire.SinkPush(
        3, 17, {"batches": [[1, [[2, 3]]]], "first": 1, "last": 1, "dropped": None}
    )
    msg = wire.unpack(rwire.encode(push))
    assert rwire.sink_push_problem(msg) is None
    assert rwire.named(msg).page["batches"] == ((1, ((2, 3),)),)
    assert rwire.sink_push_problem((rwire.REP_SINK, 3, 17, None, None)) == "one of page and error"
    assert rwire.sink_push_problem((rwire.REP_SINK, "x", 17, {}, None)) is not None
