"""High availability on one machine: 3 ZooKeeper servers, 3 sequencers on loopback
addresses 127.0.0.1-3, 2 replicas x 2 partitions, under a load of transfers with a
client-side ledger.

Each scenario ends with the same checks: every call the ledger saw acknowledged is in
the committed log exactly once, no (client, request) is in the log twice, money is
conserved, replicas' hashes agree per partition and equal a serial replay of the log,
and every sequencer's local log holds the same batches.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.commands.run import ha_layout
from cluster.config import ClusterConfig
from cluster.launcher import (
    LocalCluster,
    cluster_client,
    free_base_port,
    leader_status,
    sequencer_statuses,
)
from cluster.ledger import Ledger, drive_transfers
from sequencer.log import iter_frames
from tests.ha_checks import check_outcome
from txn_library.client import Client
from txn_library.errors import OrdoError
from txn_library.workloads.bank import make_transfers, open_accounts

ACCOUNTS = 400
START = 10_000
REPLICAS, PARTITIONS = 2, 2


@pytest.fixture
def ha_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cfg = ha_layout(
        ClusterConfig(
            replicas=REPLICAS,
            partitions=PARTITIONS,
            base_port=free_base_port(),
            data_dir=str(tmp_path / "data"),
        )
    )
    lc = LocalCluster(cfg)
    try:
        lc.start()
        yield lc
    finally:
        lc.stop()


def leader_name(lc: LocalCluster) -> tuple[str, dict]:
    st = wait_for_leader(lc)
    return LocalCluster.sequencer_name(lc.config, st["member"]), st


def wait_for_leader(lc: LocalCluster, not_member: int | None = None, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = leader_status(lc.config, timeout_s=1.0)
        if st is not None and st["member"] != not_member:
            return st
        time.sleep(0.02)
    raise TimeoutError("no leader elected")


def wait_settled(lc: LocalCluster, timeout_s: float = 60) -> dict:
    """Leader and every partition at the same epoch, idle, hashes stable."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = leader_status(lc.config, timeout_s=1.0)
        if st is not None:
            parts = st["partitions"]
            if (
                len(parts) == REPLICAS * PARTITIONS
                and st["pending"] == 0
                and all(
                    p["last_epoch"] == st["epoch"] and p["active"] == 0 and not p["down"]
                    for p in parts
                )
            ):
                return st
        time.sleep(0.1)
    raise TimeoutError(f"cluster did not settle: {st}")


def run_with_fault(lc: LocalCluster, fault, n: int = 6_000) -> tuple[Ledger, dict]:  # type: ignore[no-untyped-def]
    with cluster_client(lc.config) as c:
        open_accounts(c, ACCOUNTS, START)
    transfers = make_transfers(n, ACCOUNTS, PARTITIONS, multi_share=0.5, seed=7)
    ledger = Ledger()
    load = threading.Thread(target=drive_transfers, args=(lc.config, transfers, 4, ledger))
    load.start()
    time.sleep(1.0)  # under load
    info = fault(lc)
    load.join(timeout=240)
    assert not load.is_alive(), "the load did not finish"
    st = wait_settled(lc)
    check_outcome(lc.config, ledger, st, n)
    with cluster_client(lc.config) as c:
        assert c.call("bank.total", 0, ACCOUNTS).value == ACCOUNTS * START
    return ledger, info


def test_leader_kill9_fails_over_without_loss(ha_cluster: LocalCluster) -> None:
    """... and a procedure deployed through the log (txn_library.deployed) before the
    kill is known to the new leader, which installs it from its copy of the log."""
    from tests.deploy_modules import bump_module
    from txn_library.deployed import DEPLOY

    def kill_leader(lc: LocalCluster) -> dict:
        with cluster_client(lc.config, timeout_s=30.0) as c:
            deployed = c.call(DEPLOY, "bump", bump_module(1), [])
            assert deployed.ok, deployed
        name, st = leader_name(lc)
        lc.kill(name)
        killed_at = time.monotonic()
        new = wait_for_leader(lc, not_member=st["member"])
        assert new["term"] > st["term"]
        # the killed sequencer comes back as a follower and copies what it missed
        lc.start_sequencer(st["member"])
        with cluster_client(lc.config, timeout_s=30.0) as c:
            assert list(c.call("demo.bump", "after-failover").value) == ["v1", 1]
        return {"failover_s": time.monotonic() - killed_at}

    _ledger, info = run_with_fault(ha_cluster, kill_leader)
    assert info["failover_s"] < 30


def test_a_killed_leader_is_replaced_by_its_closed_connections_not_its_session(
    ha_cluster: LocalCluster,
) -> None:
    """kill -9 closes the leader's connections: a follower sees its publication's
    connection close and its address refuse a reconnect, removes it from the election,
    and the next member leads without waiting for the dead leader's ZooKeeper session
    to expire (the removal is what the survivors' status counts; the session path
    counts none)."""

    def kill_leader(lc: LocalCluster) -> dict:
        name, st = leader_name(lc)
        lc.kill(name)
        new = wait_for_leader(lc, not_member=st["member"])
        assert new["term"] > st["term"]
        survivors = [s for s in sequencer_statuses(lc.config) if s is not None]
        removed = sum(s.get("dead_leaders_removed", 0) for s in survivors)
        lc.start_sequencer(st["member"])
        return {"removed": removed}

    _ledger, info = run_with_fault(ha_cluster, kill_leader, n=3_000)
    assert info["removed"] == 1


def test_a_live_leader_removed_from_the_election_is_fenced_and_stands_again(
    ha_cluster: LocalCluster,
) -> None:
    """What a wrong removal would do (a leader believed dead that lives): its election
    node deleted under load, the next member claims a term, the old leader's next
    commit is refused, it follows and joins the election again; nothing acknowledged
    is lost or run twice."""
    from kazoo.client import KazooClient

    from cluster.ordering_zk import ZK_USER, secret_path

    cfg = ha_cluster.config

    def remove_leader(lc: LocalCluster) -> dict:
        name, st = leader_name(lc)
        zk = KazooClient(
            hosts=cfg.zookeeper_connect,
            timeout=5,
            auth_data=[("digest", f"{ZK_USER}:{secret_path(cfg).read_text().strip()}")],
        )
        zk.start(timeout=15)
        try:
            election = f"{cfg.zookeeper_root}/election"
            first = sorted(zk.get_children(election), key=lambda c: c[-10:])[0]
            assert int(zk.get(f"{election}/{first}")[0]) == st["member"]
            zk.delete(f"{election}/{first}")
            new = wait_for_leader(lc, not_member=st["member"])
            assert new["term"] > st["term"]
            deadline = time.monotonic() + 30
            while len(zk.get_children(election)) < cfg.sequencers:  # it stands again
                assert time.monotonic() < deadline, zk.get_children(election)
                time.sleep(0.05)
        finally:
            zk.stop()
            zk.close()
        return {"old": st["member"]}

    _ledger, info = run_with_fault(ha_cluster, remove_leader, n=3_000)
    old = sequencer_statuses(cfg)[info["old"]]
    assert old is not None and old["role"] == "follower"


def test_paused_leader_is_fenced_and_rejoins_as_follower(ha_cluster: LocalCluster) -> None:
    """SIGSTOP the leader past its session timeout: the others elect a new term; on
    SIGCONT the old leader's commits are refused (term fencing) and it follows."""

    def pause_leader(lc: LocalCluster) -> dict:
        name, st = leader_name(lc)
        pid = lc.procs[name].pid
        os.kill(pid, signal.SIGSTOP)
        try:
            new = wait_for_leader(lc, not_member=st["member"])
        finally:
            os.kill(pid, signal.SIGCONT)
        assert new["term"] > st["term"]
        return {"old": st["member"]}

    _ledger, info = run_with_fault(ha_cluster, pause_leader)
    st = wait_for_leader(ha_cluster)
    assert st["member"] != info["old"]


def test_ha_layout_status_names_roles_and_terms(ha_cluster: LocalCluster) -> None:
    from click.testing import CliRunner

    from cluster.cli import main

    out = CliRunner().invoke(main, ["status", "--json", "--data-dir", ha_cluster.config.data_dir])
    assert out.exit_code == 0, out.output
    st = json.loads(out.output)
    roles = sorted(s["role"] for s in st["sequencers"])
    assert roles == ["follower", "follower", "leader"]
    assert all(s["pid"] and s["term"] >= 1 for s in st["sequencers"] if s["role"] == "leader")
    assert [z["mode"] for z in st["zookeeper"]].count("leader") == 1
    assert len(st["partitions"]) == REPLICAS * PARTITIONS


def test_a_client_without_admitted_keys_gets_no_service(ha_cluster: LocalCluster) -> None:
    """CURVE on every socket (ha_layout): the admin client is served; a client with no
    keys, or with a key pair not on the allowlist, gets nothing and changes nothing."""
    import zmq

    from txn_library.wire.curve import ClientCurve

    cfg = ha_cluster.config
    assert cfg.curve
    with cluster_client(cfg) as c:
        assert c.call("kv.put", "k", "admitted").ok
    public, secret = zmq.curve_keypair()
    with cluster_client(cfg) as admin:
        admitted = admin.curves
    strangers = [ClientCurve(public, secret, admitted[a].server_public) for a in cfg.client_addrs]
    for kw in ({}, {"curve": strangers}):
        with Client(cfg.client_addrs, timeout_s=2, retry_s=0.5, **kw) as c:  # type: ignore[arg-type]
            with pytest.raises(OrdoError):
                c.call("kv.put", "k", "intruder")
    with cluster_client(cfg) as c:
        assert c.call("kv.get", "k").value == "admitted"


def test_a_wiped_follower_rejoins_from_zookeeper_and_its_peers(ha_cluster: LocalCluster) -> None:
    """kill -9 a follower and delete its disk under load: it comes back empty, copies
    the trimmed part of the log from a peer's log service and the rest from ZooKeeper,
    and ends with the same log as the leader."""
    import shutil

    def wipe_follower(lc: LocalCluster) -> dict:
        st = wait_for_leader(lc)
        member = (st["member"] + 1) % lc.config.sequencers
        lc.kill(LocalCluster.sequencer_name(lc.config, member))
        shutil.rmtree(lc.config.sequencer_log_dir(member).parent)
        time.sleep(1.5)  # the others trim the tail meanwhile (their progress moves on)
        lc.start_sequencer(member)
        return {"member": member}

    _ledger, info = run_with_fault(ha_cluster, wipe_follower)
    cfg = ha_cluster.config
    st = wait_for_leader(ha_cluster)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        wiped = cfg.sequencer_log_dir(info["member"])
        frames = list(iter_frames(wiped)) if Path(wiped).is_dir() else []  # not made yet
        if frames and frames[-1][0] >= st["epoch"]:
            break
        time.sleep(0.1)
    assert frames and frames[-1][0] >= st["epoch"]
    # Both logs are live files, each fdatasynced every sequencer_local_sync_s: compare
    # what both hold.
    leader_frames = list(iter_frames(cfg.sequencer_log_dir(st["member"])))
    n = min(len(frames), len(leader_frames))
    assert n >= st["epoch"] - frames[0][0] and frames[:n] == leader_frames[:n]
    assert frames[0][0] == 1  # the whole log, from a peer where ZooKeeper had trimmed it


def test_zookeeper_nodes_of_the_cluster_refuse_clients_without_its_secret(
    ha_cluster: LocalCluster,
) -> None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    cfg = ha_cluster.config
    zk = KazooClient(hosts=cfg.zookeeper_connect, timeout=5)
    zk.start(timeout=15)
    try:
        for node in ("term", "last", "log"):
            with pytest.raises(NoAuthError):
                zk.get(f"{cfg.zookeeper_root}/{node}")
            with pytest.raises(NoAuthError):
                zk.set(f"{cfg.zookeeper_root}/{node}", b"0")
    finally:
        zk.stop()
        zk.close()


def test_batches_near_the_byte_bound_commit_through_zookeeper(ha_cluster: LocalCluster) -> None:
    """Batches above ZooKeeper's default 1 MiB request limit commit (the servers run
    with jute.maxbuffer = limits.zk_node_bytes_max)."""
    cfg = ha_cluster.config
    value = "x" * 900_000
    sizes = [0]
    with cluster_client(cfg, timeout_s=60) as c:
        # Two calls land in one batch only if both arrive within one epoch: on a loaded
        # host each may get its own, so send rounds until a batch held two of them.
        for r in range(10):
            futs = [c.submit("kv.put", f"big{r}-{i}", value) for i in range(6)]
            assert all(f.result().ok for f in futs)
            assert c.call("kv.get", f"big{r}-5").value == value
            st = wait_for_leader(ha_cluster)
            sizes = [len(d) for _e, d in iter_frames(cfg.sequencer_log_dir(st["member"]))]
            if max(sizes) > 1 << 20:
                break
    assert max(sizes) > 1 << 20, f"no batch held two of the calls in 10 rounds: {sizes}"


def test_ordo_up_ha_supervises_and_restarts_a_killed_process(ha_cluster: LocalCluster) -> None:
    """`ordo up --ha` runs ``run_foreground``: a killed sequencer is started again and
    rejoins (the embedded default would stop the whole cluster instead)."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def supervise() -> None:
        try:
            ha_cluster.run_foreground(stop.is_set, poll_s=0.05)
        except BaseException as e:  # the test fails below with it
            errors.append(e)

    t = threading.Thread(target=supervise, daemon=True)
    t.start()
    try:
        name, st = leader_name(ha_cluster)
        old_pid = ha_cluster.procs[name].pid
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            p = ha_cluster.procs.get(name)
            if p is not None and p.pid != old_pid and p.poll() is None:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"{name} was not started again")
        new = wait_for_leader(ha_cluster, not_member=st["member"])
        assert new["term"] > st["term"]
        with cluster_client(ha_cluster.config) as c:
            assert c.call("kv.put", "k", "after").ok
    finally:
        stop.set()
        t.join(timeout=5)
    assert not errors, errors
