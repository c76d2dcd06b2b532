"""In-memory tables of one partition, with an incrementally maintained state hash.

Rows are tuples (positional, in the table's column order); keys are tuples.

State hash: the sum mod 2**64 of xxh3_64(msgpack([table, key, row])) over every row
of every *partitioned* table held here. It is independent of dict order, process
and partition layout (the sum over partitions equals the hash of the whole
database), and costs O(1) per write (subtract the old row's digest, add the new).
Replicated read-only tables (TPC-C ITEM) are hashed separately in ``static_hash``.

Packing a row (``Storage.encode``) is most of a write's cost; the fast encoder beside
msgpack's, the checks a written key and row pass and the decoding of a loaded row's
bytes are in ``executor.core.rows``. Keeping the collector off a loaded database is
``executor.core.heap``.

Digests of overwritten rows (``_digests[table][key]``): a transaction's overwrite keeps
the digest of the row it installs, so that the next overwrite of that row hashes it out
with one dict look-up instead of packing it again (a New Order overwrites 11 rows, its
district and ten stock rows, and re-packing them cost ~7% of a partition's
instructions, measured with callgrind). Inserted rows are not kept
(most are never overwritten), and at ``limits.overwritten_digests_max`` all are
forgotten at once, so the memory is bounded and nothing depends on what is kept.
Invariant (checked by ``recompute_hash``): a kept digest is the digest of its key's row
now; every path that changes a row outside ``apply`` drops its digest (``_install``,
``load``), and a key kept is in ``tables`` (never pending).

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

Encoded rows (for base checkpoints, which then pack nothing): ``encoded[table][key]``
is msgpack([table, key, row]), kept from packings done anyway: loaders keep the bytes
they digest or read, and the bytes transactions packed reach it through the change
record (below), folded in when the record is taken or restarted (``take_changes``,
``track_changes``, ``stop_tracking``), not on every write: the hot path does not touch
it. Invariant: ``encoded`` updated with the current change record holds, for every key
it has, exactly the bytes of that key's row now; a missing key is packed when needed
(``lend_encoded``). A transaction's write while nothing is recorded would break that,
so it drops them all first (``apply``): an engine without checkpoints keeps none.
A table whose encoded rows only grew at their end since a base lent them (every fold
added new keys only) tells the next base how many of its first rows are unchanged
(``lend_encoded``), so that base copies those rows' frames instead of packing them.

Rows loaded but not decoded yet (``pending``, a checkpoint load: ``insert_encoded``,
``install_encoded``): ``pending[table][key]`` is msgpack([table, key, row]) of a row
that no one has read or written since the load. A load then costs each row's bytes and
key, one dict insert, not its decoding; ``get`` and ``scan`` decode a pending row when
they first meet it (``_fault``: the decoded table and key must be the ones it was
loaded under), and a write hashes the old row out from those bytes without decoding
them. ``encoded`` does not hold pending rows: ``lend_encoded`` adds them when a base
needs them. Invariants: a key is in at most one of ``tables[t]`` and ``pending[t]``,
and the table's state is both; ``pending`` holds only non-empty dicts (``get`` on a
missing key looks there only then); every pending row's bytes are its row's (it was
never written since). Readers of whole tables call ``materialize`` first (``rows``,
``recompute_hash``, ``whole_tables``).

Change tracking (incremental checkpoints, replay's checkpoint validation): while
``track_changes`` is on, every key whose row is installed or deleted is recorded, table
by table, with the encoded row it holds now (msgpack([table, key, row]), the bytes the
state hash digests; None: deleted). A checkpoint's delta is the record taken at the
boundary (``take_changes``, which starts a fresh one): bytes packed when the row was
written, while it was in cache, so the checkpoint writer packs nothing. The record is
one dict store per write and allocates nothing the cyclic collector tracks.

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

from executor.core.ordered_index import OrderedIndex
from executor.core.rows import (
    _decoded,
    _decoded_chunk,
    _digest,
    _encode,
    _packb,
    _plain,
    _quote,
    _writable,
    _writable_key_types,
    _write_problem,
    encode_failure,
)
from executor.core.versions import Versions
from txn_library import catalog, limits
from txn_library.errors import invariant
from txn_library.heap import gc_paused

MASK64 = (1 << 64) - 1


# (table, key, row or None = delete, msgpack([table, key, row]) or None for a delete)
PreparedWrite = tuple[str, tuple, tuple | None, bytes | None]


# table -> {key: msgpack([table, key, row now]) or None if deleted} for every key written
Changes = dict[str, dict[tuple, bytes | None]]


MATERIALIZE_CHUNK = 4096  # pending rows decoded as one msgpack array (materialize)


class Storage:
    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple, tuple]] = {}
        self.encoded: dict[str, dict[tuple, bytes]] = {}  # see the module docstring
        self.indexes: dict[str, OrderedIndex] = {}  # built indexes (see ``index``)
        self._unindexed: set[str] = set()  # ordered tables whose index is not built yet
        self.state_hash = 0
        self.static_hash = 0
        self._replicated: dict[str, bool] = {}
        self._changes: Changes | None = None  # see track_changes
        self.pending: dict[str, dict[tuple, bytes]] = {}  # see the module docstring
        self._encoded_held = False  # encoded holds any bytes (see the module docstring)
        self._lent: set[str] = set()  # tables whose encoded dict a writer holds (lend_encoded)
        # Tables whose encoded rows have only grown at their end since they were last lent
        # (table -> how many rows were lent then): see lend_encoded.
        self._grown: dict[str, int] = {}
        # One Packer per Storage (a Storage is single-threaded): the same bytes as
        # msgpack.packb, without building a Packer per row.
        self._pack = msgpack.Packer(autoreset=True).pack
        self._digests: dict[str, dict[tuple, int]] = {}  # see the module docstring
        self._digests_held = 0  # how many, over all tables
        # Rows before recent epochs' writes, for snapshot queries (executor.core.versions;
        # the partition sets it and the epoch of what it applies). None: none kept.
        self.versions: Versions | None = None

    def encode(self, table: Any, key: Any, row: Any) -> bytes:
        """msgpack([table, key, row]), msgpack's bytes (see the module docstring), or
        msgpack's error for what it cannot pack (a row's own code may raise anything)."""
        if type(table) is str and type(key) is tuple and type(row) is tuple and _plain(key):
            return self._encode_row(table, key, row)
        return self._pack((table, key, row))

    def _encode_row(self, table: str, key: tuple, row: tuple) -> bytes:
        """``encode`` of a key already known to be plain (``prepare_writes`` checked each
        part's type against its table's declared int, str or bytes)."""
        if _plain(row):
            try:
                return _encode((table, key, row))
            except Exception:
                pass  # an int out of range, a lone surrogate: msgpack raises its error
        return self._pack((table, key, row))

    def _forget_digests(self) -> None:
        for kept in self._digests.values():
            kept.clear()
        self._digests_held = 0

    def _table(self, name: str) -> dict[tuple, tuple]:
        t = self.tables.get(name)
        if t is None:
            spec = catalog.table(name)
            t = self.tables[name] = {}
            self.encoded[name] = {}
            self._digests[name] = {}
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
            return self._fault(table, key)
        return row

    def _fault(self, table: str, key: tuple) -> tuple | None:
        """``key``'s row if it is pending: decoded, checked and moved to ``tables``."""
        p = self.pending.get(table)
        data = None if p is None else p.get(key)
        if data is None:
            return None
        assert p is not None
        row = _decoded(table, key, data)  # raises before anything moves
        del p[key]
        if not p:
            del self.pending[table]
        self.tables[table][key] = row
        return row

    def materialize(self) -> None:
        """Decode every pending row (for readers of whole tables), each checked as a
        read checks it. A table's rows decode ``MATERIALIZE_CHUNK`` at a time as one
        msgpack array, and move to ``tables`` at once when all of them have (both
        partitions of a TPC-C state after 60 s of New Order, 4.1M rows: 6.9-7.5 s, and
        8.3-9.4 s a row at a time); if a chunk's elements are not each (its table, its
        key, a row), the table's rows are decoded a row at a time (``_fault``), which
        names the row at fault."""
        with gc_paused():  # millions of acyclic tuples (txn_library.heap)
            for table, p in list(self.pending.items()):
                keys, datas = list(p), list(p.values())
                rows: list[tuple] = []
                for i in range(0, len(keys), MATERIALIZE_CHUNK):
                    j = i + MATERIALIZE_CHUNK
                    got = _decoded_chunk(table, keys[i:j], datas[i:j])
                    if got is None:
                        break
                    rows.extend(got)
                if len(rows) != len(keys):
                    for key in keys:
                        self._fault(table, key)  # raises at the row at fault
                    continue
                self.tables[table].update(zip(keys, rows, strict=True))
                del self.pending[table]

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
        """Validate a transaction's whole write set; (prepared writes, None) or ([], why).

        Checked per write, in the body's order (so the reason is the same everywhere):
        the table is registered and partitioned, the key has the table's shape and part
        types, the row is a tuple (or None to delete), encodes with msgpack (which also
        bounds the key's ints), and is at most ``limits.row_bytes_max`` bytes with its
        table and key. The footprint was enforced when the body wrote (TxnContext).
        Depends on nothing this Storage holds. This runs for every write of every
        transaction: the common case costs a cached look-up of the table's key types,
        one type check per key part and one packing.
        ``writes`` is the body's ``ctx.writes``, which a body may have changed itself:
        anything but a dict of (table, key) entries is rejected too (typed Any, so
        that compiled and pure code reject the same things the same way).
        """
        if type(writes) is not dict:
            return [], f"write rejected: the write set is {type(writes).__name__}, not a dict"
        out: list[PreparedWrite] = []
        append = out.append
        writable = _writable_key_types
        row_bytes_max = limits.row_bytes_max
        entry: Any
        row: Any
        for entry, row in writes.items():
            if type(entry) is not tuple or len(entry) != 2:
                return [], f"write rejected: an entry is {type(entry).__name__}, not (table, key)"
            t, key = entry
            types = writable.get(t) if type(t) is str else None
            if types is None and type(t) is str:
                types = _writable(t)
            ok = False  # the common case: a tuple row, each key part of its declared type
            if types is not None and type(row) is tuple and type(key) is tuple:
                n = len(types)
                ok = len(key) == n
                i = 0
                while ok and i < n:
                    ok = type(key[i]) is types[i]
                    i += 1
            if not ok:
                problem = _write_problem(catalog.table_or_none(t), t, key, row)
                if problem is not None:
                    return [], f"write rejected: {_quote(t, key)}: {problem}"
                if row is None:
                    append((t, key, None, None))
                    continue
            try:
                # ok: the key's parts are of their declared (plain) types, checked above
                data = self._encode_row(t, key, row) if ok else self.encode(t, key, row)
            # The row is the procedure's value: packing it may run its code
            # (subclasses), so anything it raises is the procedure's failure.
            except Exception as e:
                return [], f"write rejected: {_quote(t, key)}: {encode_failure(e)}"
            if len(data) > row_bytes_max:
                return [], (
                    f"write rejected: {_quote(t, key)}: row of {len(data)} bytes exceeds "
                    f"row_bytes_max ({row_bytes_max})"
                )
            append((t, key, row, data))
        return out, None

    def apply(self, writes: Iterable[PreparedWrite]) -> None:
        """Install writes from ``prepare_writes`` (of any Storage); cannot fail.

        The hot path of every transaction, so ``_install`` is inlined: prepared writes
        never touch a replicated table, so only ``state_hash`` moves, once per call.
        """
        tables, indexes = self.tables, self.indexes
        changes, pending, digests = self._changes, self.pending, self._digests
        if changes is None and self._encoded_held:
            self._drop_encoded()  # a write nothing records would leave them stale
        held, held_max = self._digests_held, limits.overwritten_digests_max
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
                        self._forget_digests()
                        held = 0
                    held += 1
                kept[key] = new_digest
        self._digests_held = held
        self.state_hash = (self.state_hash + delta) & MASK64

    def _install(self, table: str, key: tuple, row: tuple | None, data: bytes | None) -> None:
        """Insert, overwrite, or (row None) delete one row (``data``: its encoding),
        keeping hash, encoded rows and index."""
        t = self._table(table)
        enc = self._writable_encoded(table)
        self._grown.pop(table, None)  # a direct install (loaders, put): not counted as grown
        self._drop_digest(table, key)
        old = t.get(key)
        if old is None and self.pending:
            old = self._fault(table, key)
        if old is None and row is None:
            return
        self._note_change(table, key, data)
        delta = 0 if data is None else _digest(data)
        if old is not None:  # packed: its held encoding may be older than the record's
            delta -= _digest(self.encode(table, key, old))
        if row is None:
            del t[key]
            enc.pop(key, None)
            idx = self.indexes.get(table)
            if idx is not None:
                idx.remove(key)
        else:
            invariant(data is not None, "a row needs its encoding")
            t[key] = row
            enc[key] = data  # type: ignore[assignment]
            self._encoded_held = True
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
        for table, key, row in rows:
            t = self._table(table)
            enc = self._writable_encoded(table)
            self._grown.pop(table, None)
            self._drop_digest(table, key)
            old = t.get(key)
            if old is None and self.pending:
                old = self._fault(table, key)
            data = self.encode(table, key, row)
            self._note_change(table, key, data)
            d = _digest(data)
            if old is not None:  # packed, as in _install
                d -= _digest(self.encode(table, key, old))
            elif table in self.indexes:
                pending_idx.setdefault(table, []).append(key)
            t[key] = row
            enc[key] = data
            self._encoded_held = True
            if self._replicated[table]:
                self.static_hash = (self.static_hash + d) & MASK64
            else:
                self.state_hash = (self.state_hash + d) & MASK64
            n += 1
        for table, keys in pending_idx.items():
            self.indexes[table].update(keys)
        return n

    def _drop_digest(self, table: str, key: tuple) -> None:
        """Forget ``key``'s kept digest: its row changes outside ``apply``."""
        if self._digests[table].pop(key, None) is not None:
            self._digests_held -= 1

    # Change tracking and the checkpoint loader's paths -----------------------------
    def _note_change(self, table: str, key: tuple, data: bytes | None) -> None:
        changes = self._changes
        if changes is not None:
            changes.setdefault(table, {})[key] = data

    def track_changes(self) -> None:
        """Record changed keys from now on (a fresh record if one was being kept)."""
        self._fold(self._changes)
        self._changes = {}

    def stop_tracking(self) -> None:
        self._fold(self._changes)
        self._changes = None

    def _fold(self, record: Changes | None) -> None:
        """Bring ``encoded`` up to date with a change record that is being let go."""
        if not record or not self._encoded_held:
            return
        grown = self._grown
        for table, rows in record.items():
            enc = self._writable_encoded(table)
            before = len(enc)
            enc.update(rows)  # type: ignore[arg-type]  # deleted keys: popped below
            if None in rows.values():
                for key in [k for k, v in rows.items() if v is None]:
                    del enc[key]
                grown.pop(table, None)
            elif len(enc) - before != len(rows):  # a key it held changed: not an append
                grown.pop(table, None)

    def _drop_encoded(self) -> None:
        self.encoded = {t: {} for t in self.encoded}  # new dicts: a writer may hold one
        self._lent.clear()
        self._grown.clear()
        self._encoded_held = False

    def _writable_encoded(self, table: str) -> dict[tuple, bytes]:
        """``encoded[table]`` to change: a copy first if a writer holds it (copy on
        write, so what a checkpoint captured stays the state at its boundary)."""
        enc = self.encoded[table]
        if table in self._lent:
            enc = self.encoded[table] = enc.copy()
            self._lent.discard(table)
        return enc

    @property
    def tracking(self) -> bool:
        return self._changes is not None

    def take_changes(self) -> Changes:
        """The record kept since tracking (re)started; a fresh one starts now."""
        invariant(self._changes is not None, "take_changes without track_changes")
        taken, self._changes = self._changes, {}
        assert taken is not None
        self._fold(taken)
        return taken

    def changes(self) -> Changes:
        """The record kept so far (not to be modified); empty if not tracking."""
        return self._changes if self._changes is not None else {}

    def changed_count(self) -> int:
        changes = self._changes
        return 0 if changes is None else sum(map(len, changes.values()))

    def insert_encoded(
        self, table: str, keys: Sequence[tuple], encodings: Sequence[bytes], digests: int
    ) -> int:
        """Bulk insert rows of one table as pending rows (see the module docstring): each
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
        p = self.pending.setdefault(table, {})
        before = len(p)
        p.update(zip(keys, encodings, strict=True))
        if not p:
            del self.pending[table]
        if self._replicated[table]:
            self.static_hash = (self.static_hash + digests) & MASK64
        else:
            self.state_hash = (self.state_hash + digests) & MASK64
        return len(p) - before

    def _loading(self, table: str) -> None:
        """A loader's precondition: ``table`` holds pending rows only, and nothing is
        recorded or encoded (a checkpoint loads into a fresh Storage)."""
        invariant(
            not self._table(table) and self._changes is None and not self._encoded_held,
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
        p = self.pending.setdefault(table, {})
        if digests is not None:
            old = sum(map(_digest, filter(None, map(p.get, keys))))
            self.state_hash = (self.state_hash + sum(digests) - old) & MASK64
        p.update(zip(keys, encodings, strict=True))
        for i in deleted:
            del p[keys[i]]
        if not p:
            del self.pending[table]

    def rehash_pending(self) -> int:
        """Set ``state_hash`` from the bytes of every partitioned row, all pending (a
        Storage just loaded), and return it."""
        total = 0
        for name, t in self.tables.items():
            if not self._replicated[name]:
                invariant(not t, f"{name}: a decoded row in a Storage being loaded")
                total += sum(map(_digest, self.pending.get(name, {}).values()))
        self.state_hash = total & MASK64
        return self.state_hash

    def lend_encoded(self, table: str) -> tuple[dict[tuple, bytes], int]:
        """``table``'s rows as msgpack([table, key, row]) by key, for a checkpoint writer
        to hold (not to change) until ``return_encoded``: this Storage copies the dict
        before it changes it meanwhile. Packs any row whose encoding is not held yet;
        the change record is folded in first (it may go on: folding it again later is
        harmless, but the table then counts as changed, below).

        Also how many of its first rows (in dict order) are the rows lent last time,
        the same keys with the same bytes in the same order: the rows then, if since
        then every fold only added keys at the end (no key it held was written or
        deleted, nothing was loaded or dropped), else 0. A base writer copies what the
        previous base wrote of them instead of packing them again
        (``CheckpointWriter``): append-only tables (TPC-C ORDER-LINE, HISTORY) and
        tables nothing wrote (CUSTOMER under New Order) cost a copy of their frames."""
        self._fold(self._changes)
        kept = self._grown.get(table, 0)
        t = self._table(table)
        enc = self._writable_encoded(table)
        p = self.pending.get(table, {})
        if len(enc) != len(t) + len(p):
            enc.update(p)  # a pending row's bytes are its row's (never written since)
            for key in t.keys() - enc.keys():
                enc[key] = self.encode(table, key, t[key])
        invariant(len(enc) == len(t) + len(p), f"{table}: an encoded row without its row")
        invariant(kept <= len(enc), f"{table}: fewer encoded rows than when last lent")
        self._encoded_held = True
        self._lent.add(table)
        self._grown[table] = len(enc)
        return enc, kept

    def return_encoded(self) -> None:
        """The checkpoint writer that held encoded dicts is done with them."""
        self._lent.clear()

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
        kept_count = sum(map(len, self._digests.values()))
        invariant(kept_count == self._digests_held, "kept digests miscounted")
        for name, t in self.tables.items():
            s = 0
            enc = dict(self.encoded[name])
            enc.update((self._changes or {}).get(name, {}))  # type: ignore[arg-type]
            kept = self._digests[name]
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
