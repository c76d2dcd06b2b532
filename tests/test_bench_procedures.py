"""Unit tests of the paper-experiment fixtures (txn_library/bench_procedures.py).

In-process only: the genesis is partition-consistent, the procedures are
deterministic, and the dependent lookup-then-update restarts on a changed index
entry when run through the live partition code (executor.engine.LocalReplica).
"""

from __future__ import annotations

from executor.engine import LocalReplica, genesis_storage
from sequencer.sequencer import make_batch
from txn_library import catalog
from txn_library.bench_procedures import REC, TAG, genesis, slot_rids
from txn_library.errors import ABORTED, OK, RESTART

GENESIS = "txn_library.bench_procedures:genesis"


def test_genesis_is_partition_consistent_and_complete() -> None:
    rows = [list(genesis(p, 2, records=100, tags=10)) for p in range(2)]
    for p, part in enumerate(rows):
        for table, key, _row in part:
            assert catalog.partition_of(table, key, 2) == p
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
