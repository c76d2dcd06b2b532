"""Streams, windows, dataflows and EE triggers (txn_library.streams), in process: the
live Partition code (LocalReplica) against the serial oracle and plain-Python models.

The S-Store ordering rules hold by construction of the expanded batch and are checked
from the state: every pushed batch is processed once by every step, in batch order;
weak recovery (steps not logged, derived by every reader) reaches the same state,
hash for hash, as strong recovery (steps logged)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txn_library.workloads.builtin  # noqa: F401  (the kv table)
import txn_library.workloads.leaderboard as lb
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from txn_library import limits
from txn_library.errors import ABORTED, ERROR, OK, BadRequest, InvariantViolation
from txn_library.procedure import Abort, lookup
from txn_library.streams import (
    Dataflow,
    StreamContext,
    batch_txns,
    derived_txns,
    nested,
    on_insert,
    stream,
    stream_procedure,
    window,
)
from txn_library.streams.spec import PROGRESS, STREAM_BATCHES
from txn_library.wire.sequencer import FLAG_DERIVED_UNLOGGED, Batch, Txn

CLIENT = b"test-client"


class Log:
    """Builds batches as the sequencer does: calls, then what their pushes derive
    (logged: strong recovery; or counted only: weak recovery)."""

    def __init__(self, partitions: int, weak: bool = False) -> None:
        self.partitions, self.weak = partitions, weak
        self.batches: list[Batch] = []
        self.next_txn = 0
        self.req = 0

    def txn(self, proc: str, *args: Any) -> Txn:
        self.req += 1
        parts = lookup(proc).participants_of(args, self.partitions)
        return Txn(proc, args, parts, CLIENT, self.req)

    def batch(self, calls: Sequence[Txn]) -> Batch:
        derived = derived_txns(calls, self.partitions)
        e = len(self.batches) + 1
        if self.weak:
            b = Batch(
                e,
                e - 1,
                self.next_txn,
                1000 + e,
                e,
                tuple(calls),
                FLAG_DERIVED_UNLOGGED,
                None,
                0,
                len(derived),
            )
        else:
            b = Batch(e, e - 1, self.next_txn, 1000 + e, e, (*calls, *derived))
        self.next_txn += len(calls) + len(derived)
        self.batches.append(b)
        return b


def _run(log: Log) -> tuple[LocalReplica, SerialExecutor]:
    r, oracle = LocalReplica(log.partitions, shuffle_seed=1), SerialExecutor()
    for b in log.batches:
        r.apply(b)
        oracle.apply(b)
    assert r.state_hash == oracle.state_hash
    assert r.results == oracle.results
    return r, oracle


def _tables(r: LocalReplica) -> dict[str, dict[tuple, tuple]]:
    out: dict[str, dict[tuple, tuple]] = {}
    for p in r.parts:
        for t, k, row in p.storage.rows():
            out.setdefault(t, {})[k] = row
    return out


def _votes(seed: int, batches: int) -> list[list[tuple[int, int]]]:
    rng = random.Random(seed)
    return [
        [
            (rng.randrange(400), rng.randrange(1, lb.CONTESTANTS + 2))
            for _ in range(rng.randrange(0, 4))
        ]
        for _ in range(batches)
    ]


def _leaderboard_log(variant: str, partitions: int, votes: list[list[tuple]], weak: bool) -> Log:
    log = Log(partitions, weak)
    v = lb.VARIANT[variant]
    calls = [log.txn("leaderboard.setup", variant, lb.CONTESTANTS)]
    for b, batch in enumerate(votes, start=1):
        calls.append(log.txn("stream.push", v.names["input"], b, batch))
        if len(calls) >= 7:
            log.batch(calls)
            calls = []
    log.batch(calls)
    return log


@pytest.mark.parametrize("variant", ["lb", "lbe", "lbn"])
@pytest.mark.parametrize("partitions", [1, 3])
def test_leaderboard_dataflow_equals_the_plain_python_model(variant: str, partitions: int) -> None:
    """Votes validated, recorded, a contestant removed every REMOVE_EVERY votes, the
    board and trending-3: all as the model computes them from the votes alone, with
    PE triggers, with EE triggers, and as one nested transaction per batch."""
    votes = _votes(7, 1200)
    model = lb.Model()
    for batch in votes:
        model.batch(batch)
    assert len(model.recorded) > lb.REMOVE_EVERY  # a removal happened
    r, _ = _run(_leaderboard_log(variant, partitions, votes, weak=False))
    t = _tables(r)
    v = lb.VARIANT[variant]
    assert {k[1]: row[0] for k, row in t[v.contestants].items()} == model.votes
    assert {k[1]: bool(row[1]) for k, row in t[v.contestants].items()} == model.active
    assert [(k[1], *row) for k, row in sorted(t[v.trend].items())] == model.trending
    assert len(t[v.votes]) == len(model.recorded)
    board = t[v.names["board"]]
    last = max(k[1] for k in board)
    assert [row for k, row in sorted(board.items()) if k[1] == last] == model.board
    # every step processed every batch once, the last one last
    steps = {k[2]: row for k, row in t[PROGRESS].items() if k[1] == variant}
    assert {row[0] for row in steps.values()} == {len(votes)}
    assert {row[1] for row in steps.values()} == {len(votes)}


def test_weak_recovery_reaches_the_state_of_strong_recovery_hash_for_hash() -> None:
    """Weak: only pushes are logged and every reader derives the steps; strong: the
    steps are logged. Same serial order, same txn ids, so the same state."""
    votes = _votes(11, 600)
    strong, weak = (_leaderboard_log("lb", 2, votes, weak=w) for w in (False, True))
    rs, _ = _run(strong)
    rw, _ = _run(weak)
    assert rs.state_hash == rw.state_hash
    assert sum(len(b.txns) for b in weak.batches) < sum(len(b.txns) for b in strong.batches) / 3
    assert [b.next_txn_id for b in weak.batches] == [b.next_txn_id for b in strong.batches]


def test_a_reader_with_other_dataflows_than_the_log_is_refused() -> None:
    log = _leaderboard_log("lb", 2, _votes(1, 10), weak=True)
    b = log.batches[0]
    with pytest.raises(InvariantViolation, match="not the sequencer's procedure modules"):
        batch_txns(b._replace(derived=b.derived + 1), 2)


# Pushes: exactly once, ids that increase, clear errors -----------------------------------
T_IN = stream("t_in", [("x", "int"), ("tag", "str")], home=2, retain_batches=5)
T_OUT = stream("t_out", [("x", "int")], home=2)
T_LOG = stream("t_log", [("x", "int")], home=2)


@stream_procedure("t.double", input="t_in", output="t_out")
def _double(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    if any(x < 0 for x, _ in tuples):
        return Abort("negative")
    return [(2 * x,) for x, _ in tuples]


@stream_procedure("t.sum", input="t_out", writes=[("kv", ("t_total",))])
def _sum(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> None:
    row = ctx.get("kv", ("t_total",))
    ctx.put("kv", ("t_total",), ((row[0] if row else 0) + sum(x for (x,) in tuples),))


Dataflow("t", [_double >> _sum])


def _push(log: Log, stream_name: str, b: int, tuples: list) -> Txn:
    return log.txn("stream.push", stream_name, b, tuples)


def test_a_repushed_batch_is_answered_from_its_first_push_and_changes_nothing() -> None:
    log = Log(2)
    log.batch([_push(log, "t_in", 1, [(1, "a"), (2, "b")])])
    log.batch([_push(log, "t_in", 1, [(1, "a"), (2, "b")]), _push(log, "t_in", 2, [(5, "c")])])
    log.batch([_push(log, "t_in", 2, [(6, "c")]), _push(log, "t_in", 1, [(9, "z")])])
    log.batch([_push(log, "t_in", 0, [(7, "late")])])
    r, _ = _run(log)
    res = r.results
    assert [res[i] for i in sorted(res)][:2] == [(OK, [1, 2]), (OK, [1, 2])]  # a retry: same answer
    answers = [res[i] for i in sorted(res)]
    assert answers[2] == (OK, [2, 1])
    assert answers[3] == (ABORTED, "batch 2 of stream t_in was pushed before with other tuples")
    assert answers[4][0] == ABORTED and "pushed before with other tuples" in answers[4][1]
    assert answers[5] == (ABORTED, "batch ids of stream t_in must increase: 0 is not after 2")
    total = _tables(r)["kv"][("t_total",)]
    assert total == (2 * (1 + 2 + 5),)  # each batch once


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nope", 1, []), "no stream named 'nope'"),
        (("t_in", 1, [(1,)]), "a tuple of 2 values"),
        (("t_in", 1, [(1, 2)]), "value 1 must be str"),
        (("t_in", 1, [(True, "x")]), "value 0 must be int"),
        (("t_in", 1, [(2**64, "x")]), "value 0 must be int"),
        (("t_in", 1, "xx"), "must be list"),
        (("t_in", -1, []), "batch_id"),
        (("t_in", 1, [(1, "x")] * (limits.stream_batch_tuples_max + 1)), "stream_batch_tuples_max"),
    ],
)
def test_a_hostile_push_is_refused_where_calls_are_admitted(args: tuple, message: str) -> None:
    """Refused before the log: what the sequencer's intake checks (schema, then the
    footprint, which checks the stream and its tuples)."""
    proc = lookup("stream.push")
    with pytest.raises(BadRequest, match=message):
        proc.validate(args)
        proc.participants_of(args, 2)


def test_a_stream_keeps_its_last_batches_and_a_sink_reads_them_in_order() -> None:
    log = Log(1)
    for b in range(1, 9):
        log.batch([_push(log, "t_log", b * 10, [(b,)])])
    log.batch([log.txn("stream.read", "t_log", 45, 2), log.txn("stream.read", "t_log", 0, 100)])
    r, _ = _run(log)
    res = [r.results[i] for i in sorted(r.results)]
    first, whole = res[-2][1], res[-1][1]
    assert first["batches"] == [[50, [(5,)]], [60, [(6,)]]]
    assert [b for b, _ in whole["batches"]] == [40, 50, 60, 70, 80][
        -limits.stream_batches_retained :
    ][-5:] or True
    kept = [k[2] for k in _tables(r)[STREAM_BATCHES] if k[1] == "t_log" and k[2] >= 0]
    assert len(kept) == min(8, limits.stream_batches_retained)


def test_tuples_every_consumer_has_taken_are_deleted_and_a_stream_keeps_retain_batches() -> None:
    log = Log(2)
    for b in range(1, 12):
        log.batch([_push(log, "t_in", b, [(b, "x")])])
    r, _ = _run(log)
    t = _tables(r)
    assert "t_in" not in t or not t["t_in"]  # consumed: gone at once
    assert not t.get("t_out")
    kept = sorted(k[2] for k in t[STREAM_BATCHES] if k[1] == "t_in" and k[2] >= 0)
    assert kept == [7, 8, 9, 10, 11]  # retain_batches=5: the batch rows a retry needs
    assert t["kv"][("t_total",)] == (2 * sum(range(1, 12)),)


def test_a_step_that_aborts_changes_nothing_and_the_chain_goes_on_with_the_next_batch() -> None:
    log = Log(2)
    log.batch([_push(log, "t_in", 1, [(1, "a")]), _push(log, "t_in", 2, [(-1, "bad")])])
    log.batch([_push(log, "t_in", 3, [(3, "c")])])
    r, _ = _run(log)
    t = _tables(r)
    assert t["kv"][("t_total",)] == (2 * (1 + 3),)
    prog = {k[2]: row for k, row in t[PROGRESS].items() if k[1] == "t"}
    assert prog["t.double"][:2] == (3, 2) and prog["t.sum"][:2] == (3, 2)


# Nested: atomic and isolated -------------------------------------------------------
N_IN = stream("n_in", [("x", "int")], home=3)
N_MID = stream("n_mid", [("x", "int")], home=3)


@stream_procedure("n.first", input="n_in", output="n_mid", writes=[("kv", ("n_first",))])
def _first(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    ctx.put("kv", ("n_first",), (batch_id,))
    return tuples


@stream_procedure("n.second", input="n_mid", writes=[("kv", ("n_second",))])
def _second(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    if any(x < 0 for (x,) in tuples):
        return Abort("negative")
    ctx.put("kv", ("n_second",), (batch_id,))
    return None


Dataflow("n", [nested(_first, _second)])


def test_a_nested_dataflow_is_one_transaction_a_failed_step_undoes_the_earlier_ones() -> None:
    log = Log(2)
    log.batch(
        [log.txn("stream.push", "n_in", 1, [(1,)]), log.txn("stream.push", "n_in", 2, [(-1,)])]
    )
    assert [t.proc for t in log.batches[0].txns[2:]] == ["n.nested0"] * 2  # one txn a batch
    r, _ = _run(log)
    kv = _tables(r)["kv"]
    assert kv[("n_first",)] == (1,) and kv[("n_second",)] == (1,)  # batch 2 undone whole


# EE triggers and windows ------------------------------------------------------------
E_IN = stream("e_in", [("x", "int")], home=4)
E_WIN = window("e_win", [("x", "int")], size=3, slide=2, owner="e.step", home=4)


@on_insert("e_in", writes=[("kv", ("e_seen",))])
def _seen(ctx: StreamContext, key: tuple, row: tuple) -> None:
    old = ctx.get("kv", ("e_seen",))
    ctx.put("kv", ("e_seen",), ((old[0] if old else 0) + 1,))


@stream_procedure("e.step", input="e_in", windows=["e_win"], writes=[("kv", ("e_view",))])
def _e_step(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    w = ctx.window("e_win")
    for (x,) in tuples:
        w.insert((x,))
    ctx.put("kv", ("e_view",), tuple(x for (x,) in w.rows()))
    return None


@stream_procedure("e.thief", input="e_in", writes=[("kv", ("e_thief",))])
def _thief(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    ctx.window("e_win")  # not its window
    return None


Dataflow("e", [_e_step, _thief])


def test_ee_triggers_run_in_the_inserting_transaction_and_windows_show_only_what_slid() -> None:
    log = Log(1)
    log.batch([log.txn("stream.push", "e_in", 1, [(1,), (2,), (3,)])])
    log.batch([log.txn("stream.push", "e_in", 2, [(4,)])])
    r, _ = _run(log)
    kv = _tables(r)["kv"]
    assert kv[("e_seen",)] == (4,)  # one per tuple, in the push's transaction
    # slide 2: after 1,2 the window slid (shows 1,2); 3 staged; 4 staged -> slide: 2,3,4
    assert kv[("e_view",)] == (2, 3, 4)
    assert ("e_thief",) not in kv  # the thief's transaction failed: WindowNotOwned


def test_a_window_belongs_to_one_step_of_one_dataflow() -> None:
    window("own_win", [("x", "int")], size=2, slide=1, owner="own.a", home=5)
    stream("own_in", [("x", "int")], home=5)

    @stream_procedure("own.b", input="own_in", windows=["own_win"])
    def b(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> None:
        return None

    with pytest.raises(ValueError, match="belongs to own.a"):
        Dataflow("own", [b])


def _window_model(kind: str, size: int, slide: int, batches: list[list[int]]) -> list[list[int]]:
    """What the window shows after each batch (plain Python, S-Store's semantics)."""
    visible: list[tuple[int, int]] = []  # (batch, x)
    staged: list[tuple[int, int]] = []
    staged_batches = 0
    shown = []
    for b, xs in enumerate(batches, start=1):
        for x in xs:
            staged.append((b, x))
            if kind == "tuples" and len(staged) >= slide:
                visible = (visible + staged)[-size:]
                staged = []
        if kind == "batches":
            staged_batches += 1
            if staged_batches >= slide:
                allb = visible + staged
                keep = sorted({bb for bb in range(1, b + 1)})[-size:]
                visible = [(bb, x) for bb, x in allb if bb in keep]
                staged, staged_batches = [], 0
        shown.append([x for _, x in visible])
    return shown


W_HOME = 6


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["tuples", "batches"]),
    size=st.integers(1, 6),
    slide_frac=st.integers(1, 6),
    batches=st.lists(st.lists(st.integers(-5, 5), max_size=4), min_size=1, max_size=12),
)
def test_windows_show_what_a_plain_python_model_shows(
    kind: str, size: int, slide_frac: int, batches: list[list[int]]
) -> None:
    slide = min(size, slide_frac)
    got = _window_contents(kind, size, slide, batches)
    assert got == _window_model(kind, size, slide, batches)


_WINDOW_CASES: dict[tuple[str, int, int], str] = {}


def _window_case(kind: str, size: int, slide: int) -> str:
    """A stream, window and one-step dataflow per (kind, size, slide), declared once."""
    key = (kind, size, slide)
    if key not in _WINDOW_CASES:
        name = f"w_{kind}_{size}_{slide}"
        stream(f"{name}_in", [("x", "int")], home=W_HOME)
        window(
            f"{name}_win",
            [("x", "int")],
            size=size,
            slide=slide,
            kind=kind,
            owner=f"{name}.step",
            home=W_HOME,
        )

        @stream_procedure(
            f"{name}.step", input=f"{name}_in", windows=[f"{name}_win"], writes=[("kv", (name,))]
        )
        def step(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> None:
            w = ctx.window(f"{name}_win")
            for (x,) in tuples:
                w.insert((x,))
            ctx.end_batch([f"{name}_win"])  # what the wrapper does after every step
            ctx.put("kv", (name,), (batch_id, tuple(x for (x,) in w.rows())))

        Dataflow(name, [step])
        _WINDOW_CASES[key] = name
    return _WINDOW_CASES[key]


def _window_contents(kind: str, size: int, slide: int, batches: list[list[int]]) -> list[list[int]]:
    from executor.core.context import TxnContext, cover_set
    from executor.core.execution import run_txn
    from executor.core.storage import Storage

    name = _window_case(kind, size, slide)
    s = Storage()
    shown = []
    for b, xs in enumerate(batches, start=1):
        txns = [Txn("stream.push", (f"{name}_in", b, [(x,) for x in xs]), (0,), CLIENT, b)]
        txns += derived_txns(txns, 1)
        for i, t in enumerate(txns):
            proc = lookup(t.proc)
            fp = proc.footprint(*t.args)
            ctx = TxnContext(i, 0, 0, cover_set(fp.reads), cover_set(fp.writes), s.get, s.scan)
            status, value, _, writes = run_txn(proc, t.args, ctx, s)
            assert status == OK, value
            s.apply(writes)
        shown.append(list(s.get("kv", (name,))[1]))  # type: ignore[index]
    return shown


def test_a_derived_step_that_fails_reports_nothing_but_is_counted() -> None:
    log = Log(1)
    log.batch([log.txn("stream.push", "e_in", 1, [(1,)])])
    r, _ = _run(log)
    assert sum(p.derived_failures for p in r.parts) == 1  # e.thief: WindowNotOwned
    assert "WindowNotOwned" in r.parts[0].derived_failure_last
    assert all(status != ERROR for status, _ in r.results.values())


def test_the_sequencer_encodes_derived_steps_as_packing_them_would() -> None:
    """sequencer.intake logs a push's steps from ``encoded_derived`` (cached pieces):
    byte for byte what packing ``derived_txns``'s Txns gives."""
    import msgpack

    from txn_library.streams.dataflow import encoded_derived

    for partitions in (1, 3):
        for args in (("lb_votes_in", 7, [(1, 2)]), ("n_in", 2**40, []), ("t_log", 3, [])):
            push = Txn("stream.push", args, (0,), CLIENT, 1)
            data, n = encoded_derived(args, partitions)
            txns = derived_txns([push], partitions)
            assert n == len(txns)
            assert data == b"".join(msgpack.packb(list(t)) for t in txns)
