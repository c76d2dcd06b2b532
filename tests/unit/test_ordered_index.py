"""The ordered index against a plain sorted list of the same keys (random operations)."""

from __future__ import annotations

import random

import pytest

import tpcc.schema as s
from executor.core.ordered_index import OrderedIndex
from executor.core.storage import Storage
from executor.deterministic.workloads import clone_storage
from txn_library import catalog


def _prefixes(key: tuple) -> list[tuple]:
    return [key[:n] for n in range(len(key) + 1)]


@pytest.mark.parametrize("group_len", [0, 1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_index_matches_a_sorted_list(group_len: int, seed: int) -> None:
    rng = random.Random(seed)
    # Keys of 4 int parts: some grow monotonically per group (TPC-C's order ids),
    # some arrive in random order (ORDER_BY_CUSTOMER), some are deleted (NEW_ORDER).
    start = {(rng.randrange(3), rng.randrange(3), o, rng.randrange(4)) for o in range(40)}
    index = OrderedIndex(group_len, start)
    ref = sorted(start)
    next_id = 100
    for _ in range(600):
        op = rng.random()
        if op < 0.45:
            key = (rng.randrange(3), rng.randrange(3), next_id, rng.randrange(4))
            next_id += rng.randrange(2)
        elif op < 0.7:
            key = (rng.randrange(3), rng.randrange(3), rng.randrange(200), rng.randrange(4))
        else:
            key = None
        if key is not None and key not in ref:
            index.add(key)
            ref.append(key)
            ref.sort()
        elif ref and op >= 0.7:
            gone = rng.choice(ref)
            index.remove(gone)
            ref.remove(gone)
        if rng.random() < 0.2:
            probe = rng.choice(ref) if ref else (0, 0, 0, 0)
            for prefix in _prefixes(probe) + [(9,), (1, 9, 0)]:
                n = len(prefix)
                assert list(index.starting_with(prefix)) == [k for k in ref if k[:n] == prefix]
    index.check()
    assert list(index) == ref and len(index) == len(ref)
    dup = index.copy()
    dup.add((5, 5, 5, 5))
    assert list(index) == ref  # the copy is independent
    built = OrderedIndex(group_len, reversed(ref))
    built.check()
    assert list(built) == ref and len(built) == len(ref)


@pytest.mark.parametrize("group_len", [0, 1, 2])
def test_an_index_built_from_keys_of_str_and_bytes_parts_is_grouped_right(group_len: int) -> None:
    keys = [(w, d, n) for w in ("a", "b", "bb") for d in (b"", b"x", b"y") for n in range(5)]
    index = OrderedIndex(group_len, random.Random(1).sample(keys, len(keys)))
    index.check()
    assert list(index) == sorted(keys)
    assert len(index.groups) == {0: 1, 1: 3, 2: 9}[group_len]
    assert list(index.starting_with(("b", b"x"))) == [("b", b"x", n) for n in range(5)]


def test_group_len_is_the_lock_prefix_unless_rows_are_locked_one_by_one() -> None:
    def table(key_len: int, lock_len: int, index_len: int | None = None) -> catalog.Table:
        types = (int,) * key_len
        return catalog.Table(
            "t", key_len, lock_len, ordered=True, key_types=types, index_len=index_len
        )

    assert table(4, 2).index_prefix == 2  # TPC-C ORDER_LINE: (w, d) groups
    assert table(3, 3).index_prefix == 2
    assert table(1, 1).index_prefix == 0  # one group: the whole table
    assert table(4, 2, index_len=3).index_prefix == 3
    assert catalog.table(s.ORDER_BY_CUSTOMER).index_prefix == 3  # per customer: appends
    for bad in (4, -1):
        with pytest.raises(ValueError, match="index_len"):
            table(4, 2, index_len=bad)
    with pytest.raises(ValueError, match="index_len"):
        catalog.Table("t", 2, 1, key_types=(int, int), index_len=1)  # not ordered


def test_storage_scans_and_clones_keep_the_index_exact() -> None:
    import tpcc.transactions  # noqa: F401  (registers the TPC-C tables)
    from tpcc.schema import NEW_ORDER, ORDER_BY_CUSTOMER

    s = Storage()
    for o in range(1, 30):
        s.put(NEW_ORDER, (1, 1 + o % 3, o), (o, 1 + o % 3, 1))
        s.put(ORDER_BY_CUSTOMER, (1, 1, 30 - o, o), ())  # out of order within (w, d)
    s.put(NEW_ORDER, (1, 2, 4), None)
    district_2 = [(1, 2, o) for o in range(1, 30, 3) if o != 4]
    assert [k for k, _ in s.scan(NEW_ORDER, (1, 2))] == district_2
    assert [k for k, _ in s.scan(ORDER_BY_CUSTOMER, (1, 1, 5))] == [(1, 1, 5, 25)]
    c = clone_storage(s)
    c.put(NEW_ORDER, (1, 2, 99), (99, 2, 1))
    assert (1, 2, 99) not in [k for k, _ in s.scan(NEW_ORDER, (1,))]
    s.recompute_hash()
    c.recompute_hash()
