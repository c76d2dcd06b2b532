"""PySpark jobs over a replica's history: verify it in parallel across time, rebuild the
database at any epoch, and turn the command log into a table.

Spark only places the work; every task runs the pure-Python replay core
(executor.replay.verify, .reconstruct, .tables), which runs the live Partition code
in-process (LocalReplica). Task layout:

- verify: the intervals between consecutive checkpoints (genesis first, then the tail
  after the last checkpoint) cut into one run of consecutive intervals per slot, about
  equal in transactions and load (``split_runs``), one task each. A task loads the
  state at its first interval's start, then for each interval replays its epochs,
  compares hashes, checks the end checkpoint's files and, on a mismatch, locates the
  bad epoch; a verified end state is the next interval's start
  (executor.replay.verify.verify_run), so a task loads one state, not one per
  interval, and retires its last state instead of freeing it before its rows go back
  (executor.core.heap.retire). Each interval gives one small row; the driver
  annotates them across intervals (a checkpoint found corrupt when loaded as a start
  marks the interval that ends at it; the other replicas' checkpoint hashes) and
  writes them as one Parquet file.
- state: one task (the state at E depends on every epoch before it, from the nearest
  checkpoint) rebuilds the replica and writes each table with pyarrow, directly to the
  output directory: ``OUT/<table>/`` with the catalog's column names, hive-partitioned
  by the first key column for tables placed by it (``place_by_first_int``; for TPC-C's
  STOCK, ``OUT/stock/s_w_id=3/``).
- history: the log's epoch range cut into chunks (segment-aligned, then split to about
  twice the default parallelism); each task streams its frames into rows; Spark writes
  them partitioned by procedure. The summary is computed with Spark SQL on the table.

Invariants: the log is read only with sequencer.log.iter_frames (constant memory per
task, torn tail = end of log, corruption raised and reported); workers import the
cluster's procedure modules before touching a batch; an output directory is replaced
only if it is empty or was written by these jobs (marker file ``_ordo.json``).
Workers must see LOG_DIR, CHECKPOINT_DIR and the output path at the same paths. Tasks
carry only executor-layer values (ReplaySpec, Boundary): on a remote master the code
goes with them as a zip (executor.replay.spark_session, which makes the session).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

from executor.core.checkpoint import DELTA_ROW_LOAD_WEIGHT
from executor.core.heap import release_heap, release_retired
from executor.replay.boundaries import Boundary, peer_checkpoint_dirs, scan_checkpoints
from executor.replay.export import arrow_array, prepare_output, publish_output, staging_dir
from executor.replay.intervals import VERIFY_COLUMNS, IntervalTask
from executor.replay.reconstruct import reconstruct
from executor.replay.spark_session import parallelism
from executor.replay.spec import ReplaySpec, log_last_epoch, log_segments
from executor.replay.tables import (
    HistoryLayout,
    TableLayout,
    history_layout,
    history_rows,
    split_epochs,
    table_columns,
    table_layout,
)
from executor.replay.verdicts import PASSED, UNCHECKED
from executor.replay.verify import annotate_results, plan_history, verify_run
from txn_library.errors import invariant

_UTC = dt.UTC


def _ts(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000.0, tz=_UTC)


def spark_schema(columns: Sequence[tuple[str, str]]) -> Any:
    """A Spark StructType for replay's (name, kind) column lists (all nullable)."""
    from pyspark.sql import types as T

    kinds = {
        "int": T.LongType(),
        "str": T.StringType(),
        "float": T.DoubleType(),
        "bool": T.BooleanType(),
        "ts": T.TimestampType(),
        "bytes": T.BinaryType(),
        "json": T.StringType(),
        "int_list": T.ArrayType(T.LongType()),
    }
    return T.StructType([T.StructField(n, kinds[k], True) for n, k in columns])


def _convert(columns: Sequence[tuple[str, str]], row: Sequence[Any]) -> tuple:
    return tuple(_ts(v) if kind == "ts" else v for (_, kind), v in zip(columns, row, strict=True))


# verify -----------------------------------------------------------------------------------
@dataclass
class VerifyReport:
    rows: list[dict[str, Any]]
    out: Path | None
    job_s: float
    master: str
    parallelism: int

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["verdict"] not in PASSED | UNCHECKED]

    @property
    def passed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["verdict"] in PASSED]

    @property
    def unchecked(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["verdict"] in UNCHECKED]

    @property
    def txns(self) -> int:
        return sum(r["txns"] for r in self.rows)

    def summary(self) -> dict[str, Any]:
        replay_s = sum(r["replay_s"] for r in self.rows)
        return {
            "intervals": len(self.rows),
            "ok": len(self.passed),
            "failed": len(self.failed),
            "unchecked": len(self.unchecked),
            "txns": self.txns,
            "epochs": sum(r["epochs"] for r in self.rows),
            "job_s": round(self.job_s, 3),
            "task_s_sum": round(sum(r["total_s"] for r in self.rows), 3),
            "task_cpu_s_sum": round(sum(r["cpu_s"] for r in self.rows), 3),
            "replay_s_sum": round(replay_s, 3),
            "txns_per_s_job": round(self.txns / self.job_s, 1) if self.job_s else None,
            "txns_per_s_replay": round(self.txns / replay_s, 1) if replay_s else None,
            "master": self.master,
            "parallelism": self.parallelism,
            "workers": sorted({r["worker"] for r in self.rows if r["worker"]}),
            "out": None if self.out is None else str(self.out),
        }


def run_verify(
    spark: Any,
    spec: ReplaySpec,
    checkpoint_dir: str | Path,
    out: str | Path | None,
    *,
    tail: bool = True,
    locate: bool = True,
    runs: int | None = None,
) -> VerifyReport:
    """Verify every interval of one replica's history in parallel; write the table.

    The intervals are cut into ``runs`` runs of consecutive intervals (default: one per
    slot of the session), one Spark task each (``split_runs``, ``verify_run``).
    """
    tasks = plan_history(spec, checkpoint_dir, tail=tail, locate=locate)
    sc = spark.sparkContext
    cut = split_runs(tasks, runs if runs is not None else parallelism(spark))
    t0 = time.perf_counter()
    # each run's state is retired, not freed, so its rows come back at once
    run = partial(verify_run, keep=True)
    rows = sc.parallelize(cut, max(1, len(cut))).flatMap(run).collect()
    job_s = time.perf_counter() - t0
    peers = {
        r: scan_checkpoints(d, spec.partitions)
        for r, d in peer_checkpoint_dirs(checkpoint_dir).items()
    }
    rows = annotate_results(rows, peers)
    report = VerifyReport(rows, None, job_s, sc.master, parallelism(spark))
    if out is not None:
        path = prepare_output(out, "verify", keep=True)
        stage = staging_dir(path)
        cols = VERIFY_COLUMNS
        data = [_convert(cols, [r[c] for c, _ in cols]) for r in rows]
        df = spark.createDataFrame(data, spark_schema(cols))
        df.coalesce(1).write.mode("overwrite").parquet(str(stage))
        publish_output(
            stage,
            path,
            "verify",
            {"log_dir": spec.log_dir, "checkpoint_dir": str(checkpoint_dir), **report.summary()},
        )
        report.out = path
    return report


LOAD_ROWS_PER_EPOCH = 15_000  # checkpoint rows a task loads in the time it replays an epoch
SPLIT_EXACT_MAX = 400  # intervals up to which split_runs finds the best cut exactly


EMPTY_EPOCH_SHARE = 0.02  # of an epoch's replay time that does not depend on its txns


def interval_costs(tasks: Sequence[IntervalTask]) -> list[float]:
    """Each interval's estimated replay time, in epochs of the history's mean density:
    its transactions times the history's epochs per transaction (plus a small share per
    epoch, ``EMPTY_EPOCH_SHARE``), or its epochs where its transactions are not known.
    An estimate for balancing only (never for correctness): live throughput varies
    over a history, and the tail after a finished run holds many empty epochs."""
    known = [t for t in tasks if t.txns is not None]
    txns = sum(t.txns or 0 for t in known)
    if not txns:
        return [float(t.cost) for t in tasks]
    per_txn = sum(t.cost for t in known) / txns
    share = EMPTY_EPOCH_SHARE
    return [
        float(t.cost) if t.txns is None else share * t.cost + (1 - share) * per_txn * t.txns
        for t in tasks
    ]


def load_epochs(boundary: Boundary) -> float:
    """Estimated time to load ``boundary``, in epochs replayed: ``LOAD_ROWS_PER_EPOCH``
    base rows per epoch, a delta's row weighing ``DELTA_ROW_LOAD_WEIGHT`` (TPC-C, W=2,
    New Order, on this machine class, 2026-11-26, rows loaded pending: a base of 1.15M
    rows in 0.61 s, a base and three deltas of 1.14M rows in 0.66 s, per partition;
    ~100 epochs/s replayed; before rows were loaded pending, 7,500)."""
    weighted = boundary.rows + (DELTA_ROW_LOAD_WEIGHT - 1) * boundary.delta_rows
    return weighted / LOAD_ROWS_PER_EPOCH


def split_runs(tasks: Sequence[IntervalTask], runs: int) -> list[list[IntervalTask]]:
    """The intervals, in order, cut into at most ``runs`` runs of consecutive intervals
    whose longest estimated time (``interval_costs``, plus the checkpoint load at a
    run's start: ``load_epochs``) is as small as it can be. Every run pays one state
    load, so there are no more runs than slots: a run per slot keeps every slot busy,
    and a cut where the load is cheap (just after a base) is preferred. Exact (dynamic
    programming) up to ``SPLIT_EXACT_MAX`` intervals; beyond, cut greedily at the
    smallest limit that packs."""
    ordered = sorted(tasks, key=lambda t: t.index)
    n = len(ordered)
    runs = max(1, min(runs, n))
    if runs == 1:
        return [ordered]
    prefix = list(accumulate(interval_costs(ordered), initial=0.0))
    loads = [load_epochs(t.start) for t in ordered]

    def cost(i: int, j: int) -> float:  # the run ordered[i:j]
        return loads[i] + prefix[j] - prefix[i]

    if n <= SPLIT_EXACT_MAX:
        inf = float("inf")
        # best[k][j]: the least longest run covering ordered[:j] in k runs; cut: its start
        best = [[inf] * (n + 1) for _ in range(runs + 1)]
        cut = [[0] * (n + 1) for _ in range(runs + 1)]
        best[0][0] = 0.0
        for k in range(1, runs + 1):
            for j in range(1, n + 1):
                for i in range(k - 1, j):
                    v = max(best[k - 1][i], cost(i, j))
                    if v < best[k][j]:
                        best[k][j], cut[k][j] = v, i
        k = min(range(1, runs + 1), key=lambda r: (best[r][n], r))
        bounds = [n]
        while k > 0:
            bounds.append(cut[k][bounds[-1]])
            k -= 1
        bounds.reverse()
        return [ordered[a:b] for a, b in pairwise(bounds)]

    def pack(limit: float) -> list[list[IntervalTask]] | None:
        out: list[list[IntervalTask]] = []
        start = 0
        for j in range(1, n + 1):
            if cost(start, j) > limit and j - 1 > start:
                out.append(ordered[start : j - 1])
                start = j - 1
            if cost(start, j) > limit or len(out) >= runs:
                return None
        out.append(ordered[start:])
        return out

    lo, hi = 0.0, cost(0, n)
    for _ in range(60):
        mid = (lo + hi) / 2
        if pack(mid) is None:
            lo = mid
        else:
            hi = mid
    best_pack = pack(hi)
    invariant(best_pack is not None, "the history packs at the bisection's upper limit")
    assert best_pack is not None
    return best_pack


# state ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StateTask:
    spec: ReplaySpec
    boundaries: tuple[Boundary, ...]
    epoch: int
    out: str


@dataclass
class StateReport:
    epoch: int
    state_hash: int
    partition_hashes: list[int]
    start_epoch: int
    epochs: int
    txns: int
    tables: dict[str, int]
    partition_columns: dict[str, str | None]
    load_s: float
    replay_s: float
    write_s: float
    notes: list[str] = field(default_factory=list)
    out: str = ""
    job_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["state_hash"] = f"{self.state_hash:016x}"
        d["partition_hashes"] = [f"{h:016x}" for h in self.partition_hashes]
        return d


def build_state(task: StateTask) -> dict[str, Any]:
    """Worker side of ``state``: rebuild the replica at task.epoch and write every table."""
    release_retired()
    rc = reconstruct(task.spec, task.boundaries, task.epoch)
    t0 = time.perf_counter()
    out = Path(task.out)
    storages = [p.storage for p in rc.replica.parts]
    names = sorted({name for s in storages for name, rows in s.whole_tables().items() if rows})
    counts, partition_columns = {}, {}
    for name in names:
        layout = table_layout(name)
        counts[name] = write_table(storages, layout, out / name)
        partition_columns[name] = layout.partition_by
    report = StateReport(
        epoch=task.epoch,
        state_hash=rc.state_hash,
        partition_hashes=rc.partition_hashes,
        start_epoch=rc.start_epoch,
        epochs=rc.stats.epochs,
        txns=rc.stats.txns,
        tables=counts,
        partition_columns=partition_columns,
        load_s=round(rc.load_s, 3),
        replay_s=round(rc.replay_s, 3),
        write_s=round(time.perf_counter() - t0, 3),
        notes=rc.notes,
        out=str(out),
    )
    del rc, storages
    release_heap()  # the task's state is gone; the worker runs other tasks next
    return report.summary()


def write_table(storages: Sequence[Any], layout: TableLayout, directory: Path) -> int:
    """One table as Parquet under ``directory`` (hive-partitioned by layout.partition_by)."""
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    names, cols, n = table_columns(storages, layout)
    table = pa.table({name: arrow_array(col) for name, col in zip(names, cols, strict=True)})
    directory.mkdir(parents=True, exist_ok=True)
    if layout.partition_by is None:
        pq.write_table(table, directory / "part-0.parquet")
    else:
        pads.write_dataset(
            table,
            directory,
            format="parquet",
            partitioning=[layout.partition_by],
            partitioning_flavor="hive",
            basename_template="part-{i}.parquet",
            existing_data_behavior="overwrite_or_ignore",
        )
    return n


def run_state(
    spark: Any,
    spec: ReplaySpec,
    checkpoint_dir: str | Path | None,
    epoch: int | None,
    out: str | Path,
) -> StateReport:
    """Rebuild the database at the end of ``epoch`` (default: the log's last) as Parquet."""
    boundaries = scan_checkpoints(checkpoint_dir, spec.partitions) if checkpoint_dir else []
    if epoch is None:
        epoch = log_last_epoch(spec.log_dir)
    path = prepare_output(out, "state", keep=True)
    stage = staging_dir(path)
    task = StateTask(spec, tuple(boundaries), epoch, str(stage))
    t0 = time.perf_counter()
    (result,) = spark.sparkContext.parallelize([task], 1).map(build_state).collect()
    job_s = time.perf_counter() - t0
    result["state_hash"] = int(result["state_hash"], 16)
    result["partition_hashes"] = [int(h, 16) for h in result["partition_hashes"]]
    report = StateReport(**{**result, "job_s": round(job_s, 3), "out": str(path)})
    publish_output(stage, path, "state", {"log_dir": spec.log_dir, **report.summary()})
    return report


# history ----------------------------------------------------------------------------------
@dataclass
class HistoryReport:
    out: Path
    txns: int
    epochs: int
    first_epoch: int
    last_epoch: int
    log_seconds: float
    txns_per_s: float | None
    peak_txns_per_s: int
    multi_partition_share: float
    by_procedure: list[dict[str, Any]]
    tasks: int
    job_s: float

    def summary(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["out"] = str(self.out)
        return d


def history_ranges(log_dir: str, pieces: int) -> list[tuple[int, int]]:
    """Epoch ranges covering the log: per segment, split to about ``pieces`` in total."""
    firsts = log_segments(log_dir)
    if not firsts:
        return []
    last = log_last_epoch(log_dir)
    bounds = [(f, nxt - 1) for f, nxt in zip(firsts, [*firsts[1:], last + 1], strict=True)]
    bounds = [(lo, hi) for lo, hi in bounds if hi >= lo]
    total = sum(hi - lo + 1 for lo, hi in bounds)
    out: list[tuple[int, int]] = []
    for lo, hi in bounds:
        share = max(1, round(pieces * (hi - lo + 1) / max(1, total)))
        out.extend(split_epochs(lo, hi, share))
    return out


def _history_chunk(spec: ReplaySpec, layout: HistoryLayout, lo: int, hi: int) -> Iterator[tuple]:
    spec.prepare()
    columns = layout.columns
    for row in history_rows(spec, layout, lo, hi):
        yield _convert(columns, row)


def run_history(
    spark: Any, spec: ReplaySpec, out: str | Path, *, tasks: int | None = None
) -> HistoryReport:
    """The command log as a Parquet table of transactions, with a Spark SQL summary."""
    spec.prepare()
    layout = history_layout()
    ranges = history_ranges(spec.log_dir, tasks or 2 * parallelism(spark))
    path = prepare_output(out, "history", keep=True)
    stage = staging_dir(path)
    schema = spark_schema(layout.columns)
    t0 = time.perf_counter()
    rdd = spark.sparkContext.parallelize(ranges, max(1, len(ranges))).flatMap(
        lambda r: _history_chunk(spec, layout, r[0], r[1])
    )
    df = spark.createDataFrame(rdd, schema, verifySchema=False)
    df.write.mode("overwrite").partitionBy("procedure").parquet(str(stage))
    report = history_summary(spark, stage, len(ranges))
    report.job_s = round(time.perf_counter() - t0, 3)
    report.out = path  # where it will be
    publish_output(stage, path, "history", {"log_dir": spec.log_dir, **report.summary()})
    return report


def history_summary(spark: Any, path: Path, tasks: int = 0) -> HistoryReport:
    """Counts, log-time throughput and multi-partition share, with Spark SQL."""
    h = spark.read.parquet(str(path))
    h.createOrReplaceTempView("ordo_history")
    totals = spark.sql(
        """
        SELECT count(*) AS txns, count(DISTINCT epoch) AS epochs,
               min(epoch) AS first_epoch, max(epoch) AS last_epoch,
               min(batch_ts_ms) AS t0, max(batch_ts_ms) AS t1,
               avg(CAST(multi_partition AS INT)) AS multi
        FROM ordo_history
        """
    ).first()
    procs = spark.sql(
        """
        SELECT procedure, count(*) AS txns,
               round(avg(CAST(multi_partition AS INT)), 4) AS multi_partition_share
        FROM ordo_history GROUP BY procedure ORDER BY txns DESC, procedure
        """
    ).collect()
    peak = spark.sql(
        """
        SELECT coalesce(max(n), 0) AS peak FROM (
          SELECT floor(batch_ts_ms / 1000) AS second, count(*) AS n
          FROM ordo_history GROUP BY floor(batch_ts_ms / 1000))
        """
    ).first()
    txns = int(totals["txns"] or 0)
    seconds = ((totals["t1"] or 0) - (totals["t0"] or 0)) / 1000.0
    return HistoryReport(
        out=path,
        txns=txns,
        epochs=int(totals["epochs"] or 0),
        first_epoch=int(totals["first_epoch"] or 0),
        last_epoch=int(totals["last_epoch"] or 0),
        log_seconds=round(seconds, 3),
        txns_per_s=round(txns / seconds, 1) if seconds > 0 else None,
        peak_txns_per_s=int(peak["peak"]),
        multi_partition_share=round(float(totals["multi"] or 0.0), 4),
        by_procedure=[r.asDict() for r in procs],
        tasks=tasks,
        job_s=0.0,
    )
