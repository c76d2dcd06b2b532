"""Whole-replica simulation in one process: the live Partition code against the serial
oracle, with shuffled peer-message delivery, plus footprint enforcement and aborts."""

from __future__ import annotations

import random
from collections.abc import Callable

import msgpack
import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers tables and procedures)
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.partition import INTERLEAVE_EVERY, Partition
from executor.deterministic.replica import LocalReplica
from sequencer.calls import make_batch
from tests.heap_checks import no_cycles
from txn_library import catalog, placement
from txn_library.errors import ABORTED, ERROR, OK
from txn_library.procedure import Abort, Arg, Footprint, procedure
from txn_library.wire import sequencer as wire

ACCOUNTS = 200
START = 1_000


def bank_batches(partitions: int, n_txns: int, seed: int, per_batch: int = 50) -> list[tuple]:
    rng = random.Random(seed)
    batches = [make_batch(1, 0, 1000, 7, [("bank.open", (0, ACCOUNTS, START))], partitions)]
    txn_id = 1
    calls = []
    for i in range(n_txns):
        src, dst = rng.randrange(ACCOUNTS), rng.randrange(ACCOUNTS)
        calls.append(("bank.transfer", (src, dst, rng.randint(1, 1500))))
        if i % 7 == 0:
            calls.append(("bank.total", (0, ACCOUNTS)))
        if len(calls) >= per_batch:
            e = len(batches) + 1
            batches.append(make_batch(e, txn_id, 1000 + e, seed + e, calls, partitions))
            txn_id += len(calls)
            calls = []
    if calls:
        e = len(batches) + 1
        batches.append(make_batch(e, txn_id, 1000 + e, seed + e, calls, partitions))
    return batches


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_partitioned_replica_equals_serial_execution(partitions: int) -> None:
    batches = bank_batches(partitions, 2000, seed=partitions)
    multi = sum(1 for b in batches for t in b[5] if len(t[2]) > 1)
    if partitions > 1:
        assert multi > 500  # the workload really spans partitions
    serial = SerialExecutor()
    for b in batches:
        serial.apply(b)
    replicas = [LocalReplica(partitions, shuffle_seed=s) for s in (1, 2)]
    for r in replicas:
        r.apply_all(batches)
        assert r.idle()
        assert r.state_hash == serial.state_hash
        assert r.results == serial.results
    # Money is conserved, and every bank.total saw exactly the starting total.
    totals = [v for st, v in serial.results.values() if st == OK and v == ACCOUNTS * START]
    assert len(totals) == sum(1 for b in batches for t in b[5] if t[0] == "bank.total")
    aborted = [v for st, v in serial.results.values() if st == ABORTED]
    assert aborted and all(v == "insufficient funds" for v in aborted)


def test_hash_is_layout_independent_and_matches_recompute() -> None:
    hashes = set()
    for partitions in (1, 3, 4):
        r = LocalReplica(partitions)
        r.apply_all(bank_batches(partitions, 500, seed=11))
        hashes.add(r.state_hash)
        for p in r.parts:
            assert p.storage.recompute_hash()[0] == p.storage.state_hash
    assert len(hashes) == 1


catalog.register_table(catalog.Table("sim_t", key_len=1))


@procedure(
    "test.sneaky",
    [Arg("k", "int")],
    lambda k: Footprint(reads=(("sim_t", (k,)),), writes=(("sim_t", (k,)),)),
)
def _sneaky(ctx, k):  # type: ignore[no-untyped-def]
    ctx.put("sim_t", (k,), (1,))
    ctx.put("sim_t", (k + 1,), (1,))  # outside the footprint
    return "never"


@procedure(
    "test.abort_after_write", [Arg("k", "int")], lambda k: Footprint(writes=(("sim_t", (k,)),))
)
def _abort_after_write(ctx, k):  # type: ignore[no-untyped-def]
    ctx.put("sim_t", (k,), (99,))
    return Abort("changed my mind")


@procedure("test.crash", [Arg("k", "int")], lambda k: Footprint(writes=(("sim_t", (k,)),)))
def _crash(ctx, k):  # type: ignore[no-untyped-def]
    ctx.put("sim_t", (k,), (1,))
    return 1 // 0


@pytest.mark.parametrize("partitions", [1, 3])
def test_footprint_violation_and_aborts_change_nothing(partitions: int) -> None:
    calls = [("test.sneaky", (5,)), ("test.abort_after_write", (6,)), ("test.crash", (7,))]
    batch = make_batch(1, 0, 1, 1, calls, partitions)
    r = LocalReplica(partitions)
    r.apply(batch)
    assert r.state_hash == 0
    assert r.results[0][0] == ABORTED and "footprint" in r.results[0][1]
    assert r.results[1] == (ABORTED, "changed my mind")
    assert r.results[2][0] == ERROR and "ZeroDivisionError" in r.results[2][1][1]


def test_every_builtin_procedure_is_deterministic() -> None:
    """Run each procedure twice on copies of the same state and compare everything."""
    batches = bank_batches(2, 300, seed=5)
    a, b = SerialExecutor(), SerialExecutor()
    for x in batches:
        a.apply(x)
        b.apply(x)
    assert a.results == b.results and a.state_hash == b.state_hash


def test_the_engine_leaves_no_reference_cycles() -> None:
    """Partitions freeze what outlives a loop turn (heap.settle_turn), so the engine
    must make no cycles: transfers across partitions (remote reads, aborts) and the
    violating, aborting and crashing procedures above, on one and on three partitions."""
    for partitions in (1, 3):
        r = LocalReplica(partitions, shuffle_seed=partitions)
        batches = bank_batches(partitions, 600, seed=3)
        last = batches[-1]
        calls = [("test.sneaky", (5,)), ("test.abort_after_write", (6,)), ("test.crash", (7,))]
        batches.append(
            make_batch(last.epoch + 1, last.first_txn_id + len(last.txns), 1, 1, calls, partitions)
        )
        with no_cycles():
            r.apply_all(batches)
        assert r.idle()


def _accounts_by_partition(n: int) -> tuple[list[int], list[int]]:
    """Accounts 0-7 (bank.open's) that live at partition 0, and those at partition 1."""
    at = [placement.partition_of("account", (k,), n) for k in range(8)]
    return [k for k in range(8) if at[k] == 0], [k for k in range(8) if at[k] == 1]


def test_reads_cross_mid_batch_through_the_interleave_hook() -> None:
    """A multi-partition txn's reads go out at admission and are taken between
    admissions (Partition.on_batch's ``interleave``): the partition that reaches the
    batch second finds them waiting, runs the txn at once, and answers the first one,
    with no pump between. Results and state equal serial execution."""
    n = 2
    home, away = _accounts_by_partition(n)
    a, b, c, d = home[0], away[0], home[1], away[1]
    opened = make_batch(1, 0, 1000, 7, [("bank.open", (0, 8, START))], n)
    # Enough admissions at each partition for on_batch to call the hook mid-batch.
    more = INTERLEAVE_EVERY + 4
    calls = [("bank.transfer", (a, b, 10))]
    calls += [("bank.transfer", (a, c, 1))] * more + [("bank.transfer", (b, d, 1))] * more
    batch = make_batch(2, 1, 1001, 8, calls, n)
    serial = SerialExecutor()
    for x in (opened, batch):
        serial.apply(x)
    r = LocalReplica(n)
    r.apply(opened)
    p0, p1 = r.parts

    def deliver(sender: Partition) -> Callable[[], None]:
        def hook() -> None:
            for q, entries in sender.take_peer_out().items():
                r.parts[q].on_reads(sender.partition, tuple(entries))

        return hook

    p0.on_batch(batch, deliver(p0))
    assert not p0.idle()  # the transfer to b waits for p1's read; the rest queue behind
    p1.on_batch(batch, deliver(p1))
    assert p0.idle() and p1.idle()  # p1 ran it at admission and its read crossed back
    r.pump()
    assert r.results == serial.results
    assert r.state_hash == serial.state_hash


def test_the_interleave_hook_sees_results_waiting_mid_batch() -> None:
    """A batch of single-partition txns has no reads to send, but results wait after
    INTERLEAVE_EVERY admissions: with ``results_early`` (a live partition whose host
    has cores to spare) on_batch calls the hook, which takes them; without, it does
    not. Taking them mid-batch changes no result and no state."""
    n = 2
    home, _ = _accounts_by_partition(n)
    a, c = home[0], home[1]
    opened = make_batch(1, 0, 1000, 7, [("bank.open", (0, 8, START))], n)
    batch = make_batch(2, 1, 1001, 8, [("bank.transfer", (a, c, 1))] * (INTERLEAVE_EVERY + 4), n)
    serial = SerialExecutor()
    for x in (opened, batch):
        serial.apply(x)
    r = LocalReplica(n)
    r.apply(opened)
    r.pump()
    p0 = r.parts[0]
    taken: list[list] = []

    def hook() -> None:
        taken.append(p0.take_outputs()[1])

    p0.results_early = True
    p0.on_batch(batch, hook)
    assert [len(t) for t in taken] == [INTERLEAVE_EVERY]  # once, mid-batch
    rest = p0.take_outputs()[1]
    assert len(rest) == 4 and p0.idle()
    got = {t: (st, v) for t, st, v, _ in [*taken[0], *rest]}
    assert got == {t: serial.results[t] for t in got}
    assert [msgpack.unpackb(d, use_list=False) for *_, d in rest] == [v for _, _, v, _ in rest]
    r.parts[1].on_batch(batch)
    assert r.state_hash == serial.state_hash
    more = [("bank.transfer", (a, c, 1))] * (INTERLEAVE_EVERY + 4)
    again = make_batch(3, 1 + len(batch.txns), 1002, 9, more, n)
    serial.apply(again)
    p0.results_early = False
    p0.on_batch(again, hook)
    r.parts[1].on_batch(again)
    assert len(taken) == 1  # no reads outstanding, results not wanted early: no call
    assert len(p0.take_outputs()[1]) == INTERLEAVE_EVERY + 4
    assert r.state_hash == serial.state_hash


def test_a_batch_held_for_peers_waits_then_computes_the_same() -> None:
    """BatchFeed.hold_for_peers: while a multi-partition txn of an earlier batch is
    unfinished here, the next batch stays held (nothing of it admitted, so nothing
    queues behind the txn in the lock table); once the peer's read arrives the txn
    finishes and the held batch runs. Results and state equal serial execution."""
    from executor.deterministic.delivery import BatchFeed
    from txn_library.wire import sequencer as wire

    n = 2
    home, away = _accounts_by_partition(n)
    a, b, c = home[0], away[0], home[1]
    batches = [
        make_batch(1, 0, 1000, 7, [("bank.open", (0, 8, START))], n),
        make_batch(2, 1, 1001, 8, [("bank.transfer", (a, b, 10))], n),
        make_batch(3, 2, 1002, 9, [("bank.transfer", (a, c, 1)), ("bank.transfer", (c, a, 2))], n),
    ]
    serial = SerialExecutor()
    for x in batches:
        serial.apply(x)
    r = LocalReplica(n)
    r.apply(batches[0])
    p0, p1 = r.parts
    feed = BatchFeed(p0, 0.5)
    feed.hold_for_peers = True
    feed.offer(wire.pack(batches[1]))
    assert p0.multi_waiting and not feed.held_for_peers()  # nothing else here yet
    feed.offer(wire.pack(batches[2]))
    assert p0.last_epoch == 2 and feed.held_for_peers()  # held: b's read is not here
    p1.on_batch(batches[1])
    for sender in (p0, p1):
        for q, entries in sender.take_peer_out().items():
            r.parts[q].on_reads(sender.partition, tuple(entries))
    assert not p0.multi_waiting  # the transfer to b finished
    feed.apply_held()
    assert p0.last_epoch == 3 and not feed.held_for_peers()
    p1.on_batch(batches[2])
    r.pump()
    assert r.results == serial.results
    assert r.state_hash == serial.state_hash


def test_a_hold_runs_out_when_the_peer_stays_silent() -> None:
    """BatchFeed.pace: a batch held for a peer that never answers (down) waits at most
    ``peer_hold_max``; then batches run ahead for ``peer_hold_retry`` before holding
    again, so a dead peer stops no single-partition work for long. Without
    contention nothing is held."""
    from executor.deterministic.delivery import BatchFeed
    from txn_library.wire import sequencer as wire

    n = 2
    home, away = _accounts_by_partition(n)
    a, b, c, d = home[0], away[0], home[1], home[2]
    transfer_out = [("bank.transfer", (a, b, 1))]  # waits for partition 1 for good
    batches = [make_batch(1, 0, 1000, 7, [("bank.open", (0, 8, START))], n)]
    for e in range(2, 7):
        calls = transfer_out if e in (2, 5) else [("bank.transfer", (c, d, 1))]
        batches.append(make_batch(e, 10 * e, 1000 + e, e, calls, n))
    r = LocalReplica(n)
    r.apply(batches[0])
    p0 = r.parts[0]
    feed = BatchFeed(p0, 0.5, peer_hold_max=0.1, peer_hold_retry=1.0)
    feed.pace(0.0, contended=True)
    for x in batches[1:3]:
        feed.offer(wire.pack(x))
    assert p0.last_epoch == 2 and feed.held_for_peers()
    assert not feed.pace(0.0, contended=True)  # the owner's turn sees the hold start
    assert not feed.pace(0.05, contended=True) and p0.last_epoch == 2  # still waiting
    assert feed.pace(0.11, contended=True) and p0.last_epoch == 3  # ran out: runs ahead
    assert feed.peer_holds_expired == 1
    for x in batches[3:5]:
        feed.offer(wire.pack(x))
    assert not feed.pace(0.5, contended=True) and p0.last_epoch == 5  # not before 1.11
    feed.offer(wire.pack(batches[5]))
    assert p0.last_epoch == 6
    assert not feed.pace(1.2, contended=True) and feed.hold_for_peers  # holding again
    quiet = BatchFeed(p0, 0.5, peer_hold_max=0.1, peer_hold_retry=1.0)
    assert not quiet.pace(0.0, contended=False) and not quiet.hold_for_peers


def test_sent_reads_are_kept_until_every_peer_says_it_will_not_ask_again() -> None:
    """However many checkpoint boundaries pass (a peer's busy writer may skip them all),
    a partition keeps the reads it sent until each peer names the first txn it could
    replay from (MSG_READS_FLOOR: its oldest kept checkpoint); then only older ones go.
    A floor from a partition that is not a peer is refused and changes nothing."""
    n = 3
    batches = bank_batches(n, 600, seed=5)
    flagged = [b._replace(flags=wire.FLAG_CHECKPOINT) for b in batches]
    r = LocalReplica(n)
    r.apply_all(flagged)  # every epoch a boundary
    p0 = r.parts[0]
    assert p0.boundary[0] == flagged[-1].epoch and p0.sent_complete_from == 0
    sent_to_1 = [t for t, (dests, _) in p0.sent_reads.sent.items() if 1 in dests]
    assert len(sent_to_1) > 50
    assert p0.resend(1, 0) and p0.take_peer_out()[1]  # a restart from genesis recovers
    floor = sent_to_1[len(sent_to_1) // 2]
    p0.on_reads_floor(1, floor)
    assert p0.resend(1, 0)  # partition 2 has not said: nothing is forgotten
    p0.on_reads_floor(9, floor)
    p0.on_reads_floor(0, floor)
    assert p0.inputs_dropped == 2 and p0.resend(2, 0)
    p0.on_reads_floor(2, floor + 10**6)
    assert p0.sent_complete_from == floor  # the lowest floor of all peers
    assert not p0.resend(1, floor - 1) and p0.resend(1, floor)
    p0.on_reads_floor(1, 0)  # a floor never goes down
    assert p0.sent_complete_from == floor
