"""An online backup of a cluster: one replica's checkpoint at an epoch B, the command
log from B on, and cluster.json, in a directory that says what it holds and is
verified whole (``ordo backup``; restored by cluster.backup_restore).

A backup directory:
  backup.json       the manifest, written last: the epoch B, the replica, each
                    partition's state hash at B (and their sum), the log's epochs
                    B..L, and every other file's size and CRC32C (whole file)
  cluster.json      the cluster's config as it was
  checkpoints/      each partition's checkpoint at B with every file its chain needs
                    (parents, static tables), byte for byte, and the replica's
                    deploys/ (procedures deployed through the log, txn_library.deployed)
  log/              the command log's frames B..L, as segments (sequencer.log)

The frames start at B, not B + 1: a cluster restored at B resumes its log after B's
batch, whose bytes the sequencer reads for the digest chain and the next txn id.
L is the epoch the sequencer had published when the log was read, so every frame
copied was durable (a frame in the page cache before its fdatasync is not history).

Invariants:
- A backup is complete only with its manifest; every file it lists is verified
  (``verify_backup``) by its whole CRC32C, each checkpoint by a full load (frame
  CRCs, chain links, rows hashing to the header), the partitions' hashes against the
  manifest's, and the log by its frames' CRCs, contiguous epochs B..L, each batch's
  shape and the digest chain (executor.replay.batches.iter_batches). The first fault
  raises ``BackupInvalid`` naming the file.
- Nothing here writes to the cluster's directory; the caller holds the checkpoint
  against pruning while it is copied (cluster.fresh_checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c

from cluster.config import ClusterConfig
from executor.core import checkpoint as ckpt
from executor.core.checkpoint.writer import fsync_dir
from executor.core.state_hash import MASK64
from executor.core.storage import Storage
from executor.replay.batches import ReplayFailure, iter_batches
from sequencer.log import CommandLog, LogCorruption, iter_frames
from txn_library.procedure import load_modules

MANIFEST = "backup.json"
FORMAT = "ordo-backup"
FORMAT_VERSION = 1
CONFIG = "cluster.json"
CHECKPOINTS = "checkpoints"
LOG = "log"
_CHUNK_BYTES = 1 << 20  # read at a time for a whole-file CRC or a copy


class BackupInvalid(Exception):
    """A backup file is missing, torn or corrupt: ``path`` names it."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Manifest:
    epoch: int  # B: the checkpoint's epoch
    replica: int
    partitions: int
    partition_hashes: tuple[int, ...]
    log_first_epoch: int
    log_last_epoch: int  # L
    files: dict[str, tuple[int, int]]  # relative path -> (bytes, CRC32C)
    created: str = ""

    @property
    def state_hash(self) -> int:
        return sum(self.partition_hashes) & MASK64

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "epoch": self.epoch,
                "replica": self.replica,
                "partitions": self.partitions,
                "state_hash": f"{self.state_hash:016x}",
                "partition_hashes": [f"{h:016x}" for h in self.partition_hashes],
                "log": {"first_epoch": self.log_first_epoch, "last_epoch": self.log_last_epoch},
                "files": {p: {"bytes": n, "crc32c": c} for p, (n, c) in sorted(self.files.items())},
                "created": self.created,
            },
            indent=2,
        )

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST
        if not path.is_file():
            raise BackupInvalid(path, "missing: not a backup, or one that did not finish")
        try:
            d = json.loads(path.read_text())
            if d.get("format") != FORMAT or d.get("version") != FORMAT_VERSION:
                raise ValueError(f"format {d.get('format')!r} version {d.get('version')!r}")
            return cls(
                epoch=int(d["epoch"]),
                replica=int(d["replica"]),
                partitions=int(d["partitions"]),
                partition_hashes=tuple(int(h, 16) for h in d["partition_hashes"]),
                log_first_epoch=int(d["log"]["first_epoch"]),
                log_last_epoch=int(d["log"]["last_epoch"]),
                files={p: (int(f["bytes"]), int(f["crc32c"])) for p, f in d["files"].items()},
                created=str(d.get("created", "")),
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise BackupInvalid(path, f"unreadable manifest ({type(e).__name__}: {e})") from None


def file_crc32c(path: Path) -> tuple[int, int]:
    """(bytes, CRC32C) of a whole file, read in chunks."""
    crc = size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            crc = google_crc32c.extend(crc, chunk)
            size += len(chunk)
    return size, crc


def copy_durably(src: Path, dst: Path) -> None:
    """``src`` to ``dst`` through a temp name: fsynced, then renamed (the caller fsyncs
    the directory)."""
    tmp = dst.with_name(dst.name + ".tmp")
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, _CHUNK_BYTES)
        fout.flush()
        os.fsync(fout.fileno())
    os.replace(tmp, dst)


def checkpoint_files(path: Path) -> list[Path]:
    """The files a checkpoint's state needs: its chain (links checked) and static file."""
    chain = ckpt.chain_of(path)
    files = [c.path for c in chain]
    if chain[0].static_hash:
        files.append(path.parent / ckpt.static_name(chain[0].partition, chain[0].static_hash))
    return files


def copy_checkpoints(files: Sequence[Path], dest: Path) -> None:
    """Each partition's checkpoint file (``files``, partition order) and its chain into
    ``dest``. The caller holds them against pruning."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        for needed in checkpoint_files(f):
            copy_durably(needed, dest / needed.name)
    # The procedures deployed through the log that the replica keeps beside them
    # (txn_library.deployed): the log before the checkpoint no longer says them.
    deploys = files[0].parent / "deploys" if files else None
    if deploys is not None and deploys.is_dir():
        (dest / "deploys").mkdir(exist_ok=True)
        for record in sorted(deploys.glob("*.deploy")):
            copy_durably(record, dest / "deploys" / record.name)
        fsync_dir(dest / "deploys")
    fsync_dir(dest)


def copy_log(log_dir: Path, dest: Path, first: int, last: int) -> int:
    """The frames ``first``..``last`` of the log in ``log_dir`` as a new log in
    ``dest`` (its first segment named ``first``); every frame's CRC is checked as it is
    read. Returns the last epoch copied (< ``last`` if the log ends before it:
    LogCorruption if it holds no ``first``)."""
    copied = first - 1
    with CommandLog(dest) as out:
        out.start_at(first)
        for epoch, payload in iter_frames(log_dir, first, last):
            if epoch != copied + 1:
                raise LogCorruption(log_dir, 0, copied + 1, f"the log holds no epoch {copied + 1}")
            out.append(epoch, payload)
            copied = epoch
        out.sync()
    if copied < first:
        raise LogCorruption(log_dir, 0, first, f"the log no longer holds epoch {first} (pruned?)")
    return copied


def write_manifest(
    directory: Path, epoch: int, replica: int, partitions: int, hashes: Sequence[int], last: int
) -> Manifest:
    """List every file of the backup with its CRC, and write the manifest (last)."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel != MANIFEST:
            files[rel] = file_crc32c(path)
    m = Manifest(
        epoch,
        replica,
        partitions,
        tuple(hashes),
        epoch,
        last,
        files,
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    tmp = directory / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        f.write(m.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)
    fsync_dir(directory)
    return m


@dataclass
class VerifiedBackup:
    """A backup that verified: its manifest, config text and each partition's state."""

    directory: Path
    manifest: Manifest
    config: ClusterConfig
    loaded: list[tuple[ckpt.CheckpointInfo, Storage]]

    @property
    def log_dir(self) -> Path:
        return self.directory / LOG


def verify_backup(directory: Path) -> VerifiedBackup:
    """Check every file of a backup (module docstring); BackupInvalid names the first
        bad one. Imports the cluster's procedure modules (ImportError: the tables its rows
    belong to are unknown here). Returns the checkpoint's state, loaded."""
    m = Manifest.read(directory)
    for rel, (size, crc) in sorted(m.files.items()):
        path = directory / rel
        if not path.is_file():
            raise BackupInvalid(path, "missing")
        have = file_crc32c(path)
        if have != (size, crc):
            raise BackupInvalid(
                path,
                f"{have[0]} bytes, CRC32C {have[1]:08x}; the manifest says {size} bytes, "
                f"CRC32C {crc:08x} (corrupt)",
            )
    config = directory / CONFIG
    if CONFIG not in m.files:
        raise BackupInvalid(config, "not in the manifest")
    try:
        cfg = ClusterConfig.from_json(config.read_text())
    except (OSError, ValueError, TypeError) as e:
        raise BackupInvalid(config, f"not a valid cluster config ({e})") from None
    if cfg.partitions != m.partitions:
        raise BackupInvalid(config, f"{cfg.partitions} partitions, the manifest {m.partitions}")
    load_modules(cfg.procedure_modules)  # the tables a checkpoint's rows belong to
    loaded = [_verified_checkpoint(directory, m, p) for p in range(m.partitions)]
    _verify_log(directory / LOG, m.epoch, m.log_last_epoch)
    return VerifiedBackup(directory, m, cfg, loaded)


def _verified_checkpoint(
    directory: Path, m: Manifest, partition: int
) -> tuple[ckpt.CheckpointInfo, Storage]:
    path = directory / CHECKPOINTS / ckpt.checkpoint_name(m.epoch, partition)
    try:
        info, storage = ckpt.load(path)
    except ckpt.CheckpointInvalid as e:
        raise BackupInvalid(_named(e, path), str(e)) from None
    except OSError as e:
        raise BackupInvalid(path, f"unreadable: {e}") from None
    if (info.epoch, info.partition, info.partitions) != (m.epoch, partition, m.partitions):
        raise BackupInvalid(path, f"header says epoch {info.epoch}, partition {info.partition}")
    if info.state_hash != m.partition_hashes[partition]:
        raise BackupInvalid(
            path,
            f"state hash {info.state_hash:016x}, the manifest says "
            f"{m.partition_hashes[partition]:016x}",
        )
    return info, storage


def _named(e: ckpt.CheckpointInvalid, default: Path) -> Path:
    """The file a CheckpointInvalid is about (its message starts with the path)."""
    head = str(e).split(": ", 1)[0]
    return Path(head) if head.endswith(".ckpt") else default


def _verify_log(log_dir: Path, first: int, last: int) -> None:
    try:
        for _ in iter_batches(log_dir, first, last):
            pass
    except LogCorruption as e:
        raise BackupInvalid(e.path, f"epoch {e.epoch}: {e.reason}") from None
    except ReplayFailure as e:
        raise BackupInvalid(_segment_of(log_dir, e.epoch), str(e)) from None


def _segment_of(log_dir: Path, epoch: int) -> Path:
    """The segment file that holds ``epoch`` (by the names), else the directory."""
    firsts = sorted(
        (int(p.name[8:20]), p) for p in log_dir.glob("segment-*.log") if p.name[8:20].isdigit()
    )
    held = [p for f, p in firsts if f <= epoch]
    return held[-1] if held else log_dir


def summary(m: Manifest) -> dict[str, Any]:
    return {
        "epoch": m.epoch,
        "replica": m.replica,
        "state_hash": f"{m.state_hash:016x}",
        "log_epochs": [m.log_first_epoch, m.log_last_epoch],
        "files": len(m.files),
    }


def prepare_destination(dest: Path) -> None:
    """A backup goes into a new or empty directory (a backup is never mixed with another)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest} exists and is not an empty directory")
    dest.mkdir(parents=True, exist_ok=True)


def write_backup(
    dest: Path,
    config_path: Path,
    replica: int,
    epoch: int,
    files: Sequence[Path],
    log_dir: Path,
    log_last: int,
) -> VerifiedBackup:
    """Write a backup of ``replica``'s checkpoint at ``epoch`` (``files``: each
    partition's, held by the caller) and the log ``epoch``..``log_last`` into the empty
    ``dest``, then verify it whole. On any failure ``dest`` is emptied again."""
    try:
        copy_durably(config_path, dest / CONFIG)
        copy_checkpoints(files, dest / CHECKPOINTS)
        last = copy_log(log_dir, dest / LOG, epoch, log_last)
        hashes = [ckpt.read_info(dest / CHECKPOINTS / f.name).state_hash for f in files]
        write_manifest(dest, epoch, replica, len(files), hashes, last)
        return verify_backup(dest)
    except BaseException:
        for entry in dest.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        raise
