"""Writing checkpoint files: a planned checkpoint, in process while its partition keeps
working (``CheckpointWriter``), or at once (``write_checkpoint``: tests, the simulator),
and the static tables file (``ensure_static``: once per content).

A base packs only the tables written since the last base other than by new keys: the
frames of the rows a table held then are copied from that base (read back, CRC checked;
``CheckpointWriter``), so an append-only table costs its new rows.

Invariant: written to a temp file, fsynced, renamed, then the directory fsynced: a
reader sees a whole file or none. (A killed writer's temp file is deleted when its
partition next starts: ``retention.remove_temp_files``.)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import msgpack

from executor.core.changes import Changes
from executor.core.checkpoint.format import (
    _ANSWERS_TAG,
    _ARRAY_HEADER,
    BASE,
    DELTA,
    END,
    STATIC,
    Answer,
    CheckpointInvalid,
    _header_list,
    _rows_frame,
    _third,
    checkpoint_name,
    static_name,
)
from executor.core.checkpoint.plan import ChainTip, PlannedCheckpoint, next_tip
from executor.core.checkpoint.reader import _check_hash_only
from executor.core.storage import Storage
from sequencer.log import encode_frame, frame_intact
from txn_library import limits
from txn_library.errors import detached, invariant

log = logging.getLogger("ordo.checkpoint")

ROWS_PER_FRAME = 4096


def fsync_dir(d: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    answers: Sequence[Answer] = (),
) -> Iterator[Frame | None]:
    """The frames after the header: rows (one table per frame), the answers, then the
    footer. Yields None once a table's rows are in order (a pause point for a sliced
    writer).

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
    yield from _answers_frames(packer, answers)
    footer = [END, count, header[9] if header[11] == STATIC else header[8]]
    yield None, 0, encode_frame(pack(footer))


def _answers_frames(packer: msgpack.Packer, answers: Sequence[Answer]) -> Iterator[Frame]:
    """``answers`` (oldest first) in frames of at most checkpoint_frame_bytes_max."""
    frame_bytes_max = limits.checkpoint_frame_bytes_max
    parts: list[bytes] = []
    size = 0
    for answer in answers:
        part = packer.pack(answer)
        if parts and size + len(part) + 16 > frame_bytes_max:
            yield None, 0, _answers_frame(parts)
            parts, size = [], 0
        parts.append(part)
        size += len(part)
    if parts:
        yield None, 0, _answers_frame(parts)


def _answers_frame(parts: list[bytes]) -> bytes:
    return encode_frame(_ANSWERS_TAG + _ARRAY_HEADER(len(parts)) + b"".join(parts))


def recent_answers(answers: Sequence[Answer]) -> list[Answer]:
    """The most recent of ``answers`` (oldest first) a checkpoint carries: at most
    limits.checkpoint_answers_max of them and checkpoint_answers_bytes_max packed bytes;
    an answer that does not pack is left out (it could not have been sent either)."""
    pack = msgpack.Packer(autoreset=True).pack
    kept: list[Answer] = []
    size = 0
    for answer in reversed(answers[-limits.checkpoint_answers_max :]):
        try:
            size += len(pack(answer))
        except Exception:  # a value msgpack refuses: never answered either
            continue
        if size > limits.checkpoint_answers_bytes_max:
            break
        kept.append(answer)
    kept.reverse()
    return kept


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
        answers: Sequence[Answer] = (),
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
        self._frames = _body_frames(
            self.header, tables, self.path, self._copier.frames, recent_answers(answers)
        )
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
        partition (which freezes what outlives a loop turn: heap.settle_turn) would
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
            fsync_dir(self.directory)
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
    answers: Sequence[Answer] = (),
) -> Path:
    """Write one checkpoint atomically now (temp file + fsync + rename + fsync dir),
    carrying the most recent of ``answers`` (format.py).

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
        answers=answers,
    )
    return writer.finish()
