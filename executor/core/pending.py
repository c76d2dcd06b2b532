"""Rows a checkpoint load left undecoded (``Storage.pending``), and the loader's paths
that put them there.

``pending[table][key]`` is msgpack([table, key, row]) of a row that no one has read or
written since the load (``insert_rows``, ``install_rows``). A load then costs each row's
bytes and key, one dict insert, not its decoding; a read decodes a pending row when it
first meets it (``fault``: the decoded table and key must be the ones it was loaded
under), readers of whole tables decode them all first (``decode_all``,
``Storage.materialize``), and a write hashes the old row out from its bytes without
decoding them (``Storage.apply``).

Invariants: a key is in at most one of ``tables[t]`` and ``pending[t]``, and the table's
state is both; ``pending`` holds only non-empty dicts (so a read of a missing key looks
there only if some row is pending); every pending row's bytes are its row's (it was
never written since). The functions here keep them; ``tables`` and ``pending`` are the
Storage's own dicts.
"""

from __future__ import annotations

from collections.abc import Sequence

from executor.core.rows import _decoded, _decoded_chunk, _digest
from txn_library.heap import gc_paused

MATERIALIZE_CHUNK = 4096  # pending rows decoded as one msgpack array (decode_all)


def fault(
    tables: dict[str, dict[tuple, tuple]],
    pending: dict[str, dict[tuple, bytes]],
    table: str,
    key: tuple,
) -> tuple | None:
    """``key``'s row if it is pending: decoded, checked and moved to ``tables``."""
    p = pending.get(table)
    data = None if p is None else p.get(key)
    if data is None:
        return None
    assert p is not None
    row = _decoded(table, key, data)  # raises before anything moves
    del p[key]
    if not p:
        del pending[table]
    tables[table][key] = row
    return row


def decode_all(
    tables: dict[str, dict[tuple, tuple]], pending: dict[str, dict[tuple, bytes]]
) -> None:
    """Decode every pending row, each checked as a read checks it. A table's rows decode
    ``MATERIALIZE_CHUNK`` at a time as one msgpack array, and move to ``tables`` at once
    when all of them have (both partitions of a TPC-C state after 60 s of New Order,
    4.1M rows: 6.9-7.5 s, and 8.3-9.4 s a row at a time); if a chunk's elements are not
    each (its table, its key, a row), the table's rows are decoded a row at a time
    (``fault``), which names the row at fault."""
    with gc_paused():  # millions of acyclic tuples (txn_library.heap)
        for table, p in list(pending.items()):
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
                    fault(tables, pending, table, key)  # raises at the row at fault
                continue
            tables[table].update(zip(keys, rows, strict=True))
            del pending[table]


def insert_rows(
    pending: dict[str, dict[tuple, bytes]],
    table: str,
    keys: Sequence[tuple],
    encodings: Sequence[bytes],
) -> int:
    """Add each key with its encoding as a pending row of ``table``; how many keys were
    new (fewer than ``len(keys)``: a key repeated or already pending)."""
    p = pending.setdefault(table, {})
    before = len(p)
    p.update(zip(keys, encodings, strict=True))
    if not p:
        del pending[table]
    return len(p) - before


def install_rows(
    pending: dict[str, dict[tuple, bytes]],
    table: str,
    keys: Sequence[tuple],
    encodings: Sequence[bytes],
    deleted: Sequence[int],
    digests: Sequence[int] | None,
) -> int:
    """Install each key's encoding as its pending row, or delete it (the positions in
    ``deleted``): a checkpoint delta, each key at most once. Returns what the state hash
    gains: ``digests`` (the new rows', 0 for a delete) less the digests of the rows
    they replace, hashed out from their bytes; 0 if ``digests`` is None (the caller
    sets the hash from every row afterwards)."""
    p = pending.setdefault(table, {})
    delta = 0
    if digests is not None:
        delta = sum(digests) - sum(map(_digest, filter(None, map(p.get, keys))))
    p.update(zip(keys, encodings, strict=True))
    for i in deleted:
        del p[keys[i]]
    if not p:
        del pending[table]
    return delta


def digest_sum(pending: dict[str, dict[tuple, bytes]], table: str) -> int:
    """The sum of the digests of ``table``'s pending rows (not reduced mod 2**64)."""
    return sum(map(_digest, pending.get(table, {}).values()))
