"""The ``ordo`` commands that run the cluster's processes.

  ordo up           start sequencer + replicas on 127.0.0.1, foreground until Ctrl-C
                    (--ha: 3 ZooKeeper servers, 3 sequencers, loopback hosts, CURVE)
  ordo sequencer    run a sequencer process of a cluster (--id N of a replicated one)
  ordo zookeeper    run ZooKeeper server --id N of a multi-host cluster on its host
  ordo replica      run one partition (or all partitions) of one replica
  ordo reader       run one reader (follows the log holding every partition, answers
                    queries; `ordo up --readers N` starts N)
  ordo traditional-partition
                    run one partition process of a 2PL + 2PC cluster (`ordo up` starts it)

``ordo up`` owns its data directory for its whole run (cluster.ownership) and keeps
the database's own settings from the cluster.json there, never the flags' defaults
(``_config_for_up``; every ClusterConfig field is placed in one of its groups).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from cluster.commands.common import (
    cluster_file_option,
    data_dir_option,
    load_config,
    role_config,
)
from cluster.config import CONFIG_FILE, DEFAULT_BASE_PORT, ClusterConfig


@click.command()
@click.option(
    "--replicas",
    type=int,
    default=None,
    help="Replicas [default: the data directory's cluster's, else 2].",
)
@click.option(
    "--partitions",
    type=int,
    default=None,
    help="Partitions per replica [default: the data directory's cluster's, else 2].",
)
@click.option("--base-port", default=DEFAULT_BASE_PORT, show_default=True)
@click.option("--epoch-ms", default=10, show_default=True, help="Epoch length.")
@click.option("--no-fsync", is_flag=True, help="Skip fdatasync (benchmarks only: not durable).")
@click.option("--fresh", is_flag=True, help="Delete the data directory first.")
@click.option(
    "--module", "modules", multiple=True, help="Extra module registering procedures (repeatable)."
)
@click.option(
    "--checkpoint-every", default=0, show_default=True, help="Checkpoint every N epochs (0: never)."
)
@click.option(
    "--dataflow-recovery",
    type=click.Choice(["strong", "weak"]),
    default="strong",
    show_default=True,
    help="Dataflows: log every transaction a push derives (strong), or only the push and "
    "derive them again on replay (weak). Same state either way (docs/STREAMS.md).",
)
@click.option(
    "--mode",
    type=click.Choice(["deterministic", "traditional"]),
    default="deterministic",
    show_default=True,
    help="Ordo (sequenced, deterministic) or the 2PL + 2PC baseline.",
)
@click.option("--no-update-locks", is_flag=True, help="Traditional mode: shared, then upgrade.")
@click.option(
    "--ha",
    is_flag=True,
    help="Highly available layout on this machine: 3 ZooKeeper servers, 3 sequencers "
    "(one leads, elected through ZooKeeper), hosts on loopback addresses 127.0.0.1-3, "
    "CURVE on every socket.",
)
@click.option(
    "--readers",
    type=int,
    default=None,
    help="Readers: processes that follow the log holding every partition and answer "
    "snapshot and read-committed queries (docs/QUERIES.md) [default: the data "
    "directory's cluster's, else 0].",
)
@click.option(
    "--replica-versions/--no-replica-versions",
    default=None,
    help="Whether the transactional replicas keep row versions for snapshot queries. "
    "Default: they do without readers and keep none with --readers (the readers keep "
    "their own, so transactions stop paying for them). cluster.json records the choice.",
)
@click.option(
    "--metrics-port",
    default=0,
    show_default=True,
    help="First port of the processes' Prometheus endpoints (0: after the cluster's "
    "other ports). `ordo up` prints them and writes DATA_DIR/prometheus.yml.",
)
@data_dir_option
def up(
    replicas: int | None,
    partitions: int | None,
    base_port: int,
    epoch_ms: int,
    no_fsync: bool,
    fresh: bool,
    modules: tuple[str, ...],
    checkpoint_every: int,
    dataflow_recovery: str,
    mode: str,
    no_update_locks: bool,
    ha: bool,
    readers: int | None,
    replica_versions: bool | None,
    metrics_port: int,
    data_dir: str,
) -> None:
    """Start a local cluster and stay in the foreground until Ctrl-C.

    --mode traditional starts the 2PL + 2PC baseline instead (one replica; clients talk
    to any partition, e.g. `ordo call` reaches partition 0).
    """
    with _cluster_dir_owned(data_dir, fresh):  # before anything there is read or written
        from dataclasses import replace

        from cluster.launcher import LocalCluster, ProcessGroup, stop_requested_on_signals

        try:
            cfg = _config_for_up(
                data_dir,
                replicas,
                partitions,
                base_port,
                epoch_ms,
                not no_fsync,
                modules,
                checkpoint_every,
                dataflow_recovery,
                readers,
                replica_versions,
                metrics_port,
            )
        except ValueError as e:  # a shape or port the config refuses
            raise click.UsageError(str(e)) from None
        if ha:
            if mode == "traditional":
                raise click.ClickException(
                    "--ha replicates Ordo's ordering layer; not with --mode traditional"
                )
            cfg = ha_layout(cfg)
        existing = Path(data_dir) / CONFIG_FILE
        if existing.exists() and load_config(data_dir).sequencers != cfg.sequencers:
            held = "a replicated" if load_config(data_dir).sequencers > 1 else "a single-sequencer"
            raise click.ClickException(
                f"{data_dir} holds {held} cluster; use --fresh to start over, or "
                f"{'add' if held.startswith('a repl') else 'drop'} --ha"
            )
        cluster: ProcessGroup
        replicas, partitions, readers = cfg.replicas, cfg.partitions, cfg.readers
        if mode == "traditional" and readers:
            raise click.ClickException(
                "readers follow Ordo's command log; the traditional mode has none"
            )
        if mode == "traditional":
            from cluster.traditional_server import TraditionalCluster
            from executor.traditional.options import TraditionalOptions

            if replicas != 1:
                click.echo("ordo up: the traditional mode is not replicated; using 1 replica")
            cfg = replace(cfg, replicas=1)
            cluster = TraditionalCluster(cfg, TraditionalOptions(update_locks=not no_update_locks))
            banner = f"traditional (2PL + 2PC) mode, {partitions} partitions"
        else:
            cluster = LocalCluster(cfg)
            shape = f"{replicas} replicas x {partitions} partitions" + (
                f", {readers} reader(s) at {', '.join(cfg.reader_addrs)}" if readers else ""
            )
            if readers and not cfg.replica_versions:
                shape += " (snapshots from the readers: the replicas keep no row versions)"
            banner = f"sequencer at {cfg.client_addr}, {shape}"
            if cfg.replicated:
                banner = (
                    f"{cfg.sequencers} sequencers at {', '.join(cfg.client_addrs)} "
                    f"(ZooKeeper {cfg.zookeeper_connect}), "
                    f"{replicas} replicas x {partitions} partitions"
                )
        stopping = stop_requested_on_signals()
        try:
            cluster.start()
            click.echo(f"ordo up: {banner}, data in {data_dir} (Ctrl-C to stop)")
            click.echo(metrics_banner(cfg, mode == "traditional"))
            cluster.run_foreground(stopping)
        finally:
            click.echo("ordo up: stopping")
            cluster.stop()


def metrics_banner(cfg: ClusterConfig, traditional: bool, who: str = "ordo up") -> str:
    """Where Prometheus scrapes each process, and the configuration written for it
    (``who``: the command that says it)."""
    from cluster.metrics.scrape import write_prometheus_config

    path = write_prometheus_config(cfg, traditional)
    addrs = cfg.metrics_addrs()
    if traditional:
        addrs = {n: a for n, a in addrs.items() if n == "launcher" or n.startswith("r0p")}
    shown = ", ".join(f"{name} {addr}" for name, addr in addrs.items())
    return (
        f"{who}: Prometheus metrics at http://ADDRESS/metrics: {shown}\n"
        f"{who}: to scrape them all: prometheus --config.file={path}"
    )


@contextmanager
def _cluster_dir_owned(data_dir: str, fresh: bool) -> Iterator[None]:
    """``ordo up``'s claim on DATA_DIR for its whole run (cluster.ownership): refused,
    with the owner's pid, while another process owns anything there; ``fresh`` empties
    it only then. A child that exits is reported in one line."""
    from cluster.launcher import ChildExited
    from cluster.ownership import StateInUse, claim_cluster_dir

    def waiting(pid: int | None) -> None:
        click.echo(f"ordo up: {data_dir} is held by process {pid}: waiting for it to exit")

    try:
        owner = claim_cluster_dir(data_dir, fresh, on_wait=waiting)
    except StateInUse as e:
        raise click.ClickException(str(e)) from None
    try:
        yield
    except ChildExited as e:
        raise click.ClickException(str(e)) from None
    finally:
        owner.release()


HA_HOSTS = {"h1": "127.0.0.1", "h2": "127.0.0.2", "h3": "127.0.0.3"}


def ha_layout(cfg: ClusterConfig) -> ClusterConfig:
    """``ordo up --ha``: three hosts on loopback addresses, a sequencer on each, three
    ZooKeeper servers, replica r's partitions on host r mod 3."""
    from dataclasses import replace

    names = tuple(HA_HOSTS)
    return replace(
        cfg,
        sequencers=3,
        zookeeper_servers=3,
        curve=True,
        hosts=dict(HA_HOSTS),
        sequencer_hosts=names,
        zookeeper_hosts=names,
        partition_hosts=tuple(
            (names[r % len(names)],) * cfg.partitions for r in range(cfg.replicas)
        ),
        reader_hosts=tuple(names[i % len(names)] for i in range(cfg.readers)),
    )


# Every ClusterConfig field, by what ``ordo up`` does with it on a directory that holds a
# cluster (tests/cluster/test_cli.py checks that each field is in exactly one group, so
# a new field has to be placed here):
# kept from its cluster.json (no flag sets these: they are the database's own)
_KEPT_BY_UP = (
    "reader_retention_s",
    "genesis",
    "genesis_args",
    "checkpoint_every_s",
    "checkpoint_keep",
    "log_segment_bytes",
)
# the flags' (--replicas/--partitions must match; --module adds to the modules)
_SET_BY_UP_FLAGS = (
    "replicas",
    "partitions",
    "procedure_modules",
    "base_port",
    "data_dir",
    "epoch_duration_ms",
    "fsync",
    "checkpoint_every_epochs",
    "dataflow_recovery",
    "readers",
    "query_versions",
    "metrics_base_port",
)
# --ha's layout (ha_layout; a switch between single and replicated is refused)
_SET_BY_HA = (
    "sequencers",
    "zookeeper_servers",
    "hosts",
    "sequencer_hosts",
    "zookeeper_hosts",
    "partition_hosts",
    "zookeeper_root",
    "curve",
    "reader_hosts",
)
# tests' fault injection: never carried into a cluster a person starts
_NOT_KEPT_BY_UP = ("fault_drop_every_nth_batch",)


def _config_for_up(
    data_dir: str,
    replicas: int | None,
    partitions: int | None,
    base_port: int,
    epoch_ms: int,
    fsync: bool,
    modules: tuple[str, ...],
    checkpoint_every: int,
    dataflow_recovery: str = "strong",
    readers: int | None = 0,
    replica_versions: bool | None = None,
    metrics_port: int = 0,
) -> ClusterConfig:
    """The config ``ordo up`` runs with: its flags, over what the data directory's
    cluster.json holds if there is one. The database's own settings are the directory's,
    never the flags' defaults: its shape (replicas x partitions: taken when no flag
    names it, another is refused) and its readers (unless --readers says otherwise),
    its genesis (the state its command log starts from: a restart without it would
    replay the log over empty tables, a wrong state served as live), its procedure
    modules (the flags' are added), checkpoint retention and log segment size. Whether
    the replicas keep row versions is the flag's, else decided by the readers: none
    when readers serve (ClusterConfig.replica_versions), recorded in cluster.json."""
    base = ClusterConfig()
    mods = tuple(dict.fromkeys(base.procedure_modules + modules))
    kept: dict[str, Any] = {}
    existing = Path(data_dir) / CONFIG_FILE
    if existing.exists():
        old = load_config(data_dir)
        replicas = old.replicas if replicas is None else replicas
        partitions = old.partitions if partitions is None else partitions
        readers = old.readers if readers is None else readers
        if (old.replicas, old.partitions) != (replicas, partitions):
            raise click.ClickException(
                f"{data_dir} holds a {old.replicas}x{old.partitions} cluster; use --fresh "
                f"to start over, or leave out --replicas/--partitions (or give its own)"
            )
        mods = tuple(dict.fromkeys(old.procedure_modules + mods))
        kept = {name: getattr(old, name) for name in _KEPT_BY_UP}
    replicas = 2 if replicas is None else replicas
    partitions = 2 if partitions is None else partitions
    readers = 0 if readers is None else readers
    return ClusterConfig(
        replicas=replicas,
        partitions=partitions,
        base_port=base_port,
        data_dir=data_dir,
        epoch_duration_ms=epoch_ms,
        fsync=fsync,
        procedure_modules=mods,
        checkpoint_every_epochs=checkpoint_every,
        dataflow_recovery=dataflow_recovery,
        readers=readers,
        query_versions=readers == 0 if replica_versions is None else replica_versions,
        metrics_base_port=metrics_port,
        **kept,
    )


@click.command()
@click.option(
    "--member",
    "--id",
    "member",
    type=int,
    default=0,
    show_default=True,
    help="Which of the cluster's sequencers (replicated ordering layer).",
)
@cluster_file_option
@data_dir_option
def sequencer(member: int, cluster_file: str | None, data_dir: str) -> None:
    """Run a sequencer of the cluster in DATA_DIR (on its host, as cluster.json says)."""
    from cluster.profiling import maybe_profile
    from cluster.sequencer_server import main as run

    cfg = role_config(cluster_file, data_dir)
    if not 0 <= member < cfg.sequencers:
        raise click.ClickException(f"no sequencer {member}: the cluster has {cfg.sequencers}")
    maybe_profile("sequencer" if cfg.sequencers == 1 else f"sequencer-{member}")
    run(cfg, member)


@click.command()
@click.option("--id", "server", type=int, required=True, help="The server's number, 1-based.")
@cluster_file_option
@data_dir_option
def zookeeper(server: int, cluster_file: str | None, data_dir: str) -> None:
    """Run ZooKeeper server ID of the cluster in the foreground, on its host (as
    cluster.json places it): for multi-host clusters; `ordo up --ha` starts its own."""
    import os

    from cluster.ordering_zk import ensemble_of
    from cluster.ownership import StateInUse, claim

    cfg = role_config(cluster_file, data_dir)
    if not 1 <= server <= cfg.zookeeper_servers:
        raise click.ClickException(
            f"no ZooKeeper server {server}: the cluster has {cfg.zookeeper_servers}"
        )
    try:  # before its configuration is written: a running server keeps its own
        owner = claim(cfg.data_dir, f"zookeeper-{server}", f"ZooKeeper server {server}'s data")
        argv = ensemble_of(cfg).server_command(server)
    except StateInUse as e:
        raise click.ClickException(str(e)) from None
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from None
    owner.keep_across_exec()  # the JVM holds the claim for as long as it runs
    os.execv(argv[0], argv)


@click.command()
@click.option("--replica", "-r", type=int, required=True)
@click.option(
    "--partition",
    "-p",
    type=int,
    default=None,
    help="One partition; default: every partition, one process each.",
)
@click.option(
    "--copy-from",
    type=int,
    default=None,
    help="Seed this (new) replica with the newest complete checkpoint of another.",
)
@cluster_file_option
@data_dir_option
def replica(
    replica: int,
    partition: int | None,
    copy_from: int | None,
    cluster_file: str | None,
    data_dir: str,
) -> None:
    """Run partition processes of one replica."""
    from cluster.ownership import StateInUse, claim, partition_owner, watch_lifeline

    cfg = role_config(cluster_file, data_dir)
    if partition is None:
        watch_lifeline()  # its partitions' launcher: they go when it goes
    if copy_from is not None:
        from executor.core.checkpoint import copy_newest_complete

        held = []
        try:  # no partition of this replica may run while its checkpoints are replaced
            for p in range(cfg.partitions):
                what = f"replica {replica}'s partition {p}"
                held.append(claim(cfg.data_dir, partition_owner(replica, p), what))
            epoch = copy_newest_complete(
                cfg.checkpoint_dir(copy_from), cfg.checkpoint_dir(replica), cfg.partitions
            )
        except StateInUse as e:
            raise click.ClickException(str(e)) from None
        finally:
            for c in held:
                c.release()
        if epoch is None:
            raise click.ClickException(f"replica {copy_from} has no complete valid checkpoint")
        click.echo(
            f"replica {replica}: seeded from replica {copy_from}'s checkpoint at epoch {epoch}"
        )
    if partition is not None:
        from cluster.partition_server import main as run
        from cluster.profiling import maybe_profile

        maybe_profile(f"partition-{partition}")
        run(cfg, replica, partition)
        return
    from cluster.launcher import LocalCluster

    lc = LocalCluster(cfg)
    try:
        for p in range(cfg.partitions):
            lc.start_partition(replica, p)
        while True:
            lc.check_alive()
            time.sleep(0.5)
    finally:
        lc.stop()


@click.command()
@click.argument("reader_id", metavar="R", type=int)
@click.option(
    "--from-genesis",
    is_flag=True,
    help="Replay the whole log from the genesis (verifying all of it), not from the "
    "newest checkpoint a replica on this host has.",
)
@cluster_file_option
@data_dir_option
def reader(reader_id: int, from_genesis: bool, cluster_file: str | None, data_dir: str) -> None:
    """Run reader R of the cluster in DATA_DIR (on its host, as cluster.json says): it
    starts from the newest checkpoint of a replica on this host (else the genesis),
    replays the log from there, then follows it and answers queries."""
    from cluster.reader_server import main as run

    cfg = role_config(cluster_file, data_dir)
    if not 0 <= reader_id < cfg.readers:
        raise click.ClickException(
            f"no reader {reader_id}: the cluster has {cfg.readers} (ordo up --readers N)"
        )
    run(cfg, reader_id, from_genesis)


@click.command("traditional-partition")
@click.option("--partition", "-p", type=int, required=True)
@data_dir_option
def traditional_partition(partition: int, data_dir: str) -> None:
    """Run one partition process of the 2PL + 2PC cluster in DATA_DIR.

    `ordo up --mode traditional` starts one per partition (its options are
    DATA_DIR/traditional.json)."""
    from cluster.traditional_server import serve

    serve(load_config(data_dir), partition)
