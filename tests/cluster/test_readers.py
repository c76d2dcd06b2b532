"""Readers on a live cluster (issue 46): a process that follows the log holding every
partition, re-executing the batches, and answers snapshot queries; real processes on
127.0.0.1.

One cluster of 1 replica x 2 partitions and one reader, 200 bank accounts, checkpoints
every 50 epochs (so the replica reports state hashes at boundaries while it is busy),
serves the checks in order:

- under transfers (most across partitions) the reader's per-partition state hashes
  equal the replica's at a checkpoint boundary both applied, and at the epoch the
  cluster rests at afterwards; the reader checked the replica's hashes itself and
  found no violation; ``ordo status`` shows the reader's applied epoch and lag;
- ``bank.total`` snapshots the reader answers (pinned to it, and by default: the client
  sends queries to readers) always equal the money opened and name their epoch, and
  the reader's balances at an epoch equal, row for row, the database replayed from
  the log to that epoch (``executor.replay.reconstruct``);
- kill -9 of the reader under transfers and queries: queries not pinned to it are
  answered by the replica meanwhile (never wrong), the restarted reader replays the
  log from genesis (``--from-genesis``) or from the replica's newest checkpoint,
  catches up, and its hashes agree with the replica's again;
- read-your-writes: a call, then a query naming its epoch, answered by the reader
  always shows the write;
- a client given one sequencer's address (``Client(addr)``, ``ordo query --host``) learns
  the reader from it and queries it;
- under ``ordo up --ha``'s layout (ZooKeeper, 3 sequencers, CURVE) a reader follows,
  answers the admin client (from one sequencer's address too) and agrees with the
  replica.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from cluster.cli import main as cli_main
from cluster.commands.run import ha_layout
from cluster.config import ClusterConfig
from cluster.launcher import (
    LocalCluster,
    cluster_client,
    free_base_port,
    leader_status,
    reader_report,
    wait_quiescent,
)
from cluster.replay_cli import find_config, replay_spec
from executor.replay.boundaries import scan_checkpoints
from executor.replay.reconstruct import reconstruct
from tests.cluster.test_queries import ACCOUNTS, Transfers, wait_for
from txn_library.client import Client
from txn_library.workloads.bank import open_accounts

START = 10_000
TOTAL = ACCOUNTS * START
PARTITIONS = 2


@pytest.fixture(scope="module")
def bank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cfg = ClusterConfig(
        replicas=1,
        partitions=PARTITIONS,
        readers=1,
        # The replicas keep versions here (readers alone would drop them: ClusterConfig.
        # replica_versions), so a snapshot the reader cannot give falls back to them.
        query_versions=True,
        checkpoint_every_epochs=50,
        base_port=free_base_port(),
        data_dir=str(tmp_path_factory.mktemp("readers") / "data"),
    )
    lc = LocalCluster(cfg)
    try:
        lc.start()
        with cluster_client(cfg) as c:
            open_accounts(c, ACCOUNTS, START)
        yield lc
    finally:
        lc.stop()


def report(cfg: ClusterConfig, epochs: tuple = ()) -> dict:
    rep = reader_report(cfg, 0, epochs, timeout_s=5.0)
    assert rep is not None, "the reader does not answer its status"
    return rep


def reader_hashes_at(cfg: ClusterConfig, epoch: int) -> list[str]:
    """The reader's per-partition hashes at ``epoch`` (waiting until it applied it)."""
    wait_for(lambda: report(cfg)["applied_epoch"] >= epoch, f"reader at epoch {epoch}")
    [(e, hashes)] = report(cfg, (epoch,))["hashes"]
    assert e == epoch
    return list(hashes)


def replica_boundary(cfg: ClusterConfig) -> tuple[int, list[str]]:
    """A checkpoint boundary every partition of the replica passed, and their hashes
    there (waiting until they report one in common)."""
    out: list[tuple[int, list[str]]] = []

    def common() -> bool:
        st = leader_status(cfg)
        if st is None:
            return False
        parts = sorted(st["partitions"], key=lambda p: p["partition"])
        epochs = {p["boundary_epoch"] for p in parts}
        if len(parts) != PARTITIONS or len(epochs) != 1 or 0 in epochs:
            return False
        out.append((epochs.pop(), [p["boundary_hash"] for p in parts]))
        return True

    wait_for(common, "a checkpoint boundary common to the replica's partitions")
    return out[-1]


def test_the_readers_hashes_equal_the_replicas_and_status_shows_it(bank: LocalCluster) -> None:
    cfg = bank.config
    with Transfers(cfg, seed=11) as load:
        load.wait_answered(1_500)
        epoch, hashes = replica_boundary(cfg)
        assert reader_hashes_at(cfg, epoch) == hashes, f"at the boundary of epoch {epoch}"
        load.stop()
    with cluster_client(cfg) as c:
        st = wait_quiescent(c, 1, PARTITIONS)
    rest = st["epoch"]
    replica = [p["state_hash"] for p in sorted(st["partitions"], key=lambda p: p["partition"])]
    assert reader_hashes_at(cfg, rest) == replica
    rep = report(cfg)
    assert rep["live"] and rep["applied_epoch"] == rest and rep["lag_epochs"] == 0
    assert list(rep["state_hashes"]) == replica
    wait_for(lambda: report(cfg)["hashes_checked"] > 0, "the reader checked the replica")
    assert report(cfg)["determinism_violations"] == 0
    out = CliRunner().invoke(cli_main, ["status", "--json", "--data-dir", cfg.data_dir])
    assert out.exit_code == 0, out.output
    [row] = json.loads(out.stdout)["readers"]
    assert row["applied_epoch"] == rest and row["lag_epochs"] == 0 and row["live"]
    out = CliRunner().invoke(cli_main, ["status", "--data-dir", cfg.data_dir])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["reader", "applied_epoch"])
    assert lines[header + 1].split()[:3] == ["0", str(rest), "0"], lines[header + 1]


def test_reader_snapshots_equal_the_money_and_the_log_replayed_to_their_epoch(
    bank: LocalCluster,
) -> None:
    cfg = bank.config
    taken: dict[int, dict[int, int]] = {}
    with Transfers(cfg, seed=12) as load, cluster_client(cfg, timeout_s=30) as c:
        load.wait_answered(load.answered + 300)
        served = report(cfg)["queries_served"]
        epochs = []
        for _ in range(10):
            futs = [c.submit_query("bank.total", 0, ACCOUNTS, reader=0) for _ in range(10)]
            futs += [c.submit_query("bank.total", 0, ACCOUNTS) for _ in range(10)]  # default
            for f in futs:
                a = f.result(timeout=30)
                assert a.ok and a.value == TOTAL and a.epoch is not None, a
                epochs.append(a.epoch)
        # Every one of them was the reader's (the client sends queries to readers).
        assert report(cfg)["queries_served"] >= served + len(epochs)
        assert max(epochs) > min(epochs), "the reader's snapshots did not follow the transfers"
        for _ in range(3):
            load.wait_answered(load.answered + 200)
            e = c.query("bank.total", 0, ACCOUNTS, reader=0).epoch
            assert e is not None and e not in taken
            futs = {a: c.submit_query("bank.balance", a, at_epoch=e, reader=0) for a in range(210)}
            balances = {}
            for a, f in futs.items():
                ans = f.result(timeout=30)
                assert ans.ok and ans.epoch == e, (a, ans)
                if ans.value is not None:
                    balances[a] = ans.value
            taken[e] = balances
        load.stop()
    spec = replay_spec(find_config(cfg.log_dir), cfg.log_dir)
    ckpt = cfg.checkpoint_dir(0)
    boundaries = scan_checkpoints(ckpt, cfg.partitions) if Path(ckpt).is_dir() else []
    for e, balances in sorted(taken.items()):
        rc = reconstruct(spec, boundaries, e)
        rows: dict[tuple, tuple] = {}
        for part in rc.replica.parts:
            rows.update(part.storage.whole_tables().get("account", {}))
        assert balances == {k[0]: r[0] for k, r in rows.items()}, f"epoch {e}"
        assert sum(balances.values()) == TOTAL


def test_a_client_always_reads_its_own_writes_from_the_reader(bank: LocalCluster) -> None:
    """call -> query(read_your_writes=True), repeated under transfers: the reader
    answers once it has applied the call's epoch, so the answer always shows the
    write and names an epoch at or after the call's (pinned to the reader, and sent
    to it by default)."""
    cfg = bank.config
    served = report(cfg)["queries_served"]
    with Transfers(cfg, seed=15) as load, cluster_client(cfg, timeout_s=30) as c:
        load.wait_answered(load.answered + 100)
        last = 0
        for i in range(100):
            r = c.call("kv.put", "read-your-writes", i)
            assert r.ok and r.epoch >= max(last, 1) and r.epoch == c.last_epoch, (r, last)
            last = r.epoch
            pinned = {"reader": 0} if i % 2 else {}
            a = c.query("kv.get", "read-your-writes", read_your_writes=True, **pinned)
            assert a.ok and a.value == i and a.epoch is not None and a.epoch >= r.epoch, (i, r, a)
        load.stop()
    assert report(cfg)["queries_served"] >= served + 100  # the reader answered them


def test_one_sequencer_address_is_enough_to_query_the_reader(
    bank: LocalCluster, tmp_path: Path
) -> None:
    """``Client(address)`` and ``ordo query --host`` without the cluster directory: the
    sequencer names the reader and the partitions (cluster.info), and queries go to
    the reader."""
    cfg = bank.config
    served = report(cfg)["queries_served"]
    with Client(cfg.client_addr, timeout_s=30) as c:
        for _ in range(5):
            a = c.query("bank.total", 0, ACCOUNTS)
            assert a.ok and a.value == TOTAL and a.epoch is not None, a
        pinned = c.query("bank.total", 0, ACCOUNTS, replica=0)  # the replica's partitions
        assert pinned.ok and pinned.value == TOTAL, pinned
    assert report(cfg)["queries_served"] >= served + 5
    host = cfg.client_addr.removeprefix("tcp://")
    nowhere = str(tmp_path / "no-cluster-here")
    out = CliRunner().invoke(
        cli_main, ["query", "bank.total", "0", str(ACCOUNTS), "--host", host, "--data-dir", nowhere]
    )
    assert out.exit_code == 0, out.output
    answer = json.loads(out.stdout)
    assert answer["status"] == "ok" and answer["value"] == TOTAL and answer["epoch"] >= 1


@pytest.mark.parametrize("from_genesis", [True, False], ids=["from-genesis", "from-checkpoint"])
def test_a_reader_killed_under_load_restarts_catches_up_and_agrees_again(
    bank: LocalCluster, from_genesis: bool
) -> None:
    cfg = bank.config
    with Transfers(cfg, seed=13) as load, cluster_client(cfg, timeout_s=30, retry_s=0.2) as c:
        load.wait_answered(load.answered + 500)
        old_pid = report(cfg)["pid"]
        bank.kill("reader-0")  # SIGKILL
        killed_at = c.status()["epoch"]
        bank.start_reader(0, from_genesis=from_genesis)
        answered = 0
        deadline = time.monotonic() + 120
        while True:
            # Not pinned: answered by the replica while the reader is down or catching up.
            for f in [c.submit_query("bank.total", 0, ACCOUNTS) for _ in range(5)]:
                a = f.result(timeout=40)
                assert a.ok and a.value == TOTAL, a
                answered += 1
            rep = reader_report(cfg, 0, timeout_s=1.0)
            if rep is not None and rep["live"] and rep["applied_epoch"] >= killed_at:
                break
            assert time.monotonic() < deadline, f"the reader did not catch up: {rep}"
        assert rep["pid"] != old_pid, rep
        if from_genesis:
            assert rep["started_epoch"] == 0, rep  # the whole log replayed
        else:  # the replica's newest checkpoint (every 50 epochs)
            assert rep["started_epoch"] > 0, rep
        for _ in range(20):
            a = c.query("bank.total", 0, ACCOUNTS, reader=0)
            assert a.ok and a.value == TOTAL and a.epoch is not None, a
        epoch, hashes = replica_boundary(cfg)
        load.stop()
    assert reader_hashes_at(cfg, epoch) == hashes
    with cluster_client(cfg) as c:
        st = wait_quiescent(c, 1, PARTITIONS)
    replica = [p["state_hash"] for p in sorted(st["partitions"], key=lambda p: p["partition"])]
    assert reader_hashes_at(cfg, st["epoch"]) == replica
    assert report(cfg)["determinism_violations"] == 0


def test_a_reader_under_the_replicated_ordering_layer_with_curve(tmp_path: Path) -> None:
    """``ordo up --ha``'s layout (ZooKeeper, 3 sequencers, CURVE, loopback hosts) with a
    reader: it authenticates to the sequencers, answers the admin client's queries,
    and agrees with the replica."""
    cfg = ha_layout(
        ClusterConfig(
            replicas=1,
            partitions=PARTITIONS,
            readers=1,
            base_port=free_base_port(),
            data_dir=str(tmp_path / "data"),
        )
    )
    assert cfg.curve and cfg.replicated and cfg.reader_hosts == ("h1",)
    with LocalCluster(cfg) as lc:
        with cluster_client(lc.config, timeout_s=30) as c:
            open_accounts(c, ACCOUNTS, START)
            with Transfers(cfg, seed=14) as load:
                load.wait_answered(300)
                for _ in range(20):
                    a = c.query("bank.total", 0, ACCOUNTS, reader=0)
                    assert a.ok and a.value == TOTAL and a.epoch is not None, a
                # Any sequencer, a follower too, names the reader and its key.
                for address in cfg.client_addrs:
                    with Client(address, curve=c.curves[address], timeout_s=30) as one:
                        a = one.query("bank.total", 0, ACCOUNTS, reader=0)
                        assert a.ok and a.value == TOTAL, (address, a)
                load.stop()
            st = wait_quiescent(c, 1, PARTITIONS)
        replica = [p["state_hash"] for p in sorted(st["partitions"], key=lambda p: p["partition"])]
        assert reader_hashes_at(cfg, st["epoch"]) == replica
        wait_for(lambda: report(cfg)["hashes_checked"] > 0, "the reader checked the replica")
        assert report(cfg)["determinism_violations"] == 0
