"""Checkpoint files: atomic format, validation, corrupt/torn ones skipped, pruning."""

from __future__ import annotations

from pathlib import Path

import pytest

import txn_library.builtin  # noqa: F401
from executor import checkpoint
from executor.engine import LocalReplica
from executor.storage import Storage
from sequencer.sequencer import make_batch


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
        batches.append(b + ((1,) if e % 4 == 0 else (0,)))
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
