"""What every ``ordo`` command shares: finding the cluster and reaching it.

Every command finds the cluster through ``--data-dir`` (its cluster.json), read by
``load_config``: a missing or unreadable config is a one-line error, never a
traceback. A role process may instead be given a multi-host cluster's description
(``--cluster``, ``role_config``). Control requests (checkpoint, dump, log prune) go to
the leading sequencer (``leader_address``); a procedure module that does not import is
a one-line error too (``load_procedure_modules``).
"""

from __future__ import annotations

from pathlib import Path

import click

from cluster.config import CONFIG_FILE, DEFAULT_DATA_DIR, ClusterConfig

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


def load_procedure_modules(cfg: ClusterConfig) -> None:
    """Import the cluster's procedure modules (registering their procedures), or a
    one-line ClickException."""
    from txn_library.procedure import load_modules

    try:
        load_modules(cfg.procedure_modules)
    except ImportError as e:
        raise click.ClickException(
            f"cannot import a procedure module of the cluster: {e}"
        ) from None
    # And what was deployed through the log, as this host's replicas installed it.
    from txn_library.deployed import CodeStore

    for r in range(cfg.replicas):
        CodeStore(Path(cfg.checkpoint_dir(r)) / "deploys").install_all()


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
