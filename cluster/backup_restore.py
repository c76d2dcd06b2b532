"""Point-in-time restore: a new cluster directory at a backup's epoch B, or at any later
epoch E that the backup's log and an archive cover (``ordo restore``).

How the epochs line up. The restored directory holds, for every partition of every
replica, one base checkpoint at E (written by this module from the rebuilt state;
``previous_epoch`` 0: the new cluster's first) and the command log's frames B..E (a
log whose first segment is named B, as a pruned log's is). So ``ordo up`` on it loads
each partition's checkpoint at E, and the sequencer resumes at E + 1: it reads E's
batch for the digest chain, the next txn id and the timestamp floor; no partition
replays anything. The history of the new cluster begins with the state at E; the
log's frames B..E are kept so the checkpoint's epoch and the log's agree and E's batch
is there to be read.

Building the state at E: the backup's checkpoint at B is loaded fully validated
(cluster.backup.verify_backup), then the frames B+1..E are replayed through
``LocalReplica`` (executor.replay.batches: the live partition code, every batch
checked, the digest chain followed). The state hash is checked against the history at
every epoch in B..E where it was recorded: B (the backup's manifest) and every
checkpoint epoch an archive recorded (cluster.backup_archive, history.jsonl). The
checkpoint files written are loaded back and must hash to the rebuilt state.

Invariants:
- A restore onto a directory that any process owns (cluster.ownership), or that holds
  anything, is refused before anything is read or written.
- The new directory is built under a temporary name beside it and renamed into place
  only when complete and checked: a failed restore leaves nothing behind, and the
  target never holds half a cluster.
- Nothing here writes to the backup or the archive.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster.backup import CONFIG, VerifiedBackup, verify_backup
from cluster.backup_archive import recorded_epochs
from cluster.config import ClusterConfig
from cluster.ownership import StateInUse, held_owners, owner_file
from cluster.replay_cli import replay_spec
from executor.core import checkpoint as ckpt
from executor.core.checkpoint.writer import fsync_dir
from executor.core.heap import settle_heap
from executor.deterministic.replica import LocalReplica
from executor.replay.batches import Replayer
from sequencer.log import CommandLog, LogCorruption, iter_frames
from txn_library import deployed
from txn_library.wire.sequencer import batch_digest, decode_batch

RESTORED = "restored.json"  # in the new directory: where it came from


class RestoreRefused(Exception):
    """The target directory cannot take a restore; nothing was touched."""


class HistoryMismatch(Exception):
    """A rebuilt state's hash differs from the one the history recorded at its epoch."""


@dataclass
class RestoreReport:
    data_dir: Path
    epoch: int
    backup_epoch: int
    state_hash: int
    partition_hashes: list[int]
    checked_epochs: list[int]  # epochs whose recorded hash the rebuilt state matched
    replayed_epochs: int
    txns: int
    notes: list[str] = field(default_factory=list)


def check_target(target: Path) -> None:
    """Refuse a target that a process owns or that holds anything (reads only)."""
    owners = held_owners(target)
    if owners:
        name, pid = owners[0]
        raise StateInUse(f"{target} (its {name})", owner_file(target, name), pid)
    if target.exists():
        if not target.is_dir():
            raise RestoreRefused(f"{target} exists and is not a directory")
        if any(target.iterdir()):
            raise RestoreRefused(
                f"{target} is not empty: a restore builds a new cluster directory; choose "
                f"a new or empty one"
            )


def _history(archive: Path | None, vb: VerifiedBackup) -> dict[int, tuple[int, ...]]:
    recorded = recorded_epochs(archive) if archive is not None else {}
    recorded[vb.manifest.epoch] = vb.manifest.partition_hashes
    return recorded


def _sources(vb: VerifiedBackup, archive: Path | None, last: int) -> Iterator[tuple[int, bytes]]:
    """Frames B..``last`` (as far as they go): the backup's log, then the archive's."""
    m = vb.manifest
    yield from iter_frames(vb.log_dir, m.epoch, min(last, m.log_last_epoch))
    if last > m.log_last_epoch and archive is not None and archive.is_dir():
        yield from iter_frames(archive, m.log_last_epoch + 1, last)


def covered_until(vb: VerifiedBackup, archive: Path | None) -> int:
    """The last epoch the backup's log and the archive cover without a gap from B."""
    expected = vb.manifest.log_last_epoch + 1
    if archive is not None and archive.is_dir():
        try:
            for epoch, _ in iter_frames(archive, expected):
                if epoch != expected:
                    break
                expected += 1
        except LogCorruption:
            pass  # the covered part ends before the bad frame
    return expected - 1


def write_log(vb: VerifiedBackup, archive: Path | None, epoch: int, log_dir: Path) -> None:
    """The restored log: frames B..``epoch``, contiguous, each batch's digest of its
    predecessor followed across the backup's and the archive's (and of ``epoch`` by
    its successor when a source holds it). LogCorruption names where it breaks."""
    expected = vb.manifest.epoch
    prev: bytes | None = None
    with CommandLog(log_dir) as out:
        out.start_at(expected)
        for e, payload in _sources(vb, archive, epoch + 1):
            if e != expected:
                if e > epoch:
                    break  # ``epoch``'s successor is not there to vouch for it
                raise LogCorruption(
                    archive or vb.log_dir, 0, expected, f"neither source holds epoch {expected}"
                )
            recorded = decode_batch(payload).prev_digest
            if prev is not None and recorded is not None and recorded != batch_digest(prev):
                raise LogCorruption(
                    archive or vb.log_dir,
                    0,
                    e - 1,
                    f"batch {e - 1} is not the one batch {e} records (another history?)",
                )
            if e > epoch:
                break  # read only to vouch for ``epoch``
            out.append(e, payload)
            prev, expected = payload, e + 1
        out.sync()
    if expected <= epoch:
        raise LogCorruption(vb.log_dir, 0, expected, f"the log ends at epoch {expected - 1}")


def rebuild(
    vb: VerifiedBackup, spec_log_dir: Path, epoch: int, history: dict[int, tuple[int, ...]]
) -> tuple[LocalReplica, list[int], int, int]:
    """The replica at ``epoch``: the backup's checkpoint, then the log replayed, the
    hash checked at every recorded epoch on the way. (replica, checked epochs, epochs
    replayed, txns)."""
    cfg = vb.config
    spec = replay_spec(cfg, spec_log_dir)
    spec.prepare()
    replica = LocalReplica(spec.partitions, [s for _, s in vb.loaded])
    for part, (info, _) in zip(replica.parts, vb.loaded, strict=True):
        part.restore(info.epoch, info.next_txn_id, info.txns_applied)
    settle_heap()
    replayer = Replayer(replica, spec.partitions)
    stops = sorted(e for e in history if vb.manifest.epoch <= e <= epoch)
    checked: list[int] = []
    for stop in [*stops, epoch]:
        if stop > replayer.last_epoch:
            replayer.run(spec.log_dir, stop)
        if stop in history and stop not in checked:
            have = [p.storage.state_hash for p in replica.parts]
            if tuple(have) != history[stop]:
                raise HistoryMismatch(
                    f"epoch {stop}: the rebuilt state hashes to "
                    f"{', '.join(f'{h:016x}' for h in have)}; the history recorded "
                    f"{', '.join(f'{h:016x}' for h in history[stop])}"
                )
            checked.append(stop)
    return replica, checked, replayer.stats.epochs, replayer.stats.txns


def single_sequencer(cfg: ClusterConfig, data_dir: Path) -> ClusterConfig:
    """The restored cluster's config: the backup's, in ``data_dir``, with one sequencer
    on this host (a replicated ordering layer's ZooKeeper state is not in a backup)."""
    return replace(
        cfg,
        data_dir=str(data_dir),
        sequencers=1,
        zookeeper_servers=0,
        hosts={},
        sequencer_hosts=(),
        zookeeper_hosts=(),
        partition_hosts=(),
        reader_hosts=(),
        curve=False,
        fault_drop_every_nth_batch=0,
    )


def write_checkpoints(
    cfg: ClusterConfig, replica: LocalReplica, epoch: int, next_txn_id: int, root: Path
) -> None:
    """A base at ``epoch`` for every partition of every replica, each loaded back and
    checked against the rebuilt state. ``next_txn_id``: the one after ``epoch``'s batch,
    where the sequencer resumes (every partition must agree)."""
    for part in replica.parts:
        if (part.last_epoch, part.next_txn_id) != (epoch, next_txn_id):
            raise HistoryMismatch(
                f"partition {part.partition} rebuilt to epoch {part.last_epoch}, next txn "
                f"{part.next_txn_id}; epoch {epoch}'s batch says next txn {next_txn_id}"
            )
    for r in range(cfg.replicas):
        directory = root / f"replica-{r}" / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        for part in replica.parts:
            path = ckpt.write_checkpoint(
                directory,
                part.storage,
                replica=r,
                partition=part.partition,
                partitions=cfg.partitions,
                epoch=epoch,
                next_txn_id=part.next_txn_id,
                txns_applied=part.txns_applied,
                previous_epoch=0,
            )
            info, _ = ckpt.load(path)
            if info.state_hash != part.storage.state_hash:
                raise HistoryMismatch(
                    f"{path}: written with hash {info.state_hash:016x}, the state is "
                    f"{part.storage.state_hash:016x}"
                )


def restore(
    source: Path, target: Path, epoch: int | None = None, archive: Path | None = None
) -> RestoreReport:
    """Build a new cluster directory ``target`` from the backup in ``source`` at
    ``epoch`` (default: the backup's), with frames past the backup's log from
    ``archive``. Raises StateInUse / RestoreRefused (nothing touched), BackupInvalid
    (naming the file), LogCorruption, ReplayFailure or HistoryMismatch (nothing left)."""
    target = target.absolute()
    check_target(target)
    vb = verify_backup(source)
    m = vb.manifest
    want = m.epoch if epoch is None else epoch
    covered = covered_until(vb, archive)
    if not m.epoch <= want <= covered:
        where = f"the backup's log and {archive}" if archive is not None else "the backup's log"
        raise RestoreRefused(
            f"epoch {want} is not covered: the backup is at epoch {m.epoch} and "
            f"{where} hold epochs up to {covered}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.restoring-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        cfg = single_sequencer(vb.config, target)
        write_log(vb, archive, want, staging / "log")
        replica, checked, epochs, txns = rebuild(vb, staging / "log", want, _history(archive, vb))
        with CommandLog(staging / "log") as restored_log:
            next_txn_id = decode_batch(restored_log.read(want)).next_txn_id
        write_checkpoints(cfg, replica, want, next_txn_id, staging)
        # The procedures deployed up to ``want`` (the rebuild installed them): where
        # each replica and the sequencer keep them (txn_library.deployed.CodeStore).
        records = [r for r in deployed.installed() if r.effective_epoch <= want + 1]
        for r in range(cfg.replicas):
            deployed.CodeStore(staging / f"replica-{r}" / "checkpoints" / "deploys").save(records)
        deployed.CodeStore(staging / "log" / "deploys").save(records)
        (staging / CONFIG).write_text(cfg.to_json())
        report = RestoreReport(
            target,
            want,
            m.epoch,
            replica.state_hash,
            [p.storage.state_hash for p in replica.parts],
            checked,
            epochs,
            txns,
        )
        (staging / RESTORED).write_text(_provenance(source, archive, report))
        fsync_dir(staging)
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def _provenance(source: Path, archive: Path | None, report: RestoreReport) -> str:
    return json.dumps(
        {
            "backup": str(source.absolute()),
            "archive": None if archive is None else str(archive.absolute()),
            "backup_epoch": report.backup_epoch,
            "epoch": report.epoch,
            "state_hash": f"{report.state_hash:016x}",
            "checked_epochs": report.checked_epochs,
            "restored": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        indent=2,
    )


def _move_into_place(staging: Path, target: Path) -> None:
    """Rename the finished directory onto ``target`` (absent, or still empty: checked
    again, so a process that claimed it meanwhile keeps it)."""
    check_target(target)
    if target.exists():
        target.rmdir()  # empty (checked): fails rather than delete what appeared since
    os.rename(staging, target)
    fsync_dir(target.parent)
