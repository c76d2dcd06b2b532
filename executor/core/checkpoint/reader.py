"""One checkpoint file read back: its header (``read_info``), its rows frames as rows, as
keys and rows' bytes, or as digests (``_frames``), and a base's or static file's rows
hashed against its header without building tables (``_check_hash_only``).

Invariant: a file reads whole or raises ``CheckpointInvalid`` (naming its epoch): every
frame's CRC holds, the header is well formed (and the one expected), the footer is
present with nothing after it, and its row count and hash agree with the header and
with the rows read. A problem found at the end is raised after the last frame, so a
caller builds from a file's rows only what it throws away then (a fresh Storage).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import accumulate
from pathlib import Path
from typing import Any

import msgpack

from executor.core.checkpoint.format import (
    _ANSWERS_TAG,
    _ARRAY_HEADER,
    _HEADER_FIELDS,
    _MASK64,
    _ROWS_TAG,
    _VERSIONS,
    BASE,
    DELTA,
    END,
    MAGIC,
    NAME_RE,
    STATIC,
    VERSION,
    Answer,
    CheckpointInfo,
    CheckpointInvalid,
    _digest,
    _first,
    _second,
)
from sequencer.log import LogCorruption, iter_file_frames
from txn_library.errors import invariant

_U32 = struct.Struct("<I")
invariant(array("I").itemsize == 4, "array('I') must hold 32-bit lengths")


def _epoch_of(path: Path) -> int | None:
    m = NAME_RE.fullmatch(path.name)
    return int(m.group(1)) if m is not None else None


def _header(payload: bytes, path: Path) -> CheckpointInfo:
    epoch = _epoch_of(path)
    try:
        h = msgpack.unpackb(payload, use_list=False)
    except Exception as e:  # a CRC-valid frame that msgpack refuses: not ours
        raise CheckpointInvalid(f"{path}: undecodable header: {e}", epoch) from None
    if not (isinstance(h, tuple) and len(h) >= 2 and h[0] == MAGIC):
        raise CheckpointInvalid(f"{path}: not an Ordo checkpoint", epoch)
    if h[1] not in _VERSIONS:
        raise CheckpointInvalid(f"{path}: checkpoint version {h[1]}, expected {VERSION}", epoch)
    if (
        len(h) != _HEADER_FIELDS
        or h[11] not in (BASE, DELTA, STATIC)
        or not all(type(x) is int for i, x in enumerate(h[2:], 2) if i != 11)
    ):
        raise CheckpointInvalid(f"{path}: malformed header", epoch)
    return replace(CheckpointInfo(path, *h[2:_HEADER_FIELDS]), version=h[1])


def read_info(path: Path) -> CheckpointInfo:
    """The header only (cheap); does not validate the rows."""
    try:
        with open(path, "rb") as f:
            first = next(iter_file_frames(f, path))
    except (StopIteration, LogCorruption, OSError) as e:
        raise CheckpointInvalid(f"{path}: unreadable header: {e}", _epoch_of(path)) from None
    return _header(first, path)


def _frame_rows(payload: bytes, path: Path, epoch: int | None) -> tuple[bytes, list[bytes]]:
    """(body, each row's bytes) of one version 2 rows frame, from its bytes alone: its n
    lengths must add up to its body after a msgpack array header of n."""
    try:
        (n,) = _U32.unpack_from(payload, 1)
        lengths_end = 5 + 4 * n
        lengths = array("I")
        lengths.frombytes(payload[5:lengths_end])
    except Exception as e:
        raise CheckpointInvalid(f"{path}: undecodable rows frame: {e}", epoch) from None
    if sys.byteorder != "little":
        lengths.byteswap()
    body = payload[lengths_end:]
    first = len(body) - sum(lengths)
    header = _ARRAY_HEADER(n)
    if len(lengths) != n or first != len(header) or body[:first] != header:
        raise CheckpointInvalid(f"{path}: rows frame does not match its lengths", epoch)
    offsets = list(accumulate(lengths, initial=first))
    return body, list(map(body.__getitem__, map(slice, offsets, offsets[1:])))


# A rows frame's keys: (table, keys, positions of deleted rows), one per row.
Keyed = tuple[str, tuple, tuple]


def _keyed_frame(payload: bytes, path: Path, epoch: int | None) -> tuple[Keyed, tuple]:
    """((table, keys, deleted positions), each row's bytes) of one version 3 rows frame,
    checked for shape, rows not decoded (that each key is its row's is checked where a
    row is decoded: ``pending.fault``, ``_decode_rows``)."""
    try:
        table, keys, deleted, rows = msgpack.unpackb(memoryview(payload)[1:], use_list=False)
        ok = (
            type(table) is str
            and type(keys) is tuple
            and type(rows) is tuple
            and len(keys) == len(rows)
            and set(map(type, rows)) <= {bytes}
            and type(deleted) is tuple
            and all(type(i) is int and 0 <= i < len(rows) for i in deleted)
        )
    except Exception:
        ok = False
    if not ok:
        raise CheckpointInvalid(f"{path}: malformed rows frame", epoch)
    return (table, keys, deleted), rows


def _decode_rows(
    payload: bytes, path: Path, epoch: int | None, keyed: bool, digests: bool = True
) -> tuple[tuple, Sequence[bytes], list[int] | None]:
    """(rows, each row's bytes, their digests or None if not ``digests``) of one rows
    frame; its keys (version 3, ``keyed``) must be each row's table and key, and its
    deleted positions the rows of None."""
    if keyed:
        (table, keys, deleted), encodings = _keyed_frame(payload, path, epoch)
        body = _ARRAY_HEADER(len(encodings)) + b"".join(encodings)
    else:
        body, encodings = _frame_rows(payload, path, epoch)  # type: ignore[assignment]
    try:
        rows = msgpack.unpackb(body, use_list=False)
    except Exception as e:
        raise CheckpointInvalid(f"{path}: undecodable rows frame: {e}", epoch) from None
    if not isinstance(rows, tuple) or len(rows) != len(encodings):
        raise CheckpointInvalid(f"{path}: rows frame does not match its lengths", epoch)
    if keyed:
        try:
            same = (
                all(r[0] == table for r in rows)
                and tuple(map(_second, rows)) == keys
                and tuple(i for i, r in enumerate(rows) if r[2] is None) == deleted
            )
        except (TypeError, IndexError):
            same = False
        if not same:
            raise CheckpointInvalid(f"{path}: a rows frame's keys do not name its rows", epoch)
    return rows, encodings, list(map(_digest, encodings)) if digests else None


def _frame_keys(
    payload: bytes, path: Path, epoch: int | None, keyed: bool
) -> tuple[Keyed, Sequence[bytes]]:
    """((table, keys, deleted positions), each row's bytes) of one rows frame: rows not
    decoded (version 3), or decoded for their keys (version 2)."""
    if keyed:
        return _keyed_frame(payload, path, epoch)
    rows, encodings, _ = _decode_rows(payload, path, epoch, False, digests=False)
    try:
        tables = set(map(_first, rows))
        deleted = tuple(i for i, r in enumerate(rows) if r[2] is None)
        keys = tuple(map(_second, rows))
    except (TypeError, IndexError) as e:
        raise CheckpointInvalid(f"{path}: malformed rows: {e}", epoch) from None
    if len(tables) != 1 or not all(type(t) is str for t in tables):
        raise CheckpointInvalid(f"{path}: a rows frame mixes tables", epoch)
    return (tables.pop(), keys, deleted), encodings


# What ``_frames`` yields per rows frame.
_ROWS, _KEYS, _DIGESTS = "rows", "keys", "digests"


def _frames(path: Path, expect: CheckpointInfo | None, what: str = _ROWS) -> Iterator[Any]:
    """Every rows frame of one file, after checking its header (equal to ``expect``'s if
    given), as ``what`` says: _ROWS (rows, encodings, digests); _KEYS ((table, keys,
    deleted positions), encodings), rows not decoded (version 3); _DIGESTS (rows, sum
    of their digests), rows not decoded. Checks CRCs, the footer and the row count, and
    raises CheckpointInvalid after the last frame if anything is wrong."""
    epoch = _epoch_of(path) if expect is None else expect.epoch
    try:
        with open(path, "rb") as f:
            frames = iter_file_frames(f, path)
            first = next(frames, None)
            if first is None:
                raise CheckpointInvalid(f"{path}: empty file", epoch)
            info = _header(first, path)
            if expect is not None and info != expect:
                raise CheckpointInvalid(f"{path}: header changed while reading it", epoch)
            keyed = info.version >= 3
            count = 0
            for payload in frames:
                if payload[:1] == _ROWS_TAG:
                    if what == _DIGESTS:
                        summed = _frame_digests(payload, path, epoch, keyed)
                        count += summed[0]
                        yield summed
                    elif what == _KEYS:
                        found = _frame_keys(payload, path, epoch, keyed)
                        count += len(found[1])
                        yield found
                    else:
                        decoded = _decode_rows(payload, path, epoch, keyed)
                        count += len(decoded[0])
                        yield decoded
                    continue
                if payload[:1] == _ANSWERS_TAG:
                    continue  # read_answers reads them
                _footer(payload, path, info, count)
                if next(frames, None) is not None:
                    raise CheckpointInvalid(f"{path}: data after the footer", epoch)
                return
    except LogCorruption as e:
        raise CheckpointInvalid(f"{path}: {e}", epoch) from None
    except OSError as e:
        raise CheckpointInvalid(f"{path}: {e}", epoch) from None
    raise CheckpointInvalid(f"{path}: no footer (torn write?)", epoch)


def _answers(payload: bytes, path: Path, epoch: int | None) -> list[Answer]:
    try:
        answers = msgpack.unpackb(payload[1:], use_list=False, strict_map_key=False)
        if type(answers) is tuple and all(
            type(a) is tuple and len(a) == 3 and type(a[0]) is int and type(a[1]) is int
            for a in answers
        ):
            return list(answers)
    except Exception:
        pass
    raise CheckpointInvalid(f"{path}: malformed answers frame", epoch)


def read_answers(path: Path) -> list[Answer]:
    """The answers ``path`` carries (oldest first; none before version 4). Checks each
    frame's CRC, not the rows (read it after loading the file: ``load``)."""
    epoch = _epoch_of(path)
    out: list[Answer] = []
    try:
        with open(path, "rb") as f:
            for payload in iter_file_frames(f, path):
                if payload[:1] == _ANSWERS_TAG:
                    out += _answers(payload, path, epoch)
    except LogCorruption as e:
        raise CheckpointInvalid(f"{path}: {e}", epoch) from None
    except OSError as e:
        raise CheckpointInvalid(f"{path}: {e}", epoch) from None
    return out


def _footer(payload: bytes, path: Path, info: CheckpointInfo, count: int) -> None:
    try:
        footer = msgpack.unpackb(payload, use_list=False)
    except Exception as e:
        raise CheckpointInvalid(f"{path}: undecodable footer: {e}", info.epoch) from None
    want_hash = info.static_hash if info.kind == STATIC else info.state_hash
    if not (isinstance(footer, tuple) and len(footer) == 3 and footer[0] == END):
        raise CheckpointInvalid(f"{path}: malformed footer", info.epoch)
    if footer[1] != count or info.rows != count:
        raise CheckpointInvalid(
            f"{path}: footer says {footer[1]} rows, header {info.rows}, read {count}", info.epoch
        )
    if footer[2] != want_hash:
        raise CheckpointInvalid(f"{path}: footer hash differs from the header's", info.epoch)


def _frame_digests(payload: bytes, path: Path, epoch: int | None, keyed: bool) -> tuple[int, int]:
    """(rows, sum of their digests) of one rows frame, without decoding the rows."""
    if keyed:
        encodings: Sequence[bytes] = _keyed_frame(payload, path, epoch)[1]
    else:
        encodings = _frame_rows(payload, path, epoch)[1]
    return len(encodings), sum(map(_digest, encodings))


def _check_hash_only(
    path: Path, expect: CheckpointInfo | None, *, decode: bool = True
) -> CheckpointInfo:
    """Validate a base or static file without building tables: CRCs, counts, and the sum
    of its rows' digests against its header. ``decode=False`` skips decoding the rows
    (their bytes are digested, not parsed): for a file whose header hash equals that
    of a state known to be right (a replayed one), where bytes that hash to it are
    that state's rows."""
    info = expect if expect is not None else read_info(path)
    if info.kind == DELTA:
        raise CheckpointInvalid(f"{path}: a delta cannot be checked alone", info.epoch)
    total = 0
    if decode:
        for rows, _encodings, digests in _frames(path, info):
            if any(r[2] is None for r in rows):
                raise CheckpointInvalid(f"{path}: a deleted row in a {info.kind}", info.epoch)
            total += sum(digests)
    else:
        for _n, digests_sum in _frames(path, info, _DIGESTS):
            total += digests_sum
    want = info.static_hash if info.kind == STATIC else info.state_hash
    if total & _MASK64 != want:
        raise CheckpointInvalid(
            f"{path}: rows hash to {total & _MASK64:016x}, header says {want:016x}", info.epoch
        )
    return info
