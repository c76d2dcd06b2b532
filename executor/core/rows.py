"""A row as the store takes it: the checks a written key and row must pass, the row's
bytes (msgpack([table, key, row]): what the state hash digests, checkpoints hold and
replay compares) and their digest, the decoding of a loaded row's bytes, and refusals
in words that are the same on every replica.

A transaction's whole write set is checked and packed here (``prepare_write_set``)
before ``Storage.apply`` installs any of it, so a bad write is refused whole and never
leaves half a transaction applied.

Packing a row (``encode_row``, ``Storage.encode``) is most of a write's cost. msgspec's
encoder writes the same bytes as msgpack's Packer for what rows are nearly always made
of, and in a third to a half of the time: a key and row of plain scalars (exactly str,
int, float, bool, None or bytes) go through it; anything else, and anything it refuses,
goes through msgpack's Packer, whose bytes and errors define the encoding
(tests/unit/test_row_encoding.py compares the two).

Invariants: the fast encoder writes exactly msgpack's bytes and raises msgpack's errors
(``_plain`` admits only values it packs alike); a write's checks depend only on the
write and the catalog, never on what a Storage holds, so every executor of a
transaction accepts or rejects the same write set; a message quotes a key only if its
parts are of known types (``_quote``), and an error's text carries no object address
(``failure_text``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgpack
import msgspec
import xxhash

from txn_library import catalog, limits
from txn_library.errors import invariant

KEY_INT_MIN, KEY_INT_MAX = -(1 << 63), (1 << 64) - 1  # what msgpack can encode
_packb = msgpack.packb
_encode = msgspec.msgpack.Encoder().encode  # see the module docstring: Storage.encode
_digest = xxhash.xxh3_64_intdigest
_KEY_PART_TYPES = frozenset(catalog.KEY_PART_TYPES)
_REPR_CHARS_MAX = 120  # of a key quoted in an error message
FAILURE_CHARS_MAX = 500  # of an exception's text in an ERROR result
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

# (table, key, row or None = delete, msgpack([table, key, row]) or None for a delete)
PreparedWrite = tuple[str, tuple, tuple | None, bytes | None]


def _decoded(table: str, key: tuple, data: bytes) -> tuple:
    """The row of a pending ``data`` (msgpack([table, key, row])), which must be
    ``key``'s row of ``table``: a checkpoint's bytes are vouched for by its CRCs and its
    hash, the key it was loaded under by the writer alone."""
    try:
        elem = msgpack.unpackb(data, use_list=False)
    except Exception:
        elem = None
    if not _is_row_of(elem, table, key):
        invariant(False, f"{_quote(table, key)}: a loaded row is not the row of its key")
    return elem[2]  # type: ignore[index]


def _is_row_of(elem: Any, table: str, key: tuple) -> bool:
    """``elem`` is a decoded msgpack([table, key, row]) of this table and key."""
    return (
        type(elem) is tuple
        and len(elem) == 3
        and elem[0] == table
        and elem[1] == key
        and type(elem[2]) is tuple
    )


_ARRAY_HEADER = msgpack.Packer().pack_array_header


def _decoded_chunk(table: str, keys: list[tuple], datas: list[bytes]) -> list[tuple] | None:
    """The rows of pending ``datas`` (each msgpack([table, key, row])) of ``keys``,
    decoded as one array; None if that fails or an element is not (``table``, its key,
    a tuple): the caller then decodes them one by one (``_decoded`` raises)."""
    try:
        elems = msgpack.unpackb(_ARRAY_HEADER(len(datas)) + b"".join(datas), use_list=False)
    except Exception:
        return None
    if type(elems) is not tuple or len(elems) != len(keys):
        return None
    rows = []
    for elem, key in zip(elems, keys, strict=True):
        if not _is_row_of(elem, table, key):
            return None
        rows.append(elem[2])
    return rows


def _plain(values: tuple) -> bool:
    """Every value is exactly a str, int, float, bool, None or bytes: what msgspec
    packs to msgpack's bytes (not a subclass, a container or a set, which msgpack
    refuses and msgspec packs)."""
    for v in values:
        tp = type(v)
        if not (tp is str or tp is int or v is None or tp is float or tp is bool or tp is bytes):
            return False
    return True


def encode_row(pack: Callable[[Any], bytes], table: Any, key: Any, row: Any) -> bytes:
    """msgpack([table, key, row]), msgpack's bytes (see the module docstring), or
    msgpack's error for what it cannot pack (a row's own code may raise anything).
    ``pack``: a msgpack Packer's (``Storage.encode``)."""
    if type(table) is str and type(key) is tuple and type(row) is tuple and _plain(key):
        return _encode_plain(pack, table, key, row)
    return pack((table, key, row))


def _encode_plain(pack: Callable[[Any], bytes], table: str, key: tuple, row: tuple) -> bytes:
    """``encode_row`` of a key already known to be plain (``prepare_write_set`` checked each
    part's type against its table's declared int, str or bytes)."""
    if _plain(row):
        try:
            return _encode((table, key, row))
        except Exception:
            pass  # an int out of range, a lone surrogate: msgpack raises its error
    return pack((table, key, row))


def row_digest(table: str, key: tuple, row: tuple) -> int:
    return _digest(_packb((table, key, row)))


# Key part types of the tables a transaction may write (registered, partitioned, with
# declared key types) by name, filled as writes meet them: a registered table never
# changes (catalog.register_table), and a name not registered yet is not kept.
_writable_key_types: dict[str, tuple[type, ...]] = {}


def _writable(table: str) -> tuple[type, ...] | None:
    """``table``'s key part types if a transaction may write it, else None."""
    spec = catalog.table_or_none(table)
    if spec is None or spec.replicated or not spec.key_types:
        return None
    _writable_key_types[table] = spec.key_types
    return spec.key_types


def failure_text(e: Exception) -> str:
    """A short message for an exception raised by a procedure (or by msgpack on a
    procedure's value), the same on every replica: str() of it may run procedure code
    (so it may fail) and may show object addresses (so they are removed)."""
    try:
        text = str(e)
    except Exception:  # the procedure's own __str__/__repr__ failed: still its failure
        text = "<unprintable>"
    text = _ADDRESS.sub("", text)
    if len(text) > FAILURE_CHARS_MAX:
        text = text[: FAILURE_CHARS_MAX - 3] + "..."
    return f"{type(e).__name__}: {text}"


def encode_failure(e: Exception) -> str:
    """failure_text for msgpack refusing a procedure's value (its only OverflowError
    is an int outside [-2**63, 2**64-1])."""
    return "integer out of range for msgpack" if isinstance(e, OverflowError) else failure_text(e)


def key_parts_problem(key: Any) -> str | None:
    """Why ``key`` (or a key prefix) cannot travel or be stored (None if it can)."""
    if not isinstance(key, tuple):
        return f"key is {type(key).__name__}, not a tuple"
    for i, part in enumerate(key):
        tp = type(part)
        if tp not in _KEY_PART_TYPES:
            return f"key part {i} is {tp.__name__}, not int, str or bytes"
        if tp is int and not KEY_INT_MIN <= part <= KEY_INT_MAX:
            return "integer out of range for msgpack"
    return None


def prepare_write_set(
    writes: Any, pack: Callable[[Any], bytes]
) -> tuple[list[PreparedWrite], str | None]:
    """Validate a transaction's whole write set; (prepared writes, None) or ([], why).

    Checked per write, in the body's order (so the reason is the same everywhere):
    the table is registered and partitioned, the key has the table's shape and part
    types, the row is a tuple (or None to delete), encodes with msgpack (which also
    bounds the key's ints), and is at most ``limits.row_bytes_max`` bytes with its
    table and key. The footprint was enforced when the body wrote (TxnContext).
    Depends on nothing a Storage holds (``pack``: its Packer's, msgpack.packb's bytes).
    This runs for every write of every transaction: the common case costs a cached
    look-up of the table's key types, one type check per key part and one packing.
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
        ok = False  # the common case: each key part of its declared type, and a tuple row
        if types is not None and type(key) is tuple:
            n = len(types)
            ok = len(key) == n
            i = 0
            while ok and i < n:
                ok = type(key[i]) is types[i]
                i += 1
            if ok and row is None and _ints_fit(key):
                append((t, key, None, None))  # a delete: what _write_problem passes
                continue
            ok = ok and type(row) is tuple
        if not ok:
            problem = _write_problem(catalog.table_or_none(t), t, key, row)
            if problem is not None:
                return [], f"write rejected: {_quote(t, key)}: {problem}"
            if row is None:
                append((t, key, None, None))
                continue
        try:
            # ok: the key's parts are of their declared (plain) types, checked above
            data = _encode_plain(pack, t, key, row) if ok else encode_row(pack, t, key, row)
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


def _ints_fit(key: tuple) -> bool:
    """Every int part of ``key`` fits msgpack (``_key_problem``'s bound)."""
    for part in key:
        if type(part) is int and not KEY_INT_MIN <= part <= KEY_INT_MAX:
            return False
    return True


def _write_problem(spec: catalog.Table | None, table: Any, key: Any, row: Any) -> str | None:
    """Why a write cannot be applied, before packing it (None if it may be packed, or
    if it is a valid delete). The slow path of ``prepare_write_set``."""
    if spec is None:
        return "unknown table"
    if spec.replicated:
        return "the table is replicated (read-only)"
    problem = _key_problem(spec, key)
    if problem is not None:
        return problem
    if row is not None and not isinstance(row, tuple):
        return f"row is {type(row).__name__}, not a tuple"
    return None


def _key_problem(spec: catalog.Table, key: Any) -> str | None:
    """Why ``key`` cannot be a key of ``spec`` (None if it can)."""
    if not isinstance(key, tuple):
        return f"key is {type(key).__name__}, not a tuple"
    if len(key) != spec.key_len:
        return f"key has {len(key)} parts, the table's keys have {spec.key_len}"
    declared = spec.key_types
    for i, part in enumerate(key):
        tp = type(part)
        if declared:
            if tp is not declared[i]:
                return f"key part {i} is {tp.__name__}, the table declares {declared[i].__name__}"
        elif tp not in _KEY_PART_TYPES:
            return f"key part {i} is {tp.__name__}, not int, str or bytes"
        if tp is int and not KEY_INT_MIN <= part <= KEY_INT_MAX:
            return "integer out of range for msgpack"
    return None


def _quote(table: Any, key: Any) -> str:
    """``table(key)`` for an error message. Only values of known types are shown: the
    repr of anything else may run procedure code or contain an address, and the
    message must be the same on every replica."""
    name = table if type(table) is str else f"<{type(table).__name__}>"
    if isinstance(key, tuple) and all(type(p) in _KEY_PART_TYPES for p in key):
        text = f"{name}{key!r}"
    else:
        text = f"{name}(<{type(key).__name__}>)"
    return text if len(text) <= _REPR_CHARS_MAX else text[: _REPR_CHARS_MAX - 3] + "..."
