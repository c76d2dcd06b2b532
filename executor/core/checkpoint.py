"""Partition checkpoints: consistent snapshots at epoch boundaries, written atomically
as chains of a base and deltas.

A partition checkpoints after epoch E when E's batch carries the checkpoint flag
(the sequencer sets it every N epochs / seconds, or on request), so every partition
of every replica snapshots at the *same* boundaries and the history splits into
intervals that replay tooling can verify independently.

Files (in the replica's checkpoint directory; one partition's files never depend on
another's):
  ``{epoch:012d}-p{partition}.ckpt``  a checkpoint of the state at the end of epoch:
      base   every row of the partition's *partitioned* tables;
      delta  only the rows of keys written since its parent (the partition's previous
             written checkpoint), a deleted key as a row of None. The state at a delta
             is its base plus every delta of the chain up to it, in order.
  ``static-p{partition}-{static_hash:016x}.ckpt``  the replicated tables (TPC-C ITEM):
      written after genesis never change, so they are written once, named by their
      hash, and referenced by every checkpoint's ``static_hash`` (0: none).

Each file is a sequence of frames in the command log's frame encoding (``<II`` length
+ CRC32C, then payload; see sequencer.log.encode_frame):
  frame 0     header  [MAGIC, VERSION, replica, partition, partitions, epoch,
                       next_txn_id, txns_applied, state_hash, static_hash, created_ms,
                       kind, parent_epoch, parent_state_hash, base_epoch, depth, rows,
                       base_rows, chain_rows, previous_epoch]
              (previous_epoch: the partition's previous written checkpoint, whatever its
              kind, 0 if none, -1 if the writer did not say; a boundary between the two
              was not written by this partition: its writer was busy or failed. Replay
              tooling tells such a gap from a lost file.)
  frames 1..n rows    b"R", then msgpack([table, [n keys], [positions of deleted
                       rows], [n rows as bin]]): each row is exactly the bytes
                       msgpack([table, key, row]), which the state hash digests, so a
                       loader hashes the bytes it read instead of packing rows again, and
                       one unpacking of the frame gives keys and each row's bytes
                       without decoding a row (rows stay pending in the Storage until
                       read). A key is checked against its row wherever the row is
                       decoded (``Storage._fault``, a full check's ``_decode_rows``).
                       (Version 2 frames, still read: b"R", u32 n, n x u32 lengths, then
                       a msgpack array of the n rows; no keys: rows are decoded.)
                       At most ROWS_PER_FRAME rows of ONE table, cut once the frame
                       holds limits.checkpoint_frame_bytes_max bytes (a frame stays under
                       log_frame_bytes_max whatever the rows). Tables in name order;
                       a base's rows in the storage's dict order (the same on replicas
                       that executed the same history; a restored one may differ: the
                       rows and the hash are the same, the bytes of the file need not
                       be), the static file's keys sorted; a delta's rows are the bytes
                       its transactions packed (Storage.track_changes), in the order
                       first written since its parent.
  last frame  footer  [END, rows, state_hash] (the static file: its static hash)

When a partition writes a base (chain policy, one home: ``CheckpointChain``): its first
checkpoint (a partition started from genesis with periodic checkpoints writes its
genesis state as a base at epoch 0, before it serves), after a failed writer, and once
the chain since the base holds ``limits.checkpoint_chain_depth_max`` deltas or would
cost a load more than ``limits.checkpoint_chain_load_excess_max`` beyond a base of the
same state (``ChainTip.wants_base``; a delta's row costs ``DELTA_ROW_LOAD_WEIGHT`` of
a base's). So writing a checkpoint costs the rows written since the last one, and
loading one costs at most a bounded multiple of the partition's own data; the static
tables cost one file per content. A base packs only the tables written since the last
base other than by new keys: the frames of the rows a table held then are copied from
that base (read back, CRC checked; ``CheckpointWriter``), so an append-only table
costs its new rows. Files are written in process while the partition keeps working
(``CheckpointWriter``); ``write_checkpoint`` writes one at once (tests, simulator).

Invariants:
- Written to a temp file, fsynced, renamed, then the directory fsynced: a reader sees a
  whole file or none. A killed writer's temp file is deleted when its partition next
  starts (``remove_temp_files``, called by the process that owns its checkpoints).
- A checkpoint is valid only if every file of its chain (and its static file) reads
  whole: every frame's CRC holds, the footer is present, row counts match, each
  delta's parent link (epoch, state hash, depth, base, static hash) matches its
  parent's header; the base's and static file's rows hash to their headers; and the
  state the chain builds, hashed from the bytes of its rows, equals the checkpoint's
  header. (A load hashes a chain's deltas once, at its end; if the state differs it
  loads again file by file, each file's state against its header, to name the file
  at fault. A delta whose wrong row a later delta overwrites yields a right state: it
  fails only its own epoch's load, and verify's check of it.) An invalid one is
  skipped with a warning, never half-loaded; ``CheckpointInvalid.epoch`` names the
  file at fault.
- ``prune`` never removes a file that a kept checkpoint's chain needs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate, compress, islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from executor.core.storage import Changes, Storage
from sequencer.log import LogCorruption, encode_frame, frame_intact, iter_file_frames
from txn_library import limits
from txn_library.errors import detached, invariant
from txn_library.heap import gc_paused

log = logging.getLogger("ordo.checkpoint")

MAGIC = "ORDO-CKPT"
END = "END"
VERSION = 3
_VERSIONS = (2, 3)  # read; version 2's rows frames carry no keys (its rows are decoded)
BASE, DELTA, STATIC = "base", "delta", "static"
ROWS_PER_FRAME = 4096
# A delta's row costs a load about this many base rows (it lands in a full table: a
# TPC-C chain of seven deltas, W=2, measured 2026-11-25); chain policy and replay's
# run planning (executor.replay.spark_jobs.load_epochs) share it. Since rows load
# pending (2026-11-26) a base row costs 0.40-0.49 us and a delta row 0.6-1.05 us (an
# overwrite finds its key in a full dict), ~2x; kept at 1.5: a higher weight writes
# bases more often, which costs live throughput, and the loads are half as long as
# when it was set.
DELTA_ROW_LOAD_WEIGHT = 1.5
_HEADER_FIELDS = 20
_ROWS_TAG = b"R"
_U32 = struct.Struct("<I")
NAME_RE = re.compile(r"(\d{12})-p(\d+)\.ckpt")  # a checkpoint file: (epoch, partition)
_STATIC_NAME = re.compile(r"static-p(\d+)-([0-9a-f]{16})\.ckpt")
SKIP_NAME_RE = re.compile(r"(\d{12})-p(\d+)\.skipped")  # a skip marker: (epoch, partition)
_digest = xxhash.xxh3_64_intdigest
_ARRAY_HEADER = msgpack.Packer().pack_array_header
_MASK64 = (1 << 64) - 1
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)
invariant(array("I").itemsize == 4, "array('I') must hold 32-bit lengths")


class CheckpointInvalid(Exception):
    """A checkpoint file is torn, corrupt or inconsistent; skip it.

    ``epoch`` is the epoch of the file at fault (a delta's chain may fail at an older
    file; a static tables file is charged to the base that references it), None if
    unknown.
    """

    def __init__(self, message: str, epoch: int | None = None) -> None:
        super().__init__(message)
        self.epoch = epoch

    def __reduce__(self) -> tuple[type[CheckpointInvalid], tuple[str, int | None]]:
        return (type(self), (str(self), self.epoch))  # Spark pickles task exceptions


@dataclass(frozen=True)
class ChainTip:
    """The newest written checkpoint of a partition's chain, as its successor needs it."""

    epoch: int
    state_hash: int
    static_hash: int
    base_epoch: int
    depth: int  # deltas since the base (0: the base itself)
    base_rows: int
    chain_rows: int  # rows in the base and every delta up to this one

    def wants_base(self, delta_rows: int, state_rows: int) -> bool:
        """Whether the next checkpoint, ``delta_rows`` rows as a delta of a state of
        ``state_rows`` partitioned rows, should be a base.

        The rule bounds what a load of the chain costs against a load of a base of the
        same state (``state_rows`` rows): a base's rows, plus every delta row at
        ``DELTA_ROW_LOAD_WEIGHT`` (it lands in a full table, overwriting or growing it),
        at most ``1 + limits.checkpoint_chain_load_excess_max`` times as much. New
        keys count too: a delta row costs a load more than the same row in a base.
        (2026-11-25: a rule that counted only overwritten rows wrote a TPC-C base every
        17th checkpoint; the chains took 1.6x as long to load at recovery, for no
        live throughput the benchmark could tell from noise.)"""
        if self.depth + 1 > limits.checkpoint_chain_depth_max:
            return True
        deltas = self.chain_rows - self.base_rows + delta_rows
        cost = self.base_rows + DELTA_ROW_LOAD_WEIGHT * deltas
        return cost > (1 + limits.checkpoint_chain_load_excess_max) * max(state_rows, 1)


def next_tip(
    parent: ChainTip | None, epoch: int, state_hash: int, static_hash: int, rows: int
) -> ChainTip:
    """The tip after writing a checkpoint of ``rows`` rows at ``epoch`` (a base if no parent)."""
    if parent is None:
        return ChainTip(epoch, state_hash, static_hash, epoch, 0, rows, rows)
    return ChainTip(
        epoch,
        state_hash,
        static_hash,
        parent.base_epoch,
        parent.depth + 1,
        parent.base_rows,
        parent.chain_rows + rows,
    )


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    replica: int
    partition: int
    partitions: int
    epoch: int
    next_txn_id: int
    txns_applied: int
    state_hash: int
    static_hash: int
    created_ms: int
    kind: str = BASE
    parent_epoch: int = 0
    parent_state_hash: int = 0
    base_epoch: int = 0
    depth: int = 0
    rows: int = 0  # rows in this file
    base_rows: int = 0
    chain_rows: int = 0
    previous_epoch: int = -1  # this partition's previous written checkpoint (0: none, -1: ?)
    version: int = VERSION  # the file's format (2: rows frames without keys)

    @property
    def tip(self) -> ChainTip:
        return ChainTip(
            self.epoch,
            self.state_hash,
            self.static_hash,
            self.base_epoch,
            self.depth,
            self.base_rows,
            self.chain_rows,
        )


def checkpoint_name(epoch: int, partition: int) -> str:
    return f"{epoch:012d}-p{partition}.ckpt"


def static_name(partition: int, static_hash: int) -> str:
    return f"static-p{partition}-{static_hash:016x}.ckpt"


def skip_name(epoch: int, partition: int) -> str:
    return f"{epoch:012d}-p{partition}.skipped"


# a writer's temp file: a checkpoint's, a skip marker's or a static file's (its partition)
_TEMP_NAME = re.compile(
    r"(?:\d{12}-p(\d+)\.(?:ckpt|skipped)|static-p(\d+)-[0-9a-f]{16}\.ckpt)\.tmp"
)


def remove_temp_files(directory: Path, partition: int) -> list[Path]:
    """Delete ``partition``'s temp files in ``directory``: what a writer killed before
    its rename left (never read: a reader sees whole files only). Only a process that
    owns the partition's checkpoints may call it (cluster.ownership): another writer's
    file in progress would go too. The deleted paths."""
    removed = []
    for path in sorted(directory.glob("*.tmp")) if directory.is_dir() else []:
        m = _TEMP_NAME.fullmatch(path.name)
        if m is not None and int(m.group(1) or m.group(2)) == partition:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def mark_skipped(directory: Path, epoch: int, partition: int, previous_epoch: int) -> Path:
    """Record that ``partition`` left the boundary ``epoch`` unwritten on purpose (its
    writer of ``previous_epoch`` was still busy): a small marker file ([epoch,
    partition, previous_epoch]), written to a temp name and renamed, not fsynced. Its
    next checkpoint's header says the same (``previous_epoch``), but at the end of a
    history there is no next checkpoint, and without the marker replay tooling could
    not tell the skip from a lost file. A marker lost in a crash only brings that
    ambiguity back."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / skip_name(epoch, partition)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgpack.packb([epoch, partition, previous_epoch]))
    os.replace(tmp, path)
    return path


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Writing ---------------------------------------------------------------------------------
# A table's rows as captured for writing: (name, its keys in order or None for the
# dict's order, {key: msgpack([name, key, row])}, and whether it is a delta's change
# record, where None stands for a deleted key).
Captured = tuple[str, list[tuple] | None, dict[tuple, bytes | None], bool]
# A frame as the body writer yields it: (its table, None for the footer; its rows; bytes)
Frame = tuple[str | None, int, bytes]
# Where a file holds a table's rows: its rows frames as (offset, bytes, rows), in order.
FrameMap = dict[str, list[tuple[int, int, int]]]


@dataclass(frozen=True)
class BaseFrames:
    """A base this process wrote, for its next base to copy frames from
    (``CheckpointWriter``): the file, its first bytes (the header frame's length and
    CRC: a file replaced since has others), and where it holds each table's rows."""

    path: Path
    stamp: bytes
    tables: FrameMap


def _rows_frame(
    packer: msgpack.Packer, table: str, keys: list[tuple], deleted: list[int], parts: list[bytes]
) -> bytes:
    return encode_frame(_ROWS_TAG + packer.pack((table, keys, deleted, parts)))


def _cut(parts: list[bytes], frame_bytes_max: int) -> Iterator[tuple[int, int]]:
    """``parts`` in frames (bounds), each cut after the row that takes it to the byte
    budget."""
    if sum(map(len, parts)) < frame_bytes_max:
        yield 0, len(parts)
        return
    start = chunk_bytes = 0
    for i, data in enumerate(parts, 1):
        chunk_bytes += len(data)
        if chunk_bytes >= frame_bytes_max:
            yield start, i
            start, chunk_bytes = i, 0
    if start < len(parts):
        yield start, len(parts)


def _body_frames(
    header: list[Any],
    tables: list[Captured],
    path: Path,
    copied: Callable[[str], Iterator[tuple[bytes, int]]] | None = None,
) -> Iterator[Frame | None]:
    """The frames after the header: rows (one table per frame), then the footer. Yields
    None once a table's rows are in order (a pause point for a sliced writer).

    ``copied(table)``: whole frames (and their rows) of the table's first rows in dict
    order, written before (a base's frames of a table that only grew since:
    ``CheckpointWriter``); the table's rows after those are packed."""
    packer = msgpack.Packer(autoreset=True)
    pack = packer.pack
    frame_bytes_max = limits.checkpoint_frame_bytes_max
    count = 0
    for name, keys, rows, changes in tables:
        done = 0
        for frame, n in copied(name) if copied is not None else ():
            done += n
            yield name, n, frame
        count += done
        if keys is None:  # a delta's keys in the order written, a base's in dict order
            values = list(islice(rows.values(), done, None))
            keys = list(islice(rows, done, None))
        else:
            invariant(done == 0, "frames copied of a table written in key order")
            values = list(map(rows.__getitem__, keys))
        yield None  # a pause point: the table's rows are in order
        for i in range(0, len(values), ROWS_PER_FRAME):
            parts = values[i : i + ROWS_PER_FRAME]
            some = keys[i : i + ROWS_PER_FRAME]
            deleted: list[int] = []
            if changes and None in parts:  # a deleted key is packed here
                deleted = [j for j, p in enumerate(parts) if p is None]
                parts = [p or pack((name, k, None)) for p, k in zip(parts, some, strict=True)]
            frame = _rows_frame(packer, name, some, deleted, parts)  # type: ignore[arg-type]
            if len(frame) <= frame_bytes_max:  # its rows are fewer bytes: no cut (_cut)
                count += len(parts)
                yield name, len(parts), frame
                continue
            for start, end in _cut(parts, frame_bytes_max):  # type: ignore[arg-type]
                count += end - start
                gone = [j - start for j in deleted if start <= j < end]
                yield (
                    name,
                    end - start,
                    _rows_frame(packer, name, some[start:end], gone, parts[start:end]),  # type: ignore[arg-type]
                )
    invariant(count == header[16], f"{path}: packed {count} rows, header says {header[16]}")
    footer = [END, count, header[9] if header[11] == STATIC else header[8]]
    yield None, 0, encode_frame(pack(footer))


def _write_all(path: Path, header: list[Any], frames: Iterable[Frame | None]) -> None:
    """Header and frames to a temp file, fsync, rename (the caller fsyncs the directory).
    The static tables file's writer (written once; checkpoints: CheckpointWriter)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(encode_frame(msgpack.packb(header)))
        for frame in frames:
            if frame is not None:
                f.write(frame[2])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _header_list(
    replica: int,
    partition: int,
    partitions: int,
    epoch: int,
    next_txn_id: int,
    txns_applied: int,
    state_hash: int,
    static_hash: int,
    kind: str,
    parent: ChainTip | None,
    tip: ChainTip | None,
    rows: int,
    previous_epoch: int = -1,
) -> list[Any]:
    """The header frame's fields (a static tables file has neither parent nor tip)."""
    link = (0, 0) if parent is None else (parent.epoch, parent.state_hash)
    chain = (0, 0, 0, 0)
    if tip is not None:
        chain = (tip.base_epoch, tip.depth, tip.base_rows, tip.chain_rows)
    return [
        MAGIC,
        VERSION,
        replica,
        partition,
        partitions,
        epoch,
        next_txn_id,
        txns_applied,
        state_hash,
        static_hash,
        int(time.time() * 1000),
        kind,
        link[0],
        link[1],
        chain[0],
        chain[1],
        rows,
        chain[2],
        chain[3],
        previous_epoch,
    ]


def _static_tables(storage: Storage) -> list[tuple[str, dict[tuple, bytes]]]:
    """The replicated tables' encoded rows (never written after genesis, so safe to read
    from the writer thread)."""
    return [
        (n, storage.lend_encoded(n)[0]) for n in sorted(storage.tables) if storage.is_replicated(n)
    ]


def ensure_static(
    directory: Path,
    tables: list[tuple[str, dict[tuple, bytes]]],
    static_hash: int,
    ids: tuple[int, int, int],
) -> None:
    """Write the replicated tables' file (``ids``: replica, partition, partitions) from
    their encoded rows (``_static_tables``) unless a valid one with this hash exists."""
    if static_hash == 0:
        return
    replica, partition, partitions = ids
    path = directory / static_name(partition, static_hash)
    if path.exists():
        if _static_seen.get(path) == _static_stamp(path, static_hash):
            return  # this process wrote or checked it, and it has not changed since
        try:
            # Digests only, not decoded: we hold the state whose hash names the file, so
            # rows whose bytes hash to it (under valid CRCs) are that state's rows.
            info = _check_hash_only(path, None, decode=False)
            if (info.kind, info.static_hash) == (STATIC, static_hash):
                _static_seen[path] = _static_stamp(path, static_hash)
                return
            log.warning("rewriting the static tables file %s: its header names another", path)
        except CheckpointInvalid as e:
            log.warning("rewriting the static tables file: %s", e)
    rows = sum(len(t) for _, t in tables)
    header = _header_list(
        replica, partition, partitions, 0, 0, 0, 0, static_hash, STATIC, None, None, rows
    )
    captured: list[Captured] = [(n, sorted(t), t, False) for n, t in tables]  # type: ignore[misc]
    _write_all(path, header, _body_frames(header, captured, path))
    _static_seen[path] = _static_stamp(path, static_hash)


# Static files this process wrote or checked: path -> (static hash, size, mtime_ns) then.
# Every base names its static file; checking it again at each base decoded its 100,000
# TPC-C ITEM rows each time (~6% of a partition's CPU under New Order with checkpoints
# every 200 epochs). A file replaced, rewritten or truncated since has another stamp and
# is checked again; loads validate it fully either way.
_static_seen: dict[Path, tuple[int, int, int]] = {}


def _static_stamp(path: Path, static_hash: int) -> tuple[int, int, int]:
    st = path.stat()
    return static_hash, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class PlannedCheckpoint:
    """What the checkpoint of one boundary will be (``CheckpointChain.plan``)."""

    epoch: int
    parent: ChainTip | None  # None: a base
    changes: Changes | None  # a delta's keys (with the rows they held at the parent)
    previous_epoch: int
    tip: ChainTip  # the chain's tip once it is written
    rows: int


class CheckpointWriter:
    """Writes one planned checkpoint while its partition keeps working: no fork, and no
    stall beyond capturing references at the boundary.

    The capture (in the constructor, at the boundary): a delta's change record, taken
    from the storage then (each written key's row as the transaction packed it: nothing
    to look up or pack), or a base's encoded rows, lent by the storage without a copy
    (``Storage.lend_encoded``; written in dict order). The storage copies a lent dict
    before it changes it (transactions' writes never do; folding the next record or a
    loader would), and encoded rows are immutable bytes, so the capture is the
    boundary's state whatever the partition does next; the chain returns them once the
    writer is done (``CheckpointChain.written``/``failed``). The owner then calls
    ``step`` between its other work: it cuts the next frames (one table per frame, as
    the format wants; no row is packed) and appends them to the temp file itself (into
    the page cache, starting their write-back every ``limits.checkpoint_sync_bytes``)
    until its time budget is spent or the file is ahead of
    ``limits.checkpoint_write_bytes_per_s``. After the last frame a thread fsyncs,
    looks after the static tables file, renames and fsyncs the directory. (Earlier
    versions handed every frame to a thread that wrote and synced it; each GIL
    hand-off may cost the partition a scheduler slice on a busy machine.) ``outcome``
    is None while in progress, then True (the file is in place and its directory
    fsynced) or the exception that stopped it.

    A base copies instead of packing where it can (``copy_from``: the previous base
    this process wrote, ``CheckpointChain``): a table whose encoded rows only grew at
    their end since that base lent them (``Storage.lend_encoded``'s count of kept rows,
    equal to the rows that base wrote of it) starts with that base's frames of it, read
    back one at a time and written unchanged if each is whole and its CRC holds (else
    the rest of the table is packed: a base never depends on another file, and a
    damaged frame is never carried on). Under New Order that is every table but STOCK
    and DISTRICT: ORDER-LINE, ORDERS and NEW-ORDER only grow, CUSTOMER and HISTORY are
    not written.

    Why not fork a writer (as earlier versions did): a forked Python process touches
    the reference count of every row it writes, so it copies the page of every such
    row, and a fork stalls the parent for the page tables of its whole heap; in-process
    packing costs the packing alone.
    """

    def __init__(
        self,
        directory: Path,
        storage: Storage,
        planned: PlannedCheckpoint,
        *,
        replica: int,
        partition: int,
        partitions: int,
        next_txn_id: int,
        txns_applied: int,
        copy_from: BaseFrames | None = None,
    ) -> None:
        self.planned = planned
        self.directory = directory
        self.path = directory / checkpoint_name(planned.epoch, partition)
        parent, changes = planned.parent, planned.changes
        invariant((parent is None) == (changes is None), "a delta needs a parent and changes")
        tables: list[Captured]
        static: list[tuple[str, dict[tuple, bytes]]] = []
        copy: FrameMap = {}  # table -> frames of copy_from to copy
        self.layout: FrameMap = {}  # where this base holds each table's rows
        if parent is None:
            tables = []
            for n in sorted(storage.tables):
                if storage.is_replicated(n):
                    continue
                # dict order: a loader sorts an ordered table's keys anyway (near-sorted:
                # fast), and taking rows by sorted key here would cost a lookup a row
                enc, kept = storage.lend_encoded(n)
                tables.append((n, None, enc, False))  # type: ignore[arg-type]
                frames = copy_from.tables.get(n) if copy_from is not None else None
                if kept and frames and sum(map(_third, frames)) == kept:
                    copy[n] = frames
            static = _static_tables(storage)
            kind = BASE
        else:
            invariant(parent.static_hash == storage.static_hash, "the static tables changed")
            assert changes is not None
            tables = [(t, None, record, True) for t, record in sorted(changes.items()) if record]
            kind = DELTA
        rows = sum(len(r) for _, _, r, _ in tables)
        invariant(rows == planned.rows, f"captured {rows} rows, planned {planned.rows}")
        self.header = _header_list(
            replica,
            partition,
            partitions,
            planned.epoch,
            next_txn_id,
            txns_applied,
            storage.state_hash,
            storage.static_hash,
            kind,
            parent,
            planned.tip,
            rows,
            planned.previous_epoch,
        )
        self._static = static
        self._static_hash = storage.static_hash
        self._ids = (replica, partition, partitions)
        self._copier = _FrameCopier(planned.epoch, copy_from, copy)
        self._frames = _body_frames(self.header, tables, self.path, self._copier.frames)
        self._packed = False
        self._outcome: bool | BaseException | None = None
        self._thread: threading.Thread | None = None
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._fd: int | None = None
        self._written = self._advised = 0
        self._started = time.monotonic()
        head = encode_frame(msgpack.packb(self.header))
        self._stamp = head[:8]
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._write(head)
        except Exception as e:
            self._fail(e)

    @property
    def copied_rows(self) -> int:
        return self._copier.rows

    def base_frames(self) -> BaseFrames:
        """Where this base (written) holds each table's rows, for the next base."""
        invariant(self.outcome is True and self.planned.parent is None, "a written base")
        return BaseFrames(self.path, self._stamp, self.layout)

    def _write(self, data: bytes) -> None:
        """Append to the temp file (the page cache: no GIL hand-off to a thread); every
        ``limits.checkpoint_sync_bytes`` start its write-back (POSIX_FADV_DONTNEED on
        Linux writes dirty pages back without waiting), so the final fsync is short."""
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self._written += len(data)
        if self._written - self._advised >= limits.checkpoint_sync_bytes:
            os.posix_fadvise(
                self._fd, self._advised, self._written - self._advised, os.POSIX_FADV_DONTNEED
            )
            self._advised = self._written

    def _ahead_s(self) -> float:
        """How far the file is ahead of its pace (``limits.checkpoint_write_bytes_per_s``
        after the first ``checkpoint_sync_bytes``), in seconds."""
        extra = self._written - limits.checkpoint_sync_bytes
        return extra / limits.checkpoint_write_bytes_per_s - (time.monotonic() - self._started)

    def _fail(self, e: BaseException) -> None:
        """Stop, keeping what stopped it for the owner, without its tracebacks: they
        hold this writer's frames, a cycle through the rows it captured that a
        partition (which freezes what outlives a loop turn: storage.settle_turn) would
        never free."""
        self._outcome = detached(e)
        self._copier.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._tmp.unlink(missing_ok=True)

    def step(self, budget_s: float, pace: bool = True) -> None:
        """Cut and write frames for about ``budget_s`` seconds, or until the file is
        ahead of its pace (unless ``pace`` is False); after the last frame a thread
        fsyncs and renames it."""
        if self._packed or self._outcome is not None:
            return  # done, or stopped (its outcome says why)
        deadline = time.perf_counter() + budget_s
        try:
            while not (pace and self._ahead_s() > 0):
                frame = next(self._frames, _DONE)
                if frame is _DONE:
                    self._packed = True
                    self._copier.close()
                    self._thread = threading.Thread(
                        target=self._run, name=f"checkpoint-{self.planned.epoch}", daemon=True
                    )
                    self._thread.start()
                    return
                if frame is not None:
                    table, rows, data = frame
                    if table is not None and self.planned.parent is None:  # a base's frames
                        self.layout.setdefault(table, []).append((self._written, len(data), rows))
                    self._write(data)
                if time.perf_counter() >= deadline:
                    return
        except Exception as e:  # handed to the owner, who decides (never lost)
            self._fail(e)

    @property
    def outcome(self) -> bool | BaseException | None:
        """None while in progress; True once durable; else what stopped it."""
        if self._thread is not None and self._thread.is_alive():
            return None
        return self._outcome

    def complete(self) -> bool | BaseException:
        """Write the rest now, unpaced, and wait for the thread; the outcome (True:
        durable)."""
        while not self._packed and self._outcome is None:
            self.step(1.0, pace=False)
        if self._thread is not None:
            self._thread.join()
        assert self._outcome is not None
        return self._outcome

    def finish(self) -> Path:
        """``complete``, raising what stopped the writer if anything did."""
        outcome = self.complete()
        if outcome is not True:
            raise outcome  # type: ignore[misc]
        return self.path

    def _run(self) -> None:
        """The writer thread: fsync the temp file, the static tables file if missing,
        rename, fsync the directory (all I/O: the GIL is released)."""
        try:
            assert self._fd is not None
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            if self._static:
                ensure_static(self.directory, self._static, self._static_hash, self._ids)
            os.replace(self._tmp, self.path)
            _fsync_dir(self.directory)
            self._outcome = True
        except BaseException as e:  # handed to the owner, who decides (never lost)
            self._fail(e)


_DONE: Any = object()


class _FrameCopier:
    """The frames a base copies from the previous base (``CheckpointWriter``): each read
    back whole, its CRC checked; at the first that is not whole or fails its CRC, or if
    the file is not the one written, none more (the caller packs those rows). Holds no
    reference to its writer (a writer must be freed by reference counting)."""

    def __init__(self, epoch: int, base: BaseFrames | None, copy: FrameMap) -> None:
        self.epoch = epoch
        self.copy = copy
        self.rows = 0
        self._fd: int | None = None
        if base is None or not copy:
            self.copy = {}
            return
        try:
            self._fd = os.open(base.path, os.O_RDONLY)
            same = os.pread(self._fd, len(base.stamp), 0) == base.stamp
        except OSError as e:
            self._give_up(str(e))
            return
        if not same:
            self._give_up(f"{base.path} is not the base written")

    def frames(self, table: str) -> Iterator[tuple[bytes, int]]:
        for offset, length, rows in self.copy.get(table, ()):
            assert self._fd is not None
            try:
                frame = os.pread(self._fd, length, offset)
            except OSError as e:
                frame, why = b"", str(e)
            else:
                why = "not whole or its CRC fails"
            if not frame_intact(frame):
                self._give_up(f"{table}'s frame at offset {offset} of the previous base is {why}")
                return
            self.rows += rows
            yield frame, rows

    def _give_up(self, why: str) -> None:
        log.warning("checkpoint %d packs rows it would have copied: %s", self.epoch, why)
        self.close()

    def close(self) -> None:
        self.copy = {}
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_checkpoint(
    directory: Path,
    storage: Storage,
    *,
    replica: int,
    partition: int,
    partitions: int,
    epoch: int,
    next_txn_id: int,
    txns_applied: int,
    parent: ChainTip | None = None,
    changes: Mapping[str, Iterable[tuple]] | None = None,
    previous_epoch: int | None = None,
) -> Path:
    """Write one checkpoint atomically now (temp file + fsync + rename + fsync dir).

    Without ``parent`` a base (and the static tables file if it is missing); with it a
    delta holding the current rows of ``changes``' keys (the keys written since
    ``parent``'s epoch; see Storage.track_changes), None for a deleted key.
    ``previous_epoch``: the partition's previous written checkpoint, 0 if none (default:
    the parent's epoch for a delta, -1 = not known for a base).
    """
    invariant((parent is None) == (changes is None), "a delta needs a parent and its changes")
    delta: Changes | None = None
    if changes is not None:
        pack = msgpack.Packer(autoreset=True).pack
        delta = {}
        for t, keys in changes.items():
            now = {k: storage.get(t, k) for k in keys}
            delta[t] = {k: None if r is None else pack((t, k, r)) for k, r in now.items()}
    rows = storage.partitioned_row_count() if delta is None else sum(map(len, delta.values()))
    tip = next_tip(parent, epoch, storage.state_hash, storage.static_hash, rows)
    if previous_epoch is None:
        previous_epoch = -1 if parent is None else parent.epoch
    planned = PlannedCheckpoint(epoch, parent, delta, previous_epoch, tip, rows)
    writer = CheckpointWriter(
        directory,
        storage,
        planned,
        replica=replica,
        partition=partition,
        partitions=partitions,
        next_txn_id=next_txn_id,
        txns_applied=txns_applied,
    )
    return writer.finish()


class CheckpointChain:
    """A partition's checkpoint chain: what its next checkpoint is, and what it follows.

    The rule (one home for it): the next checkpoint is a delta of the keys written since
    the tip (the newest *written* checkpoint) unless there is no tip (genesis, a failed
    writer) or the tip wants a base (``ChainTip.wants_base``, checked as the record
    grows: ``bound_record``). Changes are recorded from the first checkpoint on, a key
    at most once (so the record never outgrows the partition): a delta is the record,
    and a base is the storage's encoded rows with the record folded in
    (``Storage.encoded``), so neither packs a row.
    Writing is the owner's: ``plan`` at the boundary, then ``writer`` (stepped by the
    owner's loop) or ``write`` (at once), then ``written`` or ``failed``.
    """

    def __init__(self, storage: Storage, restored: CheckpointInfo | None = None) -> None:
        self.storage = storage
        self.tip: ChainTip | None = None if restored is None else restored.tip
        self.written_epoch = 0 if restored is None else restored.epoch
        self.base: BaseFrames | None = None  # the last base written here (frames to copy)
        self._writing: CheckpointWriter | None = None
        if self.tip is not None:
            storage.track_changes()

    def bound_record(self) -> None:
        """Once the record has grown past what a delta may hold, the next checkpoint is a
        base. Recording goes on (it holds a key at most once, so it never outgrows the
        partition): the base's encoded rows are the storage's updated with it."""
        tip, storage = self.tip, self.storage
        if (
            tip is not None
            and storage.tracking
            and tip.wants_base(storage.changed_count(), storage.partitioned_row_count())
        ):
            self.tip = None

    def plan(self, epoch: int) -> PlannedCheckpoint:
        """The checkpoint of ``epoch`` (the state now); recording restarts from here."""
        storage = self.storage
        parent = self.tip
        changes = storage.take_changes() if parent is not None and storage.tracking else None
        rows = 0 if changes is None else sum(map(len, changes.values()))
        if (
            parent is None
            or changes is None
            or parent.wants_base(rows, storage.partitioned_row_count())
        ):
            parent, changes = None, None
            rows = storage.partitioned_row_count()
            storage.track_changes()  # the next delta records from this base on
        tip = next_tip(parent, epoch, storage.state_hash, storage.static_hash, rows)
        return PlannedCheckpoint(epoch, parent, changes, self.written_epoch, tip, rows)

    def writer(
        self,
        directory: Path,
        planned: PlannedCheckpoint,
        *,
        replica: int,
        partition: int,
        partitions: int,
        next_txn_id: int,
        txns_applied: int,
    ) -> CheckpointWriter:
        """Start writing ``planned`` (call at its boundary: it captures the state now)."""
        self._writing = CheckpointWriter(
            directory,
            self.storage,
            planned,
            replica=replica,
            partition=partition,
            partitions=partitions,
            next_txn_id=next_txn_id,
            txns_applied=txns_applied,
            copy_from=self.base if planned.parent is None else None,
        )
        return self._writing

    def write(self, directory: Path, planned: PlannedCheckpoint, **ids: int) -> Path:
        """Write ``planned`` now, from the state at its boundary (the state now);
        ``ids`` as ``writer`` takes them."""
        return self.writer(directory, planned, **ids).finish()

    def written(self, planned: PlannedCheckpoint) -> None:
        self.tip = planned.tip
        self.written_epoch = planned.epoch
        writer, self._writing = self._writing, None
        if planned.parent is None:  # the next base copies from this one if it can
            mine = writer is not None and writer.planned is planned
            self.base = writer.base_frames() if mine else None  # type: ignore[union-attr]
        self.storage.return_encoded()

    def failed(self) -> None:
        """The planned checkpoint was not written: its changes are lost to the chain (the
        next checkpoint is a base, which packs every row; recording goes on, for its
        encoded rows)."""
        self.tip = None
        self.base = self._writing = None
        self.storage.return_encoded()


# Reading ---------------------------------------------------------------------------------
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
    row is decoded: ``Storage._fault``, ``_decode_rows``)."""
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
                _footer(payload, path, info, count)
                if next(frames, None) is not None:
                    raise CheckpointInvalid(f"{path}: data after the footer", epoch)
                return
    except LogCorruption as e:
        raise CheckpointInvalid(f"{path}: {e}", epoch) from None
    except OSError as e:
        raise CheckpointInvalid(f"{path}: {e}", epoch) from None
    raise CheckpointInvalid(f"{path}: no footer (torn write?)", epoch)


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


def chain_of(path: Path) -> list[CheckpointInfo]:
    """Headers of the chain that ``path``'s state needs, base first (headers only).

    Checks every parent link; raises CheckpointInvalid naming the file at fault.
    """
    info = read_info(path)
    if info.kind == STATIC:
        raise CheckpointInvalid(f"{path}: a static tables file, not a checkpoint")
    chain = [info]
    while info.kind == DELTA:
        parent_path = path.parent / checkpoint_name(info.parent_epoch, info.partition)
        if not info.parent_epoch < info.epoch:
            raise CheckpointInvalid(f"{info.path}: parent epoch {info.parent_epoch}", info.epoch)
        if not parent_path.exists():
            raise CheckpointInvalid(
                f"{info.path}: its parent {parent_path.name} is missing", info.parent_epoch
            )
        parent = read_info(parent_path)
        problem = _link_problem(parent, info)
        if problem is not None:
            raise CheckpointInvalid(f"{info.path}: {problem}", info.epoch)
        chain.append(parent)
        info = parent
    chain.reverse()
    return chain


def _link_problem(parent: CheckpointInfo, child: CheckpointInfo) -> str | None:
    if parent.kind == STATIC:
        return f"its parent {parent.path.name} is a static tables file"
    want = (child.parent_epoch, child.parent_state_hash, child.depth - 1, child.base_epoch)
    have = (parent.epoch, parent.state_hash, parent.depth, parent.base_epoch)
    if want != have:
        return (
            f"its parent link (epoch, hash, depth, base) {want} does not match "
            f"{parent.path.name}: {have}"
        )
    if (parent.partition, parent.partitions, parent.static_hash, parent.base_rows) != (
        child.partition,
        child.partitions,
        child.static_hash,
        child.base_rows,
    ):
        return f"partition, static tables or base size differ from {parent.path.name}"
    if parent.chain_rows + child.rows != child.chain_rows:
        return f"chain row count does not follow from {parent.path.name}"
    return None


def chain_epochs(path: Path) -> list[int]:
    """Epochs of the files ``path``'s chain names, newest first, as far as headers go
    (a missing or unreadable parent ends the list; nothing is validated)."""
    out = []
    current: Path | None = path
    while current is not None and current.exists():
        try:
            info = read_info(current)
        except CheckpointInvalid:
            out.append(_epoch_of(current) or 0)
            break
        out.append(info.epoch)
        if info.kind != DELTA or not info.parent_epoch < info.epoch:
            break
        current = current.parent / checkpoint_name(info.parent_epoch, info.partition)
    return out


def _load_file(
    info: CheckpointInfo, storage: Storage, charged_to: int | None, hashed: bool = True
) -> None:
    """Apply one file to ``storage``, validating it; its hash must then equal its
    header's (unless not ``hashed``: a file of a chain whose caller hashes the state
    at its end, ``load``). Rows are not decoded: each key's bytes become a pending row
    of the Storage (the writer wrote ``msgpack([table, key, row])`` and the CRC
    vouches for the bytes, so they are what packing would give; the key it is loaded
    under is checked when the row is decoded, ``Storage._fault``). Indexes are left to
    the caller (``Storage.defer_indexes``)."""
    path = info.path
    epoch = info.epoch if charged_to is None else charged_to
    try:
        for (table, keys, deleted), encodings in _frames(path, info, _KEYS):
            if info.kind == DELTA:
                _apply_delta_rows(storage, table, keys, deleted, encodings, hashed, path, epoch)
            else:
                _insert_rows(
                    storage, info.kind, table, keys, deleted, encodings, hashed, path, epoch
                )
    except CheckpointInvalid as e:
        raise CheckpointInvalid(str(e), epoch) from None
    if not hashed:
        return
    if info.kind == STATIC:
        ok = storage.static_hash == info.static_hash
        have, want = storage.static_hash, info.static_hash
    else:
        ok = storage.state_hash == info.state_hash
        have, want = storage.state_hash, info.state_hash
    if not ok:
        raise CheckpointInvalid(f"{path}: rows hash to {have:016x}, header says {want:016x}", epoch)


def _insert_rows(
    storage: Storage,
    kind: str,
    table: str,
    keys: tuple,
    deleted: tuple,
    encodings: Sequence[bytes],
    hashed: bool,
    path: Path,
    epoch: int,
) -> None:
    if deleted:
        raise CheckpointInvalid(f"{path}: a deleted row in a {kind}", epoch)
    try:
        if storage.is_replicated(table) != (kind == STATIC):
            raise CheckpointInvalid(f"{path}: table {table} does not belong in a {kind}", epoch)
        digests = sum(map(_digest, encodings)) if hashed else 0
        added = storage.insert_encoded(table, keys, encodings, digests)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise CheckpointInvalid(f"{path}: malformed rows: {e}", epoch) from None
    if added != len(keys):
        raise CheckpointInvalid(f"{path}: a key of {table} appears twice", epoch)


def _apply_delta_rows(
    storage: Storage,
    table: str,
    keys: tuple,
    deleted: tuple,
    encodings: Sequence[bytes],
    hashed: bool,
    path: Path,
    epoch: int,
) -> None:
    try:
        if storage.is_replicated(table):
            raise CheckpointInvalid(f"{path}: a delta writes a replicated table", epoch)
        digests = None
        if hashed:  # else a chain's delta, hashed with the whole state after it
            digests = list(map(_digest, encodings))
            for i in deleted:
                digests[i] = 0
        storage.install_encoded(table, keys, encodings, deleted, digests)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        raise CheckpointInvalid(f"{path}: malformed rows: {e}", epoch) from None


def load(path: Path) -> tuple[CheckpointInfo, Storage]:
    """Load and fully validate one checkpoint (its chain and static file) into a fresh
    Storage. Raises CheckpointInvalid naming the file at fault (``.epoch``).

    A chain's files (its base and deltas) are loaded unhashed, without hashing each
    overwritten row out; the state's hash is then computed once from every row's bytes
    and must equal the last file's header (the static file's hash, and every file's
    CRCs, counts and links, are validated as they are read). If it does not, the chain
    is loaded again file by file, each file's hash checked, to name the file at fault."""
    chain = chain_of(path)
    if len(chain) > 1:
        storage = _load_chain(path, chain, per_file=False)
        if storage.state_hash == chain[-1].state_hash:
            return chain[-1], storage
        del storage
    return chain[-1], _load_chain(path, chain, per_file=True)


def _load_chain(path: Path, chain: list[CheckpointInfo], per_file: bool) -> Storage:
    """The state of ``chain`` in a fresh Storage. ``per_file``: each file's hash checked
    against its header as it is applied (CheckpointInvalid naming it); else the base and
    deltas are loaded unhashed and the Storage's hash recomputed from its rows at the
    end, for the caller to compare (each base row is digested once, not twice)."""
    storage = Storage()
    with gc_paused(freeze=True):  # the loaded state is long-lived: see settle_heap
        static_hash = chain[0].static_hash
        if static_hash:
            static = path.parent / static_name(chain[0].partition, static_hash)
            try:
                info = read_info(static)
                if (info.kind, info.static_hash) != (STATIC, static_hash):
                    raise CheckpointInvalid(f"{static}: not the static tables file named")
            except CheckpointInvalid as e:
                raise CheckpointInvalid(str(e), chain[0].epoch) from None
            _load_file(info, storage, chain[0].epoch)
        for info in chain:
            _load_file(info, storage, None, hashed=per_file)
        if not per_file:
            storage.rehash_pending()
        storage.defer_indexes()  # each built when its table is first scanned
    return storage


def check(
    path: Path, storage: Storage | None = None, since: tuple[int, int] | None = None
) -> CheckpointInfo:
    """Validate one checkpoint file as ``load`` would, without loading its chain if it
    can: a base by the digests of its bytes (and its static file); a delta whose parent
    is ``since`` = (epoch, state hash) against ``storage``, a state whose hash equals
    the delta's header and that was exactly the parent's state when it started
    recording changes (``Storage.track_changes``, replay's way). Then the delta holds
    the right rows iff its keys are the keys written since and its rows' digests (of
    the bytes read) sum to those of the rows written: the parent's rows drop out of
    both sides. Anything else is loaded whole. A base (or static file) whose header
    hash equals ``storage``'s is checked by its bytes' digests without decoding them
    (``_check_hash_only``): bytes that hash to a right state's hash are its rows."""
    info = read_info(path)
    if info.kind == BASE:
        known = storage is not None and storage.state_hash == info.state_hash
        _check_hash_only(path, info, decode=not known)
        if info.static_hash:
            static = path.parent / static_name(info.partition, info.static_hash)
            known = storage is not None and storage.static_hash == info.static_hash
            try:
                _check_hash_only(static, None, decode=not known)
            except CheckpointInvalid as e:
                raise CheckpointInvalid(str(e), info.epoch) from None
        return info
    if info.kind != DELTA:
        raise CheckpointInvalid(f"{path}: a static tables file, not a checkpoint")
    if (
        storage is None
        or since is None
        or not storage.tracking
        or info.parent_epoch != since[0]
        or storage.state_hash != info.state_hash
    ):
        loaded, _ = load(path)
        return loaded
    if info.parent_state_hash != since[1]:
        raise CheckpointInvalid(
            f"{path}: names parent hash {info.parent_state_hash:016x}, the state at epoch "
            f"{since[0]} hashes to {since[1]:016x}",
            info.epoch,
        )
    if _delta_is_record(path, info, storage.changes()):
        return info
    keys: dict[str, set[tuple]] = {}
    total = 0
    for rows, _encodings, digests in _frames(path, info):
        tables = set(map(_first, rows))
        if len(tables) != 1:
            raise CheckpointInvalid(f"{path}: a rows frame of a delta mixes tables", info.epoch)
        (table,) = tables
        seen = keys.setdefault(table, set())
        before = len(seen)
        seen.update(map(_second, rows))
        if len(seen) - before != len(rows):
            raise CheckpointInvalid(f"{path}: a key of {table} appears twice", info.epoch)
        if None in list(map(_third, rows)):
            digests = [0 if r[2] is None else d for r, d in zip(rows, digests, strict=True)]
        total += sum(digests)
    written = {t: record for t, record in storage.changes().items() if record}
    if keys.keys() != written.keys() or any(keys[t] != written[t].keys() for t in keys):
        raise CheckpointInvalid(
            f"{path}: its keys are not the keys written since epoch {since[0]}", info.epoch
        )
    want = sum(_digest(b) for record in written.values() for b in record.values() if b)
    if total & _MASK64 != want & _MASK64:
        raise CheckpointInvalid(
            f"{path}: its rows hash to {total & _MASK64:016x}, the rows written since "
            f"epoch {since[0]} to {want & _MASK64:016x}",
            info.epoch,
        )
    return info


def _delta_is_record(path: Path, info: CheckpointInfo, record: Changes) -> bool:
    """Whether a delta's rows are exactly the bytes its writer writes for ``record``
    (each written key's row as packed, a deleted key packed as a row of None), each
    once, one table per frame, under their keys (and a deleted one marked deleted):
    then it holds the rows written since its parent and loads. Checked by the rows'
    bytes and keys, decoding no row (a version 2 file's frames carry no keys: its rows are
    decoded for their keys); the order within a table is not compared (a live
    partition records keys in the order its transactions finished, which concurrency
    may change; a replay in serial order). False (a row not in the record or twice, one
    missing, a file that does not read to its footer) leaves the judgement to
    ``check``'s decoding path, which names what is wrong."""
    pack = msgpack.Packer(autoreset=True).pack
    pools: dict[str, dict[tuple, bytes | None]] = {}
    dead: dict[str, set[tuple]] = {}  # deleted keys, per table
    for table, rows in record.items():
        if rows:
            pool = pools[table] = dict(rows)
            if None in pool.values():
                gone = dead[table] = {k for k, v in rows.items() if v is None}
                pool.update((k, pack((table, k, None))) for k in gone)
    try:
        for (table, keys, deleted), encodings in _frames(path, info, _KEYS):
            pool = pools.get(table)  # type: ignore[assignment]
            if pool is None:
                return False
            dead_keys = dead.get(table)
            marked: tuple[int, ...] = ()
            if dead_keys:
                marked = tuple(compress(range(len(keys)), map(dead_keys.__contains__, keys)))
            if marked != deleted or tuple(map(pool.pop, keys, repeat(None))) != tuple(encodings):
                return False  # a row not written since the parent, twice, or unmarked
    except Exception:  # any reading or decoding problem: the decoding path says what
        return False
    return not any(pools.values())


def iter_rows(path: Path) -> Iterator[tuple[str, tuple, tuple]]:
    """Every row of a checkpoint's state (static tables too), tables in name order and
    keys sorted. The chain is loaded and validated whole first (CheckpointInvalid)."""
    _, storage = load(path)
    yield from storage.rows()


def list_checkpoints(directory: Path, partition: int | None = None) -> list[CheckpointInfo]:
    """Headers of every checkpoint in ``directory`` (oldest first); unreadable ones skipped."""
    if not directory.exists():
        return []
    out = []
    for entry in sorted(directory.iterdir()):
        m = NAME_RE.fullmatch(entry.name)
        if m is None or (partition is not None and int(m.group(2)) != partition):
            continue
        try:
            out.append(read_info(entry))
        except CheckpointInvalid as e:
            log.warning("skipping checkpoint: %s", e)
    return sorted(out, key=lambda i: (i.epoch, i.partition))


def load_newest(
    directory: Path, partition: int, partitions: int
) -> tuple[CheckpointInfo, Storage] | None:
    """The newest checkpoint of ``partition`` that validates; corrupt ones are skipped
    (and so is every checkpoint whose chain holds a file found corrupt)."""
    bad: set[int] = set()
    for info in reversed(list_checkpoints(directory, partition)):
        if info.partitions != partitions:
            log.warning(
                "skipping %s: taken with %d partitions, cluster has %d",
                info.path,
                info.partitions,
                partitions,
            )
            continue
        if bad.intersection(chain_epochs(info.path)):
            log.warning("skipping %s: its chain holds a corrupt checkpoint", info.path.name)
            continue
        try:
            return load(info.path)
        except CheckpointInvalid as e:
            log.warning("skipping corrupt checkpoint: %s", e)
            bad.add(info.epoch if e.epoch is None else e.epoch)
    return None


def reads_floor(directory: Path, partition: int, partitions: int) -> int | None:
    """The first txn a restart of ``partition`` could replay from: the ``next_txn_id``
    of its oldest checkpoint on disk (None: none, a restart replays from genesis).
    Peers may forget the reads they sent it for earlier txns (MSG_READS_FLOOR)."""
    ids = [
        i.next_txn_id for i in list_checkpoints(directory, partition) if i.partitions == partitions
    ]
    return min(ids) if ids else None


def complete_epochs(directory: Path, partitions: int) -> list[int]:
    """Epochs for which every partition of the replica has a checkpoint (headers only)."""
    by_epoch: dict[int, set[int]] = {}
    for info in list_checkpoints(directory):
        if info.partitions == partitions:
            by_epoch.setdefault(info.epoch, set()).add(info.partition)
    return sorted(e for e, ps in by_epoch.items() if len(ps) == partitions)


def _chain_files(directory: Path, info: CheckpointInfo) -> list[Path]:
    """The files a checkpoint needs as far as headers tell (itself, parents, static)."""
    files = [directory / checkpoint_name(e, info.partition) for e in chain_epochs(info.path)]
    if info.static_hash:
        files.append(directory / static_name(info.partition, info.static_hash))
    return files


HOLDS_DIR = "holds"


class CheckpointHold:
    """A reader's hold on a replica's checkpoints (``ordo dump``): while it lives,
    ``prune`` keeps every checkpoint it names, with the files of its chain.

    First ``keep_from(E)`` (every checkpoint at or after E: taken before the reader
    asks for a checkpoint, so the one it gets cannot go before it is found), then
    ``keep_only(X)`` (the one it reads), then ``release``. Files in
    ``<directory>/holds/``: ``<id>.lock``, locked (flock) by the holder for its whole
    life, and ``<id>.hold``, msgpack ``[from_epoch, only_epoch]`` (-1: none), replaced
    atomically. A hold whose lock is free is stale (its holder died, kill -9 included:
    the kernel drops the lock) and the next prune deletes it. The lock is created
    under a temporary name and renamed once locked, so a prune never takes a new
    hold's lock for a stale one.
    """

    def __init__(self, directory: Path) -> None:
        holds = directory / HOLDS_DIR
        holds.mkdir(parents=True, exist_ok=True)
        self._name = f"{os.getpid()}-{time.time_ns():x}"
        tmp = holds / f"{self._name}.lock.tmp"
        self._fd: int | None = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.lock_path = holds / f"{self._name}.lock"
        os.replace(tmp, self.lock_path)
        self.path = holds / f"{self._name}.hold"

    def _write(self, from_epoch: int, only_epoch: int) -> None:
        invariant(self._fd is not None, "a released hold is not written")
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(msgpack.packb([from_epoch, only_epoch]))
        os.replace(tmp, self.path)

    def keep_from(self, epoch: int) -> None:
        """Keep every checkpoint at or after ``epoch``."""
        self._write(epoch, -1)

    def keep_only(self, epoch: int) -> None:
        """Keep the checkpoint of ``epoch`` (and its chain) only."""
        self._write(-1, epoch)

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        self.lock_path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> CheckpointHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _held_epochs(directory: Path) -> tuple[int | None, set[int]]:
    """What live holds keep: the smallest ``from`` epoch (None: none) and the ``only``
    epochs. Stale holds (their lock free) are deleted; an unreadable hold file keeps
    nothing (its holder rewrites it whole)."""
    holds = directory / HOLDS_DIR
    if not holds.is_dir():
        return None, set()
    from_epoch: int | None = None
    only: set[int] = set()
    for lock in holds.glob("*.lock"):
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            continue  # released meanwhile
        hold = lock.with_suffix(".hold")
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its holder lives
                try:
                    f, o = msgpack.unpackb(hold.read_bytes())
                except (OSError, ValueError, TypeError, msgpack.UnpackException):
                    continue
                if type(f) is int and f >= 0:
                    from_epoch = f if from_epoch is None else min(from_epoch, f)
                if type(o) is int and o >= 0:
                    only.add(o)
                continue
            hold.unlink(missing_ok=True)  # stale: its holder is gone
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return from_epoch, only


def prune(directory: Path, partition: int, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of one partition, keeping every
    file their chains need (older files of a kept chain, its static tables file), and
    every checkpoint a live ``CheckpointHold`` names."""
    infos = list_checkpoints(directory, partition)
    kept = infos[-keep:] if keep > 0 else []
    held_from, held_only = _held_epochs(directory)
    kept += [
        i
        for i in infos[: len(infos) - len(kept)]
        if i.epoch in held_only or (held_from is not None and i.epoch >= held_from)
    ]
    kept.sort(key=lambda i: i.epoch)
    needed = {p.name for info in kept for p in _chain_files(directory, info)}
    doomed = [i.path for i in infos if i.path.name not in needed]
    for entry in directory.glob(f"static-p{partition}-*.ckpt"):
        if entry.name not in needed and _STATIC_NAME.fullmatch(entry.name):
            doomed.append(entry)
    oldest_kept = kept[0].epoch if kept else None
    for entry in directory.glob(f"*-p{partition}.skipped"):
        m = SKIP_NAME_RE.fullmatch(entry.name)
        if m is not None and (oldest_kept is None or int(m.group(1)) < oldest_kept):
            doomed.append(entry)  # a skip before every kept checkpoint: no boundary left
    for path in doomed:
        path.unlink(missing_ok=True)
    for pattern in (
        f"*-p{partition}.skipped.tmp",
        f"*-p{partition}.ckpt.tmp",
        f"*-p{partition}.tmp",
        f"static-p{partition}-*.tmp",
    ):
        for stale in directory.glob(pattern):
            stale.unlink(missing_ok=True)
    return doomed


def copy_newest_complete(src: Path, dst: Path, partitions: int) -> int | None:
    """Seed a new replica: copy the newest epoch for which ``src`` holds a valid
    checkpoint of every partition (with the files their chains need) into ``dst``.
    Returns that epoch (None if none)."""
    for epoch in reversed(complete_epochs(src, partitions)):
        infos = []
        try:
            for p in range(partitions):
                info, _ = load(src / checkpoint_name(epoch, p))  # validate before trusting it
                infos.append(info)
        except CheckpointInvalid as e:
            log.warning("not copying epoch %d: %s", epoch, e)
            continue
        dst.mkdir(parents=True, exist_ok=True)
        for info in infos:
            for path in _chain_files(src, info):
                tmp = dst / (path.name + ".tmp")
                shutil.copyfile(path, tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, dst / path.name)
        _fsync_dir(dst)
        return epoch
    return None
