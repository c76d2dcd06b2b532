"""In-memory tables of one partition: reads, a transaction's writes (validated whole,
then applied), the ordered tables' key indexes, and a state hash kept up to date on every
write.

Rows are tuples (positional, in the table's column order); keys are tuples.

The Storage's other jobs live beside it, each module stating its invariants: the state
hash and the digests kept of overwritten rows (``executor.core.state_hash``); what
checkpoints take without packing a row, the change record and the encoded rows
(``executor.core.changes``); rows a checkpoint load left undecoded
(``executor.core.pending``); a row's bytes (packing a row, ``Storage.encode``, is most of
a write's cost), the checks a written key and row pass and the decoding of a loaded row
(``executor.core.rows``); the collector kept off a loaded database
(``executor.core.heap``); recent versions of rows for snapshot queries
(``executor.core.versions``). ``recompute_hash`` checks all of their invariants against
the rows.

Ordered tables keep a sorted index of keys (``OrderedIndex``: plain lists per key
group while keys arrive in order) so that a key prefix can be scanned in key order
(NEW-ORDER oldest per district, a customer's newest order, ...). The index is updated
in the same write path as the table. After a checkpoint load an index is built when its
table is first scanned (``index``; the tables in ``_unindexed`` have none yet): a
table's index is a function of its keys, so building it later gives the same index,
and a load (recovery, each replay run's start) does not pay ~0.3 us a key for indexes
that a workload may never scan (New Order scans none). Invariant: an ordered table
has an index in ``indexes`` or is in ``_unindexed``, never both; writes to an
unindexed table leave it so.

Writes of a transaction go in two steps, so that a bad write can never leave half a
transaction applied (or kill the process):
- ``prepare_writes`` validates the WHOLE write set and packs each new row (the one
  packing of that row: ``apply`` digests those bytes, and records them while changes are
  tracked). It depends only on the writes and the catalog, never
  on what this Storage holds, so every executor of a transaction, the serial oracle
  and every replay accept or reject the same set. A rejected set is applied nowhere.
- ``apply`` then installs prepared writes; it cannot fail (the checks above are
  exactly what the table dict, the ordered index and msgpack need).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

import msgpack

from executor.core.changes import ChangeRecord, Changes
from executor.core.ordered_index import OrderedIndex
from executor.core.pending import decode_all, digest_sum, fault, insert_rows, install_rows
from executor.core.rows import PreparedWrite, _digest, _packb, encode_row, prepare_write_set
from executor.core.state_hash import MASK64, KeptDigests
from executor.core.versions import Versions
from txn_library import catalog, limits
from txn_library.errors import invariant


class Storage:
    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple, tuple]] = {}
        self.indexes: dict[str, OrderedIndex] = {}  # built indexes (see ``index``)
        self._unindexed: set[str] = set()  # ordered tables whose index is not built yet
        self.state_hash = 0  # see executor.core.state_hash
        self.static_hash = 0
        self._replicated: dict[str, bool] = {}
        self._record = ChangeRecord()  # the change record and the encoded rows
        self.pending: dict[str, dict[tuple, bytes]] = {}  # see executor.core.pending
        # One Packer per Storage (a Storage is single-threaded): the same bytes as
        # msgpack.packb, without building a Packer per row.
        self._pack = msgpack.Packer(autoreset=True).pack
        self._kept = KeptDigests()  # digests of overwritten rows (executor.core.state_hash)
        # Rows before recent epochs' writes, for snapshot queries (executor.core.versions;
        # the partition sets it and the epoch of what it applies). None: none kept.
        self.versions: Versions | None = None

    def encode(self, table: Any, key: Any, row: Any) -> bytes:
        """msgpack([table, key, row]), msgpack's bytes, or msgpack's error for what it
        cannot pack (``executor.core.rows.encode_row``)."""
        return encode_row(self._pack, table, key, row)

    def _table(self, name: str) -> dict[tuple, tuple]:
        t = self.tables.get(name)
        if t is None:
            spec = catalog.table(name)
            t = self.tables[name] = {}
            self._record.add_table(name)
            self._kept.add_table(name)
            self._replicated[name] = spec.replicated
            if spec.ordered:
                self.indexes[name] = OrderedIndex(spec.index_prefix)
        return t

    def get(self, table: str, key: tuple) -> tuple | None:
        t = self.tables.get(table)
        if t is None:
            return None
        row = t.get(key)
        if row is None and self.pending:
            return fault(self.tables, self.pending, table, key)
        return row

    def materialize(self) -> None:
        """Decode every pending row, for readers of whole tables (``pending.decode_all``)."""
        decode_all(self.tables, self.pending)

    def whole_tables(self) -> dict[str, dict[tuple, tuple]]:
        """Every table's rows by key, pending rows decoded first: the view of a reader
        of whole tables (checks, exports, diagnosis), not to be modified."""
        self.materialize()
        return self.tables

    def put(self, table: str, key: tuple, row: tuple | None) -> None:
        """Insert, overwrite, or (row None) delete one trusted row (loaders, tests).

        Transactions' writes go through ``prepare_writes`` and ``apply`` instead.
        """
        data = None if row is None else self.encode(table, key, row)
        self._install(table, key, row, data)

    def prepare_writes(self, writes: Any) -> tuple[list[PreparedWrite], str | None]:
        """Validate a transaction's whole write set and pack its rows; (prepared writes,
        None) or ([], why): ``executor.core.rows.prepare_write_set``."""
        return prepare_write_set(writes, self._pack)

    def apply(self, writes: Iterable[PreparedWrite]) -> None:
        """Install writes from ``prepare_writes`` (of any Storage); cannot fail.

        The hot path of every transaction, so ``_install`` is inlined: prepared writes
        never touch a replicated table, so only ``state_hash`` moves, once per call.
        """
        tables, indexes = self.tables, self.indexes
        kept_digests, pending = self._kept, self.pending
        changes, digests = self._record.changes, kept_digests.by_table
        if changes is None and self._record.held:
            self._record.drop_encoded()  # a write nothing records would leave them stale
        held, held_max = kept_digests.held, limits.overwritten_digests_max
        versions = self.versions
        delta = 0
        for t, key, row, data in writes:
            tab = tables.get(t)
            if tab is None:
                tab = self._table(t)
            if row is None:
                old = tab.get(key)
            else:  # one probe of the table when the key is new (most writes insert)
                n = len(tab)
                old = tab.setdefault(key, row)
                if len(tab) != n:
                    old = None  # inserted here: the index and hash follow below
            old_data = None
            if old is None and pending:  # a pending row is hashed out from its bytes
                p = pending.get(t)
                if p is not None:
                    old_data = p.pop(key, None)
                    if not p:
                        del pending[t]
            if versions is not None and (
                old is not None or old_data is not None or row is not None
            ):
                versions.note(
                    t, key, old if old is not None else old_data, 0 if data is None else len(data)
                )
            if changes is not None and (old is not None or row is not None or old_data is not None):
                record = changes.get(t)
                if record is None:
                    record = changes[t] = {}
                record[key] = data
            if old is None and old_data is None:
                if row is None:
                    continue
                idx = indexes.get(t)
                if idx is not None:
                    idx.add(key)
                delta += _digest(data)  # type: ignore[arg-type]  # bytes: row is not None
                continue
            kept = digests[t]
            old_digest = None if old_data is not None else kept.get(key)
            if old_digest is not None:
                delta -= old_digest
            else:
                delta -= _digest(self.encode(t, key, old) if old_data is None else old_data)
            if row is None:
                tab.pop(key, None)
                idx = indexes.get(t)
                if idx is not None:
                    idx.remove(key)
                if old_digest is not None:
                    del kept[key]
                    held -= 1
            else:
                tab[key] = row
                new_digest = _digest(data)  # type: ignore[arg-type]  # bytes: row is not None
                delta += new_digest
                if old_digest is None:  # a key kept now
                    if held >= held_max:
                        kept_digests.forget()
                        held = 0
                    held += 1
                kept[key] = new_digest
        kept_digests.held = held
        self.state_hash = (self.state_hash + delta) & MASK64

    def _install(self, table: str, key: tuple, row: tuple | None, data: bytes | None) -> None:
        """Insert, overwrite, or (row None) delete one row (``data``: its encoding),
        keeping hash, change record, encoded rows and index."""
        t = self._table(table)
        self._kept.drop(table, key)
        old = t.get(key)
        if old is None and self.pending:
            old = fault(self.tables, self.pending, table, key)
        if old is None and row is None:
            return
        self._record.installed(table, key, data)
        delta = 0 if data is None else _digest(data)
        if old is not None:  # packed: its held encoding may be older than the record's
            delta -= _digest(self.encode(table, key, old))
        if row is None:
            del t[key]
            idx = self.indexes.get(table)
            if idx is not None:
                idx.remove(key)
        else:
            invariant(data is not None, "a row needs its encoding")
            t[key] = row
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
        record, kept_digests = self._record, self._kept
        for table, key, row in rows:
            t = self._table(table)
            kept_digests.drop(table, key)
            old = t.get(key)
            if old is None and self.pending:
                old = fault(self.tables, self.pending, table, key)
            data = self.encode(table, key, row)
            record.installed(table, key, data)
            d = _digest(data)
            if old is not None:  # packed, as in _install
                d -= _digest(self.encode(table, key, old))
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

    # What checkpoints take, and the checkpoint loader's paths -----------------------
    def track_changes(self) -> None:
        """Record changed keys from now on (a fresh record if one was being kept)."""
        self._record.start()

    def stop_tracking(self) -> None:
        self._record.stop()

    @property
    def tracking(self) -> bool:
        return self._record.changes is not None

    def take_changes(self) -> Changes:
        """The record kept since tracking (re)started; a fresh one starts now."""
        return self._record.take()

    def changes(self) -> Changes:
        """The record kept so far (not to be modified); empty if not tracking."""
        changes = self._record.changes
        return changes if changes is not None else {}

    def changed_count(self) -> int:
        return self._record.count()

    @property
    def encoded(self) -> dict[str, dict[tuple, bytes]]:
        """Rows as msgpack([table, key, row]) by table and key, those held
        (``executor.core.changes``); not to be modified."""
        return self._record.encoded

    def lend_encoded(self, table: str) -> tuple[dict[tuple, bytes], int]:
        """``table``'s encoded rows for a checkpoint writer to hold until
        ``return_encoded``, and how many of its first rows are the rows lent last time
        (``ChangeRecord.lend``)."""
        t = self._table(table)
        return self._record.lend(table, t, self.pending.get(table, {}), self.encode)

    def return_encoded(self) -> None:
        """The checkpoint writer that held encoded dicts is done with them."""
        self._record.returned()

    def insert_encoded(
        self, table: str, keys: Sequence[tuple], encodings: Sequence[bytes], digests: int
    ) -> int:
        """Bulk insert rows of one table as pending rows (``executor.core.pending``): each
        key with its encoding (the bytes read, whose digests sum to ``digests``; 0 from
        a chain's loader, which sets the hash once at the end: ``rehash_pending``).

        The checkpoint loader's path for a base or static file, into a Storage being
        loaded (``_loading``): rows come from a validated file. Returns how many keys
        were new: fewer than ``len(keys)`` means a key repeated or already present,
        which the caller must reject (the hash then counts a row twice). The table's
        index is NOT updated: the caller calls ``defer_indexes`` once it has inserted
        everything.
        """
        self._loading(table)
        new = insert_rows(self.pending, table, keys, encodings)
        if self._replicated[table]:
            self.static_hash = (self.static_hash + digests) & MASK64
        else:
            self.state_hash = (self.state_hash + digests) & MASK64
        return new

    def _loading(self, table: str) -> None:
        """A loader's precondition: ``table`` holds pending rows only, and nothing is
        recorded or encoded (a checkpoint loads into a fresh Storage)."""
        invariant(
            not self._table(table) and self._record.changes is None and not self._record.held,
            f"{table}: a checkpoint loads into a fresh Storage",
        )

    def defer_indexes(self) -> None:
        """After a load: every ordered table's index is built from its keys, pending or
        not, when the table is first scanned (``index``), not now."""
        self._unindexed.update(self.indexes)
        self.indexes.clear()

    def index(self, table: str) -> OrderedIndex | None:
        """``table``'s key index (None: not an ordered table), built now if a load left
        it to its first use (``defer_indexes``)."""
        idx = self.indexes.get(table)
        if idx is None and table in self._unindexed:
            keys = chain(self.tables[table], self.pending.get(table, ()))
            idx = self.indexes[table] = OrderedIndex(catalog.table(table).index_prefix, keys)
            self._unindexed.discard(table)
        return idx

    def install_encoded(
        self,
        table: str,
        keys: Sequence[tuple],
        encodings: Sequence[bytes],
        deleted: Sequence[int],
        digests: Sequence[int] | None,
    ) -> None:
        """Install rows of one partitioned table as pending rows, or delete them (the
        positions in ``deleted``): a checkpoint delta, each key at most once, with the
        bytes read and their digests (0 for a delete), into a Storage being loaded
        (``_loading``). Old rows are hashed out from their bytes. ``digests`` None
        leaves ``state_hash`` stale: the chain loader's path for the deltas of a chain,
        whose caller then sets the hash once from every row (``rehash_pending``)
        instead of hashing each overwritten row out. Indexes are left to
        ``defer_indexes``."""
        self._loading(table)
        delta = install_rows(self.pending, table, keys, encodings, deleted, digests)
        self.state_hash = (self.state_hash + delta) & MASK64

    def rehash_pending(self) -> int:
        """Set ``state_hash`` from the bytes of every partitioned row, all pending (a
        Storage just loaded), and return it."""
        total = 0
        for name, t in self.tables.items():
            if not self._replicated[name]:
                invariant(not t, f"{name}: a decoded row in a Storage being loaded")
                total += digest_sum(self.pending, name)
        self.state_hash = total & MASK64
        return self.state_hash

    def partitioned_row_count(self) -> int:
        """Rows of partitioned tables (what a base checkpoint holds)."""
        pending = self.pending
        return sum(
            len(t) + len(pending.get(name, ()))
            for name, t in self.tables.items()
            if not self._replicated[name]
        )

    def is_replicated(self, table: str) -> bool:
        self._table(table)
        return self._replicated[table]

    def scan(self, table: str, prefix: tuple) -> list[tuple[tuple, tuple]]:
        """Rows whose key starts with ``prefix``, in key order (ordered tables only)."""
        t = self.tables.get(table)
        if t is None:
            return []
        idx = self.index(table)
        n = len(prefix)
        if idx is None:
            if n == catalog.table(table).key_len:
                row = self.get(table, prefix)
                return [] if row is None else [(prefix, row)]
            raise ValueError(f"table {table} is not ordered: cannot scan a prefix")
        if table in self.pending:
            get = self.get
            return [(key, get(table, key)) for key in idx.starting_with(prefix)]  # type: ignore[misc]
        return [(key, t[key]) for key in idx.starting_with(prefix)]

    def rows(self) -> Iterator[tuple[str, tuple, tuple]]:
        """Every row, tables in name order and keys in sorted order (stable output)."""
        self.materialize()
        for name in sorted(self.tables):
            t = self.tables[name]
            for key in sorted(t):
                yield name, key, t[key]

    def row_count(self) -> int:
        return sum(map(len, self.tables.values())) + sum(map(len, self.pending.values()))

    def recompute_hash(self) -> tuple[int, int]:
        """(state_hash, static_hash) from scratch; must equal the incremental ones.
        Also asserts the encoded rows' invariant (each held encoding is its row's), the
        kept digests' (each is its row's, and counted) and the ordered indexes' (their
        own, and that they hold exactly their table's keys).
        Decodes pending rows first (each must be the row of the key it is pending for)."""
        self.materialize()
        state = static = 0
        self._kept.check_count()
        changes = self._record.changes or {}
        for name, t in self.tables.items():
            s = 0
            enc = dict(self._record.encoded[name])
            enc.update(changes.get(name, {}))  # type: ignore[arg-type]
            kept = self._kept.by_table[name]
            invariant(kept.keys() <= t.keys(), f"{name}: a kept digest of a row not held")
            for key, row in t.items():
                data = _packb((name, key, row))
                held = enc.get(key)
                invariant(held is None or held == data, f"{name}: a stale encoded row")
                d = _digest(data)
                invariant(kept.get(key, d) == d, f"{name}: a stale kept digest")
                s += d
            idx = self.indexes.get(name)
            invariant(idx is None or name not in self._unindexed, f"{name}: indexed twice")
            if idx is not None:
                idx.check()
                invariant(len(idx) == len(t) and all(map(t.__contains__, idx)), f"{name}: index")
            if catalog.table(name).replicated:
                static += s
            else:
                state += s
        return state & MASK64, static & MASK64
