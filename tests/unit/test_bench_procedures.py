"""Unit tests of the paper-experiment fixtures (txn_library/workloads/bench_procedures.py).

In-process only: the genesis is partition-consistent, the procedures are
deterministic, and the dependent lookup-then-update restarts on a changed index
entry when run through the live partition code (executor.deterministic.replica.LocalReplica).
"""

from __future__ import annotations

from executor.core.genesis import genesis_storage
from executor.deterministic.partition import Partition
from executor.deterministic.replica import LocalReplica
from executor.traditional.simulator import LocalTraditionalCluster
from sequencer.calls import make_batch
from txn_library import placement
from txn_library.errors import ABORTED, OK, RESTART
from txn_library.workloads.bench_procedures import REC, TAG, genesis, slot_rids

GENESIS = "txn_library.workloads.bench_procedures:genesis"


def test_genesis_is_partition_consistent_and_complete() -> None:
    rows = [list(genesis(p, 2, records=100, tags=10)) for p in range(2)]
    for p, part in enumerate(rows):
        for table, key, _row in part:
            assert placement.partition_of(table, key, 2) == p
    recs = sorted(k[0] for part in rows for t, k, _ in part if t == REC)
    assert recs == list(range(100))
    assert list(genesis(1, 2, records=100, tags=10)) == rows[1]  # a pure function
    for tag in range(10):
        assert {tag % 2} == {r % 2 for r in slot_rids(tag, 10, 4)}


def _replica(shuffle_seed: int | None = None) -> LocalReplica:
    args = {"records": 40, "tags": 4}
    storages = [genesis_storage(GENESIS, args, p, 2) for p in range(2)]
    return LocalReplica(2, storages, shuffle_seed=shuffle_seed)


def test_procedures_are_deterministic() -> None:
    calls = [
        ("bench.update", ([1, 2, 3], 5)),
        ("bench.update", ([2, 9], -1)),
        ("bench.tag_move", (1, 5)),
        ("bench.tag_update", (1, 7, 5)),
        ("bench.stall", ([4], 1, 0)),
        ("bench.update", ([999], 1)),  # missing record: a logical abort
    ]
    outcomes = []
    for seed in (1, 2):
        r = _replica(shuffle_seed=seed)  # different peer-delivery orders
        r.apply(make_batch(1, 1, 10, 7, calls, 2))
        outcomes.append((dict(r.results), r.state_hash))
    assert outcomes[0] == outcomes[1]
    results = outcomes[0][0]
    assert [results[i][0] for i in range(1, 7)] == [OK, OK, OK, OK, OK, ABORTED]


def test_dependent_update_restarts_on_changed_index_entry() -> None:
    r = _replica()
    # Tag 2 points at record 2 at genesis; the prediction 2 is right, then stale.
    r.apply(make_batch(1, 1, 10, 7, [("bench.tag_update", (2, 1, 2))], 2))
    assert r.results[1] == (OK, 1)
    r.apply(make_batch(2, 2, 11, 7, [("bench.tag_move", (2, 6))], 2))
    before = r.state_hash
    r.apply(make_batch(3, 3, 12, 7, [("bench.tag_update", (2, 1, 2))], 2))
    assert r.results[3] == (RESTART, 6)
    assert r.state_hash == before  # a restart writes nothing
    r.apply(make_batch(4, 4, 13, 7, [("bench.tag_update", (2, 1, 6))], 2))
    assert r.results[4] == (OK, 1)
    storage = r.parts[0].storage
    assert storage.get(REC, (6,)) == (1,) and storage.get(TAG, (2,)) == (6,)


# Lock holds (ctx.hold_locks, the clogging experiment's stall) ------------------------
HOLD_CALLS = [
    ("bench.stall", ([1, 2], 1, 500)),  # holds records 1 and 2 for 500 ms
    ("bench.update", ([2, 3], 1)),  # conflicts with it on record 2
    ("bench.update", ([7], 1)),  # conflicts with nothing
]


def _one_partition(clock: list[float] | None) -> Partition:
    part = Partition(0, 0, 1, genesis_storage(GENESIS, {"records": 40, "tags": 0}, 0, 1))
    if clock is not None:
        part.hold_clock = lambda: clock[0]
    part.on_batch(make_batch(1, 1, 10, 7, HOLD_CALLS, 1))
    return part


def test_deterministic_hold_blocks_only_conflicting_transactions() -> None:
    now = [100.0]
    part = _one_partition(now)
    _, results, _ = part.take_outputs()
    assert [r[0] for r in results] == [3]  # only the independent txn is done
    lock_waits, txn_waits, blocked = part.status()[10:13]
    assert (lock_waits, txn_waits, blocked) == (1, 1, 1)
    assert part.status().bypassed == 2  # txn 1 (then held: entered) and txn 3 ran at once
    assert part.next_hold_due() == 100.5
    part.release_holds(100.4)
    assert part.take_outputs()[1] == [] and not part.idle()
    part.release_holds(100.5)
    _, results, _ = part.take_outputs()
    assert [(r[0], r[1]) for r in results] == [(1, OK), (2, OK)]  # global order kept
    assert part.idle() and part.status()[12] == 0 and part.next_hold_due() is None
    values = {r: part.storage.get(REC, (r,)) for r in (1, 2, 3, 7)}
    assert values == {1: (1,), 2: (2,), 3: (1,), 7: (1,)}
    # A hold changes timing only: without a clock (replay) holds end at once and the
    # state is the same.
    replayed = _one_partition(None)
    assert replayed.idle() and replayed.storage.state_hash == part.storage.state_hash


def test_traditional_hold_keeps_locks_while_others_run() -> None:
    storages = [genesis_storage(GENESIS, {"records": 40, "tags": 0}, p, 2) for p in range(2)]
    sim = LocalTraditionalCluster(2, seed=3, storages=storages)
    start_us = sim.now_us
    stall, *later = [sim.submit(name, *args) for name, args in HOLD_CALLS]
    sim.run()
    order = list(sim.results)
    assert order.index(later[1]) < order.index(stall)  # independent work went on
    assert all(sim.results[r][0] == OK for r in (stall, *later))
    assert sim.now_us - start_us >= 500_000  # the hold lasted its 500 ms (virtual)
    rows = {r: sim.parts[r % 2].storage.get(REC, (r,)) for r in (1, 2, 3, 7)}
    assert rows == {1: (1,), 2: (2,), 3: (1,), 7: (1,)}
    sim.check_invariants()
