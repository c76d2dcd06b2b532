"""What a partition's checkpoints take from its Storage without packing a row: the
change record (a delta's rows) and the encoded rows (a base's rows), one
``ChangeRecord`` per Storage.

Change record (incremental checkpoints, replay's checkpoint validation): while it is
kept (``start``, ``Storage.track_changes``), every key whose row is installed or deleted
is recorded, table by table, with the encoded row it holds now (msgpack([table, key,
row]), the bytes the state hash digests; None: deleted). A checkpoint's delta is the
record taken at the boundary (``take``, which starts a fresh one): bytes packed when the
row was written, while it was in cache, so the checkpoint writer packs nothing. The
record is one dict store per write (``Storage.apply`` writes ``changes`` itself, its hot
path) and allocates nothing the cyclic collector tracks.

Encoded rows (for base checkpoints, which then pack nothing): ``encoded[table][key]`` is
msgpack([table, key, row]), kept from packings done anyway: loaders keep the bytes they
digest or read (``installed``), and the bytes transactions packed reach it through the
change record, folded in when the record is taken or restarted (``take``, ``start``,
``stop``), not on every write: the hot path does not touch it. A missing key is packed
when a base needs it (``lend``). A transaction's write while nothing is recorded would
leave them stale, so it drops them all first (``drop_encoded``): an engine without
checkpoints keeps none. A table whose encoded rows only grew at their end since a base
lent them (every fold added new keys only) tells the next base how many of its first
rows are unchanged (``lend``), so that base copies those rows' frames instead of packing
them.

Invariants (the encoded rows' checked by ``Storage.recompute_hash``):
- ``encoded`` updated with the current record holds, for every key it has, exactly the
  bytes of that key's row now. A loaded row left pending (``Storage.pending``) is not
  copied in: ``lend`` adds it when a base needs it.
- ``held`` is False only if every encoded dict is empty.
- A dict a checkpoint writer holds (``lent``) is never changed: it is copied first
  (``writable``), so what the writer captured stays the state at its boundary.
- ``grown[table]`` is the count of rows lent last time only while every fold since then
  added keys at the end, and nothing else changed the table's encoded rows.
"""

from __future__ import annotations

from collections.abc import Callable

from txn_library.errors import invariant

# table -> {key: msgpack([table, key, row now]) or None if deleted} for every key written
Changes = dict[str, dict[tuple, bytes | None]]


class ChangeRecord:
    __slots__ = ("changes", "encoded", "held", "lent", "grown")

    def __init__(self) -> None:
        self.changes: Changes | None = None  # None: not recording (see ``start``)
        self.encoded: dict[str, dict[tuple, bytes]] = {}
        self.held = False  # ``encoded`` holds any bytes
        self.lent: set[str] = set()  # tables whose encoded dict a writer holds (``lend``)
        # Tables whose encoded rows have only grown at their end since they were last
        # lent (table -> how many rows were lent then): see ``lend``.
        self.grown: dict[str, int] = {}

    def add_table(self, table: str) -> None:
        self.encoded[table] = {}

    def start(self) -> None:
        """Record changed keys from now on (a fresh record if one was being kept)."""
        self.fold(self.changes)
        self.changes = {}

    def stop(self) -> None:
        self.fold(self.changes)
        self.changes = None

    def take(self) -> Changes:
        """The record kept since recording (re)started; a fresh one starts now."""
        taken = self.changes
        invariant(taken is not None, "take_changes without track_changes")
        assert taken is not None
        self.changes = {}
        self.fold(taken)
        return taken

    def count(self) -> int:
        """Keys recorded so far (0 if not recording)."""
        changes = self.changes
        return 0 if changes is None else sum(map(len, changes.values()))

    def installed(self, table: str, key: tuple, data: bytes | None) -> None:
        """``key``'s row changed outside a transaction (loaders, ``Storage.put``):
        ``data`` is its bytes now (None: deleted). Recorded, and its bytes kept; the
        table no longer counts as grown (see ``lend``)."""
        enc = self.writable(table)
        self.grown.pop(table, None)
        changes = self.changes
        if changes is not None:
            changes.setdefault(table, {})[key] = data
        if data is None:
            enc.pop(key, None)
        else:
            enc[key] = data
            self.held = True

    def fold(self, record: Changes | None) -> None:
        """Bring ``encoded`` up to date with a change record that is being let go."""
        if not record or not self.held:
            return
        grown = self.grown
        for table, rows in record.items():
            enc = self.writable(table)
            before = len(enc)
            enc.update(rows)  # type: ignore[arg-type]  # deleted keys: popped below
            if None in rows.values():
                for key in [k for k, v in rows.items() if v is None]:
                    del enc[key]
                grown.pop(table, None)
            elif len(enc) - before != len(rows):  # a key it held changed: not an append
                grown.pop(table, None)

    def drop_encoded(self) -> None:
        self.encoded = {t: {} for t in self.encoded}  # new dicts: a writer may hold one
        self.lent.clear()
        self.grown.clear()
        self.held = False

    def writable(self, table: str) -> dict[tuple, bytes]:
        """``encoded[table]`` to change: a copy first if a writer holds it."""
        enc = self.encoded[table]
        if table in self.lent:
            enc = self.encoded[table] = enc.copy()
            self.lent.discard(table)
        return enc

    def lend(
        self,
        table: str,
        rows: dict[tuple, tuple],
        pending: dict[tuple, bytes],
        encode: Callable[[str, tuple, tuple], bytes],
    ) -> tuple[dict[tuple, bytes], int]:
        """``table``'s rows as msgpack([table, key, row]) by key, for a checkpoint writer
        to hold (not to change) until ``returned``: the dict is copied before it changes
        meanwhile. ``rows`` and ``pending`` are the table's decoded and pending rows;
        ``encode`` packs a row whose encoding is not held yet. The record is folded in
        first (it may go on: folding it again later is harmless, but the table then
        counts as changed, below).

        Also how many of its first rows (in dict order) are the rows lent last time,
        the same keys with the same bytes in the same order: the rows then, if since
        then every fold only added keys at the end (no key it held was written or
        deleted, nothing was loaded or dropped), else 0. A base writer copies what the
        previous base wrote of them instead of packing them again
        (``CheckpointWriter``): append-only tables (TPC-C ORDER-LINE, HISTORY) and
        tables nothing wrote (CUSTOMER under New Order) cost a copy of their frames."""
        self.fold(self.changes)
        kept = self.grown.get(table, 0)
        enc = self.writable(table)
        if len(enc) != len(rows) + len(pending):
            enc.update(pending)  # a pending row's bytes are its row's (never written since)
            for key in rows.keys() - enc.keys():
                enc[key] = encode(table, key, rows[key])
        invariant(len(enc) == len(rows) + len(pending), f"{table}: an encoded row without its row")
        invariant(kept <= len(enc), f"{table}: fewer encoded rows than when last lent")
        self.held = True
        self.lent.add(table)
        self.grown[table] = len(enc)
        return enc, kept

    def returned(self) -> None:
        """The checkpoint writer that held encoded dicts is done with them."""
        self.lent.clear()
