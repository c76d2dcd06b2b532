"""Crash recovery with real processes and kill -9.

- A partition of one replica is killed under a continuous transfer workload (half
  multi-partition) and restarted: it loads its checkpoint, catches up from the log
  service, and ends with the other replica's hashes; money is conserved; no call is
  lost or executed twice.
- The sequencer is killed mid-run and restarted: every acknowledged call is in the
  state, in-flight calls run at most once (retries carry the same request ids), and
  replicas continue.
- A brand-new replica joins a running cluster (genesis + full log replay).
- Log pruning removes only what every partition's checkpoint covers, and a
  partition still recovers afterwards.
- A corrupt log (flipped byte mid-log) stops the sequencer with a clear message.
- `ordo up` itself killed with kill -9: its roles stop with it, a second `ordo up` on
  the directory is refused while the first lives, and `ordo up` started again loses no
  acknowledged transfer and runs none twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster.bank_load import run_transfers
from cluster.cli import main as cli_main
from cluster.config import ClusterConfig
from cluster.launcher import (
    LocalCluster,
    free_base_port,
    partition_status,
    wait_live_again,
    wait_quiescent,
)
from cluster.ledger import Ledger, drive_transfers
from executor.core.checkpoint import copy_newest_complete
from sequencer.log import CommandLog, iter_frames
from tests.cluster_checks import replicas_agree_with_serial_replay
from tests.ha_checks import check_outcome
from tests.process_checks import children, gone_within
from txn_library import limits
from txn_library.client import Client
from txn_library.wire import sequencer as wire
from txn_library.workloads.bank import make_transfers, open_accounts

ACCOUNTS = 1_000
START = 10_000


def _logged_request_keys(cfg: ClusterConfig) -> Counter:
    keys: Counter = Counter()
    for _e, data in iter_frames(cfg.log_dir):
        for t in wire.decode_batch(data).txns:
            if t.client_id:
                keys[(t.client_id, t.req_id)] += 1
    return keys


def _wait_for(pred, timeout_s: float = 60.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


def test_kill9_partition_under_load_recovers_from_checkpoint(make_cluster) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(replicas=2, partitions=2, checkpoint_every_epochs=15)
    cfg = lc.config
    with Client(cfg.client_addr) as c:
        open_accounts(c, ACCOUNTS, START)
        # Make sure a checkpoint exists before the crash.
        epoch = c.control(wire.CheckpointRequest())
        _wait_for(
            lambda: all(p["newest_checkpoint_epoch"] >= epoch for p in c.status()["partitions"]),
            what="first checkpoint",
        )
    transfers = make_transfers(15_000, ACCOUNTS, 2, multi_share=0.5, seed=3)
    out: dict = {}
    worker = threading.Thread(
        target=lambda: out.setdefault("run", run_transfers(cfg.client_addr, transfers, 4, 100))
    )
    worker.start()
    with Client(cfg.client_addr) as c:
        _wait_for(lambda: c.status()["txns_sequenced"] > 3_000, what="load running")
        old_pid = partition_status(c, 1, 0)["pid"]
        lc.kill("r1p0")  # SIGKILL
        killed_at = c.status()["epoch"]
        time.sleep(0.5)
        lc.start_partition(1, 0)
        worker.join(timeout=120)
        run = out["run"]
        assert run.errors == 0, run.error_codes
        assert run.answered == len(transfers)
        wait_live_again(c, 1, 0, old_pid, killed_at)
        st = wait_quiescent(c, 2, 2, timeout_s=90)
        assert c.call("bank.total", 0, ACCOUNTS).value == ACCOUNTS * START
    assert st["epoch"] > killed_at
    replicas_agree_with_serial_replay(cfg, st)
    keys = _logged_request_keys(cfg)
    assert max(keys.values()) == 1  # nothing sequenced twice
    log_text = (lc.logs_dir / "replica-1-partition-0.log").read_text()
    assert "loaded checkpoint" in log_text and "live: caught up" in log_text


def test_kill9_sequencer_acknowledged_calls_survive_and_nothing_runs_twice(make_cluster) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(replicas=2, partitions=2)
    cfg = lc.config
    n = 4_000
    results: dict[int, object] = {}
    with Client(cfg.client_addr, retry_s=1.0, timeout_s=60) as c:
        sem = threading.BoundedSemaphore(200)
        futures = []
        killed = False
        for i in range(n):
            sem.acquire()
            f = c.submit("kv.add", f"k{i}", 1)
            f.add_done_callback(lambda _f: sem.release())
            futures.append(f)
            if i == n // 3 and not killed:
                lc.kill("sequencer")
                killed = True
                time.sleep(0.3)
                lc.start_sequencer()
        for i, f in enumerate(futures):
            try:
                results[i] = f.result(timeout=90)
            except Exception as e:  # reported failed to the client: allowed
                results[i] = e
    ok = {i for i, r in results.items() if getattr(r, "ok", False)}
    assert len(ok) > n * 0.9, f"only {len(ok)} of {n} acknowledged"
    with Client(cfg.client_addr) as c:
        st = wait_quiescent(c, 2, 2, timeout_s=90)
        values = {
            i: f.result(timeout=30).value
            for i, f in enumerate([c.submit("kv.get", f"k{i}") for i in range(n)])
        }
    for i in ok:
        assert values[i] == 1, (i, values[i])  # acknowledged => in the state, once
    assert all(v in (None, 1) for v in values.values())  # never executed twice
    assert max(_logged_request_keys(cfg).values()) == 1
    replicas_agree_with_serial_replay(cfg, st)


def test_new_replica_joins_a_running_cluster(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        replicas=2, partitions=2, base_port=free_base_port(), data_dir=str(tmp_path / "d")
    )
    with LocalCluster(cfg) as lc:
        pass  # warm-up: make sure ports work; stop everything
    lc = LocalCluster(cfg)
    try:
        lc.start(replicas=[0])
        with Client(cfg.client_addr) as c:
            open_accounts(c, ACCOUNTS, START)
        run = run_transfers(cfg.client_addr, make_transfers(5_000, ACCOUNTS, 2, 0.5, seed=9), 2)
        assert run.errors == 0, run.error_codes
        for p in range(2):
            lc.start_partition(1, p)  # brand new: genesis, then the whole log
        with Client(cfg.client_addr) as c:
            st = wait_quiescent(c, 2, 2, timeout_s=90)
        replicas_agree_with_serial_replay(cfg, st)
    finally:
        lc.stop()


def test_new_replica_seeded_from_a_peer_checkpoint(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        replicas=2, partitions=2, base_port=free_base_port(), data_dir=str(tmp_path / "d")
    )
    lc = LocalCluster(cfg)
    try:
        lc.start(replicas=[0])
        with Client(cfg.client_addr) as c:
            open_accounts(c, ACCOUNTS, START)
            run_transfers(cfg.client_addr, make_transfers(3_000, ACCOUNTS, 2, 0.5, seed=1), 2)
            epoch = c.control(wire.CheckpointRequest())
            _wait_for(
                lambda: all(
                    p["newest_checkpoint_epoch"] >= epoch for p in c.status()["partitions"]
                ),
                what="checkpoint",
            )
            run_transfers(cfg.client_addr, make_transfers(2_000, ACCOUNTS, 2, 0.5, seed=2), 2)
        assert copy_newest_complete(cfg.checkpoint_dir(0), cfg.checkpoint_dir(1), 2) == epoch
        for p in range(2):
            lc.start_partition(1, p)
        with Client(cfg.client_addr) as c:
            st = wait_quiescent(c, 2, 2, timeout_s=90)
        replicas_agree_with_serial_replay(cfg, st)
        for p in range(2):
            text = (lc.logs_dir / f"replica-1-partition-{p}.log").read_text()
            assert f"(epoch {epoch}," in text and "loaded checkpoint" in text
    finally:
        lc.stop()


def test_prune_keeps_what_recovery_needs(make_cluster) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(replicas=1, partitions=2, log_segment_bytes=32 * 1024)
    cfg = lc.config
    with Client(cfg.client_addr) as c:
        open_accounts(c, ACCOUNTS, START)
        run_transfers(cfg.client_addr, make_transfers(6_000, ACCOUNTS, 2, 0.5, seed=4), 2)
        epoch = c.control(wire.CheckpointRequest())
        _wait_for(
            lambda: all(p["newest_checkpoint_epoch"] >= epoch for p in c.status()["partitions"]),
            what="checkpoint",
        )
        segments_before = len(list(cfg.log_dir.glob("segment-*.log")))
        archive = Path(cfg.data_dir) / "archive"
        removed = c.control(wire.PruneRequest(str(archive)))
        assert removed and len(list(archive.glob("segment-*.log"))) == len(removed)
        assert len(list(cfg.log_dir.glob("segment-*.log"))) == segments_before - len(removed)
        first_kept = c.status()["log_first_epoch"]
        assert 1 < first_kept <= epoch + 1
        run_transfers(cfg.client_addr, make_transfers(1_000, ACCOUNTS, 2, 0.5, seed=5), 2)
        before = {p["partition"]: p["state_hash"] for p in wait_quiescent(c, 1, 2)["partitions"]}
        old_pid = partition_status(c, 0, 1)["pid"]
        lc.kill("r0p1")
        lc.start_partition(0, 1)
        wait_live_again(c, 0, 1, old_pid, c.status()["epoch"])
        after = {p["partition"]: p["state_hash"] for p in wait_quiescent(c, 1, 2)["partitions"]}
        assert after == before
        assert c.call("bank.total", 0, ACCOUNTS).value == ACCOUNTS * START


def test_corrupt_log_stops_the_sequencer_with_a_clear_message(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        replicas=1, partitions=1, base_port=free_base_port(), data_dir=str(tmp_path / "d")
    )
    cfg.save()
    log = CommandLog(cfg.log_dir)
    for e in range(1, 6):
        log.append(e, wire.pack((e, e - 1, e - 1, 0, 0, [], 0)))
    log.close()
    seg = next(cfg.log_dir.glob("segment-*.log"))
    data = bytearray(seg.read_bytes())
    data[12] ^= 0xFF  # inside the first frame: middle of the log
    seg.write_bytes(bytes(data))
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "sequencer", "--data-dir", cfg.data_dir],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3
    assert "corrupt" in proc.stderr and "epoch 1" in proc.stderr


def _start_up(args: list[str]) -> subprocess.Popen[str]:
    up = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert up.stdout is not None
    line = up.stdout.readline()
    while "ordo up: sequencer at" not in line:
        assert up.poll() is None and line, f"ordo up did not start: {line}"
        line = up.stdout.readline()
    return up


def test_kill9_of_ordo_up_takes_its_cluster_down_and_a_restart_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ordo up` killed with SIGKILL under a transfer load (its roles see their lifeline
    end and stop: none is left holding the cluster's ports or files); a second `ordo up`
    on the directory while the first lives is refused, touching nothing; `ordo up`
    started again on the same directory serves the clients' retries: every transfer is
    answered, none is lost or run twice, replicas equal the serial replay."""
    data = tmp_path / "d"
    args = [sys.executable, "-m", "cluster.cli", "up", "--replicas", "2", "--partitions", "2"]
    args += ["--base-port", str(free_base_port()), "--data-dir", str(data)]
    args += ["--checkpoint-every", "50"]
    up = _start_up(args)
    try:
        cfg = ClusterConfig.load(data)
        roles = children(up.pid)
        assert len(roles) == 5  # sequencer + 2 x 2 partitions
        with Client(cfg.client_addr) as c:
            open_accounts(c, ACCOUNTS, START)
        transfers = make_transfers(3_000, ACCOUNTS, 2, 0.5, seed=11)
        ledger = Ledger()
        load = threading.Thread(
            target=drive_transfers, args=(cfg, transfers, 2, ledger), kwargs={"timeout_s": 120}
        )
        load.start()
        _wait_for(lambda: len(ledger.acked) >= 500, what="transfers answered")

        monkeypatch.setattr(limits, "owner_wait_s", 0.3)
        second = CliRunner().invoke(cli_main, args[3:])
        assert second.exit_code == 1, second.output
        assert f"in use by process {up.pid}" in second.output
        assert sorted(p.name for p in (data / "owners").iterdir()) == [
            "launcher.lock", "r0p0.lock", "r0p1.lock", "r1p0.lock", "r1p1.lock", "sequencer-0.lock"
        ]  # fmt: skip

        up.kill()  # SIGKILL to the launcher alone
        up.wait()
        left = [pid for pid in roles if not gone_within(pid, 10.0)]
        assert not left, f"roles outlived their launcher: {left}"

        up = _start_up(args)  # same directory, same ports: the retries reach it
        load.join(timeout=180)
        assert not load.is_alive()
        with Client(cfg.client_addr) as c:
            st = wait_quiescent(c, 2, 2, timeout_s=90)
        check_outcome(cfg, ledger, st, len(transfers))
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
