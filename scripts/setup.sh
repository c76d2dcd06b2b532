#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install Ordo with every
# pinned dependency, and Debian's zookeeper package when its jar is missing.
# Then compiles the engine's hot modules with mypyc (scripts/build_native.py; once per
# change of their sources; without a C compiler the engine runs pure Python).
# Idempotent: re-installs the venv only when pyproject.toml changed.
# The pip cache (~/.cache/pip) keeps the ~450 MB pyspark download across runs.
# Packages install without byte-compiling every module (--no-compile: ~20 s of pip's
# ~45 s on a fresh venv, most of it pyspark's and matplotlib's modules no test imports);
# Python writes the bytecode of a module the first time it is imported.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.ordo-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Ordo and its pinned dependencies into .venv (log: .venv/install.log)"
  if ! { .venv/bin/python -m pip install --upgrade pip &&
         .venv/bin/python -m pip install --no-compile -e '.[dev]'; } > .venv/install.log 2>&1; then
    tail -n 40 .venv/install.log >&2
    echo "setup: pip install failed; full log in .venv/install.log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
# ZooKeeper (Debian's package): the cluster tests start real ensembles from its jars
# (cluster/zookeeper.py). Installed once; later runs see the jar and do nothing.
if [ ! -e /usr/share/java/zookeeper.jar ]; then
  zk_hint="run as root: apt-get update && apt-get install -y --no-install-recommends zookeeper"
  if [ "$(id -u)" != 0 ]; then
    echo "setup: ZooKeeper is missing and the cluster tests need it; $zk_hint" >&2
    exit 1
  fi
  echo "setup: installing Debian's zookeeper package (log: .venv/zookeeper-install.log)"
  if ! { apt-get update &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends zookeeper
       } > .venv/zookeeper-install.log 2>&1; then
    tail -n 20 .venv/zookeeper-install.log >&2
    echo "setup: apt-get failed (log: .venv/zookeeper-install.log) and the cluster tests need ZooKeeper; $zk_hint" >&2
    exit 1
  fi
fi
if ! command -v java >/dev/null 2>&1; then
  echo "warning: java not found; Spark replay needs Java 17 (apt-get install openjdk-17-jre-headless)" >&2
fi
# Three jobs of one process each, side by side: the hot modules compiled
# (txn_library/native.py, ~35 s of CPU, only when a source they depend on changed since
# the last build, and taken in ~1 s from ~/.cache/ordo/native when this machine built
# the same sources before; a failed build leaves pure Python); the Spark driver JVM's
# class-data archive (executor/replay/spark_session.py, ~20 s, once per venv and pyspark
# release; `ordo replay` sessions then start ~3 s sooner); and, on a fresh clone, the
# project type-checked as scripts/test.sh does, so that mypy run finds its cache warm
# (~1 s instead of ~15 s; its verdict is test.sh's to give). mypyc keeps its cache apart
# (build/mypyc-cache): its options differ from mypy's, so neither tool's run rewrites
# the other's entries.
build_native() {
  if ! MYPY_CACHE_DIR="$PWD/build/mypyc-cache" .venv/bin/python scripts/build_native.py \
    > .venv/native-build.log 2>&1; then
    tail -n 20 .venv/native-build.log >&2
    echo "warning: compiling the hot modules failed (log: .venv/native-build.log); the engine runs pure Python" >&2
  fi
}
build_spark_archive() {
  if command -v java >/dev/null 2>&1 &&
     ! .venv/bin/python scripts/build_spark_archive.py > .venv/spark-archive.log 2>&1; then
    tail -n 20 .venv/spark-archive.log >&2
    echo "warning: building Spark's class-data archive failed (log: .venv/spark-archive.log); replay sessions start slower" >&2
  fi
}
warm_type_cache() {
  if [ ! -d .mypy_cache ]; then
    .venv/bin/mypy > .venv/mypy-warm.log 2>&1 || true
  fi
}
build_spark_archive &
archive=$!
warm_type_cache &
types=$!
build_native
wait "$archive" "$types"
