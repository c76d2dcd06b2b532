"""Replay of a live cluster's log and checkpoints equals its replicas."""

from __future__ import annotations

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from cluster.bank_load import run_transfers
from cluster.launcher import wait_quiescent
from cluster.replay_cli import find_config, replay_spec
from executor.replay.boundaries import scan_checkpoints
from executor.replay.reconstruct import reconstruct
from executor.replay.verdicts import TAIL
from executor.replay.verify import verify_local
from tests.unit.test_replay import ACCOUNTS, START, verdicts
from txn_library.client import Client
from txn_library.workloads.bank import make_transfers, open_accounts


# Against a live cluster ---------------------------------------------------------------------
def test_replay_of_a_live_cluster_matches_its_replicas(make_cluster) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(replicas=2, partitions=2, checkpoint_every_epochs=10, checkpoint_keep=1000)
    cfg = lc.config
    with Client(cfg.client_addr) as c:
        open_accounts(c, ACCOUNTS, START)
    transfers = make_transfers(6_000, ACCOUNTS, 2, multi_share=0.1, seed=11)
    run = run_transfers(cfg.client_addr, transfers, clients=3, in_flight_per_client=40)
    assert run.errors == 0, run.error_codes
    with Client(cfg.client_addr) as c:
        st = wait_quiescent(c, 2, 2)
    lc.stop()
    spec = replay_spec(find_config(cfg.log_dir), cfg.log_dir)
    rows = verify_local(spec, cfg.checkpoint_dir(0))
    assert len(rows) >= 3, "the run should span several checkpoints"
    assert verdicts(rows) == ["ok"] * (len(rows) - 1) + [TAIL]
    assert all(r["replicas_agree"] for r in rows[:-1])
    assert sum(r["txns"] for r in rows) == st["txns_sequenced"]
    rc = reconstruct(spec, scan_checkpoints(cfg.checkpoint_dir(0), 2), st["epoch"])
    for p in st["partitions"]:
        assert f"{rc.partition_hashes[p['partition']]:016x}" == p["state_hash"]
