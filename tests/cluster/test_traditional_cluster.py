"""The 2PL+2PC baseline through real processes: money is conserved, a crash in prepare heals."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from cluster.config import ClusterConfig
from cluster.launcher import free_base_port
from cluster.traditional_server import TraditionalCluster
from executor.traditional.options import FAULT_CRASH, TraditionalOptions
from tests.sim.test_traditional import ACCOUNTS, START, on_partition
from txn_library.client.routing import RoutingClient
from txn_library.errors import ERR_UNAVAILABLE, CallFailed
from txn_library.workloads.bank import make_transfers


def submit_all(rc: RoutingClient, transfers: list[tuple[int, int, int]], threads: int) -> list:
    """Submit transfers from several threads, bounded in flight; return the Results."""
    results: list = []
    lock = threading.Lock()

    def worker(shard: list[tuple[int, int, int]]) -> None:
        sem = threading.BoundedSemaphore(200)
        futs = []
        for t in shard:
            sem.acquire()
            f = rc.submit("bank.transfer", *t)
            f.add_done_callback(lambda _f: sem.release())
            futs.append(f)
        out = [f.result(timeout=60) for f in futs]
        with lock:
            results.extend(out)

    ts = [threading.Thread(target=worker, args=(transfers[i::threads],)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results


def real_config(tmp_path: Any) -> ClusterConfig:
    port = free_base_port()
    return ClusterConfig(replicas=1, partitions=2, base_port=port, data_dir=str(tmp_path))


def test_transfers_through_real_processes_conserve_money(tmp_path) -> None:  # type: ignore[no-untyped-def]
    accounts, start = 1_000, 10_000
    cfg = real_config(tmp_path)
    with TraditionalCluster(cfg) as tc, RoutingClient(tc.client_addrs, timeout_s=60) as rc:
        assert rc.call("bank.open", 0, accounts, start).value == accounts
        transfers = make_transfers(3_000, accounts, 2, multi_share=0.5, seed=11)
        results = submit_all(rc, transfers, threads=4)
        assert len(results) == 3_000
        assert all(r.ok or r.aborted for r in results)
        assert rc.call("bank.total", 0, accounts).value == accounts * start
        own = [  # each partition's own row (peers' rows are gossip, possibly stale)
            next(r for r in c.status()["partitions"] if r["partition"] == p)
            for p, c in enumerate(rc.clients)
        ]
        tc.check_alive()
    assert sum(r["failed"] for r in own) == 0
    assert all(r["blocked"] == 0 and r["lock_waits"] >= 0 for r in own)  # gauges reported
    # Every call was coordinated somewhere and finished: 3,000 transfers, open, total.
    assert sum(r["txns_applied"] + r["aborted"] for r in own) == 3_002


def test_real_participant_crash_during_prepare(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Partition 1's process exits on its first PREPARE; the coordinator times out and
    aborts; p1 restarts from its log and everything adds up."""
    cfg = real_config(tmp_path)
    crash = TraditionalOptions(fault_prepare=FAULT_CRASH, fault_partition=1, prepare_timeout_ms=300)
    (a,), (b,) = on_partition(0, 2), on_partition(1, 2)
    with TraditionalCluster(cfg, crash) as tc, RoutingClient(tc.client_addrs, timeout_s=20) as rc:
        for acct in range(ACCOUNTS):  # single-partition opens: no prepare yet
            assert rc.call("bank.open", acct, 1, START).ok
        with pytest.raises(CallFailed) as failed:
            rc.call("bank.transfer", a, b, 100)  # coordinated at p0
        assert failed.value.code == ERR_UNAVAILABLE
        assert tc.wait_exit("p1", timeout_s=10) == 70
        replace(crash, fault_prepare=None).save(cfg.data_dir)
        tc.start_partition(1)
        tc.wait_ready()
        for _ in range(50):
            assert rc.call("bank.transfer", a, b, 5).ok
        assert rc.call("bank.total", 0, ACCOUNTS).value == ACCOUNTS * START
        assert rc.call("bank.balance", b).value == START + 250
        tc.check_alive()
