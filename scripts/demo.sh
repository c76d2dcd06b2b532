#!/usr/bin/env bash
# The main job on the embedded default: set up, start a local cluster (sequencer +
# 2 replicas x 2 partitions on 127.0.0.1), open 1,000 accounts, run a burst of
# transfers (half multi-partition), print throughput and `ordo status`, and leave the
# cluster running in the foreground until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
