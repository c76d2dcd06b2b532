"""`ordo dump`'s export, before (a tree at fc87471: rows one at a time, partitions one
after another) and after (this tree: column by column, partitions side by side),
alternating, on the genesis checkpoints of a W=2 TPC-C cluster's two partitions
(~0.69M rows each, ITEM written once).

    .venv/bin/python results/dump_s13/run.py BASE_TREE CKPT_DIR PAIRS
"""

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE, CKPT, PAIRS = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

MAKE = """
import sys
from pathlib import Path
import tpcc.schema
from executor.core import checkpoint
from executor.core.storage import Storage
from tpcc.loader import genesis
for p in range(2):
    s = Storage()
    s.load(genesis(p, 2, 2, 7, 1_700_000_000_000))
    checkpoint.write_checkpoint(Path(sys.argv[1]), s, replica=0, partition=p, partitions=2,
                                epoch=5, next_txn_id=1, txns_applied=0)
"""
OLD = """
import shutil, sys
from pathlib import Path
import tpcc.schema
from executor.core import checkpoint as ckpt
from executor.replay.export import export_rows
out = Path(sys.argv[2]); shutil.rmtree(out, ignore_errors=True)
for p in range(2):
    export_rows(ckpt.iter_rows(Path(sys.argv[1]) / f"000000000005-p{p}.ckpt"), out, p, "csv")
"""
NEW = """
import shutil, sys
from pathlib import Path
from executor.replay.export import export_checkpoints
out = Path(sys.argv[2]); shutil.rmtree(out, ignore_errors=True)
paths = [Path(sys.argv[1]) / f"000000000005-p{p}.ckpt" for p in range(2)]
export_checkpoints(paths, out, "csv", ["tpcc.procedures"])
"""


def timed(tree: Path, code: str, out: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(CKPT), out], cwd=tree, check=True)
    return time.perf_counter() - t


if not list(CKPT.glob("*-p1.ckpt")):
    subprocess.run([sys.executable, "-c", MAKE, str(CKPT)], cwd=ROOT, check=True)
runs: dict[str, list[float]] = {"before": [], "after": []}
for _ in range(PAIRS):
    runs["before"].append(timed(BASE, OLD, "/tmp/dump_s13_old"))
    runs["after"].append(timed(ROOT, NEW, "/tmp/dump_s13_new"))
    print({k: round(v[-1], 2) for k, v in runs.items()}, flush=True)
same = subprocess.run(["diff", "-r", "/tmp/dump_s13_old", "/tmp/dump_s13_new"]).returncode == 0
result = {"seconds": runs, "same_files": same}
(Path(__file__).parent / "dump.json").write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result))
