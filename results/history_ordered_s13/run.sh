#!/usr/bin/env bash
# The standard mix with HISTORY ordered (this tree) and unordered (BASE_TREE, 1174a0b),
# alternating: each `ordo tpcc run --mix standard` on its own embedded cluster
# (W=2, 1 replica x 2 partitions, fsync on), 2 s warm-up + 15 s measured.
#   bash results/history_ordered_s13/run.sh BASE_TREE PAIRS
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
base=$1
pairs=${2:-3}
out=$here/results/history_ordered_s13
for i in $(seq 1 "$pairs"); do
  for side in base head; do
    tree=$here
    [ "$side" = base ] && tree=$base
    # python -c from the tree, not .venv/bin/ordo: the editable install would import
    # this checkout's code for both sides; '' first on sys.path imports the tree's.
    (cd "$tree" && "$here/.venv/bin/python" -c "from cluster.cli import main; main()" \
      tpcc run --mix standard --duration 15 --warmup 2 --quiet --out "$out/$side-$i.json" |
      tail -4)
  done
done
"$here/.venv/bin/python" - "$out" "$pairs" <<'PY'
import json, sys
out, pairs = sys.argv[1], int(sys.argv[2])
for side in ("base", "head"):
    runs = [json.load(open(f"{out}/{side}-{i}.json"))["summary"] for i in range(1, pairs + 1)]
    tps = [round(r["txn_per_s"]) for r in runs]
    pay = [r["per_type"]["payment"]["latency_ms"]["p50"] for r in runs]
    print(f"{side}: committed txn/s {tps}; payment p50 ms {pay}")
PY
