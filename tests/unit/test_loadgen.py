"""cluster.loadgen against an in-process fake server (a ROUTER on inproc://).

Proves the generator's contract without a cluster: the one percentile rule (nearest
rank, index floor(q * n)); closed-loop terminals never exceed their in-flight bound and
a finite source ends the run with every call answered; open loop keeps its rate and
skips what its bound does not allow; answers outside the window are not counted; a lost
answer is recovered by a resend with the same request id, and a call never answered
becomes a timeout error; status is read at the window's edges; every answer reaches the
answer hook; failover follows a "not leader" hint and leaves a silent sequencer,
resending with the same ids; a background load runs until stopped; raw frames travel
through one channel that never blocks; queries (calls of the kinds a QueryTargets names)
go to the partition their route or footprint names, each replica in turn, batched in
frames within the bounds, with their isolation and epoch, while the other calls go to
the sequencer; a lost query is resent with the same id and an error is counted by code.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from cluster import load_raw
from cluster.launcher import free_base_port
from cluster.load_background import Background
from cluster.load_queries import QueryTargets
from cluster.load_raw import PUSH, RawChannel
from cluster.load_shapes import Call, ClosedLoop, OpenLoop
from cluster.loadgen import TIMEOUT_CODE, LoadGenerator
from cluster.measure import latency_percentiles_ms, percentiles
from txn_library import limits, placement
from txn_library.errors import ABORTED, ERR_NOT_LEADER, ERR_NOT_READY, ERROR, OK
from txn_library.wire import sequencer as wire

# decide(proc, args, copy) -> (status, value), or None to drop the call (no answer);
# copy counts how many times this (client, req_id) arrived (1 = first send).
Decide = Callable[[str, tuple, int], tuple[int, Any] | None]


class FakeServer:
    """Answers REQ_CALLS after ``hold_s`` (answers of one poll turn go together), and
    REQ_STATUS with a counter; records per-terminal outstanding calls (args[0])."""

    def __init__(self, decide: Decide, hold_s: float = 0.0) -> None:
        self.addr = f"inproc://fake-{os.urandom(6).hex()}"
        self.decide = decide
        self.hold_s = hold_s
        self.copies: Counter[tuple[bytes, int]] = Counter()
        self.outstanding: Counter[Any] = Counter()
        self.max_outstanding: Counter[Any] = Counter()
        self.statuses = 0
        self._stop = threading.Event()
        ctx: zmq.Context = zmq.Context.instance()
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.bind(self.addr)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)

    def _serve(self) -> None:
        held: list[tuple[bytes, int, tuple, int, Any]] = []
        while not self._stop.is_set():
            if self._sock.poll(int(self.hold_s * 1000) or 1):
                while self._sock.poll(0):
                    ident, frame = self._sock.recv_multipart()
                    held += self._take(ident, wire.unpack(frame))
            by_ident: dict[bytes, list[tuple[int, int, Any]]] = {}
            for ident, req_id, args, status, value in held:
                self.outstanding[args[0]] -= 1
                by_ident.setdefault(ident, []).append((req_id, status, value))
            held = []
            for ident, results in by_ident.items():
                self._sock.send_multipart([ident, wire.pack((wire.REP_RESULTS, results))])

    def _take(self, ident: bytes, msg: tuple) -> list[tuple[bytes, int, tuple, int, Any]]:
        if msg[0] == wire.REQ_STATUS:
            self.statuses += 1
            reply = (wire.REP_STATUS, {"restarts": self.statuses})
            self._sock.send_multipart([ident, wire.pack(reply)])
            return []
        _kind, client_id, calls = msg
        out = []
        for req_id, proc, args in calls:
            self.copies[(client_id, req_id)] += 1
            answer = self.decide(proc, tuple(args), self.copies[(client_id, req_id)])
            if answer is None:
                continue
            self.outstanding[args[0]] += 1
            key = args[0]
            self.max_outstanding[key] = max(self.max_outstanding[key], self.outstanding[key])
            out.append((ident, req_id, tuple(args), *answer))
        return out


@pytest.fixture
def serve() -> Iterator[Callable[..., FakeServer]]:
    servers: list[FakeServer] = []

    def make(decide: Decide = lambda proc, args, copy: (OK, None), **kw: Any) -> FakeServer:
        servers.append(FakeServer(decide, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def numbered(terminals: int, per_terminal: int, kind: str = "x") -> Callable[[int], Call | None]:
    """Each terminal's calls (terminal, i) for i < per_terminal, then None."""
    sent = [0] * terminals

    def source(t: int) -> Call | None:
        if sent[t] >= per_terminal:
            return None
        sent[t] += 1
        return Call("p", (t, sent[t]), kind)

    return source


def test_percentiles_are_nearest_rank_at_index_floor_q_n() -> None:
    xs = [float(x) for x in range(100, 0, -1)]  # 1..100, unsorted
    assert percentiles(xs, (0.0, 0.5, 0.95, 0.99, 1.0)) == [1.0, 51.0, 96.0, 100.0, 100.0]
    assert percentiles([3.0, 1.0], (0.5,)) == [3.0]  # no interpolation, no averaging
    assert percentiles([], (0.5, 0.99)) == [None, None]
    assert latency_percentiles_ms([0.001, 0.002, 0.0031], (0.5, 0.999)) == {
        "p50": 2.0,
        "p99.9": 3.1,
    }
    with pytest.raises(ValueError):
        percentiles([1.0], (1.5,))


def test_closed_loop_keeps_each_terminal_within_its_bound_and_answers_everything(
    serve: Callable[..., FakeServer],
) -> None:
    def decide(proc: str, args: tuple, copy: int) -> tuple[int, Any]:
        return (ABORTED, "no") if args[1] % 5 == 0 else (OK, args[1])

    server = serve(decide, hold_s=0.005)
    load = ClosedLoop(terminals=4, in_flight_per_terminal=3)
    with LoadGenerator(server.addr, numbered(4, 50), load, connections=2) as gen:
        w = gen.run()
    assert w.sent == w.answered == 200 and w.unanswered == 0
    assert (w.ok, w.aborted, w.errors) == (160, 40, 0)
    assert len(w.kinds["x"].latencies_s) == 200
    assert max(server.max_outstanding.values()) == 3  # reached, never exceeded
    assert w.measured_s > 0


def test_open_loop_keeps_its_rate_and_skips_beyond_its_bound(
    serve: Callable[..., FakeServer],
) -> None:
    fast = serve()
    source = numbered(1, 10_000)
    with LoadGenerator(fast.addr, source, OpenLoop(200.0, in_flight_max=50)) as gen:
        w = gen.run(duration_s=0.5)
    assert 85 <= w.sent <= 101 and w.skipped == 0  # 200/s for 0.5 s, fixed spacing
    assert w.answered >= w.sent - 5  # answers of the last turn may land after the window

    never = serve(lambda proc, args, copy: None)
    source = numbered(1, 10_000)
    with LoadGenerator(never.addr, source, OpenLoop(400.0, in_flight_max=10)) as gen:
        w = gen.run(duration_s=0.25, drain_s=0.0)
    assert w.sent == 10 and w.skipped >= 80 and w.unanswered == 10


def test_warm_up_answers_are_not_counted_and_status_is_read_at_both_edges(
    serve: Callable[..., FakeServer],
) -> None:
    server = serve(hold_s=0.005)
    ticks: list[bool] = []
    edges: list[str] = []
    source = numbered(2, 10**9)
    with LoadGenerator(server.addr, source, ClosedLoop(terminals=2)) as gen:
        w = gen.run(
            warmup_s=0.3,
            duration_s=0.3,
            status_at_edges=True,
            on_edge=edges.append,
            on_tick=lambda _t, measuring, _w, _n: ticks.append(measuring),
            tick_s=0.1,
        )
    assert edges == ["start", "end"]
    assert w.status_start == {"restarts": 1} and w.status_end == {"restarts": 2}
    assert w.answered_all > w.answered > 0  # the warm-up's answers are in _all only
    assert 0.29 <= w.measured_s <= 0.4
    assert ticks[0] is False and ticks[-1] is True


def test_lost_answers_are_resent_with_the_same_id_and_silence_times_out(
    serve: Callable[..., FakeServer],
) -> None:
    def decide(proc: str, args: tuple, copy: int) -> tuple[int, Any] | None:
        if proc == "silent" or copy == 1:
            return None  # the first copy of every call is lost
        return (OK, None)

    server = serve(decide)
    source = numbered(3, 2)
    with LoadGenerator(server.addr, source, ClosedLoop(3), retry_s=0.15, timeout_s=5) as gen:
        w = gen.run()
    assert (w.ok, w.errors) == (6, 0)
    assert sorted(server.copies.values()) == [2] * 6  # each call resent once, same id

    calls = iter([Call("silent", (0, 1)), Call("p", (0, 2))])
    with LoadGenerator(
        server.addr, lambda t: next(calls, None), ClosedLoop(1), retry_s=0.1, timeout_s=0.3
    ) as gen:
        w = gen.run()
    assert w.error_codes == {"silent: timeout": 1}
    assert w.ok == 1  # the terminal moved on after the timeout


def test_bounds_are_checked_when_the_generator_is_built() -> None:
    with pytest.raises(ValueError, match="loadgen_in_flight_max"):
        LoadGenerator("inproc://nowhere", numbered(1, 1), ClosedLoop(100_000, 1))
    with pytest.raises(ValueError, match="route"):
        LoadGenerator(["inproc://a", "inproc://b"], numbered(1, 1), ClosedLoop(1))


def test_think_time_spaces_a_terminals_calls_and_poisson_arrivals_keep_the_rate(
    serve: Callable[..., FakeServer],
) -> None:
    server = serve()
    thinking = ClosedLoop(terminals=1, think_s=0.05)
    with LoadGenerator(server.addr, numbered(1, 10_000), thinking) as gen:
        w = gen.run(duration_s=0.5)
    assert 6 <= w.sent <= 11  # one call per ~50 ms, not back to back

    poisson = OpenLoop(400.0, in_flight_max=1000, arrivals="poisson")
    with LoadGenerator(server.addr, numbered(1, 10_000), poisson, seed=7) as gen:
        w = gen.run(duration_s=0.5)
    assert 140 <= w.sent <= 260  # 200 expected; a seeded draw, not a flaky one


def test_every_answer_and_timeout_reaches_the_answer_hook(
    serve: Callable[..., FakeServer],
) -> None:
    server = serve(lambda proc, args, copy: None if args[1] == 3 else (OK, args[1]))
    seen: list[tuple[int, Any, Any, float]] = []

    def on_answer(t: int, call: Any, status: Any, value: Any, sent: float, at: float) -> None:
        assert at >= sent
        seen.append((t, call.args, status, value))

    source = numbered(2, 3)
    with LoadGenerator(server.addr, source, ClosedLoop(2), retry_s=0.1, timeout_s=0.3) as gen:
        w = gen.run(on_answer=on_answer)
    assert sorted(s[1] for s in seen) == [(t, i) for t in range(2) for i in (1, 2, 3)]
    timeouts = [s for s in seen if s[2] != OK]
    assert [s[3][0] for s in timeouts] == [TIMEOUT_CODE] * 2 and w.errors == 2


def test_failover_follows_a_not_leader_hint_and_resends_with_the_same_ids(
    serve: Callable[..., FakeServer],
) -> None:
    leader = serve()
    follower = serve(lambda proc, args, copy: (ERROR, (ERR_NOT_LEADER, leader.addr)))
    moves: list[tuple[int, str]] = []
    with LoadGenerator(
        [follower.addr, leader.addr], numbered(3, 4), ClosedLoop(3), failover=True
    ) as gen:
        w = gen.run(on_move=lambda _at, conn, addr: moves.append((conn, addr)))
        assert gen.failovers == 1
    assert (w.ok, w.errors) == (12, 0)  # "not leader" never counts
    assert moves == [(0, leader.addr)]
    assert set(follower.copies) <= set(leader.copies)  # resent with the same ids
    assert len(leader.copies) == 12


def test_failover_leaves_a_silent_sequencer(serve: Callable[..., FakeServer]) -> None:
    silent = serve(lambda proc, args, copy: None)
    leader = serve()
    with LoadGenerator(
        [silent.addr, leader.addr], numbered(1, 2), ClosedLoop(1), failover=True, retry_s=30
    ) as gen:
        w = gen.run()
        assert gen.failovers == 1
    assert w.ok == 2 and len(silent.copies) == 1  # moved after the silence, not a resend


def test_a_background_load_runs_until_stopped(serve: Callable[..., FakeServer]) -> None:
    server = serve(hold_s=0.002)
    answers: list[int] = []
    load = Background(
        lambda source: LoadGenerator(server.addr, source, ClosedLoop(2)), numbered(2, 10**9)
    )
    load.start(on_answer=lambda t, *_rest: answers.append(t))
    time.sleep(0.3)
    w = load.stop(timeout_s=10)
    assert w.sent == w.answered == len(answers) > 0 and w.unanswered == 0


def test_raw_frames_go_through_one_channel_that_never_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(load_raw, "PLAY_LINGER_S", 0.2)
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    addr = f"tcp://127.0.0.1:{free_base_port(1)}"
    router.bind(addr)
    stop = threading.Event()

    def echo() -> None:  # answers every message with its first frame, reversed
        while not stop.is_set():
            if router.poll(10):
                ident, first, *_ = router.recv_multipart()
                router.send_multipart([ident, first[::-1]])

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    try:
        with RawChannel(sndhwm=4) as chan:
            chan.open("client", addr)
            chan.open("nowhere", f"tcp://127.0.0.1:{free_base_port(1)}", PUSH)
            assert chan.ask("client", b"ab", 5.0) == b"ba"
            sent = [chan.send("nowhere", [b"x"]) for _ in range(10)]
            assert sent == [True] * 4 + [False] * 6  # bounded, never blocking
            replies: list[tuple[str, bytes]] = []
            schedule = [(i / 5, "junk") for i in range(5)] + [(0.9, "multi")]
            played = chan.play(
                schedule,
                0.2,
                lambda kind: ("client", [kind.encode(), b"tail"]),
                lambda name, frame: replies.append((name, frame)),
                marked=("multi",),
            )
        assert played.sent == {"junk": 5, "multi": 1} and not played.not_sent
        assert played.sent_bytes["multi"] == len(b"multi") + len(b"tail")
        assert [k for _t, k in played.marked] == ["multi"]
        assert sorted(replies) == [("client", b"itlum")] + [("client", b"knuj")] * 5
    finally:
        stop.set()
        thread.join(timeout=5)
        router.close()


# --- Queries -------------------------------------------------------------------------


class FakePartition:
    """A partition's query ROUTER: answers every REQ_QUERY entry with ``answer(proc,
    args, copy)`` -> (status, value), or None to drop it; epoch 7 on every answer.
    Records each frame's entries."""

    def __init__(self, answer: Callable[[str, tuple, int], tuple[int, Any] | None]) -> None:
        self.addr = f"inproc://fake-part-{os.urandom(6).hex()}"
        self.answer = answer
        self.frames: list[tuple] = []  # [(client_id, entries), ...]
        self.copies: Counter[tuple[bytes, int]] = Counter()
        self._stop = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.bind(self.addr)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def entries(self) -> list[tuple]:
        return [e for _cid, entries in self.frames for e in entries]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(1):
                continue
            ident, frame = self._sock.recv_multipart()
            kind, client_id, entries = wire.unpack(frame)
            assert kind == wire.REQ_QUERY and wire.query_request_problem(wire.unpack(frame)) is None
            self.frames.append((client_id, entries))
            replies = []
            for qid, proc, args, _isolation, _at in entries:
                self.copies[(client_id, qid)] += 1
                got = self.answer(proc, args, self.copies[(client_id, qid)])
                if got is not None:
                    replies.append((qid, got[0], wire.pack(got[1]), 7))
            if replies:
                self._sock.send_multipart([ident, wire.encode_query_reply(replies)])


@pytest.fixture
def partitions() -> Iterator[Callable[..., FakePartition]]:
    made: list[FakePartition] = []

    def make(
        answer: Callable[[str, tuple, int], tuple[int, Any] | None] = lambda proc, args, copy: (
            OK,
            args[1],
        ),
    ) -> FakePartition:
        made.append(FakePartition(answer))
        return made[-1]

    yield make
    for p in made:
        p.close()


def mixed(n: int) -> Callable[[int], Call | None]:
    """n calls: every third a call "c" (kind "call"), the others queries "q" (kind "q")
    with args (i, i)."""
    it = iter(range(n))

    def source(_t: int) -> Call | None:
        i = next(it, None)
        if i is None:
            return None
        return Call("c", (0, i), "call") if i % 3 == 0 else Call("q", (i, i), "q")

    return source


def test_queries_go_where_their_route_says_batched_and_the_other_calls_to_the_sequencer(
    serve: Callable[..., FakeServer], partitions: Callable[..., FakePartition]
) -> None:
    seq = serve(hold_s=0.002)
    p0, p1 = partitions(), partitions()
    targets = QueryTargets([[p0.addr, p1.addr]], kinds={"q"}, route=lambda proc, args: args[0] % 2)
    load = ClosedLoop(terminals=4, in_flight_per_terminal=500)
    with LoadGenerator(seq.addr, mixed(6000), load, connections=2, queries=targets) as gen:
        w = gen.run()
        assert gen.queries is not None and gen.queries.epoch_min == gen.queries.epoch_max == 7
    assert w.kinds["q"].ok == 4000 and w.kinds["call"].ok == 2000 and w.errors == 0
    assert len(seq.copies) == 2000  # the calls went to the sequencer, the queries not
    assert {e[1] for e in p0.entries + p1.entries} == {"q"}
    assert {e[2][0] % 2 for e in p0.entries} == {0} and {e[2][0] % 2 for e in p1.entries} == {1}
    assert len(p0.entries) + len(p1.entries) == 4000
    assert {(e[3], e[4]) for e in p0.entries + p1.entries} == {("snapshot", -1)}
    sizes = [len(entries) for _cid, entries in p0.frames + p1.frames]
    assert max(sizes) <= limits.loadgen_frame_calls_max and max(sizes) > 1  # batched
    assert len({cid for cid, _e in p0.frames}) == 2  # one client identity per connection


def test_queries_take_each_replica_in_turn_or_the_footprints_first_partition(
    serve: Callable[..., FakeServer], partitions: Callable[..., FakePartition]
) -> None:
    import txn_library.workloads.builtin  # noqa: F401  (bank.balance: the default route's footprint)

    seq = serve()
    grid = [
        [partitions(lambda proc, args, copy: (OK, args[0])) for _p in range(2)] for _r in range(2)
    ]
    targets = QueryTargets([[p.addr for p in row] for row in grid], isolation="read_committed")
    accounts = iter(range(400))

    def source(_t: int) -> Call | None:
        a = next(accounts, None)
        return None if a is None else Call("bank.balance", (a,), "balance")

    with LoadGenerator(seq.addr, source, ClosedLoop(8), queries=targets) as gen:
        w = gen.run()
    assert w.kinds["balance"].ok == 400 and not seq.copies
    per_replica = [sum(len(p.entries) for p in row) for row in grid]
    assert per_replica == [200, 200]
    for row in grid:
        for p, part in enumerate(row):
            assert all(placement.partition_of("account", (e[2][0],), 2) == p for e in part.entries)
            assert {e[3] for e in part.entries} <= {"read_committed"}


def test_a_lost_query_is_resent_with_the_same_id_and_errors_count_by_code(
    serve: Callable[..., FakeServer], partitions: Callable[..., FakePartition]
) -> None:
    def answer(proc: str, args: tuple, copy: int) -> tuple[int, Any] | None:
        if args[1] == 5:
            return (ERROR, (ERR_NOT_READY, "recovering"))
        return None if copy == 1 else (OK, args[1])  # every first copy is lost

    seq = serve()
    part = partitions(answer)
    targets = QueryTargets([[part.addr]], at_epoch=3)
    source = numbered(3, 5, kind="q")
    with LoadGenerator(
        seq.addr, source, ClosedLoop(3), retry_s=0.1, timeout_s=5, queries=targets
    ) as gen:
        w = gen.run()
    assert w.kinds["q"].ok == 12 and w.error_codes == {f"p: {ERR_NOT_READY}": 3}
    assert sorted(part.copies.values()) == [1] * 3 + [2] * 12  # resent once, same id
    assert {e[4] for e in part.entries} == {3}  # the epoch named


def test_query_targets_are_checked_when_the_generator_is_built() -> None:
    with pytest.raises(ValueError, match="strict"):
        QueryTargets([["inproc://x"]], isolation="strict").check()
    with pytest.raises(ValueError, match="snapshot only"):
        QueryTargets([["inproc://x"]], isolation="read_committed", at_epoch=1).check()
    with pytest.raises(ValueError, match="same partitions"):
        LoadGenerator(
            "inproc://nowhere",
            numbered(1, 1),
            ClosedLoop(1),
            queries=QueryTargets([["inproc://a", "inproc://b"], ["inproc://c"]]),
        )
