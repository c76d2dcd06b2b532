"""The ``ordo`` commands a client of the cluster runs.

  ordo call         submit one stored-procedure call and print the result
  ordo query        a read-only procedure as a query: snapshot, read committed or strict
  ordo status       sequencers (role, term, lag), ZooKeeper, and per partition of
                    every replica: last epoch, txns applied, hash (--json)
  ordo keys         create the CURVE keys of the cluster's roles and clients (0600);
                    `ordo keys export --host H DIR`: what host H needs of them

Bad input (arity, types, values too large to send) is reported before anything
reaches the cluster; an answer the cluster gives is printed as it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cluster.commands.common import (
    data_dir_option,
    load_config,
    load_procedure_modules,
)
from cluster.config import CONFIG_FILE, DEFAULT_DATA_DIR, ClusterConfig

if TYPE_CHECKING:
    from txn_library.client import Client


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


@click.command(context_settings={"ignore_unknown_options": True})
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
    load_procedure_modules(cfg)
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


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("procedure")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--isolation",
    type=click.Choice(["snapshot", "read_committed", "strict"]),
    default="snapshot",
    show_default=True,
    help="snapshot: one completed epoch everywhere (PL3); read_committed: each partition "
    "now (PL2); strict: through the sequencer, in order (PL4).",
)
@click.option("--at-epoch", type=int, default=None, help="A past completed epoch (snapshot).")
@click.option("--replica", type=int, default=None, help="Which replica answers.")
@click.option("--timeout", default=10.0, show_default=True)
@click.option(
    "--host",
    default=None,
    metavar="HOST:PORT",
    help="A sequencer's client address: query without the cluster directory (the "
    "sequencer names the readers and partitions). A cluster without CURVE only; with "
    "CURVE, use --data-dir (it holds the admin key pair).",
)
@click.option(
    "--module",
    "modules",
    multiple=True,
    help="With --host: a procedure module to import (repeatable; default the built-ins).",
)
@data_dir_option
def query(
    procedure: str,
    args: tuple[str, ...],
    isolation: str,
    at_epoch: int | None,
    replica: int | None,
    timeout: float,
    host: str | None,
    modules: tuple[str, ...],
    data_dir: str,
) -> None:
    """Call the read-only PROCEDURE with its ARGS as a query (no log, no locks unless
    --isolation strict) and print its value and the epoch it reflects (docs/QUERIES.md)."""
    from txn_library.errors import BadRequest, OrdoError

    if host is None:
        from cluster.launcher import cluster_client

        cfg = load_config(data_dir)
        load_procedure_modules(cfg)
    else:
        from txn_library.procedure import load_modules

        try:
            load_modules(modules or ClusterConfig.procedure_modules)
        except ImportError as e:
            raise click.ClickException(f"cannot import a procedure module: {e}") from None
    try:
        values = parse_call_args(procedure, args)
    except BadRequest as e:
        raise click.ClickException(e.message) from None
    with (
        cluster_client(cfg, cfg.client_addrs, timeout_s=timeout)
        if host is None
        else _host_client(host, timeout)
    ) as c:
        try:
            a = c.query(procedure, *values, isolation=isolation, at_epoch=at_epoch, replica=replica)
        except BadRequest as e:
            raise click.UsageError(e.message) from None
        except OrdoError as e:
            raise click.ClickException(str(e)) from None
    out = {"status": "ok" if a.ok else "aborted", "value": _jsonable(a.value), "epoch": a.epoch}
    click.echo(json.dumps(out))
    if not a.ok:
        sys.exit(1)


def _host_client(host: str, timeout_s: float) -> Client:
    """A Client of the sequencer at HOST:PORT (or a full tcp:// address) alone."""
    from txn_library.client import Client

    address = host if "://" in host else f"tcp://{host}"
    _, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise click.UsageError(f"--host {host}: expected HOST:PORT")
    return Client(address, timeout_s=timeout_s)


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


def _status(c: Client) -> dict:
    from txn_library.errors import OrdoError

    try:
        return c.status()
    except OrdoError as e:
        raise click.ClickException(f"no answer at {c.address}: {e}") from None


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--watch", is_flag=True, help="A live view, redrawn every second: throughput, lag, states."
)
@click.option("--interval", default=1.0, show_default=True, help="With --watch: seconds.")
@click.option("--count", type=int, default=None, help="With --watch: stop after N screens.")
@data_dir_option
def status(as_json: bool, watch: bool, interval: float, count: int | None, data_dir: str) -> None:
    """Per partition of every replica: last applied epoch, txns applied, transactions
    active and blocked on locks now, lock requests that had to queue so far, state hash.
    Replicated: every sequencer's role, term and lag, and each ZooKeeper server's mode.
    --watch: the same, live (cluster/commands/watch.py)."""
    from cluster.launcher import cluster_client

    cfg = load_config(data_dir)
    if watch:
        from cluster.commands.watch import watch as live_view

        live_view(cfg, interval, count, tty=sys.stdout.isatty(), write=click.echo)
        return
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
    flows = _dataflow_rows(cfg) if "epoch" in st else []
    readers = _reader_rows(cfg, st.get("epoch"))
    if as_json:
        st = {**st, "dataflows": flows, "readers": readers}
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
    if readers:
        click.echo(
            f"{'reader':>7} {'applied_epoch':>13} {'lag':>6} {'txns_applied':>12} "
            f"{'violations':>10} {'queries':>9}  state"
        )
        for r in readers:
            if r.get("down"):
                dash = "-"
                click.echo(
                    f"{r['reader']:>7} {dash:>13} {dash:>6} {dash:>12} {dash:>10} {dash:>9}  DOWN"
                )
                continue
            state = "live" if r["live"] else "catching up"
            click.echo(
                f"{r['reader']:>7} {r['applied_epoch']:>13} {r['lag_epochs']:>6} "
                f"{r['txns_applied']:>12} {r['determinism_violations']:>10} "
                f"{r['queries_served']:>9}  {state}"
            )
    if flows:
        click.echo(f"{'dataflow':<16} {'last_pushed':>11} {'last_processed':>14} {'backlog':>7}")
        for f in flows:
            if "error" in f:
                click.echo(f"{f['dataflow']:<16} {f['error']}")
                continue
            click.echo(
                f"{f['dataflow']:<16} {_shown(f['last_pushed']):>11} "
                f"{_shown(f['last_processed']):>14} {f['backlog']:>7}"
            )


def _reader_rows(cfg: ClusterConfig, epoch: int | None) -> list[dict]:
    """Per reader: its own report (applied epoch, hashes, counters) and its lag behind
    the sequencer's epoch (``epoch``; else behind the newest epoch it knows of)."""
    from cluster.launcher import reader_reports

    rows = []
    for i, rep in enumerate(reader_reports(cfg, timeout_s=1.0)):
        if rep is None:
            rows.append({"reader": i, "down": True})
            continue
        rep.pop("hashes", None)
        if epoch is not None:
            rep["lag_epochs"] = max(0, epoch - rep["applied_epoch"])
        rows.append({**rep, "down": False})
    return rows


def _shown(v: Any) -> str:
    return "-" if v is None else str(v)


def _dataflow_rows(cfg: ClusterConfig) -> list[dict]:
    """Per dataflow of the cluster's procedure modules: last batch pushed, last batch
    every step has processed, backlog (the read-only ``dataflow.status``)."""
    from cluster.commands.common import leader_address
    from cluster.launcher import cluster_client
    from txn_library.errors import OrdoError
    from txn_library.streams import dataflows

    load_procedure_modules(cfg)
    names = sorted(dataflows())
    if not names:
        return []
    rows = []
    with cluster_client(cfg, leader_address(cfg)) as c:
        for name in names:
            try:
                r = c.call("dataflow.status", name, timeout_s=5.0)
                rows.append(r.value if r.ok else {"dataflow": name, "error": str(r.value)})
            except OrdoError as e:
                rows.append({"dataflow": name, "error": f"no answer: {e}"})
    return rows


@click.group(invoke_without_command=True)
@click.option(
    "--client",
    "clients",
    multiple=True,
    help="Also a key pair for client NAME, its public key on the allowlist (repeatable).",
)
@data_dir_option
@click.pass_context
def keys(ctx: click.Context, clients: tuple[str, ...], data_dir: str) -> None:
    """Create the CURVE keys of the cluster in DATA_DIR, in DATA_DIR/keys: a key pair per
    role (each sequencer, each partition of each replica, each reader), per client
    (always `admin`, which the command line uses) and the client allowlist. Never
    replaces a key: run it again to add what is missing. Secret key files are created
    0600. `ordo keys export --host H DIR`: what host H needs of them (docs/OPERATIONS.md,
    "Keys per host")."""
    if ctx.invoked_subcommand is not None:
        if clients:
            raise click.UsageError("--client creates keys: run `ordo keys --client` alone")
        ctx.obj = data_dir  # `ordo keys --data-dir D export ...` means D
        return
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


@keys.command("export", short_help="Write into DIR only what host HOST needs of the keys.")
@click.option("--host", required=True, help="The host (a name in cluster.json's hosts).")
@click.option(
    "--with-client",
    "with_clients",
    multiple=True,
    metavar="NAME",
    help="Also client NAME's secret key (repeatable; e.g. admin, for `ordo status` on "
    "the host). Default: no client secret at all.",
)
@click.argument("out_dir", metavar="DIR", type=click.Path(file_okay=False))
@data_dir_option
@click.pass_context
def keys_export(
    ctx: click.Context, host: str, with_clients: tuple[str, ...], out_dir: str, data_dir: str
) -> None:
    """Write into DIR what host HOST needs of the keys in DATA_DIR/keys, to copy there:
    the secret keys of the roles cluster.json places on HOST (0600), every role's public
    key, the client allowlist, the ZooKeeper password if HOST runs a sequencer, and
    cluster.json. No other role's secret and no client secret unless --with-client
    names it. DIR must be new, empty or an earlier export for HOST (then only what is
    missing is added; a key there is never replaced). On HOST run its roles with
    `--cluster DIR/cluster.json`: they find their keys in DIR/keys."""
    from cluster.security import SecurityError
    from cluster.security.export import export_host_keys

    if data_dir == DEFAULT_DATA_DIR and isinstance(ctx.obj, str):
        data_dir = ctx.obj
    cfg = load_config(data_dir)
    try:
        done = export_host_keys(data_dir, cfg, host, out_dir, with_clients)
    except (SecurityError, OSError) as e:
        raise click.ClickException(f"keys not exported: {e}") from None
    roles = ", ".join(done.roles) if done.roles else "none (public keys only)"
    click.echo(
        f"keys for host {host} in {out_dir}: secrets of {roles}"
        + (f"; clients {', '.join(with_clients)}" if with_clients else "")
    )
    click.echo(
        f"  {len(done.written)} file(s) written, {len(done.unchanged)} already there; "
        f"copy {out_dir} to {host} and run its roles with --cluster "
        f"{Path(out_dir) / CONFIG_FILE}"
    )
