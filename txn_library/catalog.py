"""Tables: key shape, lock granularity and placement on partitions.

Every key in Ordo is ``(table, key)`` where key is a tuple of ``key_len`` parts, each
an int in [-2**63, 2**64-1], a str or a bytes (``KEY_PART_TYPES``; never a bool).

Invariants:
- ``place_len <= lock_len <= key_len``: all keys under one lock name live on one
  partition, so a lock is always local.
- Placement is a stable function of the key's bytes (never Python's salted hash()),
  so every process, replica and replay agrees where a key lives.
- A footprint entry may be a *prefix* of a key (length >= place_len); it then covers
  every key that starts with it. Locked (sequenced) entries must be at least
  ``lock_len`` long so lock names never nest.
- An ordered table declares ``key_types`` (one type per key part): its keys live in
  a sorted index, so any two of them must compare, and a rule that depends only on the
  key (never on what a partition happens to hold) is what lets every executor, the
  serial oracle and replay reject the same writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import google_crc32c
import msgpack
import msgspec

Key = tuple
REPLICATED = -1

Placement = Callable[[tuple, int], int]
KEY_PART_TYPES: tuple[type, ...] = (int, str, bytes)


_encode_key = msgspec.msgpack.Encoder().encode


def key_bytes(prefix: Any) -> bytes:
    """msgpack's bytes of a key or key prefix (what ``place_by_hash`` hashes), or
    msgpack's error. A tuple of parts that are exactly int, str or bytes (every key a
    table accepts) is packed by msgspec, which writes msgpack's bytes for those in a
    third of the time; anything else, and anything msgspec refuses (an int past
    uint64), goes through msgpack, whose bytes and errors define the encoding
    (tests/unit/test_row_encoding.py compares the two)."""
    if type(prefix) is tuple:
        for part in prefix:
            tp = type(part)
            if not (tp is int or tp is str or tp is bytes):
                return msgpack.packb(prefix)
        try:
            return _encode_key(prefix)
        except Exception:
            pass  # an int out of range, a lone surrogate: msgpack raises its own error
    return msgpack.packb(prefix)


def place_by_hash(prefix: tuple, partitions: int) -> int:
    """crc32c of the msgpack encoding of the placement prefix (``key_bytes``)."""
    return google_crc32c.value(key_bytes(prefix)) % partitions


def place_by_first_int(prefix: tuple, partitions: int) -> int:
    """1-based first component (e.g. TPC-C warehouse id) round-robin over partitions.
    The component must be an int (key parts are int, str or bytes, never bool); a
    float gave partition 0.5, which no partition takes as its own."""
    first = prefix[0]
    if type(first) is not int:
        raise TypeError(f"placement by the first int: {type(first).__name__}, not int")
    return (first - 1) % partitions


@dataclass(frozen=True)
class Table:
    name: str
    key_len: int
    lock_len: int | None = None  # None: whole key
    place_len: int | None = None  # None: whole key
    placement: Placement = place_by_hash
    replicated: bool = False  # read-only, present on every partition, never locked
    ordered: bool = False  # keeps a sorted key index for prefix scans
    columns: tuple[str, ...] = ()  # row layout, for dumps and Parquet
    key_columns: tuple[str, ...] = ()  # names of the key's parts (default key_0, key_1, ...)
    # Type of each key part (from KEY_PART_TYPES); () = any of them. Required if ordered.
    key_types: tuple[type, ...] = ()
    # Ordered: key parts that group the index (executor.core.ordered_index); None: the
    # lock prefix, or one part fewer than the key if rows are locked one by one. Pick
    # the prefix under which new keys arrive in increasing order: a group is then a
    # plain list that new keys are appended to.
    index_len: int | None = None
    # Derived in __post_init__ (plain attributes: read on every access of every txn).
    lock_prefix: int = field(init=False, repr=False, compare=False)
    place_prefix: int = field(init=False, repr=False, compare=False)
    index_prefix: int = field(init=False, repr=False, compare=False)
    # The placement is place_by_first_int: hot paths compute it inline, (key[0] - 1) %
    # partitions, instead of a call with a slice of the key (a New Order call's 23
    # placements at the sequencer: 11.0 -> 9.5 us for its participants).
    by_first_int: bool = field(init=False, repr=False, compare=False)

    def output_columns(self) -> tuple[list[str], list[int], int]:
        """(column names, key positions to emit, row width) for exports.

        Key parts whose name is also a row column are not repeated.
        """
        names = list(self.key_columns) or [f"key_{i}" for i in range(self.key_len)]
        key_pos = [i for i, n in enumerate(names) if n not in self.columns]
        return [names[i] for i in key_pos] + list(self.columns), key_pos, len(self.columns)

    def __post_init__(self) -> None:
        lock = self.key_len if self.lock_len is None else self.lock_len
        object.__setattr__(self, "lock_prefix", lock)
        object.__setattr__(self, "place_prefix", lock if self.place_len is None else self.place_len)
        if not (1 <= self.place_prefix <= self.lock_prefix <= self.key_len):
            raise ValueError(f"table {self.name}: need 1 <= place_len <= lock_len <= key_len")
        if self.key_types and (
            len(self.key_types) != self.key_len
            or any(t not in KEY_PART_TYPES for t in self.key_types)
        ):
            raise ValueError(f"table {self.name}: key_types must be key_len of {KEY_PART_TYPES}")
        if self.ordered and not self.key_types:
            raise ValueError(f"table {self.name}: an ordered table must declare key_types")
        if self.index_len is None:
            index = lock if lock < self.key_len else self.key_len - 1
        elif self.ordered and 0 <= self.index_len < self.key_len:
            index = self.index_len
        else:
            raise ValueError(f"table {self.name}: index_len needs ordered and < key_len")
        object.__setattr__(self, "index_prefix", index)
        object.__setattr__(self, "by_first_int", self.placement is place_by_first_int)


_TABLES: dict[str, Table] = {}


def register_table(table: Table) -> Table:
    existing = _TABLES.get(table.name)
    if existing is not None and existing != table:
        raise ValueError(f"table {table.name!r} registered twice with different shapes")
    _TABLES[table.name] = table
    return table


def table(name: str) -> Table:
    try:
        return _TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}") from None


def table_or_none(name: object) -> Table | None:
    """The table named ``name``, or None (any value: a procedure's write may name junk)."""
    return _TABLES.get(name) if type(name) is str else None


def tables() -> dict[str, Table]:
    return dict(_TABLES)
