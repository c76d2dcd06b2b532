"""Poison-pill transactions: nothing a procedure body produces can stop a partition.

A body whose writes or result cannot be stored or sent (an int msgpack cannot encode,
a row that is not a tuple, a key of the wrong shape or type, a key outside the
footprint, an oversized row or result, a key an ordered table cannot compare) gets
ERROR procedure_failed, and none of its writes is applied, by any executor. The
outcome is the same live, in the serial oracle, on every replica, in the 2PL
baseline and in replay after a kill -9:
- in process: a LocalReplica (two message orders) and the SerialExecutor agree on
  every result and on the state hash, and keep accepting batches;
- a multi-partition txn whose *remote* write is bad aborts at every executor;
- with real processes: the overflow sequence from the bank CLI leaves every process
  alive, and a partition killed with -9 replays the poison txn from the log and
  comes back live with the other replica's hashes.
The same holds for what arrives on a partition's inbox: ``decode_inbound`` refuses
every malformed message whole, and the Partition role ignores reads from partitions
that are not peers and keeps a bounded number of early reads (tests/test_bad_input.py
sends such junk to a live partition).
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from executor.core.storage import Storage
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.partition import Partition
from executor.deterministic.replica import LocalReplica
from executor.traditional.options import TraditionalOptions
from executor.traditional.oracle import replay_history
from executor.traditional.simulator import LocalTraditionalCluster
from sequencer.calls import make_batch
from tests.heap_checks import no_cycles
from txn_library import catalog, limits, placement
from txn_library.errors import ERR_PROCEDURE_FAILED, ERROR, OK
from txn_library.procedure import Abort, Arg, Footprint, procedure
from txn_library.wire import partition as ewire

BIG = 2**63 - 1  # the largest balance bank.open accepts
FIRST = 3_000_000  # accounts FIRST (partition 0 of 2), FIRST+1 and FIRST+2 (partition 1)
PLAIN = "pp_plain"
ORDERED = "pp_ordered"

catalog.register_table(catalog.Table(PLAIN, key_len=1))
catalog.register_table(
    catalog.Table(ORDERED, key_len=2, lock_len=1, ordered=True, key_types=(int, int))
)


def _w(table: str, *keys: tuple) -> Footprint:
    return Footprint(writes=tuple((table, k) for k in keys))


@procedure("pp.put_raw", [Arg("k", "int"), Arg("row", "any")], lambda k, row: _w(PLAIN, (k,)))
def _put_raw(ctx: Any, k: int, row: Any) -> int:
    """Writes ``row`` as given (lists stay lists): bypasses ctx.put's tuple check."""
    ctx.writes[(PLAIN, (k,))] = row
    return k


@procedure("pp.put_set", [Arg("k", "int")], lambda k: _w(PLAIN, (k,)))
def _put_set(ctx: Any, k: int) -> int:
    ctx.put(PLAIN, (k,), ({1, 2},))
    return k


@procedure("pp.put_big", [Arg("k", "int")], lambda k: _w(PLAIN, (k,)))
def _put_big(ctx: Any, k: int) -> int:
    ctx.put(PLAIN, (k,), ("x" * limits.row_bytes_max,))
    return k


@procedure("pp.bad_keys", [Arg("k", "int"), Arg("case", "str")], lambda k, case: _w(PLAIN, (k,)))
def _bad_keys(ctx: Any, k: int, case: str) -> int:
    """A good write first, then one with a bad key (straight into the write buffer)."""
    ctx.put(PLAIN, (k,), (1,))
    bad: dict[str, tuple] = {
        "long": (k, 1),  # covered by the footprint entry (k,), but not a key of the table
        "bool": (True,),
        "float": (1.5,),
        "huge": (2**64,),
    }
    ctx.writes[(PLAIN, bad[case])] = (1,)
    return k


@procedure("pp.bad_entry", [Arg("k", "int"), Arg("case", "str")], lambda k, case: _w(PLAIN, (k,)))
def _bad_entry(ctx: Any, k: int, case: str) -> int:
    """A good write, then a write buffer a body broke itself (entries not (table, key))."""
    ctx.put(PLAIN, (k,), (1,))
    if case == "int":
        ctx.writes[5] = (1,)
    elif case == "triple":
        ctx.writes[(PLAIN, (k,), 0)] = (1,)
    else:  # compiled, the assignment itself raises TypeError; pure, the executor refuses
        ctx.writes = 5
    return k


@procedure(
    "pp.ordered_put",
    [Arg("a", "int"), Arg("b", "any")],
    lambda a, b: Footprint(writes=((ORDERED, (a,)),)),
)
def _ordered_put(ctx: Any, a: int, b: Any) -> int:
    ctx.put(ORDERED, (a, b), (b,))
    return a


class Loud(Exception):
    """An exception whose text cannot be had (a class made once: classes are cycles)."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@procedure("pp.result", [Arg("case", "str")], lambda case: Footprint(writes=((PLAIN, (0,)),)))
def _result(ctx: Any, case: str) -> Any:
    """Writes, then returns (or aborts with) something that cannot travel."""
    ctx.put(PLAIN, (0,), (case,))
    if case == "huge":
        return 2**64
    if case == "big":
        return "x" * (limits.result_bytes_max + 1)
    if case == "set":
        return {1, 2}
    if case == "abort_reason":
        return Abort({1, 2})  # type: ignore[arg-type]
    if case == "loud":
        raise Loud()
    return case


def _split_accounts() -> tuple[int, int]:
    """Two keys of PLAIN on partitions 0 and 1 (of 2)."""
    by_part: dict[int, int] = {}
    k = 0
    while len(by_part) < 2:
        by_part.setdefault(placement.partition_of(PLAIN, (k,), 2), k)
        k += 1
    return by_part[0], by_part[1]


@procedure(
    "pp.split",
    [Arg("a", "int"), Arg("b", "int"), Arg("bad_first", "bool")],
    lambda a, b, bad_first: _w(PLAIN, (a,), (b,)),
)
def _split(ctx: Any, a: int, b: int, bad_first: bool) -> int:
    """A good write at a's partition and an unencodable one at b's."""
    if bad_first:
        ctx.put(PLAIN, (b,), (2**64,))
        ctx.put(PLAIN, (a,), (1,))
    else:
        ctx.put(PLAIN, (a,), (1,))
        ctx.put(PLAIN, (b,), (2**64,))
    return a


class Everywhere:
    """The same batches through two replicas (different delivery orders) and the oracle."""

    def __init__(self) -> None:
        self.replicas = [LocalReplica(2, shuffle_seed=1), LocalReplica(2, shuffle_seed=2)]
        self.serial = SerialExecutor()
        self.epoch = 0
        self.next_txn = 0

    def run(self, *calls: tuple[str, tuple]) -> list[tuple[int, Any]]:
        """Apply one batch; the results, checked identical everywhere."""
        self.epoch += 1
        batch = make_batch(self.epoch, self.next_txn, self.epoch, 7, list(calls), 2)
        ids = range(self.next_txn, self.next_txn + len(calls))
        self.next_txn += len(calls)
        for r in self.replicas:
            r.apply(batch)
        self.serial.apply(batch)
        out = [self.serial.results[i] for i in ids]
        for r in self.replicas:
            assert [r.results[i] for i in ids] == out
            assert r.state_hash == self.serial.state_hash
            for p in r.parts:
                assert p.storage.recompute_hash()[0] == p.storage.state_hash
        return out

    def get(self, table: str, key: tuple) -> tuple | None:
        rows = {r.parts[placement.partition_of(table, key, 2)].storage.get(table, key)
                for r in self.replicas}  # fmt: skip
        rows.add(self.serial.storage.get(table, key))
        assert len(rows) == 1, rows
        return rows.pop()


def _rejected(result: tuple[int, Any], *words: str) -> None:
    status, value = result
    assert status == ERROR and value[0] == ERR_PROCEDURE_FAILED, result
    for w in words:
        assert w in value[1], (w, value[1])


def test_overflowing_transfer_is_an_error_everywhere_and_changes_nothing() -> None:
    e = Everywhere()
    assert e.run(("bank.open", (FIRST, 3, BIG))) == [(OK, 3)]
    first, poison = e.run(
        ("bank.transfer", (FIRST, FIRST + 1, BIG)),  # 2**64 - 2: still encodable
        ("bank.transfer", (FIRST + 2, FIRST + 1, BIG)),  # 3 * (2**63 - 1): not
    )
    assert first == (OK, 0)
    _rejected(poison, "write rejected: account(3000001,): integer out of range for msgpack")
    # No partial effect: the source was not debited, the destination not credited.
    assert e.get("account", (FIRST + 2,)) == (BIG,)
    assert e.get("account", (FIRST + 1,)) == (2 * BIG,)
    # Partitions keep going.
    assert e.run(("bank.transfer", (FIRST + 1, FIRST + 2, 5)), ("kv.put", ("k", 1))) == [
        (OK, 2 * BIG - 5),
        (OK, True),
    ]


def test_bad_remote_write_of_a_multi_partition_txn_aborts_at_every_executor() -> None:
    a, b = _split_accounts()
    e = Everywhere()
    for bad_first in (False, True):
        (res,) = e.run(("pp.split", (a, b, bad_first)))
        _rejected(res, f"{PLAIN}({b},)", "integer out of range")
        assert e.get(PLAIN, (a,)) is None and e.get(PLAIN, (b,)) is None
    assert all(r.state_hash == 0 for r in e.replicas)
    assert e.run(("kv.put", ("after", 1))) == [(OK, True)]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (("pp.put_raw", (1, [1, 2])), ["row is list, not a tuple"]),
        (("pp.put_raw", (1, 5)), ["row is int, not a tuple"]),
        (("pp.put_set", (1,)), ["can not serialize 'set'"]),
        (("pp.put_big", (1,)), ["exceeds row_bytes_max"]),
        (("pp.bad_keys", (1, "long")), ["key has 2 parts"]),
        (("pp.bad_keys", (5, "bool")), ["key part 0 is bool"]),  # not k=1: (True,) == (1,)
        (("pp.bad_keys", (1, "float")), ["key part 0 is float"]),
        (("pp.bad_keys", (1, "huge")), ["integer out of range"]),
        (("pp.bad_entry", (1, "int")), ["an entry is int, not (table, key)"]),
        (("pp.bad_entry", (1, "triple")), ["an entry is tuple, not (table, key)"]),
        (("pp.bad_entry", (1, "replaced")), []),
        (("pp.result", ("huge",)), ["result rejected: integer out of range"]),
        (("pp.result", ("big",)), ["exceeds result_bytes_max"]),
        (("pp.result", ("set",)), ["result rejected"]),
        (("pp.result", ("abort_reason",)), ["abort reason rejected"]),
        (("pp.result", ("loud",)), ["raised Loud: <unprintable>"]),
    ],
)
def test_unstorable_writes_and_untravelling_results_are_errors(
    call: tuple[str, tuple], words: list[str]
) -> None:
    e = Everywhere()
    (res,) = e.run(call)
    _rejected(res, *words)
    assert all(r.state_hash == 0 for r in e.replicas)  # not even the good write stuck
    assert e.run(("pp.result", ("fine",))) == [(OK, "fine")]


def test_ordered_table_rejects_a_key_part_of_another_type_whatever_it_holds() -> None:
    e = Everywhere()
    assert e.run(("pp.ordered_put", (1, 2))) == [(OK, 1)]
    (res,) = e.run(("pp.ordered_put", (1, "x")))  # SortedList could not compare it
    _rejected(res, "pp_ordered(1, 'x'): key part 1 is str, the table declares int")
    # The rule is the table's, not the data's: an empty partition rejects it too.
    (res,) = e.run(("pp.ordered_put", (2, "x")))
    _rejected(res, "key part 1 is str")
    assert e.run(("pp.ordered_put", (1, 3))) == [(OK, 1)]
    for r in e.replicas:
        p = r.parts[placement.partition_of(ORDERED, (1,), 2)]
        assert list(p.storage.indexes[ORDERED]) == [(1, 2), (1, 3)]


def test_prepare_writes_depends_only_on_the_writes() -> None:
    s, empty = Storage(), Storage()
    s.put(ORDERED, (1, 2), (0,))
    for writes in ({(ORDERED, (1, "x")): (0,)}, {(ORDERED, (1, 5)): [0]}):
        assert s.prepare_writes(writes) == empty.prepare_writes(writes)
        assert s.prepare_writes(writes)[1] is not None
    ok, problem = s.prepare_writes({(ORDERED, (1, 5)): (0,), (ORDERED, (1, 2)): None})
    assert problem is None
    before = s.state_hash
    s.apply(ok)
    assert s.get(ORDERED, (1, 5)) == (0,) and s.get(ORDERED, (1, 2)) is None
    assert s.state_hash == s.recompute_hash()[0] != before


def test_traditional_mode_rejects_the_same_poison_and_recovers_from_its_log() -> None:
    sim = LocalTraditionalCluster(2, seed=3, options=TraditionalOptions(status_every_ms=0))
    calls = [
        ("bank.open", (FIRST, 3, BIG)),
        ("bank.transfer", (FIRST, FIRST + 1, BIG)),
        ("bank.transfer", (FIRST + 2, FIRST + 1, BIG)),
        ("pp.split", (*_split_accounts(), False)),
    ]
    out = []
    for name, args in calls:
        req = sim.submit(name, *args)
        sim.run()
        out.append(sim.results[req])
    assert out[:2] == [(OK, 3), (OK, 0)]
    _rejected(out[2], "write rejected: account(3000001,): integer out of range")
    _rejected(out[3], "integer out of range")
    check = replay_history(sim.history or [])
    assert not check.mismatches and check.state_hash == sim.state_hash
    before = sim.state_hash
    for p in range(2):
        sim.crash(p)
    sim.run()
    assert sim.state_hash == before
    req = sim.submit("bank.transfer", FIRST + 1, FIRST + 2, 5)
    sim.run()
    assert sim.results[req] == (OK, 2 * BIG - 5)


@pytest.mark.parametrize(
    "msg",
    [
        [ewire.MSG_READS, 0, [[1, 2]]],
        [ewire.MSG_READS, True, []],
        [ewire.MSG_READS, 1, [[5, [["kv", ["k"]]], []]]],  # exact read without its row
        [ewire.MSG_READS, 1, [[5, [["kv", [{"a": 1}], None]], []]]],  # unhashable key
        [ewire.MSG_READS, 1, [[5, [], [["kv", ["k"], [["k", "v"]]]]]]],  # row not [key, row]
        [ewire.MSG_QUERY, 0, [[1, 0, "kv.get", ["k"], "later"]]],
        [ewire.MSG_QUERY, 0, [[1, 0, "kv.get", "k", 0]]],
        [ewire.MSG_QUERY, 0, [[1, 0, "kv.get", ["k"]]]],
        [ewire.MSG_RESEND, 1, 2.5],
        [ewire.MSG_RESEND_GAP, "1", 0],
        [ewire.MSG_STATUS_REQUEST, 0],
        [ewire.MSG_RESULTS, 0, 0, [], [], []],
        [99],
        [],
        "reads",
    ],
)
def test_decode_inbound_refuses_every_malformed_message_whole(msg: Any) -> None:
    decoded, problem = ewire.decode_inbound(msgpack.packb(msg))
    assert decoded is None and problem


def test_decode_inbound_accepts_what_partitions_and_the_sequencer_send() -> None:
    for msg in (
        (ewire.MSG_READS, 1, ((5, (("kv", ("k",), ("v",)), ("kv", ("j",), None)), ()),)),
        (ewire.MSG_READS, 1, ((5, (), (("o", (1, 2), (((1, 2, 3), (9,)),)),)),)),
        (ewire.MSG_QUERY, 0, ((1, 0, "kv.get", ("k",), 0),)),
        (ewire.MSG_RESEND, 1, 0),
        (ewire.MSG_STATUS_REQUEST,),
    ):
        decoded, problem = ewire.decode_inbound(ewire.pack(msg))
        assert problem is None and decoded == ewire.MESSAGES.named(msg)
        assert ewire.encode(decoded) == ewire.pack(msg)  # the named type is the same array
    assert ewire.decode_inbound(b"\xc1")[0] is None


def test_partition_ignores_reads_from_non_peers_and_bounds_early_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "early_reads_txns_max", 3)
    part = Partition(0, 0, 2)
    for not_a_peer in (0, 2, -1):
        part.on_reads(not_a_peer, ((7, (), ()),))
    assert part.inputs_dropped == 3 and not part._early
    for txn_id in range(10, 15):
        part.on_reads(1, ((txn_id, (), ()),))
        part.on_reads(1, ((txn_id, (), ()),))  # a resend replaces its twin
    assert sorted(part._early) == [10, 11, 12] and part.inputs_dropped == 3 + 4
    assert all(len(by_peer) == 1 for by_peer in part._early.values())
    # Txns 0..19 pass without touching partition 0: their early reads were strays,
    # purged when room is needed.
    b = _split_accounts()[1]
    part.on_batch(make_batch(1, 0, 1, 1, [("pp.put_raw", (b, (1,)))] * 20, 2))
    part.on_reads(1, ((25, (), ()),))
    assert sorted(part._early) == [25]


def test_hostile_calls_leave_no_reference_cycles() -> None:
    """Partitions freeze what outlives a loop turn (heap.settle_turn): the rejecting
    paths must not leave cycles (an exception's traceback held by its frame, ...)."""
    a, b = _split_accounts()
    e = Everywhere()
    with no_cycles():
        e.run(("bank.open", (FIRST, 3, BIG)))
        e.run(
            ("bank.transfer", (FIRST, FIRST + 1, BIG)),
            ("bank.transfer", (FIRST + 2, FIRST + 1, BIG)),
        )
        e.run(("pp.split", (a, b, False)), ("pp.split", (a, b, True)))
        e.run(
            ("pp.put_raw", (1, [1, 2])),
            ("pp.put_raw", (1, 5)),
            ("pp.put_set", (1,)),
            ("pp.put_big", (1,)),
        )
        e.run(*[("pp.bad_keys", (5, case)) for case in ("long", "bool", "float", "huge")])
        e.run(
            *[
                ("pp.result", (case,))
                for case in ("huge", "big", "set", "abort_reason", "loud", "fine")
            ]
        )
        e.run(("pp.ordered_put", (1, 2)), ("pp.ordered_put", (1, "x")))
