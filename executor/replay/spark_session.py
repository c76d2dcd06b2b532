"""The Spark session of Ordo's replay jobs, and its driver JVM's class-data archive.

``make_session`` gives every job one configuration (``session_settings``, pure): the
driver on 127.0.0.1 for a local or loopback master; on a local master PySpark's daemon
without Spark's source zips on its path (executor.replay.spark_daemon) and, for jobs
whose work is in Python tasks, a driver JVM that JIT-compiles with tier 1 only; on any
other master the Ordo packages shipped to the executors as a zip (``PACKAGES``).

The driver JVM's class-data-sharing archive (JDK 17 dynamic AppCDS): set-up runs one
small session that uses Spark core, SQL and Parquet (``build_driver_archive``, from
scripts/build_spark_archive.py) under ``-XX:ArchiveClassesAtExit``; every later
session maps the classes it dumped instead of loading, parsing and verifying them from
Spark's jars again. A session then starts in about 3 s instead of 6-7 s, and a job's
first use of each Spark class costs less (docs/BENCHMARKS.md, eleventh session).

Invariants: the archive only ever speeds things up. A session without it, or with one
the JVM rejects (another JDK or class path: the JVM validates the archive and then
loads from the jars, silently: ``ARCHIVE_LOG_OFF``), runs the same jobs the same way.
An archive is published whole or not at all (dumped under a temporary name and renamed
once the JVM that wrote it has exited 0). A ``spark.driver.extraJavaOptions`` of the
user's replaces all of ours.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from txn_library.errors import invariant

# What a task may import: the engine below cluster/, and workloads' procedures (tpcc).
PACKAGES = ("executor", "scheduler", "sequencer", "tpcc", "txn_library")
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
JAVA_OPTIONS = "spark.driver.extraJavaOptions"

# The driver JVM of a job whose work is all in Python tasks (verify, state) on a local
# master: JIT compilation tier 1 only. C2 compiled Spark's own code in the background
# for seconds, on the cores the tasks run on: during a 17 s `ordo replay verify` on
# local[2] (2 cores) the JVM took 6.9 s of CPU, 2.7 s of it JIT threads; with tier 1
# only 0.4 s of JIT, and the tasks' summed time fell by ~3 s (docs/BENCHMARKS.md, tenth
# session). Jobs whose work is Spark's own (``history``: Spark SQL, Parquet) keep C2.
LIGHT_DRIVER_JVM = "-XX:TieredStopAtLevel=1"
# PySpark's daemon, run with the installed pyspark ahead of Spark's source zips
# (executor.replay.spark_daemon): a session's first Python job starts ~1 s sooner.
DAEMON_MODULE = "executor.replay.spark_daemon"


# The JVM's logging about its archive, turned off: a rejected archive must not print
# to the stdout of ``ordo replay ... --json`` (the driver JVM shares it).
ARCHIVE_LOG_OFF = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def driver_archive() -> Path:
    """Where set-up keeps the driver JVM's archive: in this interpreter's prefix (the
    venv), one per pyspark release (its jars are the class path the JVM checks)."""
    return Path(sys.prefix) / "share" / "ordo" / f"spark-{version('pyspark')}-driver.jsa"


def make_session(
    master: str | None = None,
    app_name: str = "ordo-replay",
    conf: Mapping[str, str] | None = None,
    *,
    light_driver: bool = False,
) -> Any:
    """A SparkSession on ``master`` (default local[*]) with this interpreter as Python,
    configured by ``session_settings`` (the driver JVM maps ``driver_archive()`` when
    set-up built it)."""
    from pyspark.sql import SparkSession

    master = master or "local[*]"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if _is_loopback(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    archive = driver_archive()
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = session_settings(master, conf, light_driver, archive if archive.is_file() else None)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not master.startswith("local"):
        spark.sparkContext.addPyFile(str(_code_zip()))
    return spark


def session_settings(
    master: str, conf: Mapping[str, str] | None, light_driver: bool, archive: Path | None = None
) -> dict[str, str]:
    """The Spark configuration ``make_session`` gives ``master``: ours, then ``conf``.

    On a local or loopback master the driver binds to 127.0.0.1. On a local master (the
    workers run this interpreter) Spark starts ``DAEMON_MODULE``, and with
    ``light_driver`` the driver JVM compiles with tier 1 only (``LIGHT_DRIVER_JVM``).
    With ``archive`` the driver JVM maps it (any master: the driver runs here)."""
    settings = {
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        "spark.python.worker.reuse": "true",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.sources.partitionOverwriteMode": "static",
    }
    java = []
    if _is_loopback(master):
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        if master.startswith("local"):  # the workers run this interpreter
            settings["spark.python.daemon.module"] = DAEMON_MODULE
            if light_driver:
                java.append(LIGHT_DRIVER_JVM)
    if archive is not None and " " not in str(archive):  # options split at spaces
        java += [f"-XX:SharedArchiveFile={archive}", ARCHIVE_LOG_OFF]
    if java:
        settings[JAVA_OPTIONS] = " ".join(java)
    settings.update(conf or {})
    return settings


def build_driver_archive(path: Path) -> Path:
    """Write the driver JVM's archive to ``path``: run a session that uses Spark core
    (a Python job), SQL and Parquet, its JVM dumping every class it loaded when it
    exits, then publish the dump and remove other pyspark releases' archives beside
    it. Raises RuntimeError if the JVM wrote none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dump = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    dump.unlink(missing_ok=True)
    options = f"-XX:ArchiveClassesAtExit={dump} {ARCHIVE_LOG_OFF}"
    spark = make_session("local[2]", "ordo-cds", {JAVA_OPTIONS: options})
    jvm = spark.sparkContext._gateway.proc  # pyspark's launcher keeps the JVM's Popen
    try:
        _exercise(spark)
    finally:
        spark.stop()
        jvm.stdin.close()  # the gateway JVM exits at EOF on its stdin, dumping first
        code = jvm.wait(timeout=600)
    if code != 0 or not dump.is_file() or dump.stat().st_size == 0:
        dump.unlink(missing_ok=True)
        raise RuntimeError(f"the driver JVM exited {code} without writing {dump}")
    os.replace(dump, path)
    for stale in path.parent.glob("spark-*-driver.jsa"):  # other pyspark releases' archives
        if stale != path:
            stale.unlink(missing_ok=True)
    return path


def _exercise(spark: Any) -> None:
    """What the replay jobs ask of Spark, in small: Python tasks, a DataFrame written
    as Parquet, read back and aggregated."""
    spark.sparkContext.parallelize(range(8), 2).map(_square).collect()
    with tempfile.TemporaryDirectory() as d:
        df = spark.createDataFrame([(i, str(i % 3)) for i in range(64)], "n long, s string")
        df.coalesce(1).write.mode("overwrite").partitionBy("s").parquet(f"{d}/t")
        spark.read.parquet(f"{d}/t").groupBy("s").count().orderBy("s").collect()


def _square(n: int) -> int:
    return n * n


def _is_loopback(master: str) -> bool:
    if master.startswith("local"):
        return True
    hosts = [urlparse(u if "://" in u else f"x://{u}").hostname for u in master.split(",")]
    return all(h in _LOOPBACK for h in hosts)


def _code_zip() -> Path:
    """The Ordo packages as one zip for executors (built once per driver process)."""
    root = Path(__file__).resolve().parents[2]  # executor/replay/spark_jobs.py -> the tree
    path = Path(tempfile.gettempdir()) / f"ordo-code-{os.getpid()}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for package in PACKAGES:
            invariant((root / package / "__init__.py").is_file(), f"no package {package} in {root}")
            for f in sorted((root / package).rglob("*.py")):
                z.write(f, f.relative_to(root))
    return path


def parallelism(spark: Any) -> int:
    return int(spark.sparkContext.defaultParallelism)
