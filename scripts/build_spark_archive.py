"""Build the Spark driver JVM's class-data-sharing archive (called by scripts/setup.sh).

    .venv/bin/python scripts/build_spark_archive.py          # build it if missing
    .venv/bin/python scripts/build_spark_archive.py --force  # build it again

Runs one small Spark session whose JVM dumps the classes it loaded when it exits
(executor.replay.spark_session.build_driver_archive, ~20 s), into the venv
(``driver_archive()``: one per pyspark release; built again when the JVM binary is
newer than it). Every later session's driver JVM maps
them instead of loading them from Spark's jars: `ordo replay` starts ~3 s sooner. A
session without the archive works the same, only slower; this script exits non-zero
when it could not build one, and set-up then only warns.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from executor.replay.spark_session import build_driver_archive, driver_archive  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="build even if the archive exists")
    a = ap.parse_args()
    path = driver_archive()
    java = shutil.which("java")
    if java is None:
        print("build_spark_archive: no java on PATH (Spark needs Java 17)", file=sys.stderr)
        return 1
    jvm_mtime = Path(java).resolve().stat().st_mtime
    if path.is_file() and path.stat().st_mtime > jvm_mtime and not a.force:
        print(f"build_spark_archive: {path} exists")
        return 0
    t0 = time.perf_counter()
    try:
        build_driver_archive(path)
    except Exception as e:  # any failure only costs speed: say so and let set-up go on
        print(f"build_spark_archive: no archive ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    size_mb = path.stat().st_size / 2**20
    print(f"build_spark_archive: {path} ({size_mb:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
