"""The log archive: sealed command-log segments shipped to a directory as they seal,
with the state hashes the history recorded (``ordo log archive``), so a backup can be
restored to any later epoch the archive covers (cluster.backup_restore).

An archive directory:
  segment-{first_epoch:012d}.log   sealed segments, byte for byte (the same names and
                                   format as the log's, and as ``ordo log prune
                                   --archive`` moves them: one directory serves both)
  history.jsonl                    one line per checkpoint epoch seen complete in the
                                   replica's checkpoint directory: {"epoch", "replica",
                                   "partition_hashes"}: the history's state hashes,
                                   which a restore checks the states it rebuilds against

A segment is sealed once a later one exists: the sequencer fdatasyncs a segment
before it creates the next (sequencer.log), so a sealed segment never changes again.
The last segment is never shipped.

Invariants:
- A shipped segment is read whole and strictly (every frame's CRC, no torn tail
  allowed), copied to a temp name, fsynced, checked again there, renamed, and the
  directory fsynced: the archive holds whole verified segments or none.
- A segment already in the archive is skipped when its size and CRC32C equal the
  log's; a different file of the same name is an error naming it (another cluster's
  archive, or corruption), never overwritten.
- Nothing here writes to the cluster's directory.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cluster.backup import copy_durably, file_crc32c
from executor.core import checkpoint as ckpt
from executor.core.checkpoint.writer import fsync_dir
from sequencer.log import LogCorruption, iter_file_frames

HISTORY = "history.jsonl"
_SEGMENT_NAME = re.compile(r"segment-(\d{12,})\.log")


class ArchiveConflict(Exception):
    """The archive holds a different file under a segment's name: ``path`` names it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


@dataclass
class ShipReport:
    shipped: list[Path] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # pruned while this pass ran
    recorded: list[int] = field(default_factory=list)  # checkpoint epochs recorded


def segments(directory: Path) -> list[tuple[int, Path]]:
    """(first epoch, path) of every segment file in ``directory``, in epoch order."""
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if (m := _SEGMENT_NAME.fullmatch(p.name)) is not None
    ]
    return sorted(found)


def _frames_in(path: Path) -> int:
    """How many frames a sealed segment holds, every CRC checked (LogCorruption)."""
    with open(path, "rb") as f:
        return sum(1 for _ in iter_file_frames(f, path))


def ship_segment(segment: Path, archive: Path) -> bool:
    """Copy one sealed segment into ``archive`` (module docstring); False if it was
    there already."""
    target = archive / segment.name
    if target.exists():
        if file_crc32c(target) == file_crc32c(segment):
            return False
        raise ArchiveConflict(target, f"differs from {segment}: not this log's archive?")
    frames = _frames_in(segment)
    copy_durably(segment, target)
    try:
        if _frames_in(target) != frames or file_crc32c(target) != file_crc32c(segment):
            raise LogCorruption(target, 0, 0, "the copy differs from the segment")
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    fsync_dir(archive)
    return True


def recorded_epochs(archive: Path) -> dict[int, tuple[int, ...]]:
    """The history's state hashes the archive recorded: epoch -> partition hashes. A
    line that does not parse (a torn last line) is skipped."""
    out: dict[int, tuple[int, ...]] = {}
    path = archive / HISTORY
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
            out[int(d["epoch"])] = tuple(int(h, 16) for h in d["partition_hashes"])
        except (ValueError, TypeError, KeyError):
            continue
    return out


def record_history(checkpoint_dir: Path, replica: int, partitions: int, archive: Path) -> list[int]:
    """Append the state hashes of every checkpoint epoch complete in ``checkpoint_dir``
    (headers only) that the archive has not recorded; the epochs appended."""
    known = recorded_epochs(archive)
    lines, added = [], []
    for info_epoch in ckpt.complete_epochs(checkpoint_dir, partitions):
        if info_epoch <= 0 or info_epoch in known:
            continue
        try:
            infos = [
                ckpt.read_info(checkpoint_dir / ckpt.checkpoint_name(info_epoch, p))
                for p in range(partitions)
            ]
        except (ckpt.CheckpointInvalid, OSError):
            continue  # pruned meanwhile, or unreadable: not this pass's to record
        hashes = [f"{i.state_hash:016x}" for i in infos]
        lines.append(
            json.dumps({"epoch": info_epoch, "replica": replica, "partition_hashes": hashes})
        )
        added.append(info_epoch)
    if lines:
        with open(archive / HISTORY, "a") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
    return added


def ship_once(
    log_dir: Path,
    archive: Path,
    checkpoint_dir: Path | None = None,
    replica: int = 0,
    partitions: int = 0,
    on_segment: Callable[[Path], None] | None = None,
) -> ShipReport:
    """One pass: ship every sealed segment of ``log_dir`` the archive lacks, oldest
    first, then record the checkpoint hashes of ``checkpoint_dir`` (if given)."""
    archive.mkdir(parents=True, exist_ok=True)
    report = ShipReport()
    listing = segments(log_dir)
    for _first, path in listing[:-1]:  # the last one is still written
        try:
            if ship_segment(path, archive):
                report.shipped.append(archive / path.name)
                if on_segment is not None:
                    on_segment(archive / path.name)
        except FileNotFoundError:
            report.vanished.append(path.name)  # pruned (deleted or moved) meanwhile
    if checkpoint_dir is not None and checkpoint_dir.is_dir():
        report.recorded = record_history(checkpoint_dir, replica, partitions, archive)
    return report
