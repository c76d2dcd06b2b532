"""The sequencer's intake under hostile and unlucky input, in-process (no sockets).

Each test here failed before the fix it names: batches cut by bytes, fair sharing
between clients, a retry cache bounded by bytes, reused client ids, and frames that
used to be misread or to fail-stop the sequencer.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import msgpack
import pytest

import txn_library.workloads.builtin  # noqa: F401
from cluster.sequencer_server import turn_deadline
from sequencer.log import CommandLog, iter_frames
from sequencer.sequencer import Sequencer
from txn_library import limits
from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.errors import ERR_BAD_ARGUMENTS, ERR_TOO_LARGE, ERROR, OK
from txn_library.procedure import Arg, Footprint, lookup, procedure
from txn_library.wire import sequencer as wire
from txn_library.wire.partition import MSG_RESULTS, PartitionStatus

STATUS = (1, 1, 0, 0, 1, 0, 0, 0, False, 1, 0, 0, 0, 0, -1)  # a well-formed partition status


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _seq(d: Path, **kw: object) -> Sequencer:
    return Sequencer(CommandLog(d, fsync=False), replicas=1, partitions=2, **kw)  # type: ignore[arg-type]


def _frame(client: bytes, *calls: object) -> bytes:
    return msgpack.packb([wire.REQ_CALLS, client, list(calls)])


def _errors(s: Sequencer, identity: bytes) -> list[tuple]:
    return [r for r in s.take_client_out().get(identity, []) if r[1] == ERROR]


def _logged_txns(d: Path) -> list[tuple]:
    return [t for _e, data in iter_frames(d) for t in wire.decode_batch(data).txns]


def test_batches_are_cut_by_bytes_and_big_calls_wait_for_the_next_epoch(tmp_path: Path) -> None:
    """Defect 2: 48 kv.put of 0.95 MB made one 45.6 MB batch and fail-stopped."""
    s = _seq(tmp_path)
    value = "v" * 950_000
    sizes = []

    def tick() -> None:
        data = s.tick(1000 + len(sizes))
        assert data is not None
        sizes.append(len(data))
        assert wire.pack(wire.unpack(data)) == data  # encoded once, byte-identical

    for i in range(48):  # a burst arriving faster than epochs: several epochs' worth
        s.on_frame(b"big", _frame(b"c1", [i, "kv.put", [f"k{i}", value]]))
        s.run_intake()
        if i % 2 == 1:
            tick()
    while s.has_pending():
        tick()
    assert s.failed is None
    assert max(sizes) <= limits.batch_bytes_max and len(sizes) >= 6
    keys = [t.args[0] for t in _logged_txns(tmp_path)]
    assert keys == [f"k{i}" for i in range(48)]  # every call, in order


def test_a_flood_of_bad_calls_does_not_delay_another_clients_call(tmp_path: Path) -> None:
    """Defect 3: one client's frames of 10,000 bad calls stalled everyone else."""
    s = _seq(tmp_path, clock=FakeClock())
    bad = [[i, "bank.transfer", ["x", 1, 2]] for i in range(limits.calls_per_frame_max)]
    for _ in range(3):
        s.on_frame(b"flooder", _frame(b"f", *bad))
    s.on_frame(b"good", _frame(b"g", [1, "bank.transfer", [1, 2, 3]]))
    handled = s.run_intake(deadline=0.0)  # one round-robin chunk, then the turn ends
    assert handled <= 4 * limits.intake_quantum_calls
    assert s.stats.calls_accepted == 1  # the good call got in at once
    assert s.has_intake()  # most of the flood still waits
    s.run_intake()
    assert s.stats.calls_rejected == 3 * limits.calls_per_frame_max


def test_each_batch_takes_calls_round_robin_between_clients(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    n = limits.calls_per_frame_max
    for k in range(3):
        flood = [[i, "kv.put", [f"f{i}", i]] for i in range(k * n, (k + 1) * n)]
        s.on_frame(b"flooder", _frame(b"f", *flood))
    s.on_frame(b"good", _frame(b"g", [1, "kv.put", ["mine", 1]]))
    s.run_intake()
    data = s.tick(1)
    assert data is not None
    txns = wire.decode_batch(data).txns
    assert len(txns) == limits.batch_txns_max
    assert ("mine", 1) in [t.args for t in txns]


def test_one_client_cannot_take_every_pending_slot(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    n = limits.client_pending_calls_max
    calls = tuple((i, "kv.put", (f"k{i}", 0)) for i in range(n + 5))
    for i in range(0, len(calls), limits.calls_per_frame_max):
        s.on_calls(b"greedy", b"c1", calls[i : i + limits.calls_per_frame_max])
    over = _errors(s, b"greedy")
    assert len(over) == 5 and all(r[2][0] == "overloaded" for r in over)
    s.on_calls(b"other", b"c2", ((1, "kv.put", ("x", 1)),))
    assert not _errors(s, b"other")


def _answer_queries(s: Sequencer, value: object) -> None:
    for (_r, p), queries in s.take_query_out().items():
        qres = tuple((q[0], q[1], OK, value) for q in queries)
        assert s.on_results_message((MSG_RESULTS, 0, p, (), qres, STATUS))


def test_retry_cache_is_bounded_by_bytes_and_an_evicted_retry_is_refused(
    tmp_path: Path,
) -> None:
    """Defect 4: 300 kv.get of a 0.9 MB value kept ~290 MB in the retry cache."""
    s = _seq(tmp_path)
    big = "x" * 900_000
    for req in range(1, 301):
        s.on_calls(b"id", b"c1", ((req, "kv.get", ("k",)),))
        _answer_queries(s, big)
    assert s.retries.answered_bytes <= limits.retry_cache_bytes_max
    s.take_client_out()
    s.on_calls(b"id", b"c1", ((300, "kv.get", ("k",)),))  # recent: the same answer
    assert s.take_client_out()[b"id"] == [(300, OK, big)]
    s.on_calls(b"id", b"c1", ((1, "kv.get", ("k",)),))  # evicted: refused, not re-run
    (r,) = s.take_client_out()[b"id"]
    assert r[1] == ERROR and r[2][0] == "retry_expired"
    assert not s.take_query_out()


def test_reused_client_id_gets_an_error_never_another_calls_result(tmp_path: Path) -> None:
    """Defect 5: a second client with the same id got the first client's old result."""
    s = _seq(tmp_path)
    s.on_calls(b"a", b"same-id", ((1, "bank.transfer", (0, 1, 5)),))
    s.tick(1)
    assert s.on_results_message((MSG_RESULTS, 0, 0, ((0, OK, wire.pack(95)),), (), STATUS))
    assert s.take_client_out()[b"a"] == [(1, OK, wire.Packed(wire.pack(95)))]
    s.on_calls(b"b", b"same-id", ((1, "bank.transfer", (0, 1, 7)),))
    (r,) = s.take_client_out()[b"b"]
    assert r[1] == ERROR and r[2][0] == "request_id_reused"
    s.on_calls(b"a", b"same-id", ((1, "bank.transfer", (0, 1, 5)),))  # a true retry
    assert s.take_client_out()[b"a"] == [(1, OK, 95)]
    assert s.tick(2) is None  # nothing was sequenced again


def test_reused_client_id_is_caught_after_a_restart_too(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    s.on_calls(b"a", b"same-id", ((1, "bank.transfer", (0, 1, 5)),))
    s.tick(1)
    s.log.close()
    s = _seq(tmp_path)  # the dedup table is rebuilt from the log
    s.on_calls(b"b", b"same-id", ((1, "bank.transfer", (0, 1, 7)),))
    (r,) = s.take_client_out()[b"b"]
    assert r[2][0] == "request_id_reused"
    s.on_calls(b"a", b"same-id", ((1, "bank.transfer", (0, 1, 5)),))
    assert [q[2] for qs in s.take_query_out().values() for q in qs] == ["__result__"]


def _nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\x00"


@pytest.mark.parametrize(
    ("name", "frame", "expect"),
    [
        ("calls frame with 2 fields", msgpack.packb([wire.REQ_CALLS, b"c"]), "REQ_CALLS is"),
        ("calls frame with 4 fields", msgpack.packb([wire.REQ_CALLS, b"c", [], 1]), "REQ_CALLS is"),
        (
            "unordered calls frame with 4 fields",
            msgpack.packb([wire.REQ_CALLS_UNORDERED, b"c", [], 1]),
            "REQ_CALLS is",
        ),
        (
            "unordered calls frame, client id not bytes",
            msgpack.packb([wire.REQ_CALLS_UNORDERED, 5, [[1, "kv.put", ["k", 1]]]]),
            "client_id",
        ),
        ("kind True", msgpack.packb([True, b"c", [[1, "kv.put", ["k", 1]]]]), "kind:int"),
        ("kind 1.0", msgpack.packb([1.0, b"c", [[1, "kv.put", ["k", 1]]]]), "kind:int"),
        ("kind str", msgpack.packb(["1", b"c", []]), "kind:int"),
        ("too deep to decode", msgpack.packb([1, b"c"])[:-2] + _nested(100_000), "not msgpack"),
        ("map with a list key", b"\x81\x91\x00\x00", "not msgpack"),
        ("req id past int64", _frame(b"c", [2**64 - 1, "kv.put", ["k", 1]]), "int64"),
        ("negative req id", _frame(b"c", [-1, "kv.put", ["k", 1]]), "int64"),
        ("replica hint True", _frame(b"c", [1, "kv.get", ["k"], True]), "no replica"),
    ],
)
def test_malformed_frames_get_a_precise_error_and_log_nothing(
    tmp_path: Path, name: str, frame: bytes, expect: str
) -> None:
    """Defect 8: wrong field counts were 'unknown request kind'; True/1.0 were calls."""
    s = _seq(tmp_path)
    s.on_frame(b"x", frame)
    s.run_intake()
    (r,) = s.take_client_out()[b"x"]
    assert r[1] == ERROR and expect in r[2][1], (name, r)
    assert s.tick(1) is None and s.failed is None


def test_deeply_nested_fields_get_a_short_error_and_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 8: a deeply nested procedure name or replica hint made the error message's
    repr() recurse, and the sequencer logged a full traceback per frame."""
    s = _seq(tmp_path)
    deep = _nested(1015)
    head = msgpack.packb([wire.REQ_CALLS, b"c", [[1, None, []]]])
    s.on_frame(b"x", head[:-2] + deep + b"\x90")  # procedure name nested 1015 deep
    head = msgpack.packb([wire.REQ_CALLS, b"c", [[2, "kv.get", ["k"], None]]])
    s.on_frame(b"x", head[:-1] + deep)  # replica hint nested
    head = msgpack.packb([wire.REQ_CALLS, b"c", [[3, "kv.put", ["k", None]]]])
    s.on_frame(b"x", head[:-1] + deep)  # a deep value is fine: it is data
    s.run_intake()
    replies = s.take_client_out()[b"x"]
    assert [(r[0], r[2][0]) for r in replies] == [(1, "unknown_procedure"), (2, "bad_arguments")]
    assert all(len(r[2][1]) < 200 for r in replies)
    assert s.tick(1) is not None and s.failed is None
    assert [t.req_id for t in _logged_txns(tmp_path)] == [3]
    assert not [r for r in caplog.records if r.exc_info]


def test_junk_prune_requests_get_an_error_reply(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    for junk in (
        [wire.REQ_PRUNE],
        [wire.REQ_PRUNE, 5],
        [wire.REQ_PRUNE, ["a"]],
        [wire.REQ_PRUNE, ""],
    ):
        s.on_frame(b"x", msgpack.packb(junk))
    replies = s.take_control_out()
    assert len(replies) == 4 and all(isinstance(body, wire.ErrorReply) for _i, body in replies)


@pytest.mark.parametrize(
    "msg",
    [
        (MSG_RESULTS, 0, 0, 5, (), STATUS),
        (MSG_RESULTS, 0, 0, ((1, 2),), (), STATUS),
        (MSG_RESULTS, 7, 0, (), (), STATUS),
        (MSG_RESULTS, "0", 0, (), (), STATUS),
        (MSG_RESULTS, 0, 0, (), ((1, 0, 99, None),), STATUS),
        (MSG_RESULTS, 0, 0, (), (), ("a",) * 13),
        (MSG_RESULTS, 0, 0, (), (), STATUS[:5]),
        (MSG_RESULTS, 0, 0, ((1, {1: 2}, 3),), (), STATUS),
        (1, 2),
        "x",
    ],
)
def test_malformed_partition_reports_change_nothing(tmp_path: Path, msg: object) -> None:
    s = _seq(tmp_path)
    assert not s.on_results_message(msg)
    assert s.stats.bad_partition_messages == 1
    assert s.status_report()["partitions"] == []


def _status(last_epoch: int, catching_up: bool = False) -> PartitionStatus:
    return PartitionStatus._make(STATUS)._replace(last_epoch=last_epoch, catching_up=catching_up)


def test_flow_control_holds_batches_until_the_fastest_replica_applies_them(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    s = Sequencer(CommandLog(tmp_path, fsync=False), replicas=2, partitions=2, clock=clock)
    for r in range(2):
        for p in range(2):
            s.on_results(r, p, (), (), _status(0))
    value = "v" * 900_000
    for i in range(12):
        s.on_calls(b"big", b"c", ((i, "kv.put", (f"k{i}", value)),))
    cut = 0
    while s.tick(cut) is not None:
        cut += 1
    assert s.unapplied_bytes() >= limits.unapplied_bytes_max and s.has_pending()
    s.on_results(1, 0, (), (), _status(s.epoch))  # replica 1 is fast on partition 0,
    s.on_results(0, 1, (), (), _status(s.epoch))  # replica 0 on partition 1: enough
    assert s.unapplied_bytes() == 0 and s.tick(100) is not None
    clock.now = 10.0  # every partition falls silent: nothing to wait for
    while s.tick(200 + s.epoch) is not None:
        pass
    assert not s.has_pending()


def test_a_recovering_replica_does_not_hold_back_flow_control(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    s.on_results(0, 0, (), (), _status(0, catching_up=True))
    s.on_results(0, 1, (), (), _status(0, catching_up=True))
    for i in range(12):
        s.on_calls(b"big", b"c", ((i, "kv.put", (f"k{i}", "v" * 900_000)),))
    while s.tick(s.epoch) is not None:
        pass
    assert not s.has_pending()


def test_answered_calls_give_the_collector_nothing_to_walk(tmp_path: Path) -> None:
    """The retry cache kept answers as objects (a New Order result is a list of line
    tuples): 200,000 of them made each full collection pause the sequencer 100-700 ms.
    Entries are now scalars and bytes, which the collector untracks; a retry still gets
    the same answer."""
    s = _seq(tmp_path)
    value = (7, "x", [(1, "a", 2.5), (2, "b", None)])
    for req in range(1, 4):
        s.on_calls(b"id", b"c1", ((req, "kv.get", ("k",)),))
        _answer_queries(s, value)
    s.take_client_out()
    gc.collect()
    entries = list(s.retries._answered.values())
    assert len(entries) == 3 and not any(map(gc.is_tracked, entries))
    s.on_calls(b"id", b"c1", ((2, "kv.get", ("k",)),))  # a retry: the same answer
    assert s.take_client_out()[b"id"] == [(2, OK, (7, "x", ((1, "a", 2.5), (2, "b", None))))]
    assert not s.take_query_out()


register_table(
    Table("intake_by_int", key_len=2, lock_len=1, placement=place_by_first_int, columns=("v",))
)


@procedure(
    "intake.touch",
    [Arg("intake_first", "any")],  # a name no other procedure's argument has
    lambda intake_first: Footprint(writes=(("intake_by_int", (intake_first, 1)),)),
)
def _touch(ctx: object, intake_first: object) -> None:
    return None


def test_a_key_that_places_on_no_partition_is_refused_and_not_sequenced(tmp_path: Path) -> None:
    """A float first key part under place_by_first_int gave participant 0.5: a call
    logged for a partition that does not exist, which no partition would run."""
    s = _seq(tmp_path)
    bad = [1.5, True, "2", None]
    s.on_frame(b"c", _frame(b"c1", *[[i, "intake.touch", [v]] for i, v in enumerate(bad)]))
    s.on_frame(b"c", _frame(b"c1", [len(bad), "intake.touch", [2]]))
    s.run_intake()
    errors = _errors(s, b"c")
    assert sorted(e[0] for e in errors) == list(range(len(bad)))
    assert all(e[2][0] == ERR_BAD_ARGUMENTS for e in errors)
    assert s.tick(1000) is not None
    assert [(t.args, t.participants) for t in _logged_txns(tmp_path)] == [((2,), (1,))]
    with pytest.raises(TypeError):
        place_by_first_int((1.5,), 2)


register_table(Table("intake_hashed", key_len=1, columns=("v",)))  # placed by hash


@procedure(
    "intake.touch_hashed",
    [Arg("intake_key", "any")],
    lambda intake_key: Footprint(writes=(("intake_hashed", (intake_key,)),)),
)
def _touch_hashed(ctx: object, intake_key: object) -> None:
    return None


def test_a_footprint_key_no_partition_can_hash_is_refused_and_not_sequenced(
    tmp_path: Path,
) -> None:
    """A map argument that a procedure puts into a footprint key reached the batch, and
    every partition then raised at admission (a set of the footprint's entries): the
    same call on replay again, a replica that could never come back."""
    s = _seq(tmp_path)
    s.on_frame(b"c", _frame(b"c1", [0, "intake.touch_hashed", [{"a": 1}]]))
    s.on_frame(b"c", _frame(b"c1", [1, "intake.touch_hashed", [[1, {"b": 2}]]]))
    s.on_frame(b"c", _frame(b"c1", [2, "intake.touch_hashed", [3]]))
    s.run_intake()
    errors = _errors(s, b"c")
    assert [(e[0], e[2][0]) for e in errors] == [(0, ERR_BAD_ARGUMENTS), (1, ERR_BAD_ARGUMENTS)]
    assert "hashable" in errors[0][2][1]
    assert s.tick(1000) is not None
    assert [t.args for t in _logged_txns(tmp_path)] == [(3,)]


@procedure(
    "intake.lazy",
    [Arg("intake_n", "int", min_value=0, max_value=9)],
    lambda intake_n: Footprint(
        reads=(("kv", (f"l{i}",)) for i in range(intake_n)),  # type: ignore[arg-type]
        writes=[("kv", (f"l{i}",)) for i in range(intake_n)],  # type: ignore[arg-type]
    ),
)
def _lazy(ctx: object, intake_n: int) -> None:
    return None


def test_a_footprint_whose_entries_are_a_generator_is_refused_and_not_sequenced(
    tmp_path: Path,
) -> None:
    """A generator gave the sequencer's check its entries once and the placement none,
    so the call went to partition 0 alone (and a partition's lock names none after its
    cover sets): refused. Lists walk again, as tuples do."""
    s = _seq(tmp_path)
    s.on_frame(b"c", _frame(b"c1", [0, "intake.lazy", [4]]))
    s.run_intake()
    errors = _errors(s, b"c")
    assert [(e[0], e[2][0]) for e in errors] == [(0, ERR_BAD_ARGUMENTS)]
    assert "must be tuples or lists, not generator and list" in errors[0][2][1]
    assert s.tick(1000) is None
    assert _logged_txns(tmp_path) == []


def test_decoding_a_frame_of_calls_starts_at_most_one_collection(tmp_path: Path) -> None:
    """A frame of 10,000 calls is ~50,000 acyclic objects: with the collector on, its
    decode started 28 collections and took the sequencer 12-14 ms instead of
    ~2 ms, past a 10 ms epoch (txn_library.heap). The collector is held off while it
    decodes (one young collection may follow, once it is back), and is on again
    afterwards, also after a frame that fails to decode."""
    s = _seq(tmp_path)
    calls = [[i + 1, "no.such", ["a", i]] for i in range(limits.calls_per_frame_max)]
    frame = msgpack.packb([wire.REQ_CALLS, b"c1", calls])
    started: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        s.on_frame(b"id", frame)
        during = len(started)
        s.on_frame(b"id", frame[:-7])  # truncated: not msgpack
    finally:
        gc.callbacks.remove(count)
    assert during <= 1 and gc.isenabled()
    assert _errors(s, b"id")  # the truncated frame's answer


def test_a_loop_turn_phase_ends_at_the_epoch_tick_but_keeps_its_floor() -> None:
    """Reading frames and validating calls each stop after their budget, or at the
    epoch's tick if sooner, but never get less than limits.turn_s_min."""
    t = time.monotonic()
    far = turn_deadline(limits.receive_turn_s_max, t + 10.0)
    assert t + limits.receive_turn_s_max <= far <= time.monotonic() + limits.receive_turn_s_max
    due = turn_deadline(limits.intake_turn_s_max, t - 1.0)  # the tick is already late
    assert t + limits.turn_s_min <= due <= time.monotonic() + limits.turn_s_min
    soon = t + 0.002
    at_tick = turn_deadline(limits.intake_turn_s_max, soon)
    assert at_tick == soon or time.monotonic() - t > 0.0015  # (unless this host stalled)


@procedure(
    "intake.wide",
    [Arg("intake_reads", "int", min_value=0), Arg("intake_writes", "int", min_value=0)],
    lambda intake_reads, intake_writes: Footprint(
        reads=tuple(("kv", (f"w{i}",)) for i in range(intake_reads)),
        writes=tuple(("kv", (f"w{i}",)) for i in range(intake_writes)),
    ),
)
def _wide(ctx: object, intake_reads: int, intake_writes: int) -> None:
    return None


def test_a_call_with_more_footprint_entries_than_the_bound_is_refused_at_admission(
    tmp_path: Path,
) -> None:
    """limits.footprint_entries_max (reads and writes together): at the bound a call is
    sequenced, above it the caller gets too_large and nothing is logged; a logged call
    runs whatever its size (the bound is the sequencer's, not the partitions')."""
    bound = limits.footprint_entries_max
    s = _seq(tmp_path)
    s.on_frame(b"i", _frame(b"c1", [1, "intake.wide", [bound // 2, bound - bound // 2]]))
    s.on_frame(b"i", _frame(b"c1", [2, "intake.wide", [bound // 2, bound - bound // 2 + 1]]))
    s.on_frame(b"i", _frame(b"c1", [3, "intake.wide", [bound + 1, 0]]))
    s.run_intake()
    refused = _errors(s, b"i")
    assert [(r[0], r[2][0]) for r in refused] == [(2, ERR_TOO_LARGE), (3, ERR_TOO_LARGE)]
    assert f"{bound + 1} entries" in refused[0][2][1]
    assert s.tick(1000) is not None
    assert [t.args for t in _logged_txns(tmp_path)] == [(bound // 2, bound - bound // 2)]
    wide = lookup("intake.wide")
    assert len(wide.footprint_of((bound + 1, 0)).reads) == bound + 1  # unbounded there
