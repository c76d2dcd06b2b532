"""A transfer load that keeps a client-side ledger: what every call's client saw.

Crash and failover tests drive a cluster with it and then hold the cluster to the
ledger: every call the ledger records as answered must be in the committed log
exactly once, and nothing may be in the log twice. It runs in the test process or,
for clusters on network-namespace hosts, as ``python -m cluster.ledger`` inside a
client host, writing the ledger as JSON.

Invariants: each client keeps at most ``in_flight`` calls outstanding; a call is
recorded as acknowledged only with the status its future resolved to; a call whose
future failed (timeout, error) is recorded as failed with its reason, never dropped.
Client failover (txn_library.client) is the client's own: the load only waits.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import txn_library.workloads.builtin  # noqa: F401  (registers the bank procedures)
from cluster.config import ClusterConfig
from cluster.launcher import cluster_client
from txn_library.errors import OrdoError
from txn_library.workloads.bank import make_transfers, open_accounts


@dataclass
class Ledger:
    """(client_id, req_id) -> (transfer, status) for answered calls; failures by text."""

    acked: dict[tuple[bytes, int], tuple] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_json(self) -> str:
        return json.dumps(
            {
                "acked": [[k[0].hex(), k[1], list(t), s] for k, (t, s) in self.acked.items()],
                "failed": self.failed,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        d = json.loads(text)
        ledger = cls(failed=list(d["failed"]))
        for cid, req, t, s in d["acked"]:
            ledger.acked[(bytes.fromhex(cid), req)] = (tuple(t), s)
        return ledger


def drive_transfers(
    cfg: ClusterConfig,
    transfers: list[tuple[int, int, int]],
    clients: int,
    ledger: Ledger,
    in_flight: int = 20,
    timeout_s: float = 60.0,
) -> None:
    """Closed loop: ``clients`` failover clients (every sequencer's address), each with
    up to ``in_flight`` transfers out, over their share of ``transfers``."""
    share = [transfers[i::clients] for i in range(clients)]

    def one(items: list) -> None:
        with cluster_client(cfg, timeout_s=timeout_s, retry_s=2.0) as c:
            out: list[tuple[int, tuple, Future]] = []

            def settle() -> None:
                req_id, t, fut = out.pop(0)
                try:
                    r = fut.result()
                except OrdoError as e:
                    with ledger.lock:
                        ledger.failed.append(f"{t}: {type(e).__name__}: {e}")
                    return
                with ledger.lock:
                    ledger.acked[(c.proto.client_id, req_id)] = (t, r.status)

            for t in items:
                req_id, fut = c.submit_with_id("bank.transfer", *t)
                out.append((req_id, t, fut))
                if len(out) >= in_flight:
                    settle()
            while out:
                settle()

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in share]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def main(argv: list[str] | None = None) -> int:
    """Open accounts (``--open``) and/or run transfers, writing the ledger to ``--out``."""
    ap = argparse.ArgumentParser(prog="python -m cluster.ledger")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--accounts", type=int, default=400)
    ap.add_argument("--balance", type=int, default=10_000)
    ap.add_argument("--open", action="store_true", help="open the accounts first")
    ap.add_argument("--transfers", type=int, default=0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cfg = ClusterConfig.load(args.data_dir)
    if args.open:
        with cluster_client(cfg, timeout_s=60) as c:
            open_accounts(c, args.accounts, args.balance)
    ledger = Ledger()
    if args.transfers:
        transfers = make_transfers(
            args.transfers, args.accounts, cfg.partitions, multi_share=0.5, seed=args.seed
        )
        drive_transfers(cfg, transfers, args.clients, ledger)
    if args.out:
        Path(args.out).write_text(ledger.to_json())
    print(f"acked {len(ledger.acked)} failed {len(ledger.failed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
