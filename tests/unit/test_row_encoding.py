"""Storage.encode and catalog.key_bytes write exactly msgpack's bytes, and raise
msgpack's errors.

A row's bytes define the state hash, checkpoints and what replay compares, so the fast
encoder (msgspec, for keys and rows of plain scalars) must never write a different
byte, and must never accept what msgpack refuses (a set, which msgspec packs as an
array) or refuse what msgpack accepts (a subclass of int or str). Every value here is
packed both ways: the bytes must be equal, or both must fail with the same error. The
same holds for a key's bytes, which place it on a partition (``place_by_hash``): a
different byte would move a key to another partition than the one holding it.
"""

from __future__ import annotations

import collections
import enum
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.core.rows import encode_failure
from executor.core.storage import Storage
from txn_library import limits
from txn_library.catalog import key_bytes


class _Int(int):
    pass


class _Str(str):
    pass


class _Color(enum.IntEnum):
    RED = 1


_Pair = collections.namedtuple("_Pair", "a b")

# Lengths where msgpack's str and bin headers change size.
_LENGTHS = (0, 1, 31, 32, 255, 256, 65535, 65536)


def _outcome(pack: Any, table: Any, key: Any, row: Any) -> tuple[str, Any]:
    try:
        return "bytes", pack(table, key, row)
    except Exception as e:
        return "error", (type(e).__name__, encode_failure(e))


def _same(table: Any, key: Any, row: Any) -> None:
    fast = _outcome(Storage().encode, table, key, row)
    reference = _outcome(lambda t, k, r: msgpack.packb((t, k, r)), table, key, row)
    assert fast == reference, (table, key, row)
    placed = _outcome(lambda t, k, r: key_bytes(k), table, key, row)
    assert placed == _outcome(lambda t, k, r: msgpack.packb(k), table, key, row), key


_EDGES: list[Any] = [
    *limits.edge_values(),
    *(n * "é" for n in _LENGTHS),
    *(n * "a" for n in _LENGTHS),
    *(n * b"\x00" for n in _LENGTHS),
    "\U0001f600",
    "\ud800",  # a lone surrogate: not UTF-8, msgpack refuses it
    0.0,
    -0.0,
    1.5,
    math.inf,
    -math.inf,
    math.nan,
    1e308,
    5e-324,
    True,
    False,
    None,
    2**64,  # past msgpack's ints
    -(2**63) - 1,
    _Int(7),
    _Str("x"),
    _Color.RED,
    _Pair(1, 2),
    {1, 2},
    frozenset(),
    [1, "a"],
    {"a": 1},
    bytearray(b"ab"),
    object(),
]


@pytest.mark.parametrize("value", _EDGES, ids=lambda v: type(v).__name__)
def test_edges_in_rows_and_keys(value: Any) -> None:
    _same("t", (1, "k"), (value,))
    _same("t", (1, "k"), (1, value, "x"))
    _same("t", (value,), (1,))
    _same("t", (1,), [value])  # a list row: msgpack's path
    _same(value, (1,), (1,))


_scalar = st.one_of(
    st.integers(-(2**64), 2**65),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(
    table=st.text(max_size=40),
    key=st.lists(
        st.one_of(st.integers(-(2**64), 2**65), st.text(max_size=40), st.binary(max_size=40)),
        max_size=4,
    ).map(tuple),
    row=st.lists(st.one_of(_scalar, _value), max_size=20).map(tuple),
)
def test_random_rows(table: str, key: tuple, row: tuple) -> None:
    _same(table, key, row)
