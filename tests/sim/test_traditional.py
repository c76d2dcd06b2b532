"""The traditional baseline (strict 2PL + wait-die + 2PC): simulation and integration.

In-process (executor.traditional.simulator.LocalTraditionalCluster: every partition in
one process, FIFO channels randomly interleaved, virtual clock, msgpack on every hop):
- serializability of random bank transfers, half multi-partition, many concurrent:
  money conserved, every bank.total sees the invariant total, and replaying the
  committed history serially in lock-point order reproduces every result and the
  final state hash;
- a cross-partition deadlock resolved by wait-die, both transactions committing;
- 2PC abort paths: a participant that votes NO, one that never answers, one that
  crashes and recovers from its log, one in doubt after a crash, one whose
  coordinator crashed, and random crashes of any partition (seeded chaos);
- logical aborts rolled back on every participant.
With real processes: transfers through txn_library.client.Client conserve money, and
a participant process that crashes during prepare aborts the transaction cleanly.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import msgpack
import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from executor.traditional.messages import R_DECIDE, R_END, R_OUTCOME, R_PREPARE
from executor.traditional.options import FAULT_SILENT, FAULT_VOTE_NO, TraditionalOptions
from executor.traditional.oracle import replay_history
from executor.traditional.simulator import LocalTraditionalCluster
from tests.heap_checks import no_cycles
from txn_library import placement
from txn_library.errors import ABORTED, ERR_UNAVAILABLE, ERROR, OK
from txn_library.procedure import Abort, Arg, Footprint, Restart, procedure
from txn_library.workloads.bank import make_transfers

ACCOUNTS = 60
START = 1_000
SIM = TraditionalOptions(status_every_ms=0, prepare_timeout_ms=50, remote_timeout_ms=2_000)


@procedure(
    "test2pl.write_then_abort",
    [Arg("a", "int"), Arg("b", "int")],
    lambda a, b: Footprint(
        reads=(("account", (a,)), ("account", (b,))), writes=(("account", (a,)), ("account", (b,)))
    ),
)
def write_then_abort(ctx: Any, a: int, b: int) -> Any:
    """Writes on both accounts' partitions, then aborts: nothing may stick."""
    ctx.put("account", (a,), (-1,))
    ctx.put("account", (b,), (-2,))
    return Abort("changed my mind")


_recon_calls = [0]


def _both(a: int, b: int) -> tuple:
    return (("account", (a,)), ("account", (b,)))


@procedure(
    "test2pl.richer_recon",
    [Arg("a", "int"), Arg("b", "int"), Arg("amount", "int")],
    lambda a, b, amount: Footprint(reads=_both(a, b)),
    read_only=True,
)
def richer_recon(ctx: Any, a: int, b: int, amount: int) -> int:
    """Predicts the richer account; the first prediction ever made is stale on purpose."""
    _recon_calls[0] += 1
    if _recon_calls[0] == 1:
        return -1
    ra, rb = ctx.get("account", (a,)), ctx.get("account", (b,))
    return a if ra[0] >= rb[0] else b


@procedure(
    "test2pl.pay_from_richer",
    [Arg("a", "int"), Arg("b", "int"), Arg("amount", "int")],
    lambda a, b, amount, predicted: Footprint(reads=_both(a, b), writes=_both(a, b)),
    recon="test2pl.richer_recon",
)
def pay_from_richer(ctx: Any, a: int, b: int, amount: int, predicted: int) -> Any:
    """A dependent transaction: re-checks the prediction under its locks."""
    ra, rb = ctx.get("account", (a,)), ctx.get("account", (b,))
    richer, poorer = (a, b) if ra[0] >= rb[0] else (b, a)
    if richer != predicted:
        return Restart(richer)
    r, p = ctx.get("account", (richer,)), ctx.get("account", (poorer,))
    ctx.put("account", (richer,), (r[0] - amount,))
    ctx.put("account", (poorer,), (p[0] + amount,))
    return richer


def on_partition(p: int, partitions: int, n: int = 1) -> list[int]:
    found = [a for a in range(ACCOUNTS) if placement.partition_of("account", (a,), partitions) == p]
    return found[:n]


def open_bank(sim: LocalTraditionalCluster) -> None:
    r = sim.submit("bank.open", 0, ACCOUNTS, START)
    sim.run()
    assert sim.results[r] == (OK, ACCOUNTS)


def balance(sim: LocalTraditionalCluster, a: int) -> int:
    rows = [x.storage.get("account", (a,)) for x in sim.parts]
    found = [r[0] for r in rows if r is not None]
    assert len(found) == 1, f"account {a} held by {len(found)} partitions"
    return found[0]


def total(sim: LocalTraditionalCluster) -> int:
    return sum(balance(sim, a) for a in range(ACCOUNTS))


def assert_clean(sim: LocalTraditionalCluster) -> None:
    """No transaction, branch or lock is left anywhere."""
    sim.check_invariants()
    assert sim.quiet()
    for x in sim.parts:
        assert len(x.locks) == 0 and x.locks.lock_count() == 0, x.partition
        assert x.idle()


def log_kinds(sim: LocalTraditionalCluster, p: int) -> list[int]:
    return [r[0] for frame in sim.logs[p] for r in msgpack.unpackb(frame, use_list=False)]


# Serializability ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("partitions", "update_locks", "seed"), [(2, True, 1), (2, False, 2), (3, True, 3)]
)
def test_random_transfers_are_serializable(partitions: int, update_locks: bool, seed: int) -> None:
    opts = replace(SIM, update_locks=update_locks, active_max=32)
    sim = LocalTraditionalCluster(partitions, seed=seed, options=opts)
    open_bank(sim)
    rng = random.Random(seed)
    transfers = make_transfers(2_500, ACCOUNTS, partitions, multi_share=0.5, seed=seed)
    totals = []
    for i, (src, dst, amount) in enumerate(transfers):
        # Some calls go to a partition that holds none of their keys: any partition
        # can coordinate any call.
        at = rng.randrange(partitions) if rng.random() < 0.1 else None
        sim.submit("bank.transfer", src, dst, amount, at=at)
        if i % 25 == 0:
            totals.append(sim.submit("bank.total", 0, ACCOUNTS))
        if i % 100 == 99:
            for _ in range(rng.randrange(200)):  # arrivals interleave with execution
                sim.step()
    sim.run()

    statuses = [s for s, _ in sim.results.values()]
    assert statuses.count(ERROR) == 0, [v for s, v in sim.results.values() if s == ERROR][:3]
    assert statuses.count(ABORTED) > 0  # insufficient funds happens: rollbacks exercised
    assert all(sim.results[t] == (OK, ACCOUNTS * START) for t in totals)
    assert total(sim) == ACCOUNTS * START
    stats = [x.stats for x in sim.parts]
    assert sum(s.committed_multi for s in stats) > 200  # really distributed
    assert sum(s.deaths for s in stats) > 0  # really concurrent: wait-die had to act

    assert sim.history is not None
    check = replay_history(sim.history)
    assert check.mismatches == []
    assert check.replayed == len(sim.results)  # every answered call is in the history
    assert check.state_hash == sim.state_hash
    assert_clean(sim)


def test_same_seed_same_run() -> None:
    """The simulation is reproducible: a failure can be replayed from its seed."""

    def run() -> list:
        sim = LocalTraditionalCluster(2, seed=9, options=SIM)
        open_bank(sim)
        for src, dst, amount in make_transfers(200, ACCOUNTS, 2, 0.5, seed=9):
            sim.submit("bank.transfer", src, dst, amount)
        sim.run()
        return sorted(sim.results.items())

    assert run() == run()


# Deadlock ---------------------------------------------------------------------------
def test_cross_partition_deadlock_resolved_by_wait_die() -> None:
    """T1 locks a (p0) then wants b (p1); T2 locks b then wants a. T2 is younger: it
    dies at p0, restarts with its old priority, and both commit."""
    sim = LocalTraditionalCluster(2, seed=0, options=SIM)
    open_bank(sim)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    t1 = sim.submit("bank.transfer", a, b, 10)  # coordinated at p0 (home of a)
    t2 = sim.submit("bank.transfer", b, a, 20)  # coordinated at p1 (home of b)
    sim.deliver_clients(0)  # T1: X lock on a, LOCK b -> p1
    sim.deliver_clients(1)  # T2: X lock on b, LOCK a -> p0
    (t1_aid,) = sim.parts[0].coordinator.attempts
    (t2_aid,) = sim.parts[1].coordinator.attempts
    sim.deliver_channel(0, 1)  # T1 asks p1 for b: T1 is older, so it waits
    b_lock = placement.lock_name("account", (b,))
    assert sim.parts[1].locks.waiting_on(t1_aid) == b_lock
    sim.deliver_channel(1, 0)  # T2 asks p0 for a: T2 is younger, so it dies
    assert sim.parts[0].locks.deaths == 1
    assert sim.parts[0].locks.waiting_on(t2_aid) is None
    sim.run()

    assert sim.results[t1] == (OK, START - 10)
    assert sim.results[t2] == (OK, START + 10 - 20)
    assert sim.parts[1].stats.deaths == 1 and sim.parts[0].stats.deaths == 0
    assert (balance(sim, a), balance(sim, b)) == (START - 10 + 20, START + 10 - 20)
    assert sim.history is not None
    order = [h.args for h in sim.history if h.outcome == "committed"][1:]
    assert order == [(a, b, 10), (b, a, 20)]  # T1 first; T2's retry serialized after it
    assert_clean(sim)


def test_upgrade_deadlock_resolved_without_update_locks() -> None:
    """Shared-then-exclusive on the same hot account from both partitions."""
    opts = replace(SIM, update_locks=False)
    sim = LocalTraditionalCluster(2, seed=4, options=opts)
    open_bank(sim)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    calls = [sim.submit("bank.transfer", a, b, 1, at=i % 2) for i in range(40)]
    sim.run()
    assert all(sim.results[c][0] == OK for c in calls)
    assert sum(x.stats.deaths for x in sim.parts) > 0
    assert (balance(sim, a), balance(sim, b)) == (START - 40, START + 40)
    assert_clean(sim)


# Two-phase commit failures ------------------------------------------------------------------
class Switch:
    """A prepare fault that strikes while armed."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.armed = True
        self.hits = 0

    def __call__(self, _aid: tuple) -> str | None:
        if not self.armed:
            return None
        self.hits += 1
        return self.kind


def fault_cluster(kind: str) -> tuple[LocalTraditionalCluster, Switch, int, int]:
    switch = Switch(kind)
    switch.armed = False
    sim = LocalTraditionalCluster(2, seed=5, options=SIM, faults={1: switch})
    open_bank(sim)
    switch.armed = True
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    return sim, switch, a, b


def assert_recovers(sim: LocalTraditionalCluster, switch: Switch, a: int, b: int) -> None:
    switch.armed = False
    r = sim.submit("bank.transfer", a, b, 7)
    sim.run()
    assert sim.results[r] == (OK, START - 7)
    assert (balance(sim, a), balance(sim, b)) == (START - 7, START + 7)
    assert_clean(sim)


@pytest.mark.parametrize("kind", [FAULT_VOTE_NO, FAULT_SILENT])
def test_participant_failure_during_prepare_aborts_cleanly(kind: str) -> None:
    sim, switch, a, b = fault_cluster(kind)
    decides_before = log_kinds(sim, 0).count(R_DECIDE)
    prepares_before = log_kinds(sim, 1).count(R_PREPARE)
    r = sim.submit("bank.transfer", a, b, 100)
    sim.run()

    status, (code, message) = sim.results[r]
    assert (status, code) == (ERROR, ERR_UNAVAILABLE), message
    assert switch.hits == 1
    assert (balance(sim, a), balance(sim, b)) == (START, START)  # no partial writes
    assert log_kinds(sim, 0).count(R_DECIDE) == decides_before  # presumed abort: no record
    assert log_kinds(sim, 1).count(R_PREPARE) == prepares_before
    assert sim.history is not None and sim.history[-1].outcome == "failed"
    assert_clean(sim)  # locks released at both partitions
    assert_recovers(sim, switch, a, b)


def test_participant_crash_during_prepare_recovers_from_its_log() -> None:
    sim, switch, a, b = fault_cluster(FAULT_SILENT)
    hash_p1 = sim.parts[1].storage.state_hash
    r = sim.submit("bank.transfer", a, b, 100)
    while switch.hits == 0:
        sim.step()
    sim.crash(1)  # before voting: its memory and connections are gone
    assert sim.parts[1].storage.state_hash == hash_p1  # redo of its committed log
    sim.run()
    assert sim.results[r][0] == ERROR
    assert total(sim) == ACCOUNTS * START
    assert_recovers(sim, switch, a, b)


def test_participant_crash_during_a_remote_read_times_out_cleanly() -> None:
    sim = LocalTraditionalCluster(2, seed=13, options=SIM)
    open_bank(sim)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    r = sim.submit("bank.transfer", a, b, 10)
    sim.deliver_clients(0)  # locks a, sends LOCK b to p1 and waits for the row
    sim.crash(1)  # the request is lost with p1's connections
    sim.run()  # the virtual clock reaches the coordinator's remote timeout
    status, (code, _message) = sim.results[r]
    assert (status, code) == (ERROR, ERR_UNAVAILABLE)
    assert (balance(sim, a), balance(sim, b)) == (START, START)
    assert_recovers(sim, Switch(FAULT_SILENT), a, b)


def test_in_doubt_participant_learns_commit_after_crash() -> None:
    """p1 voted YES, p0 decided COMMIT, then p1 crashed before the COMMIT arrived."""
    sim = LocalTraditionalCluster(2, seed=6, options=SIM)
    open_bank(sim)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    r = sim.submit("bank.transfer", a, b, 30)
    sim.deliver_clients(0)  # lock a, LOCK b -> p1
    sim.deliver_channel(0, 1)  # granted
    sim.deliver_channel(1, 0)  # body done -> PREPARE -> p1
    sim.deliver_channel(0, 1)  # R_PREPARE forced, YES
    sim.deliver_channel(1, 0)  # R_DECIDE forced, COMMIT -> p1, client told OK
    assert sim.results[r] == (OK, START - 30)
    assert balance(sim, a) == START - 30
    sim.crash(1)  # the COMMIT in flight is lost
    p1 = sim.parts[1]
    assert p1.status().in_doubt == 1
    assert p1.locks.mode_held(
        next(iter(p1.participant.branches)), placement.lock_name("account", (b,))
    )
    assert balance(sim, b) == START  # not applied until the outcome is known
    blocked = sim.submit("bank.balance", b)  # must wait for the in-doubt lock
    sim.run()
    assert balance(sim, b) == START + 30
    assert sim.results[blocked] == (OK, START + 30)
    assert log_kinds(sim, 0).count(R_END) == log_kinds(sim, 0).count(R_DECIDE)
    assert_clean(sim)


def test_prepared_participant_asks_after_its_coordinator_crashed() -> None:
    """p1 voted YES; p0 crashed before deciding. p1 must not hold its locks forever:
    after prepare_timeout_ms it asks p0, which has no decision on record: ABORT."""
    sim = LocalTraditionalCluster(2, seed=14, options=SIM)
    open_bank(sim)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    r = sim.submit("bank.transfer", a, b, 30)
    sim.deliver_clients(0)
    sim.deliver_channel(0, 1)
    sim.deliver_channel(1, 0)  # PREPARE -> p1
    sim.deliver_channel(0, 1)  # p1 prepared, its YES is in flight
    sim.crash(0)  # the YES is lost; p0 comes back with no decision
    sim.run()
    assert r not in sim.results  # the coordinator's client connection died with it
    assert (balance(sim, a), balance(sim, b)) == (START, START)
    outcomes = [
        rec for f in sim.logs[1] for rec in msgpack.unpackb(f, use_list=False)
        if rec[0] == R_OUTCOME
    ]  # fmt: skip
    assert outcomes[-1][2] is False
    assert_clean(sim)


@pytest.mark.parametrize("seed", [1, 2, 73, 124, 136, 138, 189])
def test_random_crashes_keep_money_and_serializability(seed: int) -> None:
    """Chaos: partitions crash at random points of a transfer workload (memory and
    in-flight messages lost, restart from the log). Whatever got answered or not,
    money is conserved, the committed history is serializable, nothing stays locked."""
    rng = random.Random(seed)
    partitions = rng.choice([2, 3])
    opts = replace(
        SIM,
        remote_timeout_ms=300,
        active_max=rng.choice([4, 16, 64]),
        update_locks=rng.random() < 0.7,
        query_every_ms=20,
        branch_idle_timeout_ms=1_000,
    )
    sim = LocalTraditionalCluster(partitions, seed=seed, options=opts)
    open_bank(sim)
    crashes = 0
    for i, (src, dst, amount) in enumerate(make_transfers(600, ACCOUNTS, partitions, 0.5, seed)):
        at = rng.randrange(partitions) if rng.random() < 0.1 else None
        sim.submit("bank.transfer", src, dst, amount, at=at)
        if i % 20 == 19:
            for _ in range(rng.randrange(150)):
                sim.step()
            if rng.random() < 0.15:
                sim.crash(rng.randrange(partitions))
                crashes += 1
    sim.run()
    assert crashes > 0
    assert total(sim) == ACCOUNTS * START
    assert sim.history is not None
    check = replay_history(sim.history)
    assert check.mismatches == []
    assert check.state_hash == sim.state_hash
    assert_clean(sim)


# Logical aborts ---------------------------------------------------------------------------
def test_logical_aborts_roll_back_on_every_participant() -> None:
    sim = LocalTraditionalCluster(2, seed=7, options=SIM)
    open_bank(sim)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    records_before = [len(sim.logs[p]) for p in range(2)]
    short = sim.submit("bank.transfer", a, b, START + 1)
    changed = sim.submit("test2pl.write_then_abort", a, b)
    remote = sim.submit("test2pl.write_then_abort", b, a, at=0)  # both keys via p0
    sim.run()
    assert sim.results[short] == (ABORTED, "insufficient funds")
    assert sim.results[changed] == (ABORTED, "changed my mind")
    assert sim.results[remote] == (ABORTED, "changed my mind")
    assert (balance(sim, a), balance(sim, b)) == (START, START)
    assert [len(sim.logs[p]) for p in range(2)] == records_before  # aborts log nothing
    assert sum(x.stats.aborted for x in sim.parts) == 3
    assert_clean(sim)


def test_retried_call_runs_once() -> None:
    sim = LocalTraditionalCluster(2, seed=8, options=SIM)
    open_bank(sim)
    p0 = sim.parts[0]
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    call = (77, "bank.transfer", (a, b, 5))
    p0.on_calls(b"conn-1", b"client-x", [call])
    p0.on_calls(b"conn-2", b"client-x", [call])  # a retry while in flight
    sim._turn(0)
    sim.run()
    p0.on_calls(b"conn-3", b"client-x", [call])  # a retry after the answer
    _, _, replies = p0.take_outputs()
    assert replies == {b"conn-3": [(77, OK, START - 5)]}
    assert balance(sim, a) == START - 5
    assert p0.stats.duplicate_calls == 2


def test_reused_client_id_with_another_call_is_refused_not_answered_with_the_old_result() -> None:
    sim = LocalTraditionalCluster(2, seed=8, options=SIM)
    open_bank(sim)
    p0 = sim.parts[0]
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    p0.on_calls(b"conn-1", b"same-id", [(9001, "bank.transfer", (a, b, 5))])
    sim._turn(0)
    sim.run()
    p0.on_calls(b"conn-2", b"same-id", [(9001, "bank.transfer", (a, b, 7))])  # another client
    _, _, replies = p0.take_outputs()
    ((req, status, value),) = replies[b"conn-2"]
    assert (req, status, value[0]) == (9001, ERROR, "request_id_reused")
    assert balance(sim, a) == START - 5


def test_dependent_call_runs_recon_and_restarts_on_a_stale_prediction() -> None:
    sim = LocalTraditionalCluster(2, seed=10, options=SIM)
    open_bank(sim)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    first = sim.submit("bank.transfer", b, a, 100)
    sim.run()
    assert sim.results[first][0] == OK
    _recon_calls[0] = 0
    r = sim.submit("test2pl.pay_from_richer", a, b, 40)
    sim.run()
    assert sim.results[r] == (OK, a)
    assert sum(x.stats.dependent_restarts for x in sim.parts) == 1
    assert (balance(sim, a), balance(sim, b)) == (START + 60, START - 60)
    assert_clean(sim)


def test_tpcc_standard_mix_is_serializable_and_consistent() -> None:
    """The same TPC-C procedures (incl. dependent Payment-by-name and Delivery) run
    unchanged under 2PL: consistency conditions hold and the history is serializable.

    The database is the simulator's TPC-C genesis image (W=2 over 2 partitions, built
    once per process: a worker that ran a TPC-C simulation already holds it); the
    cluster loads its own copy of each partition, the serial replay runs on a clone
    of the whole database."""
    import tpcc.transactions  # noqa: F401  (registers TPC-C)
    from executor.deterministic.workloads import clone_storage, genesis_image
    from tpcc.consistency import check_consistency
    from tpcc.inputs import TpccInputs, terminals_for
    from tpcc.sim_workload import GENESIS, LOAD_SEED, LOAD_TS_MS

    warehouses, partitions = 2, 2
    args = {"warehouses": warehouses, "seed": LOAD_SEED, "load_ts_ms": LOAD_TS_MS}
    image = genesis_image(GENESIS, args, partitions)  # templates: never written to
    opts = replace(SIM, active_max=8)
    sim = LocalTraditionalCluster(partitions, seed=12, options=opts, storages=image.partitions)
    inputs = TpccInputs(warehouses, partitions, seed=3, load_seed=LOAD_SEED, mix="standard")
    terminals = terminals_for(10, warehouses)
    calls = [inputs.next(terminals[i % 10]) for i in range(600)]
    ids = [sim.submit(c.proc, *c.args) for c in calls]
    sim.run()

    assert [sim.results[i][0] for i in ids].count(ERROR) == 0
    assert {c.kind for c in calls} >= {"new_order", "payment", "delivery", "order_status"}
    assert sum(x.stats.committed_multi for x in sim.parts) > 10
    for x in sim.parts:
        tables: dict[str, dict] = {}
        for t, k, row in x.storage.rows():
            tables.setdefault(t, {})[k] = row
        mine = [w for w in range(1, warehouses + 1) if (w,) in tables.get("warehouse", {})]
        assert mine and check_consistency(tables, mine) == []
    assert sim.history is not None
    check = replay_history(sim.history, clone_storage(image.whole))
    assert check.mismatches == []
    assert check.state_hash == sim.state_hash
    assert_clean(sim)


# Real processes ---------------------------------------------------------------------------


def test_the_traditional_engine_leaves_no_reference_cycles() -> None:
    """Its partitions freeze what outlives a loop turn (heap.settle_turn), as the
    deterministic ones do: transfers across partitions with wait-die deaths, restarts
    and rollbacks must make no cycles. (Not a crash: the simulator then drops a
    partition object, which a process never does; its coordinator holds bound methods
    of it.)"""
    sim = LocalTraditionalCluster(2, seed=5, options=replace(SIM, active_max=32))
    open_bank(sim)
    with no_cycles():
        for src, dst, amount in make_transfers(600, ACCOUNTS, 2, multi_share=0.5, seed=5):
            sim.submit("bank.transfer", src, dst, amount)
        sim.run()
    assert sum(x.stats.deaths for x in sim.parts) > 0
    assert total(sim) == ACCOUNTS * START
