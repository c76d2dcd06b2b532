"""Smoke benchmark of the traditional baseline (2PL + wait-die + 2PC) on bank transfers.

For each multi-partition share (default 0 and 0.5): start a fresh traditional cluster
on 127.0.0.1 (one process per partition, fdatasync group commit on), open accounts,
submit transfers from several clients (cluster.bank_load), each call sent to the
partition owning its source account, with a bounded number in flight per client; then check that
money is conserved. Prints and writes bench_traditional.json, including the 1-minute load
average before and after (other work shares the machine), to the scratch directory
(scripts/bench_outputs.py), or with ``--publish`` to results/traditional/.

    .venv/bin/python scripts/bench_traditional_smoke.py --partitions 2
    .venv/bin/python scripts/bench_traditional_smoke.py --active-max 64 --in-flight 200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_outputs import BenchParser, wrote  # noqa: E402

from cluster.bank_load import run_transfers  # noqa: E402
from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import free_base_port  # noqa: E402
from cluster.traditional_server import TraditionalCluster  # noqa: E402
from executor.traditional.options import TraditionalOptions  # noqa: E402
from txn_library.client.routing import RoutingClient  # noqa: E402
from txn_library.workloads.bank import make_transfers  # noqa: E402

BALANCE = 1_000_000


def one(a: argparse.Namespace, multi: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ordo-trad-bench-") as tmp:
        cfg = ClusterConfig(
            replicas=1,
            partitions=a.partitions,
            base_port=free_base_port(),
            data_dir=tmp,
            fsync=not a.no_fsync,
        )
        options = TraditionalOptions(
            active_max=a.active_max,
            update_locks=not a.no_update_locks,
            restart_delay_base_us=a.restart_base_us,
            restart_delay_cap_us=a.restart_cap_us,
        )
        load_before = os.getloadavg()[0]
        with TraditionalCluster(cfg, options) as tc:
            with RoutingClient(tc.client_addrs, timeout_s=120) as rc:
                t0 = time.perf_counter()
                for first in range(0, a.accounts, 5_000):
                    n = min(5_000, a.accounts - first)
                    if not rc.call("bank.open", first, n, BALANCE).ok:
                        raise RuntimeError("bank.open failed")
                open_s = time.perf_counter() - t0
            transfers = make_transfers(a.transfers, a.accounts, a.partitions, multi, seed=1)
            # every call sent to its home partition (run_transfers routes several targets)
            run = run_transfers(tc.client_addrs, transfers, a.clients, a.in_flight, 120)
            with RoutingClient(tc.client_addrs) as rc:
                total = rc.call("bank.total", 0, a.accounts, timeout_s=120).value
                st = rc.status()
            tc.check_alive()
        parts = st["partitions"]
    latency_ms = run.percentiles_ms((0.50, 0.99))
    return {
        "mode": "traditional",
        "partitions": a.partitions,
        "transfers": a.transfers,
        "accounts": a.accounts,
        "multi_partition_share": multi,
        "clients": a.clients,
        "in_flight_per_client": a.in_flight,
        "active_max_per_partition": a.active_max,
        "update_locks": not a.no_update_locks,
        "restart_delay_base_us": a.restart_base_us,
        "restart_delay_cap_us": a.restart_cap_us,
        "fsync": not a.no_fsync,
        "elapsed_s": round(run.measured_s, 3),
        "transfers_per_s": round(run.answered / run.measured_s, 1),
        "ok": run.ok,
        "aborted": run.aborted,
        "failed": run.errors,
        "errors": list(run.error_codes)[:5],
        "latency_p50_ms": latency_ms["p50"],
        "latency_p99_ms": latency_ms["p99"],
        "wait_die_deaths": sum(p["deaths"] for p in parts),
        "money_conserved": total == a.accounts * BALANCE,
        "open_accounts_s": round(open_s, 2),
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--transfers", type=int, default=40_000)
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--multi", default="0,0.5", help="comma-separated multi-partition shares")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=1000, help="per client")
    ap.add_argument("--active-max", type=int, default=TraditionalOptions().active_max)
    ap.add_argument("--no-update-locks", action="store_true")
    d = TraditionalOptions()
    ap.add_argument("--restart-base-us", type=int, default=d.restart_delay_base_us)
    ap.add_argument("--restart-cap-us", type=int, default=d.restart_delay_cap_us)
    ap.add_argument("--no-fsync", action="store_true")
    ap.output("--out", "results/traditional/bench_traditional.json", "JSON")
    return ap


def main() -> None:
    a = parser().parse()
    runs = []
    for multi in (float(x) for x in a.multi.split(",")):
        r = one(a, multi)
        print(json.dumps(r, indent=2), flush=True)
        runs.append(r)
    out = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "runs": runs}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    wrote(a.out)


if __name__ == "__main__":
    main()
