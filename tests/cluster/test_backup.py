"""Integration: online backup, the log archive and point-in-time restore (``ordo
backup``, ``ordo log archive``, ``ordo restore``).

A bank cluster (1 replica x 2 partitions, 16 KB log segments so they seal quickly,
a checkpoint every 8 epochs) under a steady load of transfers:
- ``ordo backup`` while the load runs; the archive ships sealed segments and records
  the checkpoints' hashes meanwhile;
- restores at three epochs (the backup's, one where the history recorded a hash, the
  archive's last) each hash as ``ordo replay state --epoch E`` rebuilds it from
  genesis (the same function, in process, without the Spark session); the last one
  starts as a cluster at its epoch, conserves the money and takes new transfers;
- a corrupted checkpoint file or log segment of a backup is found and named, and the
  restore leaves nothing behind;
- a restore onto the live cluster's directory, or onto one that is not empty, is
  refused and touches nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cluster.backup import CHECKPOINTS, LOG, Manifest, verify_backup
from cluster.backup_archive import recorded_epochs, ship_once
from cluster.backup_restore import covered_until
from cluster.bank_load import run_transfers
from cluster.cli import main
from cluster.config import ClusterConfig
from cluster.launcher import LocalCluster, free_base_port, wait_quiescent
from cluster.replay_cli import replay_spec
from executor.core import checkpoint as ckpt
from executor.replay.reconstruct import reconstruct
from tests.deploy_modules import bump_module
from txn_library.client import Client
from txn_library.deployed import DEPLOY
from txn_library.workloads.bank import make_transfers, open_accounts

ACCOUNTS = 200
START = 1_000
PARTITIONS = 2
ORDO = [sys.executable, "-m", "cluster.cli"]
EPOCHS_AFTER = 60  # of load after the backup: several sealed segments, checkpoints


def _ordo(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@dataclass
class Backed:
    cfg: ClusterConfig
    backup: Path
    archive: Path
    manifest: Manifest
    epoch_before_backup: int
    last_epoch: int  # the live log's, once the load stopped


def _load_until(addr: str, stop: threading.Event, rounds: list[int]) -> None:
    seed = 0
    while not stop.is_set():
        seed += 1
        transfers = make_transfers(100, ACCOUNTS, PARTITIONS, 0.5, seed)
        w = run_transfers(addr, transfers, clients=2, in_flight_per_client=10)  # many epochs
        assert w.errors == 0
        rounds.append(seed)


def _ship_until(cfg: ClusterConfig, archive: Path, stop: threading.Event) -> None:
    while not stop.wait(0.2):
        ship_once(cfg.log_dir, archive, cfg.checkpoint_dir(0), 0, cfg.partitions)


@pytest.fixture(scope="module")
def backed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backed]:
    tmp = tmp_path_factory.mktemp("backup")
    cfg = ClusterConfig(
        replicas=1,
        partitions=PARTITIONS,
        base_port=free_base_port(),
        data_dir=str(tmp / "data"),
        log_segment_bytes=16 * 1024,
        checkpoint_every_epochs=8,
    )
    lc = LocalCluster(cfg)
    lc.start()
    try:
        with Client(cfg.client_addr) as c:
            open_accounts(c, ACCOUNTS, START)
            # A procedure deployed through the log before the backup's checkpoint: the
            # restored cluster knows it (the replica's deploys/ goes with the backup).
            assert c.call(DEPLOY, "bump", bump_module(1), []).ok
            assert list(c.call("demo.bump", "restored").value) == ["v1", 1]
            archive, backup = tmp / "archive", tmp / "backup"
            stop = threading.Event()
            rounds: list[int] = []
            threads = [
                threading.Thread(target=_load_until, args=(cfg.client_addr, stop, rounds)),
                threading.Thread(target=_ship_until, args=(cfg, archive, stop)),
            ]
            for t in threads:
                t.start()
            try:
                while len(rounds) < 2:  # the load is well under way
                    stop.wait(0.05)
                before = int(c.status()["epoch"])
                out = _ordo("backup", str(backup), "--data-dir", cfg.data_dir)
                assert out.exit_code == 0, out.output
                assert "verified" in out.output
                after = Manifest.read(backup).epoch + EPOCHS_AFTER
                deadline = time.monotonic() + 60
                while int(c.status()["epoch"]) < after:  # and goes on after the backup
                    assert time.monotonic() < deadline
                    stop.wait(0.05)
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=60)
            wait_quiescent(c, 1, PARTITIONS)
            last = int(c.status()["epoch"])
        shipped = _ordo("log", "archive", str(archive), "--once", "--data-dir", cfg.data_dir)
        assert shipped.exit_code == 0, shipped.output
        yield Backed(cfg, backup, archive, Manifest.read(backup), before, last)
    finally:
        lc.stop()


def _replay_state(cfg: ClusterConfig, epoch: int) -> list[int]:
    """``ordo replay state --epoch E --genesis-only``'s rebuild, in process: each
    partition's state hash at the end of ``epoch``, replayed from genesis."""
    rc = reconstruct(replay_spec(cfg, cfg.log_dir), [], epoch)
    assert rc.start_epoch == 0 and rc.replica.last_epoch == epoch
    return rc.partition_hashes


def _restored_hashes(data_dir: Path, epoch: int) -> list[int]:
    """Each partition's state hash in the restored directory's checkpoint at ``epoch``
    (loaded whole: CRCs, rows hashing to the header)."""
    directory = ClusterConfig.load(data_dir).checkpoint_dir(0)
    assert [e for e in ckpt.complete_epochs(directory, PARTITIONS)] == [epoch]
    return [
        ckpt.load(directory / ckpt.checkpoint_name(epoch, p))[0].state_hash
        for p in range(PARTITIONS)
    ]


def test_backup_under_load_restores_at_three_epochs_equal_to_replay(
    backed: Backed, tmp_path: Path
) -> None:
    m = backed.manifest
    assert m.epoch > backed.epoch_before_backup  # a fresh checkpoint, taken under load
    assert m.log_first_epoch == m.epoch <= m.log_last_epoch < backed.last_epoch
    covered = covered_until_of(backed)
    recorded = [e for e in sorted(recorded_epochs(backed.archive)) if m.epoch < e < covered]
    assert recorded, "the archive recorded no checkpoint hash past the backup"
    targets = [None, recorded[0], covered]
    for i, epoch in enumerate(targets):
        new = tmp_path / f"restored-{i}"
        args = ["restore", str(backed.backup), "--data-dir", str(new)]
        args += ["--archive", str(backed.archive)]
        if epoch is not None:
            args += ["--epoch", str(epoch)]
        if epoch is None:  # in a process of its own: it imports what the backup needs
            proc = subprocess.run([*ORDO, *args], capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            output = proc.stdout
        else:
            out = _ordo(*args)
            assert out.exit_code == 0, out.output
            output = out.output
        want = m.epoch if epoch is None else epoch
        assert f"restored epoch {want} into" in output
        assert _restored_hashes(new, want) == _replay_state(backed.cfg, want)
        if epoch == recorded[0]:  # checked against the history's hash on the way
            assert f"epochs {m.epoch}, {epoch}" in output
    _serves_from_its_epoch(tmp_path / "restored-2", covered)


def covered_until_of(backed: Backed) -> int:
    return covered_until(verify_backup(backed.backup), backed.archive)


def _serves_from_its_epoch(data_dir: Path, epoch: int) -> None:
    """``ordo up`` on a restored directory: every partition loads its checkpoint, the
    sequencer resumes after ``epoch``, money is conserved, new transfers run."""
    cfg = replace(ClusterConfig.load(data_dir), base_port=free_base_port())
    lc = LocalCluster(cfg)
    lc.start()
    try:
        with Client(cfg.client_addr) as c:
            assert int(c.status()["epoch"]) == epoch
            w = run_transfers(
                cfg.client_addr, make_transfers(200, ACCOUNTS, PARTITIONS, 0.5, 99), 2
            )
            assert w.errors == 0 and w.answered == 200
            st = wait_quiescent(c, 1, PARTITIONS)
            assert int(st["epoch"]) > epoch
            assert all(p["last_epoch"] > epoch for p in st["partitions"])
            assert c.call("bank.total", 0, ACCOUNTS).value == ACCOUNTS * START
            assert list(c.call("demo.bump", "restored").value) == ["v1", 2]
    finally:
        lc.stop()
    text = "".join(
        (lc.logs_dir / f"replica-0-partition-{p}.log").read_text() for p in range(PARTITIONS)
    )
    assert text.count("loaded checkpoint") == PARTITIONS


def _damaged_copy(backed: Backed, tmp_path: Path, name: str) -> Path:
    bad = tmp_path / name
    shutil.copytree(backed.backup, bad)
    return bad


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_corrupted_backup_file_is_found_and_named(backed: Backed, tmp_path: Path) -> None:
    m = backed.manifest
    bad_ckpt = _damaged_copy(backed, tmp_path, "bad-ckpt")
    victim = bad_ckpt / CHECKPOINTS / ckpt.checkpoint_name(m.epoch, 1)
    _flip_byte(victim)
    bad_log = _damaged_copy(backed, tmp_path, "bad-log")
    segment = sorted((bad_log / LOG).glob("segment-*.log"))[-1]
    _flip_byte(segment)
    for src, named in ((bad_ckpt, victim), (bad_log, segment)):
        new = tmp_path / f"from-{src.name}"
        out = _ordo("restore", str(src), "--data-dir", str(new))
        assert out.exit_code != 0
        assert "the backup is damaged" in out.output and str(named) in out.output, out.output
        assert not new.exists()
        assert not list(tmp_path.glob(".*restoring*"))  # nothing left behind


def test_a_restore_onto_a_directory_in_use_is_refused_and_touches_nothing(
    backed: Backed, tmp_path: Path
) -> None:
    live = Path(backed.cfg.data_dir)
    before = sorted(p.name for p in live.iterdir())
    config = (live / "cluster.json").read_bytes()
    out = _ordo("restore", str(backed.backup), "--data-dir", str(live))
    assert out.exit_code != 0
    assert "restore refused, nothing touched" in out.output and "in use by process" in out.output
    assert sorted(p.name for p in live.iterdir()) == before
    assert (live / "cluster.json").read_bytes() == config
    assert not list(live.parent.glob(".*restoring*"))
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    out = _ordo("restore", str(backed.backup), "--data-dir", str(occupied))
    assert out.exit_code != 0 and "is not empty" in out.output
    assert [p.name for p in occupied.iterdir()] == ["notes.txt"]
