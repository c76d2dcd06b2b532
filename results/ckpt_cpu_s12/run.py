"""Sample partition r0p0 with py-spy during 30 s of TPC-C New Order (2 replicas x 2
partitions, W=2, 100 terminals), checkpoints every EVERY epochs (0: none); raw
py-spy output (folded stacks) to OUT.

    .venv/bin/python results/ckpt_cpu_s12/run.py 200 results/ckpt_cpu_s12/ck200.txt
    .venv/bin/python results/ckpt_cpu_s12/run.py 0 results/ckpt_cpu_s12/ck0.txt

Compiled (mypyc) functions do not show in the stacks: their time is their caller's.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import free_base_port  # noqa: E402
from tpcc import driver  # noqa: E402

every, out = int(sys.argv[1]), sys.argv[2]
with tempfile.TemporaryDirectory(prefix="ordo-spy-") as tmp:
    cfg = ClusterConfig(
        replicas=2,
        partitions=2,
        base_port=free_base_port(),
        data_dir=tmp,
        procedure_modules=driver.PROCEDURE_MODULES,
        genesis=driver.GENESIS,
        genesis_args={"warehouses": 2, "seed": 1, "load_ts_ms": 1_700_000_000_000},
        checkpoint_every_epochs=every,
        checkpoint_keep=3,
    )
    lc = driver.start_cluster(cfg, progress=False, log=lambda *a: None)
    try:
        pid = lc.procs["r0p0"].pid
        spy = subprocess.Popen(
            [str(ROOT / ".venv/bin/py-spy"), "record", "-r", "200", "-d", "28", "-p", str(pid)]
            + ["-f", "raw", "-o", out, "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        opts = driver.RunOptions(
            mix="new-order",
            duration_s=30,
            warmup_s=0.0,
            terminals=100,
            check=False,
            attach=tmp,
            out=None,
            progress=False,
        )
        result = driver.run(opts)
        spy.wait()
        print(every, result["summary"]["txn_per_s"])
    finally:
        lc.stop()
