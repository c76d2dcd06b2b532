"""The ``ordo`` command line: one entry point, one subcommand per thing a user does.

  ordo up           start sequencer + replicas on 127.0.0.1, foreground until Ctrl-C
                    (--ha: 3 ZooKeeper servers, 3 sequencers, loopback hosts, CURVE)
  ordo sequencer    run a sequencer process of a cluster (--id N of a replicated one)
  ordo zookeeper    run ZooKeeper server --id N of a multi-host cluster on its host
  ordo replica      run one partition (or all partitions) of one replica
  ordo reader       run one reader (follows the log, answers queries)
  ordo traditional-partition
                    run one partition process of a 2PL + 2PC cluster (`ordo up` starts it)
  ordo call         submit one stored-procedure call and print the result
  ordo query        a read-only procedure as a query (snapshot, read committed, strict)
  ordo status       sequencers (role, term, lag), ZooKeeper, and per partition of
                    every replica: last epoch, txns applied, hash (--json)
  ordo checkpoint   checkpoint every partition after the next epoch; wait until durable
  ordo dump         export one replica's tables as of a fresh checkpoint
  ordo log prune    remove log segments every partition's checkpoint has made unneeded
  ordo log archive  ship sealed log segments to an archive as they seal
  ordo backup       one replica's fresh checkpoint + the log after it, verified
  ordo restore      a new cluster directory from a backup at its epoch or a later one
  ordo stream       push a file to a stream, follow a sink, list streams and dataflows
  ordo deploy       procedure modules through the log (in force from the next epoch)
  ordo procedures   every procedure: arguments, version, the epoch it took effect
  ordo keys         create the CURVE keys of the cluster's roles and clients (0600);
                    ordo keys export --host H DIR: only what host H needs
  ordo replay       Spark replay of the command log: verify history, rebuild state,
                    history as tables (cluster/replay_cli.py)

This module builds the group from the command modules (cluster/commands/: run,
client, deploy, checkpoints, backup, streams; what they share in common) and the workloads'
command groups.
Every command finds the cluster through ``--data-dir`` (its cluster.json): a missing
or unreadable config is a one-line error, never a traceback.
"""

from __future__ import annotations

import click

from cluster.commands import backup, checkpoints, client, deploy, run, streams
from cluster.replay_cli import replay


@click.group()
def main() -> None:
    """Ordo: a deterministic, replicated, partitioned transaction engine."""


def _add_engine_commands() -> None:
    for command in (
        run.up,
        run.sequencer,
        run.zookeeper,
        run.replica,
        run.reader,
        run.traditional_partition,
        client.call,
        client.query,
        client.status,
        deploy.deploy,
        deploy.procedures,
        client.keys,
        checkpoints.checkpoint,
        checkpoints.dump,
        checkpoints.log,
        backup.backup,
        backup.restore,
        streams.stream,
        # A subcommand group that lives with the code it drives (its heavy imports are lazy).
        replay,
    ):
        main.add_command(command)


def _add_log_commands() -> None:
    checkpoints.log.add_command(backup.log_archive)


def _add_workload_commands() -> None:
    """Workloads bring their own command groups (``ordo tpcc``) through the entry point
    group ``ordo.commands`` in their package metadata: the engine never imports a
    workload, and a new one plugs in without a change here."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group="ordo.commands"), key=lambda e: e.name):
        main.add_command(ep.load(), ep.name)


_add_engine_commands()
_add_log_commands()
_add_workload_commands()

if __name__ == "__main__":
    main()
