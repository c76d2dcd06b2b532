"""Storage.apply against a plain dict: inserts, overwrites (with an equal row, with the
very row object already held), deletes of present and absent keys, over rows pending
from a load, on an unordered and an ordered table (its index deferred by the load and
built by a scan between writes, or at the end), with trusted installs (``put``)
between transactions and the kept digests of overwritten rows forgotten often (a tiny
``overwritten_digests_max``). The incremental hash must equal a recomputation and the
index must hold exactly the keys (Storage.recompute_hash checks both, and that every
kept digest is its row's)."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

import tpcc.schema as schema  # registers the TPC-C tables (DISTRICT plain, NEW-ORDER ordered)
from executor.core.rows import row_digest
from executor.core.storage import Storage
from txn_library import limits

TABLES = (schema.DISTRICT, schema.NEW_ORDER)


def _key(table: str, n: int) -> tuple:
    return (1, n) if table == schema.DISTRICT else (1, 1, n)


def _loaded(rows: dict[tuple[str, tuple], tuple]) -> Storage:
    """A fresh Storage holding ``rows`` as pending rows, as a checkpoint load leaves them."""
    s = Storage()
    for table in TABLES:
        mine = [(k, r) for (t, k), r in rows.items() if t == table]
        keys = [k for k, _ in mine]
        encodings = [msgpack.packb((table, k, r)) for k, r in mine]
        s.insert_encoded(table, keys, encodings, sum(row_digest(table, k, r) for k, r in mine))
    s.defer_indexes()  # built at the first scan (a "scan" action, or the end)
    return s


write = st.tuples(
    st.sampled_from(TABLES),
    st.integers(1, 12),  # few keys: writes meet loaded rows and each other
    st.sampled_from(["row", "same_row", "same_object", "delete", "put", "scan"]),
    st.integers(-1000, 1000),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    loaded=st.dictionaries(
        st.tuples(st.sampled_from(TABLES), st.integers(1, 12)), st.integers(-1000, 1000)
    ),
    txns=st.lists(st.lists(write, min_size=1, max_size=5), max_size=12),
    digests_max=st.sampled_from([1, 3, limits.overwritten_digests_max]),
)
def test_apply_keeps_rows_hash_and_index(loaded: dict, txns: list, digests_max: int) -> None:
    saved = limits.overwritten_digests_max
    limits.overwritten_digests_max = digests_max
    try:
        _apply_against_model(loaded, txns)
    finally:
        limits.overwritten_digests_max = saved


def _apply_against_model(loaded: dict, txns: list) -> None:
    model = {(t, _key(t, n)): (v,) for (t, n), v in loaded.items()}
    s = _loaded(model)
    for txn in txns:
        writes: dict[tuple[str, tuple], tuple | None] = {}
        for table, n, how, v in txn:
            key = _key(table, n)
            # A read faults a pending row in, as a body's read does; blind writes and
            # deletes leave it pending for apply to hash out from its bytes.
            current = s.get(table, key) if how.startswith("same") else None
            if how == "scan":  # builds a deferred index; later writes must keep it
                want = sorted(k for t, k in model if t == schema.NEW_ORDER)
                assert [k for k, _ in s.scan(schema.NEW_ORDER, (1, 1))] == want
            elif how == "put":  # a trusted install, outside any transaction
                s.put(table, key, (v,))
                model[(table, key)] = (v,)
            elif how == "delete":
                writes[(table, key)] = None
            elif how == "same_object" and current is not None:
                writes[(table, key)] = current  # setdefault finds this very object
            elif how == "same_row" and current is not None:
                writes[(table, key)] = tuple(current)
            else:
                writes[(table, key)] = (v,)
        prepared, problem = s.prepare_writes(writes)
        assert problem is None
        s.apply(prepared)
        for (table, key), row in writes.items():
            if row is None:
                model.pop((table, key), None)
            else:
                model[(table, key)] = row
    assert s.recompute_hash()[0] == s.state_hash
    got = {(t, k): r for t, rows in s.whole_tables().items() for k, r in rows.items()}
    assert got == model
    for table in TABLES:
        want = sorted(k for t, k in model if t == table)
        if table == schema.NEW_ORDER:
            assert [k for k, _ in s.scan(table, (1, 1))] == want
