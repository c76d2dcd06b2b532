"""Queries on a live cluster (issue 41): snapshot and read-committed queries served by
the partitions themselves, with real processes on 127.0.0.1.

One cluster of 2 replicas x 2 partitions with 200 bank accounts serves every check that
can share it (a module fixture); each check that needs transfers runs its own load of
transfers, most of them across partitions, through the project's load generator, and
stops it before it ends. The checks, in the order they share the cluster (the recovery
early, while the log it replays is short):

- while transfers run, every ``snapshot`` bank.total from either replica equals the
  money opened, while ``read_committed`` is seen to differ;
- kill -9 of a partition of replica 1: while it recovers, snapshots pinned to replica 1
  are refused ``not_ready`` (never wrong), unpinned ones are answered by replica 0; once
  live it answers the same snapshots as replica 0;
- a snapshot at epoch E equals, row for row, the database that ``ordo replay state
  --epoch E`` rebuilds (``executor.replay.reconstruct``, its in-process core);
- time travel: an epoch older than the retention is refused naming it; an epoch just
  ahead waits and then answers; one far ahead fails ``not_ready`` after
  ``limits.query_watermark_wait_s``;
- a query takes no lock and sequences nothing (the partitions' and sequencer's counters
  do not move), and transfers beside a flood of queries stay deterministic;
- ``ordo query`` prints the answer and its epoch, and one-line errors;
- one sequencer address is enough (``Client(addr)``, ``ordo query --host``): the
  sequencer names the partitions, under the replicated layout with CURVE too;
- under the replicated ordering layer (ZooKeeper, 3 sequencers, CURVE) a snapshot works
  with the admin client's keys; without them a query gets no answer, and the client
  that sent it keeps working.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import txn_library.workloads.builtin  # noqa: F401  (registers the bank: queries and replay use it)
from cluster.cli import main as cli_main
from cluster.commands.run import ha_layout
from cluster.config import ClusterConfig
from cluster.launcher import (
    LocalCluster,
    cluster_client,
    free_base_port,
    partition_status,
    wait_quiescent,
)
from cluster.load_background import Background
from cluster.load_shapes import Call, ClosedLoop
from cluster.loadgen import LoadGenerator
from cluster.measure import Window
from cluster.replay_cli import find_config, replay_spec
from executor.replay.boundaries import scan_checkpoints
from executor.replay.reconstruct import reconstruct
from tests.cluster_checks import replicas_agree_with_serial_replay
from txn_library import limits, placement
from txn_library.client import Client, QueryAnswer
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_NOT_READY,
    BadRequest,
    CallFailed,
    CallTimeout,
)
from txn_library.workloads.bank import make_transfers, open_accounts

ACCOUNTS = 200
START = 10_000
TOTAL = ACCOUNTS * START
MISSING = 10  # accounts past the last one opened: every read of them is None
REPLICAS, PARTITIONS = 2, 2
READ_COMMITTED_TRIES = 2_000


# Helpers --------------------------------------------------------------------------------
def wait_for(pred: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.02)


class Transfers:
    """Bank transfers (most of them across partitions) from the load generator on a
    thread of its own, until ``stop``; ``answered`` counts the answers so far."""

    def __init__(self, cfg: ClusterConfig, seed: int, multi_share: float = 0.8) -> None:
        transfers = make_transfers(4_000, ACCOUNTS, cfg.partitions, multi_share, seed)
        terminals = 2
        shares = [transfers[t::terminals] for t in range(terminals)]
        sent = [0] * terminals
        self.answered = 0
        self.window: Window | None = None

        def next_transfer(t: int) -> Call:
            share = shares[t]
            args = share[sent[t] % len(share)]
            sent[t] += 1
            return Call("bank.transfer", args, "transfer")

        curve = None
        if cfg.curve:
            from cluster.security import ADMIN_CLIENT, client_curves

            curve = client_curves(cfg, ADMIN_CLIENT)
        self._load = Background(
            lambda source: LoadGenerator(
                cfg.client_addrs,
                source,
                ClosedLoop(terminals=terminals, in_flight_per_terminal=20),
                connections=terminals,
                timeout_s=30.0,
                failover=cfg.replicated,
                curve=curve,
            ),
            next_transfer,
        )

    def _on_answer(self, *_: Any) -> None:
        self.answered += 1

    def __enter__(self) -> Transfers:
        self._load.start(on_answer=self._on_answer)
        return self

    def wait_answered(self, n: int, timeout_s: float = 30.0) -> None:
        wait_for(lambda: self.answered >= n, f"{n} transfers answered", timeout_s)

    def stop(self) -> Window:
        """Stop, drain, and check every transfer was answered ok or aborted."""
        if self.window is None:
            self.window = self._load.stop(timeout_s=60)
            assert self.window.errors == 0, self.window.error_codes
            assert self.window.unanswered == 0
            assert self.window.ok > 0
        return self.window

    def __exit__(self, *exc: object) -> None:
        if self.window is None:
            try:
                self._load.stop(timeout_s=60)
            except Exception:  # noqa: BLE001 - the test's own failure is the one to see
                if exc[0] is None:
                    raise


def snapshot_at(c: Client, epoch: int, replica: int) -> tuple[dict[int, int], int]:
    """Every account's balance (those that exist) and bank.total, both as snapshot
    queries at ``epoch`` answered by ``replica``."""
    futs = {
        a: c.submit_query("bank.balance", a, at_epoch=epoch, replica=replica)
        for a in range(ACCOUNTS + MISSING)
    }
    total = c.query("bank.total", 0, ACCOUNTS + MISSING, at_epoch=epoch, replica=replica)
    assert total.ok and total.epoch == epoch, total
    balances = {}
    for a, f in futs.items():
        ans = f.result(timeout=30)
        assert ans.ok and ans.epoch == epoch, (a, ans)
        if ans.value is not None:
            balances[a] = ans.value
    return balances, total.value


def run_past(lc: LocalCluster, epoch: int) -> int:
    """Run transfers until the cluster's epoch is past ``epoch`` (an idle cluster cuts
    no epochs); the epoch it reached."""
    with cluster_client(lc.config) as c:
        if c.status()["epoch"] <= epoch:
            with Transfers(lc.config, seed=epoch) as load:
                wait_for(lambda: c.status()["epoch"] > epoch, f"epoch {epoch} passed")
                load.stop()
        return int(c.status()["epoch"])


def counters(st: dict) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """Per partition: (txns_applied, lock_waits, txn_waits, blocked)."""
    return {
        (p["replica"], p["partition"]): (
            p["txns_applied"],
            p["lock_waits"],
            p["txn_waits"],
            p["blocked"],
        )
        for p in st["partitions"]
    }


@pytest.fixture(scope="module")
def bank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """2 replicas x 2 partitions with ACCOUNTS accounts of START each, for the module."""
    cfg = ClusterConfig(
        replicas=REPLICAS,
        partitions=PARTITIONS,
        base_port=free_base_port(),
        data_dir=str(tmp_path_factory.mktemp("queries") / "data"),
    )
    lc = LocalCluster(cfg)
    try:
        lc.start()
        with cluster_client(cfg) as c:
            open_accounts(c, ACCOUNTS, START)
        yield lc
    finally:
        lc.stop()


# Isolation ------------------------------------------------------------------------------
def test_snapshot_totals_equal_the_money_under_transfers_and_read_committed_can_differ(
    bank: LocalCluster,
) -> None:
    cfg = bank.config
    epochs: dict[int, list[int]] = {0: [], 1: []}
    with Transfers(cfg, seed=1) as load, cluster_client(cfg, timeout_s=30) as c:
        load.wait_answered(300)
        before = load.answered
        for _ in range(15):
            futs = [
                (r, c.submit_query("bank.total", 0, ACCOUNTS, replica=r))
                for r in (0, 1)
                for _ in range(10)
            ]
            for r, f in futs:
                a = f.result(timeout=30)
                assert a.ok and a.value == TOTAL, (r, a)
                epochs[r].append(a.epoch)
        assert load.answered > before, "no transfer ran while the snapshots were taken"
        differed: list[QueryAnswer] = []
        for i in range(READ_COMMITTED_TRIES):
            a = c.query("bank.total", 0, ACCOUNTS, isolation="read_committed", replica=i % 2)
            assert a.ok and a.epoch is not None, a
            if a.value != TOTAL:
                differed.append(a)
                break
        load.stop()
    for r, es in epochs.items():
        assert max(es) > min(es), f"replica {r}'s snapshots did not follow the transfers"
    assert differed, (
        f"{READ_COMMITTED_TRIES} read_committed totals under cross-partition transfers "
        f"all equalled the invariant"
    )


# Recovery -------------------------------------------------------------------------------
def test_a_recovering_partition_refuses_snapshots_and_the_other_replica_answers(
    bank: LocalCluster,
) -> None:
    cfg = bank.config
    with Transfers(cfg, seed=4) as load, cluster_client(cfg, timeout_s=30, retry_s=0.2) as c:
        load.wait_answered(load.answered + 1_000)  # a log to catch up on
        st = partition_status(c, 1, 0)
        assert st is not None
        old_pid = st["pid"]
        bank.kill("r1p0")  # SIGKILL
        killed_at = c.status()["epoch"]
        bank.start_partition(1, 0)
        refused = pinned_ok = unpinned_ok = 0
        unpinned_failed: list[str] = []
        deadline = time.monotonic() + 60
        while True:
            pinned = c.submit_query("bank.total", 0, ACCOUNTS, replica=1)
            # Unpinned queries go to each replica in turn: two, so one goes to replica 1.
            unpinned = [c.submit_query("bank.total", 0, ACCOUNTS) for _ in range(2)]
            try:
                a = pinned.result(timeout=40)
                assert a.ok and a.value == TOTAL, a
                pinned_ok += 1
            except CallFailed as e:
                assert e.code == ERR_NOT_READY, e
                assert "recovering" in e.message, e
                refused += 1
            for f in unpinned:
                try:
                    b = f.result(timeout=40)
                    assert b.ok and b.value == TOTAL, b
                    unpinned_ok += 1
                except CallFailed as e:  # kept, and the checks below still run
                    unpinned_failed.append(str(e))
            p = partition_status(c, 1, 0)
            if (
                p is not None
                and p["pid"] != old_pid
                and not p["catching_up"]
                and p["last_epoch"] >= killed_at
            ):
                break
            assert time.monotonic() < deadline, f"r1p0 not live again: {p}"
        assert refused > 0, "no snapshot was refused while r1p0 recovered"
        # Live again: replica 1 answers, and its snapshot equals replica 0's at one epoch.
        for _ in range(20):
            a = c.query("bank.total", 0, ACCOUNTS, replica=1)
            assert a.ok and a.value == TOTAL, a
        epoch = c.query("bank.total", 0, ACCOUNTS, replica=1).epoch
        assert epoch is not None
        assert snapshot_at(c, epoch, 1) == snapshot_at(c, epoch, 0)
        load.stop()
    # The client moves a query it did not pin off a replica that answers not_ready.
    assert not unpinned_failed, (
        f"{len(unpinned_failed)} of {len(unpinned_failed) + unpinned_ok} unpinned snapshots "
        f"failed while r1p0 recovered (the other replica was live): {unpinned_failed[0]}"
    )


# Replay --------------------------------------------------------------------------------
def test_a_snapshot_at_an_epoch_equals_the_replayed_database_row_for_row(
    bank: LocalCluster,
) -> None:
    """What ``ordo replay state --epoch E`` rebuilds (reconstruct: the newest checkpoint
    of replica 0 at or before E, else genesis, then the log) against both replicas'
    snapshots at E, taken while transfers ran."""
    cfg = bank.config
    taken: dict[int, list[tuple[dict[int, int], int]]] = {}
    with Transfers(cfg, seed=2) as load, cluster_client(cfg, timeout_s=30) as c:
        for _ in range(4):
            load.wait_answered(load.answered + 300)
            e = c.query("bank.total", 0, ACCOUNTS).epoch
            assert e is not None and e not in taken
            taken[e] = [snapshot_at(c, e, r) for r in (0, 1)]
        load.stop()
    spec = replay_spec(find_config(cfg.log_dir), cfg.log_dir)
    ckpt = cfg.checkpoint_dir(0)
    boundaries = scan_checkpoints(ckpt, cfg.partitions) if Path(ckpt).is_dir() else []
    rebuilt_states = set()
    for e, answers in sorted(taken.items()):
        rc = reconstruct(spec, boundaries, e)
        tables: dict[str, dict[tuple, tuple]] = {}
        for part in rc.replica.parts:
            for name, rows in part.storage.whole_tables().items():
                tables.setdefault(name, {}).update(rows)
        assert {name for name, rows in tables.items() if rows} == {"account"}
        rebuilt = {key[0]: row[0] for key, row in tables["account"].items()}
        assert sorted(rebuilt) == list(range(ACCOUNTS))
        assert sum(rebuilt.values()) == TOTAL
        for replica, (balances, total) in enumerate(answers):
            assert balances == rebuilt, f"replica {replica}'s snapshot at epoch {e}"
            assert total == TOTAL
        rebuilt_states.add(tuple(sorted(rebuilt.items())))
    assert len(rebuilt_states) == len(taken), "the transfers should change state between"


# Time travel ----------------------------------------------------------------------------
def test_time_travel_is_refused_past_the_retention_and_waits_for_a_future_epoch(
    bank: LocalCluster,
) -> None:
    run_past(bank, limits.versions_epochs_max + 20)
    cfg = bank.config
    with Transfers(cfg, seed=3) as load, cluster_client(cfg, timeout_s=30) as c:
        load.wait_answered(load.answered + 100)
        for r in (0, 1):
            with pytest.raises(CallFailed) as old:
                c.query("bank.total", 0, ACCOUNTS, at_epoch=1, replica=r)
            assert old.value.code == ERR_BAD_ARGUMENTS
            assert "epoch 1 is older than the versions kept" in old.value.message
            assert f"versions_epochs_max = {limits.versions_epochs_max}" in old.value.message
        # Within the retention: answered at that epoch.
        now = c.status()["epoch"]
        back = now - limits.versions_epochs_max // 2
        a = c.query("bank.total", 0, ACCOUNTS, at_epoch=back)
        assert a.ok and a.epoch == back and a.value == TOTAL, a
        # A little ahead: the query waits for the epoch, then answers at it.
        ahead = c.status()["epoch"] + 20
        a = c.query("bank.total", 0, ACCOUNTS, at_epoch=ahead)
        assert a.ok and a.epoch == ahead and a.value == TOTAL, a
        assert c.status()["epoch"] >= ahead
        # Far ahead: not_ready once the replica asked has waited its bound.
        far = c.status()["epoch"] + 1_000_000
        t0 = time.monotonic()
        with pytest.raises(CallFailed) as future:
            c.query("bank.total", 0, ACCOUNTS, at_epoch=far, replica=0)
        waited = time.monotonic() - t0
        assert future.value.code == ERR_NOT_READY
        assert f"epoch {far} is not completed here yet" in future.value.message
        assert waited >= limits.query_watermark_wait_s * 0.9, waited
        load.stop()


# No locks -------------------------------------------------------------------------------
def test_queries_take_no_lock_sequence_nothing_and_leave_transfers_deterministic(
    bank: LocalCluster,
) -> None:
    cfg = bank.config
    marker = ("queries-marker", 1)
    home = placement.partition_of("kv", (marker[0],), cfg.partitions)
    with cluster_client(cfg, timeout_s=30) as c:
        before = wait_quiescent(c, REPLICAS, PARTITIONS)
        futs: list[Future] = []
        for i in range(400):
            futs.append(c.submit_query("bank.total", 0, ACCOUNTS, replica=i % 2))
            futs.append(c.submit_query("bank.total", 0, ACCOUNTS, isolation="read_committed"))
            futs.append(c.submit_query("bank.balance", i % ACCOUNTS))
        for f in futs:
            assert f.result(timeout=30).ok
        # One transaction after every query: a status that has applied it is newer
        # than the queries.
        assert c.call("kv.put", *marker).ok
        after = wait_quiescent(c, REPLICAS, PARTITIONS)
    assert after["epoch"] > before["epoch"]
    assert after["txns_sequenced"] == before["txns_sequenced"] + 1
    assert after["queries"] == before["queries"]
    was, now = counters(before), counters(after)
    for (r, p), (applied, lock_waits, txn_waits, blocked) in now.items():
        assert (lock_waits, txn_waits, blocked) == was[(r, p)][1:], (r, p)
        assert applied == was[(r, p)][0] + (1 if p == home else 0), (r, p)

    with Transfers(cfg, seed=5) as load, cluster_client(cfg, timeout_s=30) as c:
        load.wait_answered(load.answered + 300)
        futs = []
        for i in range(600):
            futs.append(c.submit_query("bank.total", 0, ACCOUNTS, replica=i % 2))
            futs.append(c.submit_query("bank.balance", i % ACCOUNTS, isolation="read_committed"))
        for f in futs:
            assert f.result(timeout=30).ok
        load.stop()
        st = wait_quiescent(c, REPLICAS, PARTITIONS)
    assert st["determinism_violations"] == 0
    replicas_agree_with_serial_replay(cfg, st)


# The command line -----------------------------------------------------------------------
def test_ordo_query_prints_the_value_and_epoch_and_one_line_errors(bank: LocalCluster) -> None:
    import json

    reached = run_past(bank, limits.versions_epochs_max + 20)
    data = ["--data-dir", bank.config.data_dir]

    def ordo(*args: str) -> Any:
        return CliRunner().invoke(cli_main, ["query", *args, *data])

    out = ordo("bank.total", "0", str(ACCOUNTS))
    assert out.exit_code == 0, out.output
    answer = json.loads(out.stdout)
    assert answer["status"] == "ok" and answer["value"] == TOTAL
    assert isinstance(answer["epoch"], int) and answer["epoch"] >= reached
    for isolation, epoch_is_int in (("read_committed", True), ("strict", False)):
        out = ordo("bank.total", "0", str(ACCOUNTS), "--isolation", isolation)
        assert out.exit_code == 0, out.output
        answer = json.loads(out.stdout)
        assert answer["status"] == "ok" and answer["value"] == TOTAL, isolation
        assert isinstance(answer["epoch"], int) is epoch_is_int, answer
    out = ordo("bank.total", "0", str(ACCOUNTS), "--at-epoch", "1")
    assert out.exit_code == 1, out.output
    assert out.stdout == "" and "Traceback" not in out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "versions_epochs_max" in lines[0], out.stderr
    out = ordo("bank.transfer", "1", "2", "3")
    assert out.exit_code == 1, out.output
    assert "Traceback" not in out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "bank.transfer is not read-only" in lines[0], out.stderr
    with cluster_client(bank.config) as c:  # refused, so nothing moved
        assert c.query("bank.total", 0, ACCOUNTS).value == TOTAL


def test_one_sequencer_address_is_enough_to_query_the_partitions(
    bank: LocalCluster, tmp_path: Path
) -> None:
    """No readers: ``Client(address)`` and ``ordo query --host`` learn every replica's
    partitions from the sequencer (cluster.info) and query them without the cluster
    directory."""
    import json

    cfg = bank.config
    with Client(cfg.client_addr, timeout_s=30) as c:
        for r in (None, 0, 1):
            a = c.query("bank.total", 0, ACCOUNTS, replica=r)
            assert a.ok and a.value == TOTAL and a.epoch is not None, (r, a)
        with pytest.raises(BadRequest, match="knows no reader"):
            c.query("bank.total", 0, ACCOUNTS, reader=0)
    host = cfg.client_addr.removeprefix("tcp://")
    nowhere = str(tmp_path / "no-cluster-here")
    for isolation in ("snapshot", "read_committed"):
        out = CliRunner().invoke(
            cli_main,
            ["query", "bank.total", "0", str(ACCOUNTS), "--isolation", isolation]
            + ["--host", host, "--data-dir", nowhere],
        )
        assert out.exit_code == 0, out.output
        answer = json.loads(out.stdout)
        assert answer["status"] == "ok" and answer["value"] == TOTAL, answer


# High availability ----------------------------------------------------------------------
def test_a_snapshot_on_the_replicated_ordering_layer_needs_the_clients_keys(
    tmp_path: Path,
) -> None:
    cfg = ha_layout(
        ClusterConfig(
            replicas=REPLICAS,
            partitions=PARTITIONS,
            base_port=free_base_port(),
            data_dir=str(tmp_path / "data"),
        )
    )
    assert cfg.curve and cfg.sequencers == 3 and cfg.replicated
    with LocalCluster(cfg) as lc:
        with cluster_client(lc.config, timeout_s=30) as c:
            open_accounts(c, ACCOUNTS, START)
            with Transfers(cfg, seed=7) as load:
                load.wait_answered(200)
                for r in (0, 1):
                    a = c.query("bank.total", 0, ACCOUNTS, replica=r)
                    assert a.ok and a.value == TOTAL and a.epoch is not None, (r, a)
                load.stop()
            curve = c.curves
        # One address is enough, a follower's too: each sequencer names the partitions
        # and their public keys (cluster.info); the client brings its own key pair.
        for address in cfg.client_addrs:
            with Client(address, curve=curve[address], timeout_s=30) as one:
                a = one.query("bank.total", 0, ACCOUNTS)
                assert a.ok and a.value == TOTAL and a.epoch is not None, (address, a)
        # The query sockets run CURVE: the same client without their keys gets no
        # answer to its queries (resent often while it waits), and keeps working.
        with Client(
            cfg.client_addrs,
            curve=[curve[a] for a in cfg.client_addrs],
            query_addresses=cfg.query_addrs(),
            timeout_s=1.5,
            retry_s=0.05,
        ) as keyless:
            homes = {placement.partition_of("account", (a,), PARTITIONS): a for a in range(9)}
            futs = [
                keyless.submit_query("bank.balance", a, replica=r)
                for r in (0, 1)
                for a in homes.values()  # every partition's query socket
            ]
            within_s = keyless.timeout_s + 2.0
            _, late = wait(futs, timeout=within_s)
            assert not late, (
                f"{len(late)} of {len(futs)} queries no partition would authenticate were "
                f"not expired by the client within {within_s:g} s: its I/O thread is stuck"
            )
            assert all(isinstance(f.exception(), CallTimeout) for f in futs)
            called = keyless.call("bank.total", 0, ACCOUNTS)
            assert called.ok and called.value == TOTAL
