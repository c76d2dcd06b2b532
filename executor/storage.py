"""In-memory tables of one partition, with an incrementally maintained state hash.

Rows are tuples (positional, in the table's column order); keys are tuples.

State hash: the sum mod 2**64 of xxh3_64(msgpack([table, key, row])) over every row
of every *partitioned* table held here. It is independent of dict order, process
and partition layout (the sum over partitions equals the hash of the whole
database), and costs O(1) per write (subtract the old row's digest, add the new).
Replicated read-only tables (TPC-C ITEM) are hashed separately in ``static_hash``.

Ordered tables keep a SortedList of keys so that a key prefix can be scanned in key
order (NEW-ORDER oldest per district, a customer's newest order, ...). The index is
updated in the same write path as the table.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator

import msgpack
import xxhash
from sortedcontainers import SortedList

from txn_library import catalog

MASK64 = (1 << 64) - 1
GC_THRESHOLDS = (50_000, 20, 100)  # gen0 allocations, gen1 and gen2 collection ratios
_packb = msgpack.packb
_digest = xxhash.xxh3_64_intdigest


def row_digest(table: str, key: tuple, row: tuple) -> int:
    return _digest(_packb((table, key, row)))


class Storage:
    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple, tuple]] = {}
        self.indexes: dict[str, SortedList] = {}
        self.state_hash = 0
        self.static_hash = 0
        self._replicated: dict[str, bool] = {}
        # One Packer per Storage (a Storage is single-threaded): the same bytes as
        # msgpack.packb, without building a Packer per row.
        self._pack = msgpack.Packer(autoreset=True).pack

    def _table(self, name: str) -> dict[tuple, tuple]:
        t = self.tables.get(name)
        if t is None:
            spec = catalog.table(name)
            t = self.tables[name] = {}
            self._replicated[name] = spec.replicated
            if spec.ordered:
                self.indexes[name] = SortedList()
        return t

    def get(self, table: str, key: tuple) -> tuple | None:
        t = self.tables.get(table)
        return None if t is None else t.get(key)

    def put(self, table: str, key: tuple, row: tuple | None) -> None:
        """Insert, overwrite, or (row None) delete one row, keeping hash and index."""
        t = self._table(table)
        old = t.get(key)
        if old is None and row is None:
            return
        delta = 0
        pack = self._pack
        if old is not None:
            delta -= _digest(pack((table, key, old)))
        if row is None:
            del t[key]
            idx = self.indexes.get(table)
            if idx is not None:
                idx.remove(key)
        else:
            t[key] = row
            delta += _digest(pack((table, key, row)))
            if old is None:
                idx = self.indexes.get(table)
                if idx is not None:
                    idx.add(key)
        if self._replicated[table]:
            self.static_hash = (self.static_hash + delta) & MASK64
        else:
            self.state_hash = (self.state_hash + delta) & MASK64

    def load(self, rows: Iterable[tuple[str, tuple, tuple]]) -> int:
        """Bulk insert (loader, checkpoint restore). Returns rows loaded."""
        n = 0
        pending_idx: dict[str, list[tuple]] = {}
        pack = self._pack
        for table, key, row in rows:
            t = self._table(table)
            old = t.get(key)
            d = _digest(pack((table, key, row)))
            if old is not None:
                d -= _digest(pack((table, key, old)))
            elif table in self.indexes:
                pending_idx.setdefault(table, []).append(key)
            t[key] = row
            if self._replicated[table]:
                self.static_hash = (self.static_hash + d) & MASK64
            else:
                self.state_hash = (self.state_hash + d) & MASK64
            n += 1
        for table, keys in pending_idx.items():
            self.indexes[table].update(keys)
        return n

    def scan(self, table: str, prefix: tuple) -> list[tuple[tuple, tuple]]:
        """Rows whose key starts with ``prefix``, in key order (ordered tables only)."""
        t = self.tables.get(table)
        if t is None:
            return []
        idx = self.indexes.get(table)
        n = len(prefix)
        if idx is None:
            if n == catalog.table(table).key_len:
                row = t.get(prefix)
                return [] if row is None else [(prefix, row)]
            raise ValueError(f"table {table} is not ordered: cannot scan a prefix")
        out = []
        for key in idx.irange(minimum=prefix):
            if key[:n] != prefix:
                break
            out.append((key, t[key]))
        return out

    def rows(self) -> Iterator[tuple[str, tuple, tuple]]:
        """Every row, tables in name order and keys in sorted order (stable output)."""
        for name in sorted(self.tables):
            t = self.tables[name]
            for key in sorted(t):
                yield name, key, t[key]

    def row_count(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def recompute_hash(self) -> tuple[int, int]:
        """(state_hash, static_hash) from scratch; must equal the incremental ones."""
        state = static = 0
        for name, t in self.tables.items():
            s = 0
            for key, row in t.items():
                s += _digest(_packb((name, key, row)))
            if catalog.table(name).replicated:
                static += s
            else:
                state += s
        return state & MASK64, static & MASK64


def settle_heap() -> None:
    """Keep the collector off a loaded database (after a genesis or a checkpoint load).

    A TPC-C warehouse is ~560,000 rows that live as long as the process. With CPython's
    default thresholds the cyclic collector walks the big table dicts and index lists
    over and over (they are re-tracked on the first insert after every full
    collection), which cost about half of a partition's CPU under New Order. So:
    collect once, freeze the survivors (gc.freeze: never scanned again, which also
    keeps a forked checkpoint writer from touching their pages) and make young
    collections rare. Rows are tuples without cycles; collections still run.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
