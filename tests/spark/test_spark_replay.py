"""Spark replay against a real cluster's history: verify, state, history, damage, --master.

One live bank run (2 replicas x 2 partitions, 10% multi-partition transfers,
checkpoints every 10 epochs) is shared by every test; one local[2] SparkSession is
shared too. A real standalone Spark master and worker (from the installed pyspark,
on 127.0.0.1) start in the background when the module starts, and `ordo replay
verify --master spark://...` runs against them; they are stopped by PID even when a
test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest

from cluster.bank_load import run_transfers
from cluster.config import ClusterConfig
from cluster.launcher import LocalCluster, free_base_port, wait_quiescent
from cluster.replay_cli import find_config, replay_spec
from executor.core import checkpoint
from executor.core.storage import Storage
from executor.deterministic.oracle import SerialExecutor
from executor.replay import spark_jobs as spark_replay
from executor.replay.boundaries import scan_checkpoints
from executor.replay.intervals import VERIFY_COLUMNS
from executor.replay.spark_session import LIGHT_DRIVER_JVM, driver_archive, make_session
from executor.replay.spec import ReplaySpec
from executor.replay.tables import table_layout
from executor.replay.verdicts import BAD_CHECKPOINT, BATCH_INVALID, BY_DIGEST, LOG_CORRUPT, TAIL
from sequencer.log import iter_frames, rewrite_payloads
from tests.deploy_modules import bump_module
from tests.unit.test_replay import frame_offset
from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.client import Client
from txn_library.errors import OK
from txn_library.wire import sequencer as wire
from txn_library.workloads.bank import make_transfers, open_accounts

ACCOUNTS = 1_000
START = 10_000
STANDALONE_READY_S = 120.0


@dataclass(frozen=True)
class LiveRun:
    cfg: ClusterConfig
    status: dict

    @property
    def data(self) -> Path:
        return Path(self.cfg.data_dir)

    @property
    def ckpt(self) -> Path:
        return self.cfg.checkpoint_dir(0)

    def spec(self, data: Path | None = None) -> ReplaySpec:
        log = (data or self.data) / "log"
        return replay_spec(find_config(log), log)


# Fixtures ------------------------------------------------------------------------------
@dataclass
class Standalone:
    url: str
    ui: str
    procs: list[subprocess.Popen]
    logs: Path

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STANDALONE_READY_S
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"spark daemon exited {p.returncode}; see {self.logs}")
            try:
                with urllib.request.urlopen(f"{self.ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= 1:
                        return
            except OSError:
                pass  # master not listening yet
            time.sleep(0.25)
        raise TimeoutError(f"standalone Spark not ready in {STANDALONE_READY_S}s; see {self.logs}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # its own session: the daemon and children
                p.wait(timeout=5)


@pytest.fixture(scope="module", autouse=True)
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """Master + one worker (2 cores) started now, in the background, waited for on use."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    logs = tmp_path_factory.mktemp("spark-standalone")
    base = free_base_port(span=8)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    master_url = f"spark://127.0.0.1:{base}"
    daemons = [
        ("master", ["org.apache.spark.deploy.master.Master", "--port", str(base)]),
        (
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--port",
                str(base + 2),
                "--cores",
                "2",
                "--memory",
                "2g",
                "--work-dir",
                str(logs / "work"),
                master_url,
            ],
        ),
    ]
    sa = Standalone(master_url, f"http://127.0.0.1:{base + 1}", [], logs)
    try:
        for i, (name, args) in enumerate(daemons):
            cls, *rest = args
            sa.procs.append(
                subprocess.Popen(
                    [str(home / "bin" / "spark-class"), cls, "--host", "127.0.0.1"]
                    + ["--webui-port", str(base + 1 + 2 * i), *rest],
                    stdout=open(logs / f"{name}.log", "wb"),
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            )
        yield sa
    finally:
        sa.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    # light_driver, as `ordo replay verify` and `state` run: the driver JVM's tier-1 JIT
    session = make_session("local[2]", app_name="ordo-replay-tests", light_driver=True)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A finished live run: its log, both replicas' checkpoints, and its last status."""
    cfg = ClusterConfig(
        replicas=2,
        partitions=2,
        base_port=free_base_port(),
        data_dir=str(tmp_path_factory.mktemp("live") / "data"),
        procedure_modules=("txn_library.workloads.builtin",),
        checkpoint_every_epochs=10,
        checkpoint_keep=1000,
    )
    with LocalCluster(cfg):
        with Client(cfg.client_addr) as c:
            open_accounts(c, ACCOUNTS, START)
        transfers = make_transfers(8_000, ACCOUNTS, 2, multi_share=0.1, seed=5)
        run = run_transfers(cfg.client_addr, transfers, clients=3, in_flight_per_client=30)
        assert run.errors == 0, run.error_codes
        with Client(cfg.client_addr) as c:
            status = wait_quiescent(c, 2, 2)
    assert len(scan_checkpoints(cfg.checkpoint_dir(0), 2)) >= 6, "run too short"
    yield LiveRun(cfg, status)


# verify / state / history on local[2] ------------------------------------------------------
def test_the_driver_jvm_maps_the_archive_set_up_built(spark: Any) -> None:
    """Set-up builds the driver JVM's class-data archive; a session's JVM is started
    with it (and tier-1 JIT); its workers import the installed pyspark, not a zip."""
    archive = driver_archive()
    assert archive.is_file(), "scripts/setup.sh builds it (scripts/build_spark_archive.py)"
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in args
    assert LIGHT_DRIVER_JVM in args
    (origin,) = spark.sparkContext.parallelize([0], 1).map(_pyspark_origin).collect()
    assert origin == str(Path(pyspark.__file__).parent)


def _pyspark_origin(_: int) -> str:
    return str(Path(pyspark.__file__).parent)


def test_verify_passes_every_interval_and_writes_the_table(
    spark: object, live: LiveRun, tmp_path: Path
) -> None:
    report = spark_replay.run_verify(spark, live.spec(), live.ckpt, tmp_path / "verify")
    assert not report.failed
    assert [r["verdict"] for r in report.rows][-1] == TAIL
    assert len(report.passed) == len(scan_checkpoints(live.ckpt, 2))
    assert report.txns == live.status["txns_sequenced"]
    # The other replica agrees at every boundary it checkpointed too (None: it skipped
    # that one, as a busy writer may: nothing to compare, not a disagreement).
    agree = [r["replicas_agree"] for r in report.passed]
    assert False not in agree and agree.count(True) >= len(agree) // 2, agree
    table = spark.read.parquet(str(tmp_path / "verify"))  # type: ignore[attr-defined]
    assert table.count() == len(report.rows)
    ok = table.where("verdict = 'ok' AND expected_hash = actual_hash").count()
    assert ok == len(report.passed)
    assert {c for c, _ in VERIFY_COLUMNS} == set(table.columns)


def test_state_at_the_last_epoch_matches_the_live_replicas(
    spark: object, live: LiveRun, tmp_path: Path
) -> None:
    out = tmp_path / "state"
    epoch = live.status["epoch"]
    report = spark_replay.run_state(spark, live.spec(), live.ckpt, None, out)
    assert report.epoch == epoch and report.start_epoch == epoch // 10 * 10
    live_hashes = {
        (p["replica"], p["partition"]): p["state_hash"] for p in live.status["partitions"]
    }
    for (_r, p), h in live_hashes.items():
        assert f"{report.partition_hashes[p]:016x}" == h
    assert report.tables == {"account": ACCOUNTS}
    spark.read.parquet(str(out / "account")).createOrReplaceTempView("account")  # type: ignore[attr-defined]
    total = spark.sql("SELECT sum(balance) AS s, count(*) AS n FROM account").first()  # type: ignore[attr-defined]
    assert (total["s"], total["n"]) == (ACCOUNTS * START, ACCOUNTS)  # money is conserved
    assert pq.read_table(out / "account").num_rows == ACCOUNTS  # pandas/pyarrow read it too


def test_history_table_and_summary(spark: object, live: LiveRun, tmp_path: Path) -> None:
    out = tmp_path / "history"
    report = spark_replay.run_history(spark, live.spec(), out, tasks=3)
    assert report.txns == live.status["txns_sequenced"]
    assert report.last_epoch == live.status["epoch"]
    by_proc = {p["procedure"]: p for p in report.by_procedure}
    assert by_proc["bank.transfer"]["txns"] == 8_000
    assert 0.05 < by_proc["bank.transfer"]["multi_partition_share"] < 0.15  # 10% asked
    assert report.txns_per_s and 0 < report.peak_txns_per_s <= report.txns
    h = spark.read.parquet(str(out))  # type: ignore[attr-defined]
    h.createOrReplaceTempView("h")
    # Money moved per second of log time, from the flattened arguments.
    moved = spark.sql(  # type: ignore[attr-defined]
        """SELECT date_trunc('second', batch_ts) AS second, sum(arg_amount) AS cents
           FROM h WHERE procedure = 'bank.transfer' GROUP BY 1"""
    ).collect()
    expected = sum(a for _s, _d, a in make_transfers(8_000, ACCOUNTS, 2, 0.1, seed=5))
    assert sum(r["cents"] for r in moved) == expected
    ids = [r["txn_id"] for r in h.select("txn_id").orderBy("txn_id").collect()]
    assert ids == list(range(report.txns))


def test_warehouse_tables_are_hive_partitioned_with_catalog_names(
    spark: object, tmp_path: Path
) -> None:
    register_table(
        Table(
            "test_stock",
            key_len=2,
            place_len=1,
            placement=place_by_first_int,
            columns=("ts_i_id", "ts_w_id", "ts_quantity", "ts_dist"),
            key_columns=("ts_w_id", "ts_i_id"),
        )
    )
    storages = [Storage(), Storage()]
    for w in (1, 2, 3):
        for i in range(1, 6):
            storages[(w - 1) % 2].put("test_stock", (w, i), (i, w, 10 * w + i, ["x", w]))
    layout = table_layout("test_stock")
    assert layout.partition_by == "ts_w_id"
    assert layout.columns == ("ts_i_id", "ts_w_id", "ts_quantity", "ts_dist")
    n = spark_replay.write_table(storages, layout, tmp_path / "test_stock")
    assert n == 15
    assert sorted(p.name for p in (tmp_path / "test_stock").iterdir()) == [
        "ts_w_id=1",
        "ts_w_id=2",
        "ts_w_id=3",
    ]
    df = spark.read.parquet(str(tmp_path / "test_stock"))  # type: ignore[attr-defined]
    assert set(df.columns) == {"ts_i_id", "ts_w_id", "ts_quantity", "ts_dist"}
    row = df.where("ts_w_id = 2 AND ts_i_id = 4").first()
    assert (row["ts_quantity"], row["ts_dist"]) == (24, '["x",2]')  # lists as JSON text


# Damage is detected and located ---------------------------------------------------------------
def test_verify_locates_a_doctored_frame_a_corrupt_checkpoint_and_a_flipped_byte(
    spark: object, live: LiveRun, tmp_path: Path
) -> None:
    data = tmp_path / "damaged"
    shutil.copytree(live.data, data)
    log_dir, ckpt = data / "log", data / "replica-0" / "checkpoints"
    epochs = [b.epoch for b in scan_checkpoints(ckpt, 2)]
    # 1. A changed argument, re-encoded with a valid CRC (history changed, framing intact).
    #    (Unchained logs, where only a candidate range can be given: tests/unit/test_replay.py.)
    doctored_epoch = epochs[0] + 5
    serial = SerialExecutor()  # find a transfer that committed: changing it must show
    for _e, payload in iter_frames(log_dir, 1, doctored_epoch):
        serial.apply(wire.decode_batch(payload))
    batch = wire.decode_batch(payload)
    txns = list(batch.txns)
    i = next(
        i
        for i, t in enumerate(txns)
        if t.proc == "bank.transfer"
        and t.args[0] != t.args[1]
        and serial.results[batch.first_txn_id + i][0] == OK
    )
    src, dst, amount = txns[i].args
    txns[i] = txns[i]._replace(args=(src, dst, amount + 1))
    rewrite_payloads(log_dir, {doctored_epoch: wire.pack(batch._replace(txns=tuple(txns)))})
    # 2. A checkpoint whose rows are damaged (header intact).
    bad_ckpt = ckpt / checkpoint.checkpoint_name(epochs[2], 1)
    raw = bytearray(bad_ckpt.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    bad_ckpt.write_bytes(bytes(raw))
    # 3. A flipped byte in the middle of the log (breaks the CRC) in the last interval.
    flipped_epoch = epochs[-1] - 3
    segment = max(
        (s for s in log_dir.glob("segment-*.log") if int(s.stem[8:]) <= flipped_epoch),
        key=lambda s: int(s.stem[8:]),
    )
    raw = bytearray(segment.read_bytes())
    raw[frame_offset(segment, flipped_epoch - int(segment.stem[8:])) + 8 + 3] ^= 0x20
    segment.write_bytes(bytes(raw))

    report = spark_replay.run_verify(spark, live.spec(data), ckpt, tmp_path / "verify")
    rows = {r["end_epoch"]: r for r in report.rows}
    doctored = rows[epochs[1]]
    # the next batch's prev_digest vouches for the original bytes: found exactly
    assert doctored["verdict"] == BATCH_INVALID
    assert (doctored["located_by"], doctored["bad_epoch"]) == (BY_DIGEST, doctored_epoch)
    assert rows[epochs[2]]["verdict"] == BAD_CHECKPOINT
    assert rows[epochs[2]]["bad_epoch"] == epochs[2]
    assert rows[epochs[3]]["replayed_from_epoch"] == epochs[1]  # fell back past the bad one
    assert rows[epochs[3]]["verdict"] == "ok"
    flipped = rows[epochs[-1]]
    assert (flipped["verdict"], flipped["bad_epoch"]) == (LOG_CORRUPT, flipped_epoch)
    failed = {r["end_epoch"] for r in report.failed}
    assert failed == {epochs[1], epochs[2], epochs[-1], None}  # the tail is after the flip
    table = spark.read.parquet(str(tmp_path / "verify"))  # type: ignore[attr-defined]
    assert table.where("verdict != 'ok'").count() == 4


def test_output_directory_not_written_by_replay_is_never_replaced(
    spark: object, live: LiveRun, tmp_path: Path
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        spark_replay.run_state(spark, live.spec(), live.ckpt, 5, precious)
    assert (precious / "notes.txt").read_text() == "keep me"


# On a real Spark cluster, through the CLI ------------------------------------------------------
def test_cli_verify_on_a_standalone_spark_cluster(
    standalone: Standalone, live: LiveRun, tmp_path: Path
) -> None:
    standalone.wait_ready()
    out = tmp_path / "verify"
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "replay", "verify", str(live.data / "log")]
        + [str(live.ckpt), "--master", standalone.url, "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["master"] == standalone.url
    assert summary["failed"] == 0 and summary["ok"] >= 6
    assert summary["txns"] == live.status["txns_sequenced"]
    assert pq.read_table(out).num_rows == summary["intervals"]
    deadline = time.monotonic() + 30  # the master records the app once the driver leaves
    names: list[str] = []
    while time.monotonic() < deadline and "ordo-replay" not in names:
        with urllib.request.urlopen(f"{standalone.ui}/json/", timeout=5) as r:
            state = json.load(r)
        names = [a["name"] for a in state["completedapps"] + state["activeapps"]]
        time.sleep(0.2)
    assert "ordo-replay" in names  # it really ran there


class _Shared:
    """The session fixture, with stop() a no-op (the CLI stops its session when done)."""

    def __init__(self, spark: object) -> None:
        self._spark = spark

    def __getattr__(self, name: str) -> object:
        return getattr(self._spark, name)

    def stop(self) -> None:
        pass


def test_cli_state_and_history_print_what_they_wrote(
    spark: object, live: LiveRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from cluster import replay_cli

    monkeypatch.setattr(replay_cli, "_session", lambda master, confs, **_: _Shared(spark))
    runner = CliRunner()
    data = ["--data-dir", str(live.data)]
    r = runner.invoke(replay_cli.replay, ["state", *data, "--replica", "1", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    mine = [p for p in live.status["partitions"] if p["replica"] == 1]
    total = sum(int(p["state_hash"], 16) for p in mine) % (1 << 64)
    assert summary["state_hash"] == f"{total:016x}"  # what `ordo status` shows, summed
    assert Path(summary["out"]) == live.data / "replay" / f"state-{live.status['epoch']}"
    r = runner.invoke(replay_cli.replay, ["history", *data, "--out", str(tmp_path / "h")])
    assert r.exit_code == 0, r.output
    assert f"{live.status['txns_sequenced']:,} txns" in r.output
    assert "bank.transfer" in r.output and "multi-partition" in r.output


# Procedures deployed through the log (txn_library.deployed) ---------------------------------
def test_deployed_code_is_history_every_replica_and_spark_replay_run_each_epochs_version(
    spark: object, make_cluster: Any, tmp_path: Path
) -> None:
    """v1 deployed, then v2 under load; a partition killed -9 and restarted (it installs
    what it kept beside its checkpoints, and meets the rest in the log); every call ran
    with the version in force at its epoch, replicas agree, and Spark's replay of the log
    (verify and state) equals them."""
    import threading

    from txn_library.deployed import DEPLOY

    lc = make_cluster(replicas=2, partitions=2, checkpoint_every_epochs=10, checkpoint_keep=1000)
    cfg = lc.config
    with Client(cfg.client_addr, timeout_s=30.0) as c:
        open_accounts(c, ACCOUNTS, START)
        d1 = c.call(DEPLOY, "bump", bump_module(1), [])
        assert d1.ok and list(d1.value["procedures"]) == ["demo.bump"], d1
        transfers = make_transfers(3_000, ACCOUNTS, 2, multi_share=0.1, seed=9)
        load = threading.Thread(
            target=run_transfers, args=(cfg.client_addr, transfers), kwargs={"clients": 2}
        )
        load.start()
        futures = [c.submit("demo.bump", f"k{i % 7}") for i in range(150)]
        d2 = c.call(DEPLOY, "bump", bump_module(2), [])
        assert d2.ok, d2
        futures += [c.submit("demo.bump", f"k{i % 7}") for i in range(150)]
        lc.kill("r0p1")
        lc.start_partition(0, 1)
        futures += [c.submit("demo.bump", f"k{i % 7}") for i in range(150)]
        results = [f.result(timeout=60) for f in futures]
        load.join()
        status = wait_quiescent(c, 2, 2)
    lc.stop()
    cut = d2.epoch + 1  # v2 runs from the epoch after the one that logged it
    assert all(r.ok for r in results)
    ran = [(r.value[0], r.epoch >= cut) for r in results]
    assert all(tag == ("v2" if late else "v1") for tag, late in ran), ran
    assert {tag for tag, _ in ran} == {"v1", "v2"}
    hashes: dict[int, set[str]] = {}
    for p in status["partitions"]:
        hashes.setdefault(p["partition"], set()).add(p["state_hash"])
    assert all(len(h) == 1 for h in hashes.values()), hashes  # the replicas agree
    spec = replay_spec(find_config(cfg.log_dir), cfg.log_dir)
    ckpt = Path(cfg.checkpoint_dir(0))
    report = spark_replay.run_verify(spark, spec, ckpt, tmp_path / "verify")
    assert not report.failed and report.passed, report.rows
    state = spark_replay.run_state(spark, spec, ckpt, None, tmp_path / "state")
    assert state.epoch == status["epoch"]
    for p, (h,) in hashes.items():
        assert f"{state.partition_hashes[p]:016x}" == h
