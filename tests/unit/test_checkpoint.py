"""Checkpoint files: atomic format, validation, corrupt/torn ones skipped, pruning,
frames bounded in bytes; a partition counts a checkpoint only once it is durable."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import txn_library.builtin  # noqa: F401
from cluster.config import ClusterConfig
from cluster.launcher import free_base_port
from cluster.partition_server import PartitionServer
from executor.core import checkpoint
from executor.core.storage import Storage
from executor.deterministic.replica import LocalReplica
from sequencer.calls import make_batch
from txn_library import limits
from txn_library import wire as swire


def _storage(n: int, salt: int = 0) -> Storage:
    s = Storage()
    s.load(("account", (a,), (1000 + salt + a,)) for a in range(n))
    return s


def _write(d: Path, epoch: int, s: Storage, partition: int = 0) -> Path:
    return checkpoint.write_checkpoint(
        d,
        s,
        replica=0,
        partition=partition,
        partitions=2,
        epoch=epoch,
        next_txn_id=epoch * 10,
        txns_applied=epoch,
    )


def test_roundtrip_keeps_rows_hash_and_position(tmp_path: Path) -> None:
    s = _storage(10_000)
    path = _write(tmp_path, 7, s)
    info, loaded = checkpoint.load(path)
    assert (info.epoch, info.next_txn_id, info.txns_applied, info.partition) == (7, 70, 7, 0)
    assert loaded.state_hash == s.state_hash == info.state_hash
    assert dict(loaded.tables["account"]) == dict(s.tables["account"])
    assert not list(tmp_path.glob("*.tmp"))


def test_corrupt_and_torn_checkpoints_are_skipped_for_an_older_valid_one(tmp_path: Path) -> None:
    good = _write(tmp_path, 5, _storage(3000, salt=1))
    flipped = _write(tmp_path, 6, _storage(3000, salt=2))
    torn = _write(tmp_path, 7, _storage(3000, salt=3))
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x40
    flipped.write_bytes(bytes(data))
    torn.write_bytes(torn.read_bytes()[:-20])
    for bad in (flipped, torn):
        with pytest.raises(checkpoint.CheckpointInvalid):
            checkpoint.load(bad)
    info, _ = checkpoint.load_newest(tmp_path, 0, 2)  # type: ignore[misc]
    assert info.path == good


def test_hash_mismatch_is_detected_even_with_valid_frames(tmp_path: Path) -> None:
    s = _storage(100)
    s.state_hash ^= 1  # a checkpoint whose header lies about its rows
    path = _write(tmp_path, 3, s)
    with pytest.raises(checkpoint.CheckpointInvalid, match="hash"):
        checkpoint.load(path)


def test_prune_keeps_newest_and_complete_epochs(tmp_path: Path) -> None:
    for e in (1, 2, 3, 4):
        _write(tmp_path, e, _storage(10), partition=0)
    for e in (3, 4):
        _write(tmp_path, e, _storage(10), partition=1)
    assert checkpoint.complete_epochs(tmp_path, 2) == [3, 4]
    removed = checkpoint.prune(tmp_path, 0, keep=2)
    assert sorted(p.name for p in removed) == ["000000000001-p0.ckpt", "000000000002-p0.ckpt"]
    assert [i.epoch for i in checkpoint.list_checkpoints(tmp_path, 0)] == [3, 4]


def test_flagged_epochs_give_identical_boundaries_on_replicas(tmp_path: Path) -> None:
    """Two in-process replicas (different message orders) checkpoint at the same
    boundaries with equal hashes; resuming from a checkpoint reaches the same end."""
    batches = [make_batch(1, 0, 1, 1, [("bank.open", (0, 100, 1000))], 2)]
    txn = 1
    for e in range(2, 12):
        calls = [
            ("bank.transfer", ((e * 7 + i) % 100, (e * 13 + i * 3) % 100, 5)) for i in range(40)
        ]
        b = make_batch(e, txn, e, e, calls, 2)
        batches.append(b._replace(flags=1 if e % 4 == 0 else 0))
        txn += len(calls)
    seen: dict[int, list] = {}

    def keep(epoch: int, parts: list) -> None:
        for p in parts:
            seen.setdefault(epoch, []).append(p.storage.state_hash)
            checkpoint.write_checkpoint(
                tmp_path / f"r{id(parts)}",
                p.storage,
                replica=0,
                partition=p.partition,
                partitions=2,
                epoch=epoch,
                next_txn_id=p.next_txn_id,
                txns_applied=p.txns_applied,
            )

    a, b = LocalReplica(2, shuffle_seed=1), LocalReplica(2, shuffle_seed=2)
    for x in batches:
        a.apply(x, keep)
        b.apply(x, keep)
    assert sorted(seen) == [4, 8]
    for hashes in seen.values():
        assert hashes[:2] == hashes[2:]
    # Resume from epoch 8 of replica a and replay the rest.
    d = next(p for p in tmp_path.iterdir())
    storages, infos = [], []
    for part in (0, 1):
        info, st = checkpoint.load(d / checkpoint.checkpoint_name(8, part))
        storages.append(st)
        infos.append(info)
    r = LocalReplica(2, storages)
    for p, info in zip(r.parts, infos, strict=True):
        p.restore(info.epoch, info.next_txn_id, info.txns_applied)
    for x in batches[8:]:
        r.apply(x)
    assert r.state_hash == a.state_hash


def test_rows_larger_than_a_frame_budget_still_make_a_valid_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames are cut by bytes too, so big rows never make a frame the reader refuses
    (scaled down: a 1 MiB frame limit, 100 KiB rows)."""
    monkeypatch.setattr(limits, "log_frame_bytes_max", 1 << 20)
    monkeypatch.setattr(limits, "checkpoint_frame_bytes_max", 256 << 10)
    row_bytes = 100 << 10
    assert limits.checkpoint_frame_bytes_max + row_bytes + 16 <= limits.log_frame_bytes_max
    s = Storage()
    s.load(("kv", (f"k{i}",), ("x" * row_bytes,)) for i in range(40))  # 4 MiB in all
    info, loaded = checkpoint.load(_write(tmp_path, 1, s))
    assert loaded.row_count() == 40 and loaded.state_hash == s.state_hash == info.state_hash


def _checkpoint_server(tmp_path: Path) -> PartitionServer:
    """A one-partition server, in process, at a flagged epoch that has drained."""
    cfg = ClusterConfig(
        replicas=1, partitions=1, base_port=free_base_port(), data_dir=str(tmp_path / "data")
    )
    server = PartitionServer(cfg, 0, 0, storage=Storage())
    batch = make_batch(1, 0, 1, 1, [("bank.open", (0, 50, 100))], 1)
    server.feed.offer(swire.pack(batch._replace(flags=swire.FLAG_CHECKPOINT)))
    assert server.part.checkpoint_ready()
    return server


def _reap_until(server: PartitionServer, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "checkpoint writer never exited"
        server._maybe_checkpoint()  # what the loop does every <= 50 ms
        time.sleep(0.01)


def test_a_checkpoint_counts_only_once_its_writer_made_it_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches resume at the fork, but status reports the epoch (what ``ordo dump``,
    ``ordo checkpoint`` and log pruning trust) only after the writer exited 0."""
    gate_r, gate_w = os.pipe()
    real_write = checkpoint.write_checkpoint

    def gated_write(*args: Any, **kw: Any) -> Path:  # runs in the forked writer
        os.read(gate_r, 1)  # until the test opens the gate
        return real_write(*args, **kw)

    monkeypatch.setattr(checkpoint, "write_checkpoint", gated_write)
    server = _checkpoint_server(tmp_path)
    path = server.checkpoint_dir / checkpoint.checkpoint_name(1, 0)
    try:
        server._maybe_checkpoint()  # forks the writer, which now waits at the gate
        part = server.part
        assert part.checkpoint_due is None  # the boundary is taken: batches resume
        assert part.boundary == (1, part.storage.state_hash)
        for _ in range(5):
            server._maybe_checkpoint()
            assert part.newest_checkpoint_epoch == 0 and part.status()[5] == 0
            assert not path.exists()
        os.write(gate_w, b"g")
        _reap_until(server, lambda: part.newest_checkpoint_epoch == 1)
        assert part.status()[5] == 1
        info, loaded = checkpoint.load(path)  # exists, and validates
        assert (info.epoch, loaded.state_hash) == part.boundary
    finally:
        os.write(gate_w, b"g")  # never leave the writer waiting: close() reaps it
        server.close()
        os.close(gate_r)
        os.close(gate_w)


def test_a_failed_checkpoint_writer_never_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_write(*args: Any, **kw: Any) -> Path:  # runs in the forked writer
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "write_checkpoint", failing_write)
    server = _checkpoint_server(tmp_path)
    try:
        server._maybe_checkpoint()
        _reap_until(server, lambda: server._child is None)
        assert server.part.newest_checkpoint_epoch == 0
        assert server.part.boundary[0] == 1  # compared across replicas all the same
        assert not list(server.checkpoint_dir.glob("*.ckpt"))
    finally:
        server.close()
