#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install Ordo with every
# pinned dependency. Idempotent: re-installs only when pyproject.toml changed.
# The pip cache (~/.cache/pip) keeps the ~450 MB pyspark download across runs.
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
         .venv/bin/python -m pip install -e '.[dev]'; } > .venv/install.log 2>&1; then
    tail -n 40 .venv/install.log >&2
    echo "setup: pip install failed; full log in .venv/install.log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
if ! command -v java >/dev/null 2>&1; then
  echo "warning: java not found; Spark replay needs Java 17 (apt-get install openjdk-17-jre-headless)" >&2
fi
