"""``ordo replay``: Spark jobs over the command log and one replica's checkpoints.

  ordo replay verify [LOG_DIR [CHECKPOINT_DIR]]   replay every checkpoint interval in
                       parallel (runs of consecutive intervals, one per Spark slot),
                       compare state hashes and check every checkpoint file; a table
                       with one row per interval; exit status 1 if any interval fails
  ordo replay state [LOG_DIR [CHECKPOINT_DIR]] --epoch E   the database at the end of
                       epoch E as Parquet (one directory per table); prints its hash
  ordo replay history [LOG_DIR]                  the log as a Parquet table of
                       transactions, with a summary

LOG_DIR defaults to DATA_DIR/log and CHECKPOINT_DIR to DATA_DIR/replica-R/checkpoints;
the cluster config (partitions, procedure modules, genesis) is LOG_DIR/../cluster.json
or --config. Runs on local[*] unless --master names a Spark cluster (whose workers
must see these paths). Registered on the ``ordo`` group by cluster/cli.py; pyspark is
imported only inside the commands.

This is where the cluster's configuration meets replay: ``find_config`` reads the
cluster.json that describes a log, and ``replay_spec`` turns it into the plain
ReplaySpec the executor layer replays with (the executor never reads cluster.json).
Scripts and tests build their specs here too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cluster.config import CONFIG_FILE, DEFAULT_DATA_DIR, ClusterConfig

if TYPE_CHECKING:
    from executor.replay.spec import ReplaySpec

F = Callable[..., Any]


def find_config(log_dir: str | Path, config_path: str | Path | None = None) -> ClusterConfig:
    """The cluster.json that describes LOG_DIR: ``config_path``, else LOG_DIR/../cluster.json."""
    if config_path is not None:
        return ClusterConfig.from_json(Path(config_path).read_text())
    parent = Path(log_dir).resolve().parent
    path = parent / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no {CONFIG_FILE} next to {log_dir} (looked in {parent}); pass --config PATH"
        )
    return ClusterConfig.from_json(path.read_text())


def replay_spec(cfg: ClusterConfig, log_dir: str | Path) -> ReplaySpec:
    """What a replay worker needs from ``cfg``, to replay the log in ``log_dir``."""
    from executor.replay.spec import ReplaySpec

    return ReplaySpec(
        log_dir=str(log_dir),
        partitions=cfg.partitions,
        procedure_modules=tuple(cfg.procedure_modules),
        genesis=cfg.genesis,
        genesis_args=dict(cfg.genesis_args),
    )


def _spark_options(f: F) -> F:
    f = click.option(
        "--conf",
        "confs",
        multiple=True,
        metavar="KEY=VALUE",
        help="Extra Spark configuration (repeatable).",
    )(f)
    f = click.option(
        "--master",
        default="local[*]",
        show_default=True,
        help="Spark master URL, e.g. spark://host:7077 (paths must be shared).",
    )(f)
    f = click.option("--config", "config_path", default=None, help="cluster.json to use.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")(f)
    f = click.option(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        show_default=True,
        help="Cluster directory giving the default LOG_DIR and CHECKPOINT_DIR.",
    )(f)
    return f


def _parse_confs(confs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--conf wants KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _resolve(
    data_dir: str, log_dir: str | None, config_path: str | None
) -> tuple[ClusterConfig, ReplaySpec, Path]:
    """(ClusterConfig, ReplaySpec, the directory holding the log) for LOG_DIR."""
    log = Path(log_dir) if log_dir else Path(data_dir) / "log"
    if not log.is_dir():
        raise click.ClickException(f"no command log directory {log}")
    try:
        cfg = find_config(log, config_path)
    except (FileNotFoundError, ValueError, TypeError) as e:
        raise click.ClickException(str(e)) from None
    return cfg, replay_spec(cfg, log.resolve()), log.resolve().parent


def _session(master: str, confs: tuple[str, ...], light_driver: bool = False) -> Any:
    """``light_driver``: the job's work is in Python tasks (spark_session.LIGHT_DRIVER_JVM)."""
    from executor.replay.spark_session import make_session

    return make_session(master, conf=_parse_confs(confs), light_driver=light_driver)


@click.group()
def replay() -> None:
    """Spark replay of the command log: verify history, rebuild state, history as tables."""


@replay.command()
@click.argument("log_dir", required=False)
@click.argument("checkpoint_dir", required=False)
@click.option("--replica", "-r", default=0, show_default=True, help="Default CHECKPOINT_DIR.")
@click.option("--out", default=None, help="Parquet output [LOG_DIR/../replay/verify].")
@click.option("--no-locate", is_flag=True, help="Do not search for the bad epoch.")
@click.option("--no-tail", is_flag=True, help="Skip the epochs after the last checkpoint.")
@click.option(
    "--runs",
    type=int,
    default=None,
    help="Spark tasks, each a run of consecutive intervals [the session's slots].",
)
@_spark_options
def verify(
    log_dir: str | None,
    checkpoint_dir: str | None,
    replica: int,
    out: str | None,
    no_locate: bool,
    no_tail: bool,
    runs: int | None,
    data_dir: str,
    as_json: bool,
    config_path: str | None,
    master: str,
    confs: tuple[str, ...],
) -> None:
    """Verify the whole history in parallel: the checkpoint intervals in one run of
    consecutive intervals per slot (a run loads one state, then carries it along)."""
    import sys

    from executor.replay.spark_jobs import run_verify

    cfg, spec, root = _resolve(data_dir, log_dir, config_path)
    ckpt = Path(checkpoint_dir) if checkpoint_dir else root / f"replica-{replica}" / "checkpoints"
    if not ckpt.is_dir():
        raise click.ClickException(f"no checkpoint directory {ckpt}")
    out_path = Path(out) if out else root / "replay" / "verify"
    spark = _session(master, confs, light_driver=True)
    try:
        report = run_verify(
            spark,
            spec,
            ckpt.resolve(),
            out_path,
            tail=not no_tail,
            locate=not no_locate,
            runs=runs,
        )
    finally:
        spark.stop()
    if as_json:
        click.echo(json.dumps({**report.summary(), "rows": report.rows}, default=str, indent=2))
    else:
        _print_verify(report)
    if report.failed:
        sys.exit(1)


def _epochs(r: dict[str, Any]) -> str:
    end = "end" if r["end_epoch"] is None else str(r["end_epoch"])
    return f"({r['start_epoch']}, {end}]"


def _print_verify(report: Any) -> None:
    s = report.summary()
    click.echo(
        f"{'interval':>8}  {'epochs':<16} {'txns':>9} {'replay_s':>8} {'txn/s':>8}  "
        f"{'verdict':<15} detail"
    )
    for r in report.rows:
        rate = r["replay_txns_per_s"]
        click.echo(
            f"{r['interval']:>8}  {_epochs(r):<16} {r['txns']:>9} {r['replay_s']:>8.2f} "
            f"{'' if not rate else f'{rate:,.0f}':>8}  {r['verdict']:<15} {r['detail']}"
        )
    click.echo(
        f"ordo replay verify: {s['intervals']} intervals, {s['epochs']} epochs, "
        f"{s['txns']:,} txns on {s['master']} ({s['parallelism']} slots): {s['ok']} ok, "
        f"{s['failed']} failed, {s['unchecked']} unchecked; job {s['job_s']:.1f} s "
        f"({s['txns_per_s_job'] or 0:,.0f} txn/s); table {s['out']}"
    )
    for r in report.failed:
        where = f"epoch {r['bad_epoch']}" if r["bad_epoch"] is not None else None
        if where is None and r["suspect_last_epoch"] is not None:
            where = f"epochs {r['suspect_first_epoch']}..{r['suspect_last_epoch']}"
        click.echo(
            f"FAILED interval {r['interval']} {_epochs(r)}: {r['verdict']}"
            + (f" at {where}" if where else "")
            + (f" (located by {r['located_by']})" if r["located_by"] else ""),
            err=True,
        )


@replay.command()
@click.argument("log_dir", required=False)
@click.argument("checkpoint_dir", required=False)
@click.option("--epoch", "-e", type=int, default=None, help="Epoch [the log's last].")
@click.option("--replica", "-r", default=0, show_default=True, help="Default CHECKPOINT_DIR.")
@click.option("--genesis-only", is_flag=True, help="Ignore checkpoints: replay from epoch 0.")
@click.option("--out", default=None, help="Output [LOG_DIR/../replay/state-<epoch>].")
@_spark_options
def state(
    log_dir: str | None,
    checkpoint_dir: str | None,
    epoch: int | None,
    replica: int,
    genesis_only: bool,
    out: str | None,
    data_dir: str,
    as_json: bool,
    config_path: str | None,
    master: str,
    confs: tuple[str, ...],
) -> None:
    """Rebuild the database at the end of an epoch and write every table as Parquet."""
    from executor.replay.batches import ReplayFailure
    from executor.replay.spark_jobs import run_state
    from executor.replay.spec import log_last_epoch
    from sequencer.log import LogCorruption

    cfg, spec, root = _resolve(data_dir, log_dir, config_path)
    ckpt: Path | None = None
    if not genesis_only:
        ckpt = (
            Path(checkpoint_dir) if checkpoint_dir else root / f"replica-{replica}" / "checkpoints"
        )
        if not ckpt.is_dir():
            ckpt = None  # no checkpoints yet: replay from genesis
    last = log_last_epoch(spec.log_dir)
    if epoch is None:
        epoch = last
    if not 0 <= epoch <= last:
        raise click.ClickException(f"the log ends at epoch {last}; cannot rebuild epoch {epoch}")
    out_path = Path(out) if out else root / "replay" / f"state-{epoch}"
    spark = _session(master, confs, light_driver=True)
    try:
        report = run_state(spark, spec, ckpt, epoch, out_path)
    except Exception as e:  # Spark wraps the worker's exception; show its message
        kinds = (LogCorruption, ReplayFailure, *ReplayFailure.__subclasses__())
        cause = _worker_error(e, kinds)
        raise click.ClickException(f"cannot rebuild epoch {epoch}: {cause}") from None
    finally:
        spark.stop()
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2, default=str))
        return
    s = report.summary()
    click.echo(
        f"epoch {s['epoch']}: state hash {s['state_hash']} "
        f"(partitions {' + '.join(s['partition_hashes'])})"
    )
    start = "genesis" if s["start_epoch"] == 0 else f"checkpoint {s['start_epoch']}"
    click.echo(
        f"rebuilt from {start}"
        f" + {s['epochs']} epochs ({s['txns']:,} txns): load {s['load_s']} s, "
        f"replay {s['replay_s']} s, write {s['write_s']} s"
    )
    for note in s["notes"]:
        click.echo(f"note: {note}")
    for t, n in sorted(s["tables"].items()):
        by = s["partition_columns"][t]
        click.echo(f"  {t:<20} {n:>10} rows  {out_path / t}" + (f"/{by}=*" if by else ""))


def _worker_error(e: BaseException, kinds: tuple[type, ...]) -> str:
    text = str(e)
    for kind in kinds:
        marker = f"{kind.__name__}: "
        if marker in text:
            return text[text.rindex(marker) :].splitlines()[0]
    return text.splitlines()[0] if text else type(e).__name__


@replay.command()
@click.argument("log_dir", required=False)
@click.option("--out", default=None, help="Output [LOG_DIR/../replay/history].")
@click.option("--tasks", type=int, default=None, help="Spark tasks [2 x parallelism].")
@_spark_options
def history(
    log_dir: str | None,
    out: str | None,
    tasks: int | None,
    data_dir: str,
    as_json: bool,
    config_path: str | None,
    master: str,
    confs: tuple[str, ...],
) -> None:
    """The command log as a Parquet table of transactions (partitioned by procedure)."""
    from executor.replay.spark_jobs import run_history

    cfg, spec, root = _resolve(data_dir, log_dir, config_path)
    out_path = Path(out) if out else root / "replay" / "history"
    spark = _session(master, confs)
    try:
        report = run_history(spark, spec, out_path, tasks=tasks)
    finally:
        spark.stop()
    s = report.summary()
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
        return
    click.echo(
        f"{s['txns']:,} txns in {s['epochs']:,} epochs ({s['first_epoch']}..{s['last_epoch']}), "
        f"{s['log_seconds']} s of log time: {s['txns_per_s'] or 0:,.0f} txn/s mean, "
        f"{s['peak_txns_per_s']:,} in the busiest second; "
        f"multi-partition {100 * s['multi_partition_share']:.1f}%"
    )
    click.echo(f"{'procedure':<28} {'txns':>10} {'multi-partition':>16}")
    for p in s["by_procedure"]:
        click.echo(
            f"{p['procedure']:<28} {p['txns']:>10,} {100 * p['multi_partition_share']:>15.1f}%"
        )
    click.echo(f"table: {s['out']} ({s['tasks']} tasks, {s['job_s']} s)")


if __name__ == "__main__":
    replay()
