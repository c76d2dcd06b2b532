"""The view a procedure body gets of the database while it runs.

Invariants:
- Every access is checked against the declared footprint: ``get``/``scan`` need a
  covering read entry, ``put``/``delete`` a covering write entry (an entry covers a
  key when it equals the key or is a prefix of it). Anything else raises
  FootprintViolation, which the executor turns into an identical abort everywhere.
- Writes are buffered and become visible to the body's own later reads; the executor
  validates the whole buffer (executor.core.execution.run_txn) and applies it (only the
  local writes) after the body returns OK, or none of it.
- Time and randomness come only from the batch: ``timestamp_ms`` and ``rng`` (seeded
  from the batch seed and the txn id).
- The methods a body calls take ``Any``: this module may run compiled (txn_library.native),
  where a typed parameter is checked on entry; untyped, a body's bad argument fails the
  same way compiled and pure.
- ``hold_locks`` (a benchmark hook) only asks the live engine to keep the
  transaction's locks longer; it changes no value, so outcomes stay deterministic.
- ``holds(table, key)`` says whether this executor holds that key's rows: always,
  unless its owner says otherwise (a participant of a multi-partition transaction:
  the keys of its own partition and replicated tables). A body asks it before reading
  under a ``local`` footprint entry (txn_library.procedure.Footprint).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import xxhash

from txn_library.errors import FootprintViolation

Getter = Callable[[str, tuple], "tuple | None"]
Scanner = Callable[[str, tuple], list]
Holder = Callable[[str, tuple], bool]


def txn_seed(batch_seed: int, txn_id: int) -> int:
    return xxhash.xxh3_64_intdigest(msgpack.packb((batch_seed, txn_id)))


def cover_set(entries: Iterable[tuple[str, tuple]]) -> frozenset[tuple[str, tuple]]:
    return frozenset(entries)


def covered(cover: frozenset, table: Any, key: Any) -> bool:
    return (table, key) in cover or _covered_by_prefix(cover, table, key)


def scan_of_reads(exact: dict, prefixes: dict, table: str, prefix: tuple) -> list:
    """A prefix scan answered from reads another partition sent: its rows for that
    prefix if it sent them, else the exact keys it sent under the prefix, in key order
    (a multi-partition transaction's or a query's view of a peer's rows)."""
    rows = prefixes.get((table, prefix))
    if rows is not None:
        return list(rows)
    m = len(prefix)
    found = [(k[1], v) for k, v in exact.items() if k[0] == table and k[1][:m] == prefix]
    return sorted((key, row) for key, row in found if row is not None)


def _covered_by_prefix(cover: frozenset, table: Any, key: Any) -> bool:
    """A proper prefix of ``key`` is in ``cover`` (longest first: TPC-C's covers are
    one part shorter than most keys they cover)."""
    for n in range(len(key) - 1, 0, -1):
        if (table, key[:n]) in cover:
            return True
    return False


class TxnContext:
    __slots__ = (
        "txn_id",
        "timestamp_ms",
        "_seed",
        "_rng",
        "_reads",
        "_writes",
        "_get",
        "_scan",
        "writes",
        "hold_ms",
        "_on_write",
        "_written",
        "_holds",
    )

    def __init__(
        self,
        txn_id: int,
        timestamp_ms: int,
        batch_seed: int,
        reads: frozenset,
        writes: frozenset,
        get: Getter,
        scan: Scanner,
        on_write: Callable[[str, tuple], None] | None = None,
        holds: Holder | None = None,
    ) -> None:
        self.txn_id = txn_id
        self.timestamp_ms = timestamp_ms
        self._seed = batch_seed
        self._rng: random.Random | None = None
        self._reads = reads
        self._writes = writes
        self._get = get
        self._scan = scan
        self.writes: dict[Any, Any] = {}  # (table, key) -> row or None; a body may change it
        self.hold_ms = 0
        self._on_write = on_write
        self._written: set[Any] = set()  # tables put or deleted in: a scan merges only those
        self._holds = holds

    @property
    def rng(self) -> random.Random:
        """A random.Random fixed by (batch seed, txn id): the same on every replica."""
        if self._rng is None:
            self._rng = random.Random(txn_seed(self._seed, self.txn_id))
        return self._rng

    def get(self, table: Any, key: Any) -> tuple | None:
        entry = (table, key)
        if entry not in self._reads and not _covered_by_prefix(self._reads, table, key):
            raise FootprintViolation(f"read of {table}{key!r} outside the footprint")
        w = self.writes
        if w and entry in w:
            return w[entry]
        return self._get(table, key)

    def scan(self, table: Any, prefix: Any) -> list[tuple[tuple, tuple]]:
        """Rows whose key starts with ``prefix``, in key order, with own writes merged."""
        if not covered(self._reads, table, prefix):
            raise FootprintViolation(f"scan of {table}{prefix!r} outside the footprint")
        rows = self._scan(table, prefix)
        if table not in self._written:
            return rows
        n = len(prefix)
        mine = {k[1]: v for k, v in self.writes.items() if k[0] == table and k[1][:n] == prefix}
        if not mine:
            return rows
        merged = dict(rows)
        merged.update(mine)
        return sorted((k, v) for k, v in merged.items() if v is not None)

    def put(self, table: Any, key: Any, row: Any) -> None:
        entry = (table, key)
        if entry not in self._writes and not _covered_by_prefix(self._writes, table, key):
            raise FootprintViolation(f"write of {table}{key!r} outside the footprint")
        if not isinstance(row, tuple):
            raise TypeError(f"rows are tuples, got {type(row).__name__}")
        self.writes[entry] = row
        self._written.add(table)
        if self._on_write is not None:
            self._on_write(table, key)

    def delete(self, table: Any, key: Any) -> None:
        if not covered(self._writes, table, key):
            raise FootprintViolation(f"delete of {table}{key!r} outside the footprint")
        self.writes[(table, key)] = None
        self._written.add(table)
        if self._on_write is not None:
            self._on_write(table, key)

    def holds(self, table: Any, key: Any) -> bool:
        """Whether this executor holds the rows of ``key`` of ``table`` (a key or a
        prefix at least as long as the table's placement prefix): always, but at a
        participant of a multi-partition transaction other than the key's partition."""
        h = self._holds
        return True if h is None else h(table, key)

    def hold_locks(self, ms: Any) -> None:
        """BENCHMARK HOOK: ask the engine to keep this transaction's locks (and its
        result) for ``ms`` more milliseconds after the body returns, as if it were
        stalled on slow I/O, without blocking anything else. Changes no value, so
        every replica computes the same outcome; replay and in-process engines ignore
        it. Used by the clogging experiment (scripts/paper_experiments.py b)."""
        if type(ms) is not int or ms < 0:
            raise ValueError(f"hold_locks needs a non-negative int, got {ms!r}")
        self.hold_ms = max(self.hold_ms, ms)
