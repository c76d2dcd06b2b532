"""What stays in a replica's checkpoint directory: old checkpoints pruned (``prune``)
but for those a reader holds (``CheckpointHold``), a killed writer's temp files
(``remove_temp_files``), skip markers (``mark_skipped``), what the directory holds at
every partition (``complete_epochs``) and what a restart could replay from
(``reads_floor``), and a new replica seeded from it (``copy_newest_complete``).

Invariants:
- A killed writer's temp file is deleted when its partition next starts
  (``remove_temp_files``, called by the process that owns its checkpoints).
- ``prune`` never removes a file that a kept checkpoint's chain needs.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from pathlib import Path

import msgpack

from executor.core.checkpoint.format import (
    _STATIC_NAME,
    _TEMP_NAME,
    SKIP_NAME_RE,
    CheckpointInfo,
    CheckpointInvalid,
    checkpoint_name,
    skip_name,
    static_name,
)
from executor.core.checkpoint.loader import chain_epochs, list_checkpoints, load
from executor.core.checkpoint.writer import fsync_dir
from txn_library.errors import invariant

log = logging.getLogger("ordo.checkpoint")


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
        fsync_dir(dst)
        return epoch
    return None
