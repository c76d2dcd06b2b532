"""A push's chain as one unit of work (executor.deterministic.chain): the derived steps a
partition holds alone run back to back under one lock request, their writes applied
once, and every history gives what the steps one by one give: the serial oracle's state
hash and results, with runs and without (``interleave_every=1``: no run is longer than
one step), strong and weak recovery, contended and not, compiled and pure (the test
suite runs this file both ways)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.procedure import Abort, Arg, Footprint, lookup, procedure
from txn_library.streams import (
    Dataflow,
    StreamContext,
    derived_txns,
    nested,
    stream,
    stream_procedure,
    window,
)
from txn_library.wire.sequencer import FLAG_DERIVED_UNLOGGED, Batch, Txn

CLIENT = b"runs"
HOME, ELSEWHERE = 13, 14  # on different partitions when there are two or three
STATE = register_table(
    Table(
        "run_state",
        key_len=2,
        lock_len=2,
        place_len=1,
        placement=place_by_first_int,
        key_types=(int, str),
        columns=("value",),
    )
)

stream("r_in", [("x", "int")], home=HOME)
stream("r_mid", [("x", "int")], home=HOME)
stream("r_mid2", [("x", "int")], home=HOME)
stream("r_out", [("x", "int")], home=HOME, retain_batches=3)  # a sink trimmed often
window("r_win", [("x", "int")], size=3, slide=2, owner="r.d", home=HOME)


def _bump(ctx: Any, name: str, by: int) -> int:
    row = ctx.get("run_state", (HOME, name))
    value = (row[0] if row else 0) + by
    ctx.put("run_state", (HOME, name), (value,))
    return value


@stream_procedure("r.a", input="r_in", output="r_mid", writes=[("run_state", (HOME, "a"))])
def _a(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    xs = [x for (x,) in tuples]
    if 13 in xs:
        return Abort("13")  # aborts: changes nothing, the chain goes on (with nothing)
    if 17 in xs:
        raise ValueError("17")  # fails (ERROR): counted, changes nothing
    _bump(ctx, "a", sum(xs))
    return [(2 * x,) for x in xs]


@stream_procedure("r.b", input="r_mid", output="r_mid2", writes=[("run_state", (HOME, "b"))])
def _b(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    _bump(ctx, "b", len(tuples))
    return [(x + 1,) for (x,) in tuples]


@stream_procedure("r.c", input="r_mid2", output="r_out")
def _c(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    if any(x == 2 * 19 + 1 for (x,) in tuples):
        return Abort("19")  # undoes r.b with it: nested
    return [(ctx.txn_id % 1000 + x,) for (x,) in tuples]  # its own txn id, not the run's


@stream_procedure("r.d", input="r_mid", windows=["r_win"], writes=[("run_state", (HOME, "d"))])
def _d(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> Any:
    w = ctx.window("r_win")
    for (x,) in tuples:
        w.insert((x,))
    _bump(ctx, "d", sum(x for (x,) in w.rows()))
    return None


Dataflow("r", [_a, nested(_b, _c), _d])


@procedure(
    "run.bump",
    [Arg("delta", "int")],
    lambda delta: Footprint(
        reads=(("run_state", (HOME, "a")),), writes=(("run_state", (HOME, "a")),)
    ),
)
def run_bump(ctx: Any, delta: int) -> int:
    """An OLTP call on a step's state, at the stream's home."""
    return _bump(ctx, "a", delta)


@procedure(
    "run.spread",
    [Arg("delta", "int")],
    lambda delta: Footprint(
        reads=(("run_state", (HOME, "a")), ("run_state", (ELSEWHERE, "z"))),
        writes=(("run_state", (HOME, "a")), ("run_state", (ELSEWHERE, "z"))),
    ),
)
def run_spread(ctx: Any, delta: int) -> int:
    """A multi-partition call on a step's state: at the home it holds the lock a run
    of steps needs while it waits for its peer's reads."""
    row = ctx.get("run_state", (ELSEWHERE, "z"))
    ctx.put("run_state", (ELSEWHERE, "z"), ((row[0] if row else 0) + 1,))
    return _bump(ctx, "a", delta)


class Log:
    """Batches as the sequencer builds them: calls, then what their pushes derive
    (logged: strong recovery; counted only: weak)."""

    def __init__(self, partitions: int, weak: bool) -> None:
        self.partitions, self.weak = partitions, weak
        self.batches: list[Batch] = []
        self.next_txn = 0
        self.req = 0

    def txn(self, proc: str, *args: Any) -> Txn:
        self.req += 1
        return Txn(
            proc, args, lookup(proc).participants_of(args, self.partitions), CLIENT, self.req
        )

    def batch(self, calls: Sequence[Txn]) -> None:
        derived = derived_txns(calls, self.partitions)
        e = len(self.batches) + 1
        if self.weak:
            flags, txns, n = FLAG_DERIVED_UNLOGGED, tuple(calls), len(derived)
        else:
            flags, txns, n = 0, (*calls, *derived), 0
        self.batches.append(Batch(e, e - 1, self.next_txn, 1000 + e, e, txns, flags, None, 0, n))
        self.next_txn += len(calls) + len(derived)


def _replay(log: Log, interleave_every: int, shuffle_seed: int) -> LocalReplica:
    r = LocalReplica(log.partitions, shuffle_seed=shuffle_seed)
    for p in r.parts:
        p.interleave_every = interleave_every
    r.apply_all(log.batches)
    return r


calls_st = st.lists(
    st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.lists(st.sampled_from([1, 2, 13, 17, 19]), max_size=3)),
            st.tuples(st.just("bump"), st.integers(-5, 5)),
            st.tuples(st.just("spread"), st.integers(-5, 5)),
        ),
        max_size=8,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(
    epochs=calls_st,
    partitions=st.sampled_from([1, 2, 3]),
    weak=st.booleans(),
    interleave_every=st.sampled_from([2, 3, 32]),
    shuffle_seed=st.integers(0, 3),
)
def test_runs_of_steps_give_the_serial_oracle_s_state_and_results(
    epochs: list[list[tuple[str, Any]]],
    partitions: int,
    weak: bool,
    interleave_every: int,
    shuffle_seed: int,
) -> None:
    log = Log(partitions, weak)
    batch_id = 0
    for calls in epochs:
        txns = []
        for kind, arg in calls:
            if kind == "push":
                batch_id += 1
                txns.append(log.txn("stream.push", "r_in", batch_id, [(x,) for x in arg]))
            else:
                txns.append(log.txn(f"run.{kind}", arg))
        log.batch(txns)
    oracle = SerialExecutor()
    for b in log.batches:
        oracle.apply(b)
    runs = _replay(log, interleave_every, shuffle_seed)
    one_by_one = _replay(log, 1, shuffle_seed)
    assert runs.state_hash == oracle.state_hash == one_by_one.state_hash
    assert runs.results == oracle.results == one_by_one.results
    failed = sum(p.derived_failures for p in runs.parts)
    assert failed == sum(p.derived_failures for p in one_by_one.parts)
    applied = sum(p.txns_applied for p in runs.parts)
    assert applied == sum(p.txns_applied for p in one_by_one.parts)


def _pushes(log: Log, values: Sequence[Sequence[int]], first: int = 1) -> list[Txn]:
    return [
        log.txn("stream.push", "r_in", b, [(x,) for x in xs])
        for b, xs in enumerate(values, start=first)
    ]


def test_a_run_waits_in_the_global_order_for_a_call_holding_its_locks() -> None:
    """A multi-partition call before the pushes holds a step's lock at the home while
    it waits for its peer's reads: the run of steps queues behind it (one request for
    all of them) and runs when it finishes, as the serial order says."""
    log = Log(2, weak=False)
    log.batch([log.txn("run.spread", 100), *_pushes(log, [[1], [2], [1, 2]])])
    r = LocalReplica(2)
    home = r.parts[(HOME - 1) % 2]
    home.on_batch(log.batches[0])  # no interleave hook: the peer's reads wait
    assert home.locks.txn_waits == 1 and len(home.locks) == 2  # the call; the run behind it
    r.parts[(ELSEWHERE - 1) % 2].on_batch(log.batches[0])
    r.pump()
    assert r.idle()
    oracle = SerialExecutor()
    oracle.apply(log.batches[0])
    assert r.state_hash == oracle.state_hash
    assert home.storage.get("run_state", (HOME, "a")) == (106,)  # 100, then 1 + 2 + 3


def test_a_run_applies_its_writes_once_rows_between_steps_never_reach_the_store() -> None:
    """Rows a step appends to a stream between two steps, and the next step deletes,
    exist only in the run's view: the store, its versions and its hash never see them;
    the state is the steps' one by one all the same."""
    log = Log(1, weak=False)
    log.batch(_pushes(log, [[1], [2, 2], [1]]))
    r = LocalReplica(1)
    p = r.parts[0]
    p.keep_versions()
    r.apply_all(log.batches)
    versions = p.storage.versions
    assert versions is not None
    noted = {t for t, _ in versions.by_epoch[1]}
    assert not noted & {"r_mid", "r_mid2"}  # made and taken by the next step, in the run
    assert "r_out" in noted and "r_in" in noted  # the sink; the pushes, before the run
    oracle = SerialExecutor()
    oracle.apply(log.batches[0])
    assert r.state_hash == oracle.state_hash


def test_a_step_that_aborts_or_fails_in_a_run_changes_nothing_and_the_run_goes_on() -> None:
    log = Log(1, weak=False)
    log.batch(_pushes(log, [[1], [13], [17], [19], [2]]))
    r = _replay(log, 32, 0)
    oracle = SerialExecutor()
    oracle.apply(log.batches[0])
    assert r.state_hash == oracle.state_hash
    p = r.parts[0]
    assert p.derived_failures == 1 and "r.a: " in p.derived_failure_last  # batch 3: raised
    get = p.storage.get
    assert get("run_state", (HOME, "a")) == (1 + 19 + 2,)  # 13 aborted, 17 failed
    assert get("run_state", (HOME, "b")) == (2,)  # batch 4's r.b undone with its r.c
    out = sorted(k[1] for t, k, _ in p.storage.rows() if t == "r_out")
    assert out == [1, 5]  # batches 1 and 5 reached the sink
