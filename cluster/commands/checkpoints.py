"""The ``ordo`` commands on checkpoints and the command log.

  ordo checkpoint   checkpoint every partition after the next epoch; wait until durable
  ordo dump         export one replica's tables as of a fresh checkpoint
  ordo log prune    remove log segments every partition's checkpoint has made unneeded

Each asks the leading sequencer and waits for the partitions' answer; a dump reads
checkpoint files held against pruning until they are read (cluster.fresh_checkpoint).
"""

from __future__ import annotations

import click

from cluster.commands.common import (
    data_dir_option,
    leader_address,
    load_config,
    load_procedure_modules,
)


@click.command()
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for it.")
@data_dir_option
def checkpoint(timeout: float, data_dir: str) -> None:
    """Ask every partition of every replica to checkpoint after the next epoch, and wait
    until each reports it durable (a partition still writing an earlier checkpoint
    finishes that one first)."""
    from cluster.fresh_checkpoint import CheckpointUnavailable, wait_fresh_checkpoint
    from cluster.launcher import cluster_client

    cfg = load_config(data_dir)
    with cluster_client(cfg, leader_address(cfg)) as c:
        try:
            epoch = wait_fresh_checkpoint(
                c, range(cfg.replicas), cfg.partitions, timeout, _progress
            )
        except CheckpointUnavailable as e:
            raise click.ClickException(str(e)) from None
    click.echo(
        f"checkpoint at epoch {epoch} written by {cfg.replicas * cfg.partitions} partitions "
        f"(in {cfg.data_dir}/replica-*/checkpoints)"
    )


def _progress(text: str) -> None:
    click.echo(text, err=True)


@click.command()
@click.option("--replica", "-r", default=0, show_default=True)
@click.option("--out", "out_dir", required=True, help="Directory to write <table>/part-*.")
@click.option(
    "--format", "fmt", type=click.Choice(["parquet", "csv"]), default="parquet", show_default=True
)
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for it.")
@data_dir_option
def dump(replica: int, out_dir: str, fmt: str, timeout: float, data_dir: str) -> None:
    """Export one replica's tables as of a fresh checkpoint (a consistent epoch boundary).

    Requests a checkpoint, waits until every partition of the replica reports it
    durable (progress on stderr), then reads each partition's file, held against
    pruning until it is read (cluster.fresh_checkpoint).
    """
    from concurrent.futures.process import BrokenProcessPool

    from cluster.fresh_checkpoint import CheckpointUnavailable, hold_fresh_checkpoint
    from cluster.launcher import cluster_client
    from executor.core import checkpoint as ckpt
    from executor.replay.export import export_checkpoints, prepare_output, write_marker

    cfg = load_config(data_dir)
    load_procedure_modules(cfg)
    if not 0 <= replica < cfg.replicas:
        raise click.UsageError(
            f"--replica {replica}: the cluster has replicas 0..{cfg.replicas - 1}"
        )
    if cfg.checkpoint_keep <= 0:
        raise click.ClickException("checkpoints are disabled (checkpoint_keep = 0)")
    try:  # before the checkpoint: a refused --out costs the cluster nothing
        out = prepare_output(out_dir, "dump")
    except FileExistsError as e:
        raise click.ClickException(str(e)) from None
    try:
        with (
            cluster_client(cfg, leader_address(cfg)) as c,
            hold_fresh_checkpoint(c, cfg, replica, timeout, _progress) as (epoch, files),
        ):
            # Marked first: a dump that stops half way is replaced by the next one to --out.
            write_marker(out, "dump", {"replica": replica, "epoch": epoch, "complete": False})
            try:
                totals = export_checkpoints(files, out, fmt, cfg.procedure_modules)
            except (ckpt.CheckpointInvalid, OSError, BrokenProcessPool) as e:
                raise click.ClickException(f"export incomplete ({out_dir}): {e}") from None
    except CheckpointUnavailable as e:
        raise click.ClickException(str(e)) from None
    write_marker(
        out,
        "dump",
        {"replica": replica, "epoch": epoch, "complete": True, "format": fmt, "rows": totals},
    )
    click.echo(f"replica {replica} at epoch {epoch} -> {out_dir} ({fmt})")
    for t, n in sorted(totals.items()):
        click.echo(f"  {t:<20} {n:>10} rows")


@click.group()
def log() -> None:
    """Command log maintenance."""


@log.command("prune")
@click.option("--archive", default=None, help="Move segments here instead of deleting them.")
@data_dir_option
def log_prune(archive: str | None, data_dir: str) -> None:
    """Remove log segments older than every partition's newest checkpoint.

    Never silent: prints what it removed. Segments still needed by any partition's
    recovery are kept. Note that Spark replay of the pruned history needs the archive.
    """
    from cluster.launcher import cluster_client
    from txn_library.errors import CallFailed, OrdoError
    from txn_library.wire import sequencer as wire

    cfg = load_config(data_dir)
    with cluster_client(cfg, leader_address(cfg)) as c:
        try:
            removed = c.control(wire.PruneRequest(archive))
        except CallFailed as e:
            raise click.ClickException(f"nothing pruned: {e.message}") from None
        except OrdoError as e:
            raise click.ClickException(f"no answer at {cfg.client_addr}: {e}") from None
    verb = f"archived to {archive}" if archive else "deleted"
    click.echo(f"{len(removed)} segment(s) {verb}")
    for p in removed:
        click.echo(f"  {p}")
