"""Partition checkpoints: consistent snapshots at epoch boundaries, written atomically.

A partition checkpoints after epoch E when E's batch carries the checkpoint flag
(the sequencer sets it every N epochs / seconds, or on request), so every partition
of every replica snapshots at the *same* boundaries and the history splits into
intervals that replay tooling can verify independently.

Format (one file per partition per checkpoint, ``{epoch:012d}-p{partition}.ckpt`` in
the replica's checkpoint directory): a sequence of frames in the command log's frame
encoding (``<II`` length + CRC32C, then payload; see sequencer.log.encode_frame):
  frame 0     header  [MAGIC, VERSION, replica, partition, partitions, epoch,
                       next_txn_id, txns_applied, state_hash, static_hash, created_ms]
  frames 1..n rows    [[table, key, row], ...]  (at most ROWS_PER_FRAME per frame,
                       cut once it holds limits.checkpoint_frame_bytes_max bytes, so
                       a frame stays under log_frame_bytes_max whatever the rows;
                       tables in name order, keys sorted: byte-identical across replicas
                       except the header's replica number and creation time)
  last frame  footer  [END, row_count, state_hash]

Invariants:
- Written to ``*.tmp``, fsynced, renamed, then the directory fsynced: a reader sees a
  whole checkpoint or none.
- A checkpoint is valid only if every frame's CRC holds, the footer is present, the
  row count matches and the state hash recomputed from the rows equals the header's.
  An invalid one is skipped with a warning, never half-loaded.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack

from executor.core.storage import Storage
from sequencer.log import LogCorruption, encode_frame, iter_file_frames
from txn_library import limits

log = logging.getLogger("ordo.checkpoint")

MAGIC = "ORDO-CKPT"
END = "END"
VERSION = 1
ROWS_PER_FRAME = 4096
_NAME = re.compile(r"(\d{12})-p(\d+)\.ckpt")


class CheckpointInvalid(Exception):
    """A checkpoint file is torn, corrupt or inconsistent; skip it."""


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


def checkpoint_name(epoch: int, partition: int) -> str:
    return f"{epoch:012d}-p{partition}.ckpt"


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
) -> Path:
    """Write one checkpoint atomically (temp file + fsync + rename + fsync dir)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(epoch, partition)
    tmp = final.with_suffix(".tmp")
    packb = msgpack.packb
    header = [
        MAGIC,
        VERSION,
        replica,
        partition,
        partitions,
        epoch,
        next_txn_id,
        txns_applied,
        storage.state_hash,
        storage.static_hash,
        int(time.time() * 1000),
    ]
    count = 0
    packer = msgpack.Packer(autoreset=True)
    pack = packer.pack
    frame_bytes_max = limits.checkpoint_frame_bytes_max

    def rows_frame(chunk: list[bytes]) -> bytes:
        # An array header followed by its packed elements: the bytes of packb(rows).
        return encode_frame(packer.pack_array_header(len(chunk)) + b"".join(chunk))

    with open(tmp, "wb") as f:
        f.write(encode_frame(packb(header)))
        chunk: list[bytes] = []
        chunk_bytes = 0
        for table, key, row in storage.rows():
            data = pack((table, key, row))
            chunk.append(data)
            chunk_bytes += len(data)
            if len(chunk) >= ROWS_PER_FRAME or chunk_bytes >= frame_bytes_max:
                f.write(rows_frame(chunk))
                count += len(chunk)
                chunk, chunk_bytes = [], 0
        if chunk:
            f.write(rows_frame(chunk))
            count += len(chunk)
        f.write(encode_frame(packb([END, count, storage.state_hash])))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    return final


def _header(payload: bytes, path: Path) -> CheckpointInfo:
    h = msgpack.unpackb(payload, use_list=False)
    if not (isinstance(h, tuple) and len(h) >= 11 and h[0] == MAGIC):
        raise CheckpointInvalid(f"{path}: not an Ordo checkpoint")
    if h[1] != VERSION:
        raise CheckpointInvalid(f"{path}: checkpoint version {h[1]}, expected {VERSION}")
    return CheckpointInfo(path, *h[2:11])


def read_info(path: Path) -> CheckpointInfo:
    """The header only (cheap); does not validate the rows."""
    with open(path, "rb") as f:
        try:
            first = next(iter_file_frames(f, path))
        except (StopIteration, LogCorruption) as e:
            raise CheckpointInvalid(f"{path}: unreadable header: {e}") from None
    return _header(first, path)


def iter_rows(path: Path) -> Iterator[tuple[str, tuple, tuple]]:
    """Stream every row of a checkpoint, validating frames and footer as it goes.

    Raises CheckpointInvalid on any problem (after yielding what came before it:
    callers that need all-or-nothing use ``load``).
    """
    with open(path, "rb") as f:
        frames = iter_file_frames(f, path)
        try:
            _header(next(frames), path)
            count = 0
            for payload in frames:
                chunk = msgpack.unpackb(payload, use_list=False)
                if chunk and chunk[0] == END:
                    if chunk[1] != count:
                        raise CheckpointInvalid(
                            f"{path}: footer says {chunk[1]} rows, read {count}"
                        )
                    if next(frames, None) is not None:
                        raise CheckpointInvalid(f"{path}: data after the footer")
                    return
                yield from chunk
                count += len(chunk)
        except LogCorruption as e:
            raise CheckpointInvalid(f"{path}: {e}") from None
        except StopIteration:
            raise CheckpointInvalid(f"{path}: empty file") from None
        raise CheckpointInvalid(f"{path}: no footer (torn write?)")


def load(path: Path) -> tuple[CheckpointInfo, Storage]:
    """Load and fully validate one checkpoint into a fresh Storage."""
    info = read_info(path)
    storage = Storage()
    storage.load(iter_rows(path))
    if storage.state_hash != info.state_hash or storage.static_hash != info.static_hash:
        raise CheckpointInvalid(
            f"{path}: rows hash to {storage.state_hash:016x}, header says {info.state_hash:016x}"
        )
    return info, storage


def list_checkpoints(directory: Path, partition: int | None = None) -> list[CheckpointInfo]:
    """Headers of every checkpoint in ``directory`` (oldest first); unreadable ones skipped."""
    if not directory.exists():
        return []
    out = []
    for entry in sorted(directory.iterdir()):
        m = _NAME.fullmatch(entry.name)
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
    """The newest checkpoint of ``partition`` that validates; corrupt ones are skipped."""
    for info in reversed(list_checkpoints(directory, partition)):
        if info.partitions != partitions:
            log.warning(
                "skipping %s: taken with %d partitions, cluster has %d",
                info.path,
                info.partitions,
                partitions,
            )
            continue
        try:
            return load(info.path)
        except CheckpointInvalid as e:
            log.warning("skipping corrupt checkpoint: %s", e)
    return None


def complete_epochs(directory: Path, partitions: int) -> list[int]:
    """Epochs for which every partition of the replica has a checkpoint (headers only)."""
    by_epoch: dict[int, set[int]] = {}
    for info in list_checkpoints(directory):
        if info.partitions == partitions:
            by_epoch.setdefault(info.epoch, set()).add(info.partition)
    return sorted(e for e, ps in by_epoch.items() if len(ps) == partitions)


def prune(directory: Path, partition: int, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints of one partition."""
    infos = list_checkpoints(directory, partition)
    doomed = infos[:-keep] if keep > 0 else []
    for info in doomed:
        info.path.unlink(missing_ok=True)
    for stale in directory.glob(f"*-p{partition}.tmp"):
        stale.unlink(missing_ok=True)
    return [i.path for i in doomed]


def copy_newest_complete(src: Path, dst: Path, partitions: int) -> int | None:
    """Seed a new replica: copy the newest epoch for which ``src`` holds a valid
    checkpoint of every partition into ``dst``. Returns that epoch (None if none)."""
    import shutil

    for epoch in reversed(complete_epochs(src, partitions)):
        paths = [src / checkpoint_name(epoch, p) for p in range(partitions)]
        try:
            for path in paths:
                load(path)  # validate before trusting it
        except CheckpointInvalid as e:
            log.warning("not copying epoch %d: %s", epoch, e)
            continue
        dst.mkdir(parents=True, exist_ok=True)
        for path in paths:
            tmp = dst / (path.name + ".tmp")
            shutil.copyfile(path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, dst / path.name)
        _fsync_dir(dst)
        return epoch
    return None
