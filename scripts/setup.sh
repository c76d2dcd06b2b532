#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install Ordo with every
# pinned dependency, and Debian's zookeeper and prometheus packages when missing.
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
# ZooKeeper and Prometheus (Debian's packages): the cluster tests start real ZooKeeper
# ensembles from its jars (cluster/zookeeper.py) and a real Prometheus server against a
# live cluster (tests/cluster/test_metrics_cluster.py; promtool checks
# docs/ordo-alerts.yml). Installed once; later runs find them and do nothing.
debs=()
[ -e /usr/share/java/zookeeper.jar ] || debs+=(zookeeper)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || debs+=(prometheus)
if [ ${#debs[@]} -gt 0 ]; then
  deb_hint="run as root: apt-get update && apt-get install -y --no-install-recommends ${debs[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "setup: ${debs[*]} missing and the cluster tests need it; $deb_hint" >&2
    exit 1
  fi
  echo "setup: installing Debian's ${debs[*]} package(s) (log: .venv/debian-install.log)"
  if ! { apt-get update &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${debs[@]}"
       } > .venv/debian-install.log 2>&1; then
    tail -n 20 .venv/debian-install.log >&2
    echo "setup: apt-get failed (log: .venv/debian-install.log) and the cluster tests need ${debs[*]}; $deb_hint" >&2
    exit 1
  fi
  # Debian's package starts a system-wide Prometheus (port 9090) where systemd runs; the
  # tests start their own, so the one just installed is stopped and left disabled.
  if [[ " ${debs[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
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
