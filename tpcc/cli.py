"""``ordo tpcc``: run the TPC-C driver, or check a running TPC-C cluster.

  ordo tpcc up       start a TPC-C cluster (partitions load their warehouses), foreground
  ordo tpcc run      embedded cluster (or --attach DATA_DIR), drive terminals, report,
                     check consistency and replica hashes, write JSON
  ordo tpcc check    consistency conditions (all but 10) + replica hashes on a running cluster

Registered on the ``ordo`` group by cluster/cli.py. Top-level imports stay light
(click only) so that ``ordo --help`` does not pay for the driver.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import click


@click.group()
def tpcc() -> None:
    """TPC-C on Ordo: driver and consistency checks."""


@tpcc.command()
@click.option("--warehouses", "-w", default=2, show_default=True)
@click.option("--partitions", default=2, show_default=True)
@click.option("--replicas", default=2, show_default=True)
@click.option("--fsync/--no-fsync", default=True, show_default=True)
@click.option("--epoch-ms", default=10, show_default=True)
@click.option("--base-port", default=17100, show_default=True)
@click.option("--load-seed", default=1, show_default=True, help="Database population seed.")
@click.option("--fresh", is_flag=True, help="Delete the data directory first.")
@click.option("--data-dir", default="ordo-data", show_default=True)
def up(
    warehouses: int,
    partitions: int,
    replicas: int,
    fsync: bool,
    epoch_ms: int,
    base_port: int,
    load_seed: int,
    fresh: bool,
    data_dir: str,
) -> None:
    """Start a TPC-C cluster on 127.0.0.1 and stay in the foreground until Ctrl-C.

    Each partition generates and loads its own warehouses (clause 4.3.3.1) at startup;
    drive it with `ordo tpcc run --attach DATA_DIR` or scripts/locustfile.py.
    """
    from pathlib import Path

    from cluster.commands.run import metrics_banner
    from cluster.launcher import ChildExited, stop_requested_on_signals
    from cluster.ownership import StateInUse, claim_cluster_dir
    from tpcc.driver import RunOptions, embedded_config, start_cluster

    if Path(data_dir).exists() and not fresh:
        raise click.ClickException(
            f"{data_dir} exists; pass --fresh to start a new TPC-C database there"
        )
    try:  # --fresh never deletes a directory a live cluster is using
        owner = claim_cluster_dir(data_dir, fresh=fresh)
    except StateInUse as e:
        raise click.ClickException(str(e)) from None
    opts = RunOptions(
        warehouses=warehouses,
        partitions=partitions,
        replicas=replicas,
        fsync=fsync,
        epoch_ms=epoch_ms,
        load_seed=load_seed,
    )
    cfg = embedded_config(opts, data_dir, base_port)
    stopping = stop_requested_on_signals()
    with owner:
        try:
            cluster = start_cluster(cfg, True, lambda line: click.echo(line, err=True))
        except ChildExited as e:
            raise click.ClickException(str(e)) from None
        try:
            click.echo(
                f"ordo tpcc up: W={warehouses} at {cfg.client_addr}, {replicas} replicas x "
                f"{partitions} partitions, data in {data_dir} (Ctrl-C to stop)"
            )
            click.echo(metrics_banner(cfg, False, "ordo tpcc up"))
            cluster.run_foreground(stopping)
        except ChildExited as e:
            raise click.ClickException(str(e)) from None
        finally:
            click.echo("ordo tpcc up: stopping")
            cluster.stop()


@tpcc.command()
@click.option("--warehouses", "-w", default=2, show_default=True, help="W (embedded cluster).")
@click.option("--partitions", default=2, show_default=True)
@click.option("--replicas", default=1, show_default=True)
@click.option(
    "--fsync/--no-fsync",
    default=True,
    show_default=True,
    help="Durable command log (fdatasync per epoch); --no-fsync for experiments only.",
)
@click.option("--epoch-ms", default=10, show_default=True)
@click.option(
    "--attach",
    metavar="DATA_DIR",
    default=None,
    help="Drive a running cluster (started with genesis tpcc.loader:genesis) instead.",
)
@click.option(
    "--data-dir",
    default=None,
    help="Embedded cluster directory (default: a temporary one, removed afterwards).",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Delete --data-dir first if it exists (without it, an existing one is refused).",
)
@click.option("--keep-data", is_flag=True, help="Keep the temporary data directory.")
@click.option(
    "--mix",
    type=click.Choice(["new-order", "standard"]),
    default="new-order",
    show_default=True,
    help="new-order: 100% New-Order (the seed paper); standard: 45/43/4/4/4.",
)
@click.option("--duration", default=30.0, show_default=True, help="Measured seconds.")
@click.option("--warmup", default=5.0, show_default=True, help="Seconds before measuring.")
@click.option(
    "--remote-pct",
    default=1.0,
    show_default=True,
    help="Percent of New-Order lines supplied by a remote warehouse (spec: 1).",
)
@click.option(
    "--terminals",
    default=200,
    show_default=True,
    help="Concurrent terminals (calls in flight, closed loop).",
)
@click.option("--open-loop", is_flag=True, help="Submit at --rate txn/s regardless of answers.")
@click.option("--rate", default=0.0, help="Open-loop rate (txn/s).")
@click.option("--seed", default=1, show_default=True, help="Driver input seed.")
@click.option("--load-seed", default=1, show_default=True, help="Database population seed.")
@click.option(
    "--payment-rc",
    is_flag=True,
    help="Payment by last name without the re-check (read-committed variant).",
)
@click.option(
    "--read-only-as",
    type=click.Choice(["sequenced", "snapshot"]),
    default="sequenced",
    show_default=True,
    help="Order-Status and Stock-Level: through the sequencer (run unlogged at one "
    "replica), or straight to the partitions as snapshot queries (docs/QUERIES.md).",
)
@click.option(
    "--no-versions",
    is_flag=True,
    help="Keep no row versions (ClusterConfig.query_versions off; embedded cluster): "
    "what keeping them costs. Snapshot queries are then refused.",
)
@click.option(
    "--readers",
    default=0,
    show_default=True,
    help="Readers beside the replicas (embedded cluster): they follow the log and the "
    "replicas keep no row versions; the run reports their lag behind the sequencer.",
)
@click.option("--check/--no-check", default=True, show_default=True)
@click.option(
    "--out",
    default=None,
    help="Where the run's JSON goes (default: tpcc/run.json in the scratch directory, "
    "$ORDO_SCRATCH or <tmp>/ordo-bench; with --publish results/tpcc/run.json).",
)
@click.option("--publish", is_flag=True, help="Write into results/ (the figures the docs cite).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def run(
    warehouses: int,
    partitions: int,
    replicas: int,
    fsync: bool,
    epoch_ms: int,
    attach: str | None,
    data_dir: str | None,
    fresh: bool,
    keep_data: bool,
    mix: str,
    duration: float,
    warmup: float,
    remote_pct: float,
    terminals: int,
    open_loop: bool,
    rate: float,
    seed: int,
    load_seed: int,
    payment_rc: bool,
    read_only_as: str,
    no_versions: bool,
    readers: int,
    check: bool,
    out: str | None,
    publish: bool,
    quiet: bool,
) -> None:
    """Drive TPC-C terminals against Ordo and report throughput, latency and checks.

    Terminals run back to back (closed loop) or at a fixed rate (open loop): no keying
    or think times, so the numbers are engine capacity, not a compliant tpmC.
    """
    from cluster.launcher import ChildExited
    from cluster.ownership import StateInUse
    from tpcc.driver import RunOptions
    from tpcc.driver import run as run_driver

    if open_loop and rate <= 0:
        raise click.UsageError("--open-loop needs --rate > 0")
    if attach is not None:
        from cluster.commands.common import load_config

        load_config(attach)  # a missing or broken cluster.json: one clear line, early
    opts = RunOptions(
        warehouses=warehouses,
        partitions=partitions,
        replicas=replicas,
        fsync=fsync,
        epoch_ms=epoch_ms,
        mix=mix,
        duration_s=duration,
        warmup_s=warmup,
        remote_pct=remote_pct,
        terminals=terminals,
        open_loop=open_loop,
        rate=rate,
        seed=seed,
        load_seed=load_seed,
        payment_rc=payment_rc,
        check=check,
        attach=attach,
        data_dir=data_dir,
        fresh=fresh,
        keep_data=keep_data,
        out=out or _default_out(publish),
        progress=not quiet,
        versions=not no_versions,
        readers=readers,
        queries=read_only_as,
    )
    try:
        result = run_driver(opts)
    except (ValueError, FileNotFoundError, FileExistsError, StateInUse, ChildExited) as e:
        raise click.ClickException(str(e)) from None
    if check and not result.get("check", {}).get("ok", False):
        sys.exit(1)


@tpcc.command()
@click.option("--data-dir", default="ordo-data", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--timeout", default=120.0, show_default=True)
@click.option(
    "--dump",
    "dump_dir",
    default=None,
    help="Check this `ordo dump` or `ordo replay state` output instead of the cluster.",
)
@click.option(
    "--whole",
    is_flag=True,
    help="Conditions 1-12 on the running cluster: one replica as of a fresh checkpoint "
    "(dumped to a temporary directory, then checked as --dump checks).",
)
@click.option("--replica", default=0, show_default=True, help="The replica --whole checks.")
def check(
    data_dir: str, as_json: bool, timeout: float, dump_dir: str | None, whole: bool, replica: int
) -> None:
    """Consistency conditions 1-9, 11, 12 on every warehouse of every replica, and equal
    replica state hashes, on the running cluster in DATA_DIR; with --dump, conditions
    1-12 on a whole database written to files (CSV or Parquet); with --whole, conditions
    1-12 on one replica of the running cluster at a consistent epoch (condition 10 needs
    every warehouse's payments, so only a whole database shows it)."""
    if dump_dir is not None and whole:
        raise click.UsageError("--dump checks files, --whole the cluster: give one")
    if dump_dir is not None:
        _check_dump(dump_dir, as_json)
        return
    if whole:
        _check_whole(data_dir, replica, timeout, as_json)
        return
    from cluster.commands.common import load_config
    from tpcc.driver import check_cluster, warehouses_of

    cfg = load_config(data_dir)
    try:
        warehouses = warehouses_of(cfg)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    verdict = check_cluster(cfg, warehouses, lambda line: click.echo(line), timeout)
    if as_json:
        click.echo(json.dumps(verdict, indent=2))
    if not verdict["ok"]:
        sys.exit(1)


def _check_whole(data_dir: str, replica: int, timeout: float, as_json: bool) -> None:
    """``ordo dump`` of ``replica`` (Parquet, its lines on stderr) into a temporary
    directory, checked as ``--dump`` checks, then deleted."""
    import contextlib
    import shutil
    import tempfile
    from pathlib import Path

    from cluster.commands.checkpoints import dump

    tmp = tempfile.mkdtemp(prefix="ordo-tpcc-check-")
    try:
        out = str(Path(tmp) / "dump")
        with contextlib.redirect_stdout(sys.stderr):
            args = {"replica": replica, "out_dir": out, "fmt": "parquet", "timeout": timeout}
            click.get_current_context().invoke(dump, **args, data_dir=data_dir)
        _check_dump(out, as_json)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_dump(dump_dir: str, as_json: bool) -> None:
    from tpcc.dump_check import DumpUnreadable, check_dump

    try:
        verdict = check_dump(dump_dir)
    except DumpUnreadable as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(verdict, indent=2))
    else:
        for line in verdict["violations"]:
            click.echo(line)
        w = verdict["warehouses"]
        state = "consistent" if verdict["ok"] else f"{len(verdict['violations'])} violations"
        click.echo(f"conditions 1-12 on {len(w)} warehouses of {dump_dir}: {state}")
    if not verdict["ok"]:
        sys.exit(1)


def _default_out(publish: bool) -> str:
    """results/tpcc/run.json when publishing, else the same name in the scratch directory
    (the rule of scripts/bench_outputs.py: a run never replaces published figures
    unasked)."""
    if publish:
        return "results/tpcc/run.json"
    scratch = os.environ.get("ORDO_SCRATCH") or os.path.join(tempfile.gettempdir(), "ordo-bench")
    return os.path.join(scratch, "tpcc", "run.json")
