"""The ``ordo`` commands for backups and point-in-time restore.

  ordo backup DEST        one replica's fresh checkpoint, the log after it and
                          cluster.json, taken while the cluster serves, then verified
  ordo log archive DEST   ship sealed log segments (and the history's checkpoint
                          hashes) to DEST as they seal, until stopped (--once: one pass)
  ordo restore SRC --data-dir NEW [--epoch E] [--archive DIR]
                          a new cluster directory at the backup's epoch or a later one

The files and checks are cluster.backup (the backup directory), cluster.backup_archive
(the archive) and cluster.backup_restore (how a restore lines up its epochs); this
module reaches the cluster and reports. Every failure is one line naming the file or
the cause, never a traceback, and a refused restore has touched nothing.
"""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cluster.commands.common import (
    data_dir_option,
    leader_address,
    load_config,
    load_procedure_modules,
)
from cluster.config import CONFIG_FILE, ClusterConfig

if TYPE_CHECKING:
    from cluster.backup import VerifiedBackup

ARCHIVE_INTERVAL_S = 1.0  # between two passes of ``ordo log archive``


def _progress(text: str) -> None:
    click.echo(text, err=True)


def _local_log_dir(cfg: ClusterConfig, address: str) -> Path:
    """The command log of the sequencer at ``address`` (the leader), on this machine."""
    member = next((m for m in range(cfg.sequencers) if cfg.client_addr_of(m) == address), 0)
    log_dir = cfg.sequencer_log_dir(member)
    if not log_dir.is_dir():
        raise click.ClickException(
            f"no command log at {log_dir}: run the backup on the host of sequencer {member}"
        )
    return log_dir


@click.command()
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--replica", "-r", default=0, show_default=True, help="The replica to copy.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for it.")
@data_dir_option
def backup(dest: str, replica: int, timeout: float, data_dir: str) -> None:
    """Back up a running cluster into DEST (new or empty): a fresh checkpoint of one
    replica (every partition at one epoch B), the command log from B to the newest
    durable epoch, and cluster.json; then verify every file it wrote (CRCs, chain
    links, the state hash, the log's digest chain)."""
    from cluster.backup import prepare_destination, summary

    cfg = load_config(data_dir)
    load_procedure_modules(cfg)  # a checkpoint loads into the tables they declare
    if not 0 <= replica < cfg.replicas:
        raise click.UsageError(
            f"--replica {replica}: the cluster has replicas 0..{cfg.replicas - 1}"
        )
    if cfg.checkpoint_keep <= 0:
        raise click.ClickException("checkpoints are disabled (checkpoint_keep = 0)")
    out = Path(dest)
    created = not out.exists()
    try:  # before the checkpoint: a refused DEST costs the cluster nothing
        prepare_destination(out)
    except FileExistsError as e:
        raise click.ClickException(str(e)) from None
    try:
        verified = _take_backup(cfg, out, replica, timeout)
    except BaseException:
        if created:  # emptied by write_backup, or never written
            with suppress(OSError):
                out.rmdir()
        raise
    s = summary(verified.manifest)
    first, last = s["log_epochs"]
    click.echo(
        f"backup of replica {replica} at epoch {s['epoch']} (state hash {s['state_hash']}) "
        f"+ log epochs {first}..{last} -> {dest}: {s['files']} files, verified"
    )


def _take_backup(cfg: ClusterConfig, out: Path, replica: int, timeout: float) -> VerifiedBackup:
    """Hold a fresh checkpoint of ``replica``, write the backup into ``out``, verify it."""
    from cluster.backup import BackupInvalid, write_backup
    from cluster.fresh_checkpoint import CheckpointUnavailable, hold_fresh_checkpoint
    from cluster.launcher import cluster_client
    from executor.core import checkpoint as ckpt
    from sequencer.log import LogCorruption
    from txn_library.errors import OrdoError

    address = leader_address(cfg)
    log_dir = _local_log_dir(cfg, address)
    try:
        with (
            cluster_client(cfg, address) as c,
            hold_fresh_checkpoint(c, cfg, replica, timeout, _progress) as (epoch, files),
        ):
            try:
                durable = int(c.status()["epoch"])  # published, so synced: history
            except (OrdoError, KeyError, TypeError, ValueError) as e:
                raise click.ClickException(f"no status from {address}: {e}") from None
            return write_backup(
                out, Path(cfg.data_dir) / CONFIG_FILE, replica, epoch, files, log_dir, durable
            )
    except CheckpointUnavailable as e:
        raise click.ClickException(str(e)) from None
    except BackupInvalid as e:
        raise click.ClickException(f"backup failed its verification: {e}") from None
    except (LogCorruption, ckpt.CheckpointInvalid, OSError) as e:
        raise click.ClickException(f"backup failed: {e}") from None


@click.command("archive")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option(
    "--interval", default=ARCHIVE_INTERVAL_S, show_default=True, help="Seconds between passes."
)
@click.option(
    "--replica", "-r", default=0, show_default=True, help="Whose checkpoint hashes to record."
)
@data_dir_option
def log_archive(dest: str, once: bool, interval: float, replica: int, data_dir: str) -> None:
    """Ship every sealed log segment to DEST as it seals (each verified there), and
    record the state hashes of the replica's checkpoints (DEST/history.jsonl), until
    Ctrl-C. A restore takes DEST as its --archive. Reads the cluster's files only."""
    from cluster.backup_archive import ArchiveConflict, ship_once
    from cluster.launcher import stop_requested_on_signals
    from sequencer.log import LogCorruption

    cfg = load_config(data_dir)
    if not 0 <= replica < cfg.replicas:
        raise click.UsageError(
            f"--replica {replica}: the cluster has replicas 0..{cfg.replicas - 1}"
        )
    log_dir = cfg.log_dir
    if not log_dir.is_dir():
        raise click.ClickException(f"no command log at {log_dir}")
    out = Path(dest)
    stopping = (lambda: True) if once else stop_requested_on_signals()
    while True:
        try:
            report = ship_once(
                log_dir,
                out,
                cfg.checkpoint_dir(replica),
                replica,
                cfg.partitions,
                on_segment=lambda p: click.echo(f"shipped {p.name}"),
            )
        except (ArchiveConflict, LogCorruption) as e:
            raise click.ClickException(f"archive stopped: {e}") from None
        except OSError as e:
            raise click.ClickException(f"archive stopped ({out}): {e}") from None
        for name in report.vanished:  # a restore past it needs prune's own --archive copy
            click.echo(f"warning: {name} was pruned before it was shipped", err=True)
        if once or stopping():
            break
        time.sleep(interval)


@click.command()
@click.argument("src", type=click.Path(file_okay=False))
@click.option("--data-dir", required=True, help="The new cluster directory (new or empty).")
@click.option("--epoch", "-e", type=int, default=None, help="Epoch [the backup's].")
@click.option(
    "--archive",
    default=None,
    type=click.Path(file_okay=False),
    help="Log archive (ordo log archive) for epochs past the backup's log.",
)
def restore(src: str, data_dir: str, epoch: int | None, archive: str | None) -> None:
    """Build a new cluster directory from the backup in SRC at its epoch, or at a later
    EPOCH the backup's log and the archive cover; the rebuilt state's hash is checked
    against every hash the history recorded on the way. `ordo up --data-dir NEW` then
    serves from that epoch on. A directory in use or not empty is refused untouched."""
    from cluster.backup import BackupInvalid
    from cluster.backup_restore import HistoryMismatch, RestoreRefused
    from cluster.backup_restore import restore as run_restore
    from cluster.ownership import StateInUse
    from executor.core import checkpoint as ckpt
    from executor.replay.batches import ReplayFailure
    from sequencer.log import LogCorruption

    try:
        report = run_restore(
            Path(src), Path(data_dir), epoch, Path(archive) if archive is not None else None
        )
    except (StateInUse, RestoreRefused) as e:
        raise click.ClickException(f"restore refused, nothing touched: {e}") from None
    except BackupInvalid as e:
        raise click.ClickException(f"the backup is damaged: {e}") from None
    except (LogCorruption, ReplayFailure, HistoryMismatch, ckpt.CheckpointInvalid) as e:
        raise click.ClickException(f"restore failed, nothing written: {e}") from None
    except (OSError, ImportError) as e:
        raise click.ClickException(f"restore failed, nothing written: {e}") from None
    checked = ", ".join(map(str, report.checked_epochs))
    click.echo(
        f"restored epoch {report.epoch} into {report.data_dir} (backup at epoch "
        f"{report.backup_epoch} + {report.replayed_epochs} epochs, {report.txns:,} txns "
        f"replayed): state hash {report.state_hash:016x}, matching the history at "
        f"epochs {checked}"
    )
    click.echo(f"start it with: ordo up --data-dir {report.data_dir}")
