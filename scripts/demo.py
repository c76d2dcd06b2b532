"""The embedded default: a local cluster with a bank workload, then foreground.

Starts sequencer + replicas on 127.0.0.1 (default 2 replicas x 2 partitions) in
./ordo-data, opens 1,000 accounts, runs 10,000 transfers (half multi-partition),
prints throughput, money conservation and `ordo status`, then keeps the cluster up
until Ctrl-C (or exits at once with --exit).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.bank_load import run_transfers  # noqa: E402
from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import (  # noqa: E402
    LocalCluster,
    stop_requested_on_signals,
    wait_quiescent,
)
from cluster.ownership import StateInUse, claim_cluster_dir  # noqa: E402
from txn_library.client import Client  # noqa: E402
from txn_library.workloads.bank import make_transfers, open_accounts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--transfers", type=int, default=10_000)
    ap.add_argument("--data-dir", default="ordo-data")
    ap.add_argument("--exit", action="store_true", help="stop after the workload")
    a = ap.parse_args()
    try:  # a fresh directory each run, but never one a live cluster is using
        owner = claim_cluster_dir(a.data_dir, fresh=True)
    except StateInUse as e:
        sys.exit(f"demo: {e}")
    cfg = ClusterConfig(replicas=a.replicas, partitions=a.partitions, data_dir=a.data_dir)
    accounts = 1_000
    with owner, LocalCluster(cfg) as lc:
        print(
            f"cluster up: sequencer {cfg.client_addr}, {a.replicas} replicas x "
            f"{a.partitions} partitions, data in {a.data_dir}"
        )
        with Client(cfg.client_addr) as c:
            open_accounts(c, accounts, 10_000)
        transfers = make_transfers(a.transfers, accounts, a.partitions, 0.5, seed=7)
        run = run_transfers(cfg.client_addr, transfers, clients=4, in_flight_per_client=200)
        latency_ms = run.percentiles_ms((0.5, 0.99), digits=1)
        print(
            f"{run.answered} transfers in {run.measured_s:.2f}s = "
            f"{run.answered / run.measured_s:,.0f}/s; ok {run.ok}, aborted {run.aborted}, "
            f"failed {run.errors}; p50 {latency_ms['p50']} ms, p99 {latency_ms['p99']} ms"
        )
        with Client(cfg.client_addr) as c:
            st = wait_quiescent(c, a.replicas, a.partitions)
            total = c.call("bank.total", 0, accounts).value
        print(
            f"total balance {total} (expected {accounts * 10_000}); "
            f"determinism violations {st['determinism_violations']}"
        )
        for p in st["partitions"]:
            print(
                f"  replica {p['replica']} partition {p['partition']}: epoch "
                f"{p['last_epoch']}, {p['txns_applied']} txns, hash {p['state_hash']}"
            )
        if a.exit:
            return
        print(
            f"cluster stays up; try: .venv/bin/ordo call bank.balance account=1 "
            f"--data-dir {a.data_dir}   (Ctrl-C to stop)"
        )
        lc.run_foreground(stop_requested_on_signals())


if __name__ == "__main__":
    main()
