"""The ``ordo`` command line: one entry point, one subcommand per thing a user does.

  ordo up           start sequencer + replicas on 127.0.0.1, foreground until Ctrl-C
                    (--ha: 3 ZooKeeper servers, 3 sequencers, loopback hosts, CURVE)
  ordo sequencer    run a sequencer process of a cluster (--id N of a replicated one)
  ordo zookeeper    run ZooKeeper server --id N of a multi-host cluster on its host
  ordo replica      run one partition (or all partitions) of one replica
  ordo traditional-partition
                    run one partition process of a 2PL + 2PC cluster (`ordo up` starts it)
  ordo call         submit one stored-procedure call and print the result
  ordo status       sequencers (role, term, lag), ZooKeeper, and per partition of
                    every replica: last epoch, txns applied, hash (--json)
  ordo checkpoint   checkpoint every partition after the next epoch; wait until durable
  ordo dump         export one replica's tables as of a fresh checkpoint
  ordo log prune    remove log segments every partition's checkpoint has made unneeded
  ordo procedures   list the registered procedures and their arguments
  ordo keys         create the CURVE keys of the cluster's roles and clients (0600)

Every command finds the cluster through ``--data-dir`` (its cluster.json), read by
``load_config``: a missing or unreadable config is a one-line error, never a
traceback. Bad input (arity, types, values too large to send) is reported before
anything reaches the cluster; an answer the cluster gives is printed as it is.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cluster.config import CONFIG_FILE, DEFAULT_BASE_PORT, DEFAULT_DATA_DIR, ClusterConfig

if TYPE_CHECKING:
    from txn_library.client import Client

# A checkpoint file its partition reported durable must exist within this (dump).

data_dir_option = click.option(
    "--data-dir",
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="Cluster directory (holds cluster.json, the command log, checkpoints).",
)


cluster_file_option = click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The cluster description (a cluster.json) to run a role of on this host; this "
    "host's files go under --data-dir if given, else the file's directory.",
)


def role_config(cluster_file: str | None, data_dir: str) -> ClusterConfig:
    """The config a role process runs with: DATA_DIR/cluster.json, or ``--cluster FILE``
    (a multi-host cluster's description copied to every host) with this host's data
    directory."""
    if cluster_file is None:
        return load_config(data_dir)
    from dataclasses import replace

    path = Path(cluster_file)
    try:
        cfg = ClusterConfig.from_json(path.read_text())
    except (OSError, ValueError, TypeError) as e:
        raise click.ClickException(f"{path}: not a valid cluster config ({e})") from None
    here = data_dir if data_dir != DEFAULT_DATA_DIR else str(path.parent)
    return replace(cfg, data_dir=here)


def load_config(data_dir: str) -> ClusterConfig:
    """The cluster described by DATA_DIR/cluster.json, or a one-line ClickException.

    Every command that needs a cluster reads it here (also ``ordo tpcc``).
    """
    try:
        return ClusterConfig.load(data_dir)
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from None
    except (OSError, ValueError, TypeError) as e:  # unreadable, not JSON, wrong fields
        path = Path(data_dir) / CONFIG_FILE
        raise click.ClickException(f"{path}: not a valid cluster config ({e})") from None


@click.group()
def main() -> None:
    """Ordo: a deterministic, replicated, partitioned transaction engine."""


@main.command()
@click.option("--replicas", default=2, show_default=True)
@click.option("--partitions", default=2, show_default=True)
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
@data_dir_option
def up(
    replicas: int,
    partitions: int,
    base_port: int,
    epoch_ms: int,
    no_fsync: bool,
    fresh: bool,
    modules: tuple[str, ...],
    checkpoint_every: int,
    mode: str,
    no_update_locks: bool,
    ha: bool,
    data_dir: str,
) -> None:
    """Start a local cluster and stay in the foreground until Ctrl-C.

    --mode traditional starts the 2PL + 2PC baseline instead (one replica; clients talk
    to any partition, e.g. `ordo call` reaches partition 0).
    """
    with _cluster_dir_owned(data_dir, fresh):  # before anything there is read or written
        from dataclasses import replace

        from cluster.launcher import LocalCluster, ProcessGroup, stop_requested_on_signals

        cfg = _config_for_up(
            data_dir,
            replicas,
            partitions,
            base_port,
            epoch_ms,
            not no_fsync,
            modules,
            checkpoint_every,
        )
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
            shape = f"{replicas} replicas x {partitions} partitions"
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
            cluster.run_foreground(stopping)
        finally:
            click.echo("ordo up: stopping")
            cluster.stop()


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
    )


# Every ClusterConfig field, by what ``ordo up`` does with it on a directory that holds a
# cluster (tests/cluster/test_cli.py checks that each field is in exactly one group, so
# a new field has to be placed here):
# kept from its cluster.json (no flag sets these: they are the database's own)
_KEPT_BY_UP = (
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
)
# tests' fault injection: never carried into a cluster a person starts
_NOT_KEPT_BY_UP = ("fault_drop_every_nth_batch",)


def _config_for_up(
    data_dir: str,
    replicas: int,
    partitions: int,
    base_port: int,
    epoch_ms: int,
    fsync: bool,
    modules: tuple[str, ...],
    checkpoint_every: int,
) -> ClusterConfig:
    """The config ``ordo up`` runs with: its flags, over what the data directory's
    cluster.json holds if there is one. The database's own settings are the directory's,
    never the flags' defaults: its shape (replicas x partitions: another is refused),
    its genesis (the state its command log starts from: a restart without it would
    replay the log over empty tables, a wrong state served as live), its procedure
    modules (the flags' are added), checkpoint retention and log segment size."""
    base = ClusterConfig()
    mods = tuple(dict.fromkeys(base.procedure_modules + modules))
    kept: dict[str, Any] = {}
    existing = Path(data_dir) / CONFIG_FILE
    if existing.exists():
        old = load_config(data_dir)
        if (old.replicas, old.partitions) != (replicas, partitions):
            raise click.ClickException(
                f"{data_dir} holds a {old.replicas}x{old.partitions} cluster; use --fresh "
                f"to start over or the same --replicas/--partitions"
            )
        mods = tuple(dict.fromkeys(old.procedure_modules + mods))
        kept = {name: getattr(old, name) for name in _KEPT_BY_UP}
    return ClusterConfig(
        replicas=replicas,
        partitions=partitions,
        base_port=base_port,
        data_dir=data_dir,
        epoch_duration_ms=epoch_ms,
        fsync=fsync,
        procedure_modules=mods,
        checkpoint_every_epochs=checkpoint_every,
        **kept,
    )


@main.command()
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


@main.command()
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


@main.command()
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


@main.command("traditional-partition")
@click.option("--partition", "-p", type=int, required=True)
@data_dir_option
def traditional_partition(partition: int, data_dir: str) -> None:
    """Run one partition process of the 2PL + 2PC cluster in DATA_DIR.

    `ordo up --mode traditional` starts one per partition (its options are
    DATA_DIR/traditional.json)."""
    from cluster.traditional_server import serve

    serve(load_config(data_dir), partition)


def _load_modules(cfg: ClusterConfig) -> None:
    from txn_library.procedure import load_modules

    try:
        load_modules(cfg.procedure_modules)
    except ImportError as e:
        raise click.ClickException(
            f"cannot import a procedure module of the cluster: {e}"
        ) from None


def parse_call_args(proc_name: str, items: tuple[str, ...]) -> list[Any]:
    """Command-line strings -> the procedure's typed argument list, per its schema.

    An item is a value, taken in order, or NAME=VALUE with NAME an identifier (so a
    value that itself contains "=" goes by name: ``value=a=b``). Raises
    click.UsageError for more values than the procedure takes, an argument missing,
    unknown, repeated or given both positionally and by name, or a value that does not
    parse as its declared type; BadRequest for an unknown procedure.
    """
    from txn_library.procedure import lookup

    proc = lookup(proc_name)
    signature = f"{proc_name}({', '.join(f'{a.name}:{a.type}' for a in proc.args)})"
    names = [a.name for a in proc.args]
    named: dict[str, str] = {}
    positional: list[str] = []
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key.isidentifier():
            if key not in names:
                raise click.UsageError(f"{signature} has no argument named {key!r}")
            if key in named:
                raise click.UsageError(f"{signature}: argument {key} given twice")
            named[key] = value
        elif item.startswith("--"):
            raise click.UsageError(f"no such option: {item} (pass such a value as NAME=VALUE)")
        else:
            positional.append(item)
    if len(positional) > len(names):
        raise click.UsageError(
            f"{proc_name} takes {len(names)} argument(s), got {len(positional)} values: {signature}"
        )
    out = []
    for i, spec in enumerate(proc.args):
        if i < len(positional):
            if spec.name in named:
                raise click.UsageError(
                    f"{signature}: argument {spec.name} given both positionally and by name"
                )
            raw = positional[i]
        elif spec.name in named:
            raw = named[spec.name]
        else:
            raise click.UsageError(f"{signature}: missing argument {spec.name}")
        try:
            out.append(spec.parse(raw))
        except ValueError as e:
            raise click.UsageError(
                f"{proc_name}: argument {spec.name} ({spec.type}): {e}"
            ) from None
    return out


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("procedure")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--timeout", default=10.0, show_default=True)
@data_dir_option
def call(procedure: str, args: tuple[str, ...], timeout: float, data_dir: str) -> None:
    """Submit PROCEDURE with its ARGS and print the result.

    ARGS are values in the procedure's order, or NAME=VALUE. Negative numbers are
    values, not options: `ordo call kv.add k -5`.
    """
    from cluster.launcher import cluster_client
    from txn_library.errors import BadRequest, OrdoError

    cfg = load_config(data_dir)
    _load_modules(cfg)
    try:
        values = parse_call_args(procedure, args)
    except BadRequest as e:
        raise click.ClickException(e.message) from None
    with cluster_client(cfg, cfg.client_addrs, timeout_s=timeout) as c:
        try:
            r = c.call(procedure, *values)
        except BadRequest as e:  # refused before sending: cannot be encoded, too large
            raise click.UsageError(str(e)) from None
        except OrdoError as e:
            raise click.ClickException(str(e)) from None
    if r.ok:
        click.echo(json.dumps({"status": "ok", "value": _jsonable(r.value)}))
    else:
        click.echo(json.dumps({"status": "aborted", "reason": r.value}))
        sys.exit(1)


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


def _ha_status(cfg: ClusterConfig) -> dict:
    """Every sequencer's role, term and lag, and every ZooKeeper server's mode."""
    from cluster.launcher import sequencer_statuses
    from cluster.zookeeper import four_letter_word, mode_of

    reports = sequencer_statuses(cfg)
    leader = max(
        (r for r in reports if r is not None and r.get("role") == "leader"),
        key=lambda r: r["term"],
        default=None,
    )
    committed = (
        leader["epoch"]
        if leader
        else max((r["local_last_epoch"] for r in reports if r is not None), default=0)
    )
    sequencers = []
    for m, r in enumerate(reports):
        row: dict = {"id": m, "address": cfg.client_addr_of(m)}
        if r is None:
            row.update(pid=None, role="down", term=None, local_last_epoch=None, lag_epochs=None)
        else:
            row.update(
                pid=r["pid"],
                role=r["role"],
                term=r["term"],
                local_last_epoch=r["local_last_epoch"],
                lag_epochs=max(0, committed - r["local_last_epoch"]),
                report=r,
            )
        sequencers.append(row)
    zookeeper = []
    for n in range(1, cfg.zookeeper_servers + 1):
        host, port = cfg.zookeeper_host(n), cfg.zookeeper_client_port(n)
        try:
            mode = mode_of(four_letter_word(host, port, "srvr", 1.0)) or "not serving"
        except OSError:
            mode = "down"
        zookeeper.append({"server": n, "address": f"{host}:{port}", "mode": mode})
    return {"sequencers": sequencers, "zookeeper": zookeeper}


def _echo_ha(ha: dict) -> None:
    click.echo(
        f"{'sequencer':>9} {'pid':>7} {'role':>9} {'term':>5} {'local_epoch':>11} "
        f"{'lag':>5}  address"
    )
    for s in ha["sequencers"]:
        dash = "-"
        click.echo(
            f"{s['id']:>9} {s['pid'] or dash:>7} {s['role']:>9} "
            f"{dash if s['term'] is None else s['term']:>5} "
            f"{dash if s['local_last_epoch'] is None else s['local_last_epoch']:>11} "
            f"{dash if s['lag_epochs'] is None else s['lag_epochs']:>5}  {s['address']}"
        )
    healthy = sum(z["mode"] in ("leader", "follower", "standalone") for z in ha["zookeeper"])
    click.echo(
        f"zookeeper: {healthy} of {len(ha['zookeeper'])} serving ("
        + ", ".join(f"{z['server']} {z['mode']}" for z in ha["zookeeper"])
        + ")"
    )


def leader_address(cfg: ClusterConfig) -> str:
    """Where control requests go: the leading sequencer's client address."""
    if cfg.sequencers == 1:
        return cfg.client_addr
    from cluster.launcher import sequencer_statuses

    statuses = [st for st in sequencer_statuses(cfg) if st is not None]
    leaders = [st for st in statuses if st.get("role") == "leader"]
    if not leaders:
        raise click.ClickException(
            f"no sequencer leads now ({len(statuses)} of {cfg.sequencers} answered)"
        )
    return cfg.client_addr_of(max(leaders, key=lambda st: st["term"])["member"])


def _status(c: Client) -> dict:
    from txn_library.errors import OrdoError

    try:
        return c.status()
    except OrdoError as e:
        raise click.ClickException(f"no answer at {c.address}: {e}") from None


@main.command()
@click.option("--json", "as_json", is_flag=True)
@data_dir_option
def status(as_json: bool, data_dir: str) -> None:
    """Per partition of every replica: last applied epoch, txns applied, transactions
    active and blocked on locks now, lock requests that had to queue so far, state hash.
    Replicated: every sequencer's role, term and lag, and each ZooKeeper server's mode."""
    from cluster.launcher import cluster_client

    cfg = load_config(data_dir)
    ha: dict = {}
    if cfg.replicated:
        ha = _ha_status(cfg)
        leaders = [s for s in ha["sequencers"] if s["role"] == "leader"]
        st = dict(leaders[0]["report"]) if leaders else {"partitions": []}
    else:
        with cluster_client(cfg, cfg.client_addr) as c:
            st = _status(c)
        ha_rows = [
            {
                "id": 0,
                "address": cfg.client_addr,
                "pid": st.get("pid"),
                "role": st.get("role", "leader"),
                "term": st.get("term", 0),
                "local_last_epoch": st.get("epoch"),
                "lag_epochs": 0,
            }
        ]
    if as_json:
        if ha:
            st = {**st, "sequencers": ha["sequencers"], "zookeeper": ha["zookeeper"]}
            for s_ in st["sequencers"]:
                s_.pop("report", None)
        else:
            st = {**st, "sequencers": ha_rows, "zookeeper": []}
        click.echo(json.dumps(st, indent=2, default=_jsonable))
        return
    if ha:
        _echo_ha(ha)
        if "epoch" not in st:
            click.echo("no sequencer leads now")
            return
    click.echo(
        f"epoch {st['epoch']}  txns sequenced {st['txns_sequenced']}  "
        f"pending {st['pending']}  in flight {st['in_flight']}  "
        f"determinism violations {st['determinism_violations']}"
    )
    click.echo(
        f"{'replica':>7} {'partition':>9} {'last_epoch':>10} {'txns_applied':>12} "
        f"{'active':>6} {'blocked':>7} {'lock_waits':>10} {'checkpoint':>10}  "
        f"{'state_hash':<16}  state"
    )
    for p in st["partitions"]:
        state = "DOWN" if p["down"] else ("catching up" if p["catching_up"] else "live")
        click.echo(
            f"{p['replica']:>7} {p['partition']:>9} {p['last_epoch']:>10} "
            f"{p['txns_applied']:>12} {p['active']:>6} {p.get('blocked', 0):>7} "
            f"{p.get('lock_waits', 0):>10} {p['newest_checkpoint_epoch']:>10}  "
            f"{p['state_hash']:<16}  {state}"
        )


@main.command()
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


@main.command()
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
    _load_modules(cfg)
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


@main.group()
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
    from txn_library import wire
    from txn_library.errors import CallFailed, OrdoError

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


@main.command()
@data_dir_option
def procedures(data_dir: str) -> None:
    """List registered procedures with their argument schemas (without a cluster in
    DATA_DIR: the default procedure modules)."""
    from txn_library.procedure import procedures as all_procs

    if (Path(data_dir) / CONFIG_FILE).exists():
        _load_modules(load_config(data_dir))
    else:
        _load_modules(ClusterConfig())
    for name, p in sorted(all_procs().items()):
        args = ", ".join(f"{a.name}:{a.type}" for a in p.args)
        kind = "read-only" if p.read_only else ("dependent" if p.dependent else "read-write")
        click.echo(f"{name}({args})  [{kind}]  {p.doc.splitlines()[0] if p.doc else ''}")


@main.command()
@click.option(
    "--client",
    "clients",
    multiple=True,
    help="Also a key pair for client NAME, its public key on the allowlist (repeatable).",
)
@data_dir_option
def keys(clients: tuple[str, ...], data_dir: str) -> None:
    """Create the CURVE keys of the cluster in DATA_DIR, in DATA_DIR/keys: a key pair per
    role (each sequencer, each partition of each replica), per client (always `admin`,
    which the command line uses) and the client allowlist. Never replaces a key: run it
    again to add what is missing. Secret key files are created 0600."""
    from cluster.security import ADMIN_CLIENT, SecurityError, create_keys, keys_dir, role_names

    cfg = load_config(data_dir)
    try:
        made = create_keys(data_dir, role_names(cfg), (ADMIN_CLIENT, *clients))
    except (SecurityError, OSError) as e:
        raise click.ClickException(f"keys incomplete: {e}") from None
    click.echo(
        f"keys in {keys_dir(data_dir)}: {len(made.created)} file(s) created, "
        f"{len(made.existing)} already there (left alone)"
    )
    for p in made.created:
        click.echo(f"  created {p}")
    if not getattr(cfg, "curve", False):
        click.echo(
            f"note: {Path(data_dir) / CONFIG_FILE} has curve off; the keys take "
            f"effect in a cluster that runs with CURVE"
        )


# Subcommand groups that live with the code they drive (their heavy imports are lazy).
from cluster.replay_cli import replay as _replay_group  # noqa: E402

main.add_command(_replay_group)


def _add_workload_commands() -> None:
    """Workloads bring their own command groups (``ordo tpcc``) through the entry point
    group ``ordo.commands`` in their package metadata: the engine never imports a
    workload, and a new one plugs in without a change here."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group="ordo.commands"), key=lambda e: e.name):
        main.add_command(ep.load(), ep.name)


_add_workload_commands()

if __name__ == "__main__":
    main()
