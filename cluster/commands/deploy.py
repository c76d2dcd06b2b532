"""Procedure code through the log: ``ordo deploy`` and ``ordo procedures``.

  ordo deploy MODULE.py [...] [--retire NAME]
                    send each module's source through the sequencer and the log
                    (txn_library.deployed): checked in a separate process first, in
                    force on every replica from the epoch after the one that logs it
  ordo procedures   every procedure, its arguments, its version and since which epoch

A module larger than ``limits.deploy_source_bytes_max`` or not UTF-8 is refused here,
before anything is sent; the cluster's refusal (``deploy_refused``) is printed with
its reason and exits 1.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

from cluster.commands.common import data_dir_option, load_config, load_procedure_modules
from cluster.config import CONFIG_FILE, ClusterConfig


def _read_module(path: str) -> tuple[str, bytes]:
    """(module name, source) of a .py file, or a UsageError saying why not."""
    from txn_library import limits

    p = Path(path)
    if p.suffix != ".py":
        raise click.UsageError(f"{path}: a Python module (MODULE.py)")
    name = p.stem
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
        raise click.UsageError(f"{path}: the module's name must be a Python identifier")
    try:
        size = p.stat().st_size
        if size > limits.deploy_source_bytes_max:
            raise click.UsageError(
                f"{path}: {size} bytes > {limits.deploy_source_bytes_max} (a deployed module's "
                "source must fit in one call)"
            )
        source = p.read_bytes()
    except OSError as e:
        raise click.UsageError(f"{path}: {e.strerror or e}") from None
    try:
        source.decode("utf-8")
    except UnicodeDecodeError as e:
        raise click.UsageError(f"{path}: not UTF-8 ({e})") from None
    return name, source


@click.command()
@click.argument("modules", nargs=-1)
@click.option(
    "--retire",
    "retired",
    multiple=True,
    metavar="NAME",
    help="Retire a deployed procedure (repeatable): unknown from the next epoch on.",
)
@click.option("--timeout", default=30.0, show_default=True)
@data_dir_option
def deploy(
    modules: tuple[str, ...], retired: tuple[str, ...], timeout: float, data_dir: str
) -> None:
    """Deploy MODULES (.py files) through the log: every replica, recovery and replay
    run their procedures from the epoch after the one that logs them, and earlier
    epochs with the versions in force then. A module may define new procedures and
    new versions of deployed ones (never of the cluster's start-up modules), and
    register nothing else. Prints one JSON line per deploy."""
    from cluster.launcher import cluster_client
    from txn_library.deployed import DEPLOY
    from txn_library.errors import OrdoError

    if not modules and not retired:
        raise click.UsageError("name a module to deploy (MODULE.py) or --retire NAME")
    sources = [_read_module(m) for m in modules]
    if not sources:
        sources = [("retire", b"")]
    cfg = load_config(data_dir)
    load_procedure_modules(cfg)
    failed = False
    with cluster_client(cfg, cfg.client_addrs, timeout_s=timeout) as c:
        for i, (name, source) in enumerate(sources):
            retire = list(retired) if i == len(sources) - 1 else []
            try:
                r = c.call(DEPLOY, name, source, retire, timeout_s=timeout)
            except OrdoError as e:
                click.echo(json.dumps({"module": name, "status": "refused", "error": str(e)}))
                failed = True
                break
            out = dict(r.value) if r.ok else {"module": name, "reason": r.value}
            out["status"] = "deployed" if r.ok else "aborted"
            out["logged_epoch"] = r.epoch
            out["effective_epoch"] = r.epoch + 1
            click.echo(json.dumps(out))
    if failed:
        sys.exit(1)


@click.command()
@data_dir_option
def procedures(data_dir: str) -> None:
    """List every procedure: its arguments, kind, version and the epoch it took effect
    (start-up modules: version 0; deployed ones as the replicas in DATA_DIR installed
    them). Without a cluster in DATA_DIR: the default procedure modules."""
    from txn_library.deployed import versions
    from txn_library.procedure import lookup_at

    if (Path(data_dir) / CONFIG_FILE).exists():
        load_procedure_modules(load_config(data_dir))
    else:
        load_procedure_modules(ClusterConfig())
    for row in versions():
        name, since = row["name"], row["since_epoch"]
        if row["version"] is None:
            click.echo(f"{name}  retired since epoch {since}  ({row['module']})")
            continue
        p = lookup_at(name, since)
        args = ", ".join(f"{a.name}:{a.type}" for a in p.args)
        kind = "read-only" if p.read_only else ("dependent" if p.dependent else "read-write")
        where = "start-up" if row["version"] == 0 else f"{row['module']} {row['digest']}"
        doc = p.doc.splitlines()[0] if p.doc else ""
        click.echo(
            f"{name}({args})  [{kind}]  v{row['version']} since epoch {since} ({where})  {doc}"
        )
