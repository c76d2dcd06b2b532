"""Micro-benchmark: bank transfers end to end through a real local cluster.

Starts a sequencer + replicas on 127.0.0.1 with the durable log on (fdatasync per
epoch), opens accounts, submits transfers asynchronously from several clients, and
reports transfers/s and p50/p99 latency. Writes bench_transfers.json to the scratch
directory (scripts/bench_outputs.py), or with ``--publish`` to results/transfers/
(``--out`` names another file).

    .venv/bin/python scripts/bench_transfers.py --replicas 1 --partitions 2
    .venv/bin/python scripts/bench_transfers.py --transfers 200000 --publish \
        --out results/transfers/bench_transfers_1.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_outputs import BenchParser, wrote  # noqa: E402

from cluster.bank_load import run_transfers  # noqa: E402
from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import (  # noqa: E402
    LocalCluster,  # noqa: E402
    free_base_port,
    wait_quiescent,
)
from txn_library.client import Client  # noqa: E402
from txn_library.workloads.bank import make_transfers, open_accounts  # noqa: E402


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--transfers", type=int, default=40_000)
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--multi", type=float, default=0.5, help="multi-partition share")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=1000, help="per client")
    ap.add_argument("--epoch-ms", type=int, default=10)
    ap.add_argument("--no-fsync", action="store_true")
    ap.output("--out", "results/transfers/bench_transfers.json", "JSON")
    return ap


def main() -> None:
    a = parser().parse()
    with tempfile.TemporaryDirectory(prefix="ordo-bench-") as tmp:
        cfg = ClusterConfig(
            replicas=a.replicas,
            partitions=a.partitions,
            base_port=free_base_port(),
            data_dir=tmp,
            epoch_duration_ms=a.epoch_ms,
            fsync=not a.no_fsync,
        )
        with LocalCluster(cfg) as lc:
            with Client(cfg.client_addr) as c:
                open_accounts(c, a.accounts, 1_000_000)
            transfers = make_transfers(a.transfers, a.accounts, a.partitions, a.multi, seed=1)
            run = run_transfers(cfg.client_addr, transfers, a.clients, a.in_flight)
            with Client(cfg.client_addr) as c:
                st = wait_quiescent(c, a.replicas, a.partitions)
            lc.check_alive()
    latency_ms = run.percentiles_ms((0.50, 0.99))
    out = {
        "replicas": a.replicas,
        "partitions": a.partitions,
        "transfers": a.transfers,
        "multi_partition_share": a.multi,
        "clients": a.clients,
        "in_flight_per_client": a.in_flight,
        "epoch_ms": a.epoch_ms,
        "fsync": not a.no_fsync,
        "elapsed_s": round(run.measured_s, 3),
        "transfers_per_s": round(run.answered / run.measured_s, 1),
        "ok": run.ok,
        "aborted": run.aborted,
        "failed": run.errors,
        "latency_p50_ms": latency_ms["p50"],
        "latency_p99_ms": latency_ms["p99"],
        "epochs": st["epoch"],
        "determinism_violations": st["determinism_violations"],
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    wrote(a.out)


if __name__ == "__main__":
    main()
