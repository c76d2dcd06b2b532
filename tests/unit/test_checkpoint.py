"""Checkpoint files: atomic format, validation, corrupt/torn ones skipped, pruning,
frames bounded in bytes; chains of a base and deltas load to the state of each
checkpoint, and a corrupt, missing or doctored file of a chain is found and named; the
static tables file is written once; a partition counts a checkpoint only once it is
durable, never waits for a busy writer, and writes a base after a failed one."""

from __future__ import annotations

import os
import random
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

import tpcc.schema  # noqa: F401  (registers ITEM, replicated, and NEW-ORDER, ordered)
import txn_library.workloads.builtin  # noqa: F401
from cluster.config import ClusterConfig
from cluster.launcher import free_base_port
from cluster.partition_server import PartitionServer
from executor.core import checkpoint
from executor.core.checkpoint import loader as ckpt_loader
from executor.core.checkpoint import writer as ckpt_writer
from executor.core.checkpoint.format import _rows_frame
from executor.core.checkpoint.reader import _check_hash_only, _decode_rows, _keyed_frame
from executor.core.checkpoint.writer import recent_answers
from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_body
from executor.core.storage import Storage
from executor.deterministic.replica import LocalReplica
from sequencer.calls import make_batch
from sequencer.log import encode_frame
from tests.heap_checks import no_cycles
from txn_library import limits
from txn_library.errors import InvariantViolation
from txn_library.procedure import lookup
from txn_library.wire import sequencer as swire


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
    assert dict(loaded.whole_tables()["account"]) == dict(s.tables["account"])
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


def test_prune_keeps_what_a_live_hold_names_and_sweeps_a_dead_holders(tmp_path: Path) -> None:
    """``ordo dump`` holds checkpoints while it waits for one and reads it: every one at
    or after an epoch, then one with its chain. A hold whose holder died (its lock
    free) keeps nothing and is deleted by the next prune."""
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    epochs = lambda: [i.epoch for i in checkpoint.list_checkpoints(tmp_path, 0)]  # noqa: E731
    for e in (1, 2, 3):  # a base and two deltas
        _txn(s, {("account", (e,)): (e,)})
        _checkpoint(tmp_path, chain, e)
    with checkpoint.CheckpointHold(tmp_path) as hold:
        hold.keep_from(2)
        chain.failed()  # 4: a new base, so keep=1 (5 and its base 4) needs none of 1-3
        for e in (4, 5):
            _txn(s, {("account", (e,)): (e,)})
            _checkpoint(tmp_path, chain, e)
        assert checkpoint.prune(tmp_path, 0, keep=1) == [] and epochs() == [1, 2, 3, 4, 5]
        hold.keep_only(2)  # a delta: its base stays too
        removed = checkpoint.prune(tmp_path, 0, keep=1)
        assert [p.name for p in removed] == [checkpoint.checkpoint_name(3, 0)]
        assert checkpoint.load(tmp_path / checkpoint.checkpoint_name(2, 0))[0].epoch == 2
    assert not list((tmp_path / checkpoint.HOLDS_DIR).iterdir())  # released: gone
    checkpoint.prune(tmp_path, 0, keep=1)
    assert epochs() == [4, 5]

    dead = checkpoint.CheckpointHold(tmp_path)
    dead.keep_from(0)
    os.close(dead._fd)  # type: ignore[arg-type]  # as its process dying drops the lock
    dead._fd = None
    assert dead.path.exists()
    checkpoint.prune(tmp_path, 0, keep=1)
    assert not dead.path.exists() and not dead.lock_path.exists()


def test_a_killed_writers_temp_files_are_removed_for_that_partition_only(
    tmp_path: Path,
) -> None:
    st = _storage(10)
    kept = [_write(tmp_path, 5, st, partition=0)]
    left = [
        tmp_path / (checkpoint.checkpoint_name(7, 0) + ".tmp"),
        tmp_path / (checkpoint.skip_name(9, 0) + ".tmp"),
        tmp_path / (checkpoint.static_name(0, 0xABC) + ".tmp"),
    ]
    other = [
        tmp_path / (checkpoint.checkpoint_name(7, 1) + ".tmp"),  # partition 1's
        tmp_path / (checkpoint.checkpoint_name(7, 10) + ".tmp"),
        tmp_path / "notes.tmp",  # not a checkpoint writer's
    ]
    for p in left + other:
        p.write_bytes(b"half a file")
    assert checkpoint.remove_temp_files(tmp_path, 0) == sorted(left)
    assert all(p.exists() for p in kept + other) and not any(p.exists() for p in left)
    assert checkpoint.remove_temp_files(tmp_path / "missing", 0) == []


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
        assert time.monotonic() < deadline, "checkpoint writer never finished"
        server._maybe_checkpoint()  # what the loop does every turn (<= 50 ms)
        time.sleep(0.005)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Checkpoint files are not made durable until the test sets the event (the writer
    thread waits in front of the fsync, as a slow disk would make it)."""
    opened = threading.Event()
    real_run = checkpoint.CheckpointWriter._run

    def gated(self: checkpoint.CheckpointWriter) -> None:
        assert opened.wait(30), "the test never opened the gate"
        real_run(self)

    monkeypatch.setattr(checkpoint.CheckpointWriter, "_run", gated)
    yield opened
    opened.set()  # never leave a writer waiting


def _offer(server: PartitionServer, epoch: int, first_txn_id: int, calls: list, flag: bool) -> None:
    batch = make_batch(epoch, first_txn_id, epoch, epoch, calls, 1)
    server.feed.offer(swire.pack(batch._replace(flags=swire.FLAG_CHECKPOINT if flag else 0)))


def test_a_checkpoint_counts_only_once_its_writer_made_it_durable(
    tmp_path: Path, gate: threading.Event
) -> None:
    """Batches resume at the capture, but status reports the epoch (what ``ordo dump``,
    ``ordo checkpoint`` and log pruning trust) only once the file is in place."""
    server = _checkpoint_server(tmp_path)
    path = server.checkpoint_dir / checkpoint.checkpoint_name(1, 0)
    try:
        server._maybe_checkpoint()  # captures the rows; the thread waits at the gate
        part = server.part
        assert part.checkpoint_due is None  # the boundary is taken: batches resume
        assert part.boundary == (1, part.storage.state_hash)
        for _ in range(5):
            server._maybe_checkpoint()
            assert part.newest_checkpoint_epoch == 0 and part.status()[5] == 0
            assert not path.exists()
        gate.set()
        _reap_until(server, lambda: part.newest_checkpoint_epoch == 1)
        assert part.status()[5] == 1
        info, loaded = checkpoint.load(path)  # exists, and validates
        assert (info.epoch, loaded.state_hash) == part.boundary
    finally:
        gate.set()
        server.close()


def test_a_partition_never_waits_for_a_busy_writer(tmp_path: Path, gate: threading.Event) -> None:
    """A boundary reached while the previous file is still being written is recorded
    (compared across replicas) but not written; its changes go into the next
    checkpoint, a delta whose header says which boundary it follows."""
    server = _checkpoint_server(tmp_path)
    part = server.part
    try:
        server._maybe_checkpoint()  # epoch 1: a base, stuck at the gate
        _offer(server, 2, 1, [("bank.transfer", (1, 2, 5))], flag=True)
        assert part.last_epoch == 2  # applied although the writer of epoch 1 is stuck
        server._maybe_checkpoint()
        assert part.checkpoint_due is None and part.boundary == (2, part.storage.state_hash)
        assert server.checkpoints.skipped == 1
        assert (server.checkpoint_dir / checkpoint.skip_name(2, 0)).exists()  # for replay
        _offer(server, 3, 2, [("bank.transfer", (3, 4, 7))], flag=False)
        gate.set()
        _reap_until(server, lambda: part.newest_checkpoint_epoch == 1)
        _offer(server, 4, 3, [("bank.transfer", (2, 5, 1))], flag=True)
        _reap_until(server, lambda: part.newest_checkpoint_epoch == 4)
        assert not (server.checkpoint_dir / checkpoint.checkpoint_name(2, 0)).exists()
        info, loaded = checkpoint.load(server.checkpoint_dir / checkpoint.checkpoint_name(4, 0))
        assert (info.kind, info.parent_epoch, info.previous_epoch) == (checkpoint.DELTA, 1, 1)
        assert info.rows == 5  # accounts 1, 2, 3, 4 and 5: epochs 2, 3 and 4 together
        assert loaded.state_hash == part.storage.state_hash
        assert dict(loaded.whole_tables()["account"]) == dict(part.storage.tables["account"])
    finally:
        gate.set()
        server.close()


def test_a_failed_checkpoint_writer_never_counts_and_the_next_one_is_a_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = checkpoint.CheckpointWriter._write
    failures = [OSError("disk full")]

    def failing(self: checkpoint.CheckpointWriter, data: bytes) -> None:
        if failures:
            raise failures.pop()
        real_write(self, data)

    server = _checkpoint_server(tmp_path)
    part = server.part
    try:
        server._maybe_checkpoint()
        _reap_until(server, lambda: server.checkpoints.writer is None)  # epoch 1: a base, written
        monkeypatch.setattr(checkpoint.CheckpointWriter, "_write", failing)
        _offer(server, 2, 1, [("bank.transfer", (1, 2, 5))], flag=True)
        server._maybe_checkpoint()
        assert server.checkpoints.writer is not None
        _reap_until(server, lambda: server.checkpoints.writer is None)  # epoch 2: a delta, failed
        assert part.newest_checkpoint_epoch == 1
        assert part.boundary[0] == 2  # compared across replicas all the same
        assert not (server.checkpoint_dir / checkpoint.checkpoint_name(2, 0)).exists()
        _offer(server, 3, 2, [("bank.transfer", (3, 4, 7))], flag=True)
        _reap_until(server, lambda: part.newest_checkpoint_epoch == 3)
        info, loaded = checkpoint.load(server.checkpoint_dir / checkpoint.checkpoint_name(3, 0))
        assert (info.kind, info.previous_epoch) == (checkpoint.BASE, 1)
        assert loaded.state_hash == part.storage.state_hash
    finally:
        server.close()


def test_checkpoints_written_failed_and_loaded_leave_no_reference_cycles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partitions freeze what outlives a loop turn (heap.settle_turn): a writer, even
    a failed one, must be freed by reference counting once dropped (its exception's
    traceback would hold the writer's frames, and through them the rows it captured)."""
    real_write = checkpoint.CheckpointWriter._write
    fail_after: list[int] = []  # fail the write after this many more

    def failing(self: checkpoint.CheckpointWriter, data: bytes) -> None:
        if fail_after:
            fail_after[0] -= 1
            if fail_after[0] < 0:
                fail_after.clear()
                raise OSError("disk full")
        real_write(self, data)

    monkeypatch.setattr(checkpoint.CheckpointWriter, "_write", failing)
    server = _checkpoint_server(tmp_path)
    part = server.part
    try:
        with no_cycles():
            server._maybe_checkpoint()
            _reap_until(server, lambda: server.checkpoints.writer is None)  # epoch 1: a base
            _offer(server, 2, 1, [("bank.transfer", (1, 2, 5))], flag=True)
            _reap_until(server, lambda: part.newest_checkpoint_epoch == 2)  # a delta
            for skip in (0, 1):  # the header's write fails, then a rows frame's
                fail_after.append(skip)
                _offer(server, 3 + skip, 2 + skip, [("bank.transfer", (3, 4, 7))], flag=True)
                server._maybe_checkpoint()
                assert server.checkpoints.writer is not None
                failed = weakref.ref(server.checkpoints.writer)
                _reap_until(server, lambda: server.checkpoints.writer is None)
                assert part.newest_checkpoint_epoch == 2 and not fail_after
                assert failed() is None  # freed when dropped, though pytest keeps the log
            _offer(server, 5, 4, [("bank.transfer", (2, 5, 1))], flag=True)
            _reap_until(server, lambda: part.newest_checkpoint_epoch == 5)  # a base
            path = server.checkpoint_dir / checkpoint.checkpoint_name(5, 0)
            info, loaded = checkpoint.load(path)
            checkpoint.check(path)
            assert info.kind == checkpoint.BASE and loaded.state_hash == part.storage.state_hash
            del loaded
    finally:
        server.close()


# Chains: a base, deltas, the static tables file ------------------------------------------
def _mixed_storage() -> Storage:
    """Accounts (hashed), TPC-C NEW-ORDER (ordered, indexed) and ITEM (replicated)."""
    s = Storage()
    s.load(("item", (i,), (i, 1, f"item{i}", 100 + i, "data")) for i in range(1, 501))
    s.load(("account", (a,), (1000 + a,)) for a in range(2000))
    s.load(("new_order", (1, 1, o), (o, 1, 1)) for o in range(1, 301))
    return s


def _txn(s: Storage, writes: dict) -> None:
    prepared, problem = s.prepare_writes(writes)
    assert problem is None
    s.apply(prepared)


def _state(s: Storage) -> tuple:
    s.materialize()
    tables = {t: dict(rows) for t, rows in s.tables.items() if rows}
    indexes = {t: list(s.index(t) or ()) for t in s.tables}
    return s.state_hash, s.static_hash, tables, {t: i for t, i in indexes.items() if i}


def _checkpoint(d: Path, chain: checkpoint.CheckpointChain, epoch: int) -> Path:
    planned = chain.plan(epoch)
    path = chain.write(
        d, planned, replica=0, partition=0, partitions=2, next_txn_id=10 * epoch, txns_applied=epoch
    )
    chain.written(planned)
    return path


def _history(d: Path, epochs: int = 3) -> tuple[Storage, list[Path], list[tuple]]:
    """A base at epoch 1, then a delta per epoch: updates, inserts, deletes, a key
    inserted and deleted within one interval, a deleted key inserted again."""
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    paths, states = [_checkpoint(d, chain, 1)], [_state(s)]
    for e in range(2, epochs + 1):
        _txn(s, {("account", (a,)): (e * 10_000 + a,) for a in range(e * 50, e * 50 + 100)})
        _txn(s, {("new_order", (1, 1, 300 + 10 * e + i)): (300 + e, 1, 1) for i in range(10)})
        _txn(s, {("new_order", (1, 1, o)): None for o in range(e * 5, e * 5 + 5)})
        _txn(s, {("new_order", (2, 2, 999)): (999, 2, 2)})
        _txn(s, {("new_order", (2, 2, 999)): None})
        _txn(s, {("new_order", (1, 1, (e - 1) * 5)): ((e - 1) * 5, 1, 1)})
        paths.append(_checkpoint(d, chain, e))
        states.append(_state(s))
    return s, paths, states


def test_a_chain_of_deltas_loads_to_the_state_at_each_checkpoint(tmp_path: Path) -> None:
    s, paths, states = _history(tmp_path, epochs=4)
    for path, state in zip(paths, states, strict=True):
        info, loaded = checkpoint.load(path)
        assert _state(loaded) == state
        assert loaded.recompute_hash() == (loaded.state_hash, loaded.static_hash)
    infos = [checkpoint.read_info(p) for p in paths]
    assert [(i.kind, i.depth, i.base_epoch) for i in infos] == [
        (checkpoint.BASE, 0, 1),
        (checkpoint.DELTA, 1, 1),
        (checkpoint.DELTA, 2, 1),
        (checkpoint.DELTA, 3, 1),
    ]
    assert infos[0].rows == 2300  # accounts and new orders; ITEM is in the static file
    # 100 accounts, 10 inserted, 5 deleted, 1 re-inserted, (2,2,999) as a deleted key
    assert infos[1].rows == 100 + 10 + 5 + 1 + 1
    assert len(list(tmp_path.glob("static-p0-*.ckpt"))) == 1
    assert checkpoint.chain_epochs(paths[-1]) == [4, 3, 2, 1]


def test_static_tables_are_written_once_and_a_corrupt_file_is_found_and_rewritten(
    tmp_path: Path,
) -> None:
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    _checkpoint(tmp_path, chain, 1)
    (static,) = tmp_path.glob("static-p0-*.ckpt")
    written = static.stat()
    chain.failed()  # no parent: the next one is a base too
    p2 = _checkpoint(tmp_path, chain, 2)
    assert (static.stat().st_ino, static.stat().st_mtime_ns) == (
        written.st_ino,
        written.st_mtime_ns,
    )
    data = bytearray(static.read_bytes())
    data[len(data) // 2] ^= 0x10
    static.write_bytes(bytes(data))
    # A writer changes the file's mtime; file timestamps are coarse (a few ms), so make
    # sure this one differs from the write's above, as it would in any real damage.
    os.utime(static, ns=(written.st_atime_ns, written.st_mtime_ns + 10**9))
    with pytest.raises(checkpoint.CheckpointInvalid) as bad:
        checkpoint.load(p2)
    assert bad.value.epoch == 2  # charged to the base that references it
    chain.failed()
    p3 = _checkpoint(tmp_path, chain, 3)  # a base checks the file, and rewrites it
    for path in (p2, p3):
        _, loaded = checkpoint.load(path)
        assert loaded.static_hash == s.static_hash and len(loaded.whole_tables()["item"]) == 500


def test_a_base_checks_the_static_file_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each base names the static file; it was checked (decoded) again at every base."""
    checks: list[Path] = []
    real = _check_hash_only

    def counting(path: Path, *a: Any, **kw: Any) -> checkpoint.CheckpointInfo:
        checks.append(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(ckpt_writer, "_check_hash_only", counting)
    ckpt_writer._static_seen.clear()  # as in a new process
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    _checkpoint(tmp_path, chain, 1)  # writes it
    (static,) = tmp_path.glob("static-p0-*.ckpt")
    ckpt_writer._static_seen.clear()
    for epoch in (2, 3):
        chain.failed()  # no parent: the next one is a base too
        _checkpoint(tmp_path, chain, epoch)
    assert checks == [static]  # checked once (digests), then known


def test_a_corrupt_delta_fails_every_checkpoint_after_it_and_is_named(tmp_path: Path) -> None:
    _, paths, states = _history(tmp_path, epochs=4)
    data = bytearray(paths[2].read_bytes())
    data[len(data) // 2] ^= 0x01
    paths[2].write_bytes(bytes(data))
    for path in paths[2:]:
        with pytest.raises(checkpoint.CheckpointInvalid) as bad:
            checkpoint.load(path)
        assert bad.value.epoch == 3
    info, loaded = checkpoint.load_newest(tmp_path, 0, 2)  # type: ignore[misc]
    assert info.epoch == 2 and _state(loaded) == states[1]


def _frames_of(path: Path) -> list[bytes]:
    data, offset, out = path.read_bytes(), 0, []
    while offset < len(data):
        (n,) = struct.unpack_from("<I", data, offset)
        out.append(data[offset + 8 : offset + 8 + n])
        offset += 8 + n
    return out


def _rewrite(path: Path, frames: list[bytes]) -> None:
    path.write_bytes(b"".join(encode_frame(f) for f in frames))


def test_a_missing_parent_or_a_doctored_parent_link_is_found(tmp_path: Path) -> None:
    _, paths, _ = _history(tmp_path, epochs=3)
    frames = _frames_of(paths[2])
    header = list(msgpack.unpackb(frames[0]))
    header[13] ^= 1  # parent_state_hash: a delta that claims another parent state
    _rewrite(paths[2], [msgpack.packb(header), *frames[1:]])
    with pytest.raises(checkpoint.CheckpointInvalid, match="parent link") as bad:
        checkpoint.load(paths[2])
    assert bad.value.epoch == 3
    paths[1].unlink()
    with pytest.raises(checkpoint.CheckpointInvalid, match="missing") as bad:
        checkpoint.load(paths[2])
    assert bad.value.epoch == 2


def _rows_payload(parts: list[bytes]) -> bytes:
    """A rows frame's payload (without its frame header) for encoded rows, its keys
    block naming the first row's table and every row's key (as a writer would)."""
    rows = [msgpack.unpackb(p, use_list=False) for p in parts]
    deleted = [i for i, r in enumerate(rows) if r[2] is None]
    packer = msgpack.Packer(autoreset=True)
    keys = [r[1] for r in rows]
    return _rows_frame(packer, rows[0][0], keys, deleted, parts)[8:]


def _doctor_first_row(path: Path) -> None:
    """Change one row of a checkpoint with every CRC and length still valid."""
    frames = _frames_of(path)
    rows, _, _ = _decode_rows(frames[1], path, None, True)
    table, key, row = rows[0]
    changed = (table, key, (row[0] + 1, *row[1:]))
    packer = msgpack.Packer(autoreset=True)
    parts = [packer.pack(r) for r in (changed, *rows[1:])]
    _rewrite(path, [frames[0], _rows_payload(parts), *frames[2:]])


@pytest.mark.parametrize("which", [0, 1])  # the base, a delta
def test_a_doctored_row_with_valid_crcs_is_found(tmp_path: Path, which: int) -> None:
    _, paths, _ = _history(tmp_path, epochs=3)
    _doctor_first_row(paths[which])
    with pytest.raises(checkpoint.CheckpointInvalid, match="hash to") as bad:
        checkpoint.load(paths[2])
    assert bad.value.epoch == which + 1


def test_a_chain_loads_its_deltas_unhashed_and_checks_the_state_it_returns(
    tmp_path: Path,
) -> None:
    """A chain's deltas are installed without hashing each overwritten row out; the
    state's hash, computed once from its rows, must equal the last header. A doctored
    delta whose row a later delta overwrites still loads the later state, which is
    right; loading its own epoch fails and names it (so does verify's check)."""
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    _checkpoint(tmp_path, chain, 1)
    _txn(s, {("account", (7,)): (1,)})
    p2 = _checkpoint(tmp_path, chain, 2)
    _txn(s, {("account", (7,)): (2,), ("new_order", (1, 1, 5)): None})
    p3 = _checkpoint(tmp_path, chain, 3)
    info, loaded = checkpoint.load(p3)
    assert _state(loaded) == _state(s) and loaded.state_hash == s.state_hash == info.state_hash
    _doctor_first_row(p2)  # account 7 holds (2,) in the file, valid CRCs
    assert _state(checkpoint.load(p3)[1]) == _state(s)
    with pytest.raises(checkpoint.CheckpointInvalid, match="hash to") as bad:
        checkpoint.load(p2)
    assert bad.value.epoch == 2
    _doctor_first_row(p3)  # the last state is wrong: the file-by-file load names it
    with pytest.raises(checkpoint.CheckpointInvalid, match="hash to") as bad:
        checkpoint.load(p3)
    assert bad.value.epoch == 2  # the first file whose state is wrong


def test_a_chain_loads_its_base_unhashed_too(tmp_path: Path) -> None:
    """A chain's base is not hashed on its own either (each base row is digested once,
    in the state's hash at the end): a doctored base row that a delta overwrites still
    loads the later state, which is right; loading the base's own epoch fails."""
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    p1 = _checkpoint(tmp_path, chain, 1)
    rows, _, _ = _decode_rows(_frames_of(p1)[1], p1, None, True)
    table, key, row = rows[0]  # the row _doctor_first_row changes
    _txn(s, {(table, key): (row[0] + 7, *row[1:])})
    p2 = _checkpoint(tmp_path, chain, 2)
    _doctor_first_row(p1)
    info, loaded = checkpoint.load(p2)
    assert _state(loaded) == _state(s) and info.epoch == 2
    with pytest.raises(checkpoint.CheckpointInvalid, match="hash to") as bad:
        checkpoint.load(p1)
    assert bad.value.epoch == 1


def test_check_validates_a_delta_against_a_replayed_state(tmp_path: Path) -> None:
    """Replay's way: the state at the parent plus the changes recorded while replaying
    the interval validate the delta without loading its chain."""
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    p1 = _checkpoint(tmp_path, chain, 1)
    writes = [
        {("account", (7,)): (1,), ("new_order", (1, 1, 1)): None},
        {("account", (7,)): (2,), ("new_order", (1, 1, 400)): (400, 1, 1)},
    ]
    for w in writes:
        _txn(s, w)
    p2 = _checkpoint(tmp_path, chain, 2)
    info1, replayed = checkpoint.load(p1)
    replayed.track_changes()
    for w in writes:
        _txn(replayed, w)
    since = (1, info1.state_hash)
    assert checkpoint.check(p2, replayed, since).epoch == 2
    with pytest.raises(checkpoint.CheckpointInvalid, match="parent hash"):
        checkpoint.check(p2, replayed, (1, info1.state_hash ^ 1))
    assert checkpoint.check(p1).kind == checkpoint.BASE
    _doctor_first_row(p2)
    with pytest.raises(checkpoint.CheckpointInvalid, match="hash to"):
        checkpoint.check(p2, replayed, since)


def test_check_reads_a_delta_by_its_bytes_in_any_order_and_decodes_what_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delta whose rows are the record's bytes passes without decoding its rows, in
    whatever order within a table (a live partition records keys in the order its
    transactions finished). Frames that mix tables, a row twice or one missing fall
    to the decoding path, which names the fault."""
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    p1 = _checkpoint(tmp_path, chain, 1)
    writes = {("account", (7,)): (1,), ("new_order", (1, 1, 1)): None}
    writes |= {("new_order", (1, 1, o)): (o, 1, 1) for o in range(400, 410)}
    _txn(s, writes)
    p2 = _checkpoint(tmp_path, chain, 2)
    info1, replayed = checkpoint.load(p1)
    replayed.track_changes()
    _txn(replayed, dict(reversed(writes.items())))  # the same writes, another order
    since = (1, info1.state_hash)
    fast: list[bool] = []
    real = ckpt_loader._delta_is_record
    monkeypatch.setattr(
        ckpt_loader, "_delta_is_record", lambda *a: fast.append(real(*a)) or fast[-1]
    )
    assert checkpoint.check(p2, replayed, since).epoch == 2
    head, accounts, orders, footer = _frames_of(p2)
    body = list(_keyed_frame(orders, p2, None)[1])
    shuffled = _rows_payload(body[::-1])
    _rewrite(p2, [head, accounts, shuffled, footer])
    assert checkpoint.check(p2, replayed, since).epoch == 2
    assert fast == [True, True]
    mixed = [*_keyed_frame(accounts, p2, None)[1], *body]
    _rewrite(p2, [head, _rows_payload(mixed), footer])
    with pytest.raises(checkpoint.CheckpointInvalid, match="do not name its rows"):
        checkpoint.check(p2, replayed, since)
    twice = _rows_payload([*body[:-1], body[0]])
    _rewrite(p2, [head, accounts, twice, footer])
    with pytest.raises(checkpoint.CheckpointInvalid, match="appears twice"):
        checkpoint.check(p2, replayed, since)
    assert fast == [True, True, False, False]


def test_prune_keeps_every_file_a_kept_checkpoint_needs(tmp_path: Path) -> None:
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    for e in range(1, 6):
        if e == 4:
            chain.failed()  # epoch 4: a new base
        _txn(s, {("account", (e,)): (e,)})
        _checkpoint(tmp_path, chain, e)
    (static,) = tmp_path.glob("static-p0-*.ckpt")
    markers = [checkpoint.mark_skipped(tmp_path, e, p, 0) for e, p in ((3, 0), (6, 0), (3, 1))]
    assert checkpoint.prune(tmp_path, 0, keep=3) == []  # 3 needs 2 and 1
    removed = checkpoint.prune(tmp_path, 0, keep=2)
    assert sorted(p.name for p in removed) == [
        *(checkpoint.checkpoint_name(e, 0) for e in (1, 2, 3)),
        checkpoint.skip_name(3, 0),  # before every kept checkpoint
    ]
    assert [m.exists() for m in markers] == [False, True, True]  # p1's is p1's to prune
    assert checkpoint.prune(tmp_path, 0, keep=1) == []  # 5 needs 4
    assert static.exists()
    _, loaded = checkpoint.load(tmp_path / checkpoint.checkpoint_name(5, 0))
    assert _state(loaded) == _state(s)


def test_copy_newest_complete_copies_whole_chains(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    stores = [_mixed_storage(), _mixed_storage()]
    chains = [checkpoint.CheckpointChain(s) for s in stores]
    for e in (1, 2):
        for part, (s, chain) in enumerate(zip(stores, chains, strict=True)):
            _txn(s, {("account", (e + part,)): (e,)})
            planned = chain.plan(e)
            chain.write(
                src, planned, replica=0, partition=part, partitions=2, next_txn_id=e, txns_applied=e
            )
            chain.written(planned)
    assert checkpoint.copy_newest_complete(src, dst, 2) == 2
    for part, s in enumerate(stores):
        _, loaded = checkpoint.load(dst / checkpoint.checkpoint_name(2, part))
        assert _state(loaded) == _state(s)


def test_the_chain_writes_a_base_when_its_deltas_grow_deep_or_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "checkpoint_chain_depth_max", 2)
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    kinds = []
    for e in range(1, 6):
        _txn(s, {("account", (e,)): (e,)})
        kinds.append(checkpoint.read_info(_checkpoint(tmp_path, chain, e)).kind)
    assert kinds == ["base", "delta", "delta", "base", "delta"]
    monkeypatch.setattr(limits, "checkpoint_chain_load_excess_max", 0.1)  # of 2,300 rows
    _txn(s, {("account", (a,)): (a,) for a in range(300)})
    assert s.tracking
    chain.bound_record()  # the next one is a base; recording goes on (its encoded rows)
    assert s.tracking and chain.tip is None
    assert checkpoint.read_info(_checkpoint(tmp_path, chain, 6)).kind == "base"
    assert s.tracking  # a delta may follow a base


def test_the_chain_bounds_what_a_load_costs_against_a_base_of_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain may cost a load (its base's rows, each delta row at
    DELTA_ROW_LOAD_WEIGHT) at most 1 + checkpoint_chain_load_excess_max times a base of
    the state: new keys count (a delta row lands in a full table), overwrites too."""
    monkeypatch.setattr(limits, "checkpoint_chain_load_excess_max", 0.25)
    assert checkpoint.DELTA_ROW_LOAD_WEIGHT == 1.5
    s = _mixed_storage()  # 2,300 partitioned rows
    chain = checkpoint.CheckpointChain(s)
    kinds = [checkpoint.read_info(_checkpoint(tmp_path, chain, 1)).kind]
    _txn(s, {("account", (a,)): (a,) for a in range(10_000, 10_100)})  # 2,450 <= 3,000
    kinds.append(checkpoint.read_info(_checkpoint(tmp_path, chain, 2)).kind)
    _txn(s, {("account", (a,)): (a,) for a in range(20_000, 30_000)})  # 17,450 > 15,500
    kinds.append(checkpoint.read_info(_checkpoint(tmp_path, chain, 3)).kind)
    for e, overwritten in ((4, range(1_000)), (5, range(1_000, 2_000)), (6, range(100))):
        _txn(s, {("account", (a,)): (e,) for a in overwritten})  # 13,900; 15,400; 15,550
        kinds.append(checkpoint.read_info(_checkpoint(tmp_path, chain, e)).kind)
    assert kinds == ["base", "delta", "base", "delta", "delta", "base"]
    _, loaded = checkpoint.load(tmp_path / checkpoint.checkpoint_name(5, 0))
    assert (
        loaded.state_hash
        == checkpoint.read_info(tmp_path / checkpoint.checkpoint_name(5, 0)).state_hash
    )


def test_bases_are_the_held_encodings_with_the_record_folded_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base writes the storage's encoded rows (kept from loads, updated from the change
    record when it is taken or restarted), never packing a row; transactions' writes
    do not touch them. Random updates, inserts and deletes across bases and deltas:
    every checkpoint loads to the live state, and the encodings stay exact."""
    monkeypatch.setattr(limits, "checkpoint_chain_depth_max", 2)
    rng = random.Random(7)
    s = _storage(300)
    chain = checkpoint.CheckpointChain(s)
    packed: list[int] = []
    real_pack = s._pack

    def counting(value: object) -> bytes:
        packed.append(1)
        return real_pack(value)  # type: ignore[no-any-return]

    for epoch in range(1, 10):
        for _ in range(40):
            key = ("account", (rng.randrange(400),))
            _txn(s, {key: None if rng.random() < 0.2 else (rng.randrange(10**6),)})
        packed.clear()
        s._pack = counting  # type: ignore[method-assign]
        path = _checkpoint(tmp_path, chain, epoch)
        s._pack = real_pack  # type: ignore[method-assign]
        # (epoch 1: the first base; the writes before it were not recorded, so it packs)
        if epoch > 1 and checkpoint.read_info(path).kind == checkpoint.BASE:
            assert not packed, "a base packed rows it held"
        assert _state(checkpoint.load(path)[1]) == _state(s)
        assert s.recompute_hash() == (s.state_hash, s.static_hash)  # encodings exact
    kinds = [checkpoint.read_info(p).kind for p in sorted(tmp_path.glob("0*-p0.ckpt"))]
    assert kinds.count(checkpoint.BASE) >= 3 and checkpoint.DELTA in kinds


def test_a_write_nothing_records_drops_the_encodings_and_a_base_packs_them_again(
    tmp_path: Path,
) -> None:
    s = _storage(50)
    assert len(s.encoded["account"]) == 50  # kept from the load
    _txn(s, {("account", (1,)): (7,)})  # not recorded: they would go stale
    assert not s.encoded["account"]
    chain = checkpoint.CheckpointChain(s)
    path = _checkpoint(tmp_path, chain, 1)  # a base: packs its rows, keeps them
    assert len(s.encoded["account"]) == 50
    assert _state(checkpoint.load(path)[1]) == _state(s)


def test_a_base_writer_holds_the_encoded_rows_and_the_storage_copies_before_changing_them(
    tmp_path: Path,
) -> None:
    """The base's capture is the storage's own encoded dicts (no copy); folding a later
    record while the writer still holds them copies first, so the file is the state
    at its boundary."""
    s = _storage(100)
    chain = checkpoint.CheckpointChain(s)
    _checkpoint(tmp_path, chain, 1)  # base; recording from here
    _txn(s, {("account", (a,)): (a,) for a in range(20)})
    at_boundary = _state(s)
    chain.tip = None  # the next one is a base
    planned = chain.plan(2)
    held = s.encoded["account"]
    writer = chain.writer(
        tmp_path, planned, replica=0, partition=0, partitions=2, next_txn_id=1, txns_applied=1
    )
    _txn(s, {("account", (a,)): None for a in range(10)})  # deletes, recorded
    s.take_changes()  # folded in while the writer holds the dict: copied first
    assert s.encoded["account"] is not held and len(held) == 100
    path = writer.finish()
    chain.written(planned)
    assert _state(checkpoint.load(path)[1]) == at_boundary
    assert s.recompute_hash() == (s.state_hash, s.static_hash)


def _base(d: Path, chain: checkpoint.CheckpointChain, epoch: int) -> checkpoint.CheckpointWriter:
    """Write a base at ``epoch`` now; its writer (copied_rows, layout)."""
    chain.tip = None  # the next one is a base
    planned = chain.plan(epoch)
    writer = chain.writer(
        d, planned, replica=0, partition=0, partitions=2, next_txn_id=epoch, txns_applied=epoch
    )
    writer.finish()
    chain.written(planned)
    return writer


def _table_bytes(writer: checkpoint.CheckpointWriter, table: str) -> list[bytes]:
    data = writer.path.read_bytes()
    return [data[o : o + n] for o, n, _ in writer.layout[table]]


def test_a_base_copies_the_frames_of_tables_that_only_grew_since_the_last_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table whose rows were only added to since the last base (new keys: an
    append-only table, or one nothing wrote) starts with that base's frames, copied as
    they are; only its new rows are packed. A table with a key written or deleted is
    packed whole. Every base loads to the live state either way."""
    monkeypatch.setattr(ckpt_writer, "ROWS_PER_FRAME", 64)
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    b1 = _base(tmp_path, chain, 1)
    assert b1.copied_rows == 0  # the first base packs (held encodings, no frames to copy)
    _txn(s, {("new_order", (1, 1, o)): (o, 1, 1) for o in range(301, 400)})
    _txn(s, {("account", (a,)): (a,) for a in range(10)})  # written: packed again
    _checkpoint(tmp_path, chain, 2)  # a delta between bases changes nothing here
    _txn(s, {("new_order", (2, 1, o)): (o, 2, 1) for o in range(1, 50)})
    b3 = _base(tmp_path, chain, 3)
    assert b3.copied_rows == 300  # NEW-ORDER's rows at the first base
    assert _table_bytes(b3, "new_order")[:5] == _table_bytes(b1, "new_order")
    assert _state(checkpoint.load(b3.path)[1]) == _state(s)
    checkpoint.check(b3.path)
    _txn(s, {("new_order", (1, 1, 5)): None})  # a delete: NEW-ORDER is packed whole
    b4 = _base(tmp_path, chain, 4)
    assert b4.copied_rows == 2000  # ACCOUNT, not written since the third base
    assert _state(checkpoint.load(b4.path)[1]) == _state(s)
    _txn(s, {("new_order", (2, 1, 7)): (70, 2, 1)})  # an overwrite: the same
    _txn(s, {("account", (5000,)): (1,)})  # a new key: ACCOUNT grew at its end
    b5 = _base(tmp_path, chain, 5)
    assert b5.copied_rows == 2000
    assert _state(checkpoint.load(b5.path)[1]) == _state(s)
    b6 = _base(tmp_path, chain, 6)  # nothing written: every frame copied
    assert b6.copied_rows == s.partitioned_row_count()
    assert b6.path.read_bytes()[8:] != b5.path.read_bytes()[8:]  # its own header
    assert _state(checkpoint.load(b6.path)[1]) == _state(s)
    chain.failed()  # after a failed writer the next base packs every row
    assert _base(tmp_path, chain, 7).copied_rows == 0


def test_a_base_never_copies_a_damaged_frame_or_from_a_replaced_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ckpt_writer, "ROWS_PER_FRAME", 64)
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    b1 = _base(tmp_path, chain, 1)
    offset, length, _ = b1.layout["new_order"][2]
    with open(b1.path, "r+b") as f:  # a bit flipped in NEW-ORDER's third frame
        f.seek(offset + length - 3)
        byte = f.read(1)
        f.seek(offset + length - 3)
        f.write(bytes([byte[0] ^ 1]))
    _txn(s, {("new_order", (1, 1, 301)): (301, 1, 1)})
    b2 = _base(tmp_path, chain, 2)
    assert b2.copied_rows == 2000 + 128  # ACCOUNT (before NEW-ORDER), two good frames
    assert "packs rows it would have copied" in caplog.text and "CRC" in caplog.text
    assert _state(checkpoint.load(b2.path)[1]) == _state(s)
    checkpoint.check(b2.path)
    other = _mixed_storage()  # a file of the same name that is not the base written
    checkpoint.write_checkpoint(
        tmp_path,
        other,
        replica=0,
        partition=0,
        partitions=2,
        epoch=2,
        next_txn_id=9,
        txns_applied=9,
    )
    _txn(s, {("new_order", (1, 1, 302)): (302, 1, 1)})
    b3 = _base(tmp_path, chain, 3)
    assert b3.copied_rows == 0 and "is not the base written" in caplog.text
    assert _state(checkpoint.load(b3.path)[1]) == _state(s)
    b3.path.unlink()  # gone: the next base packs
    assert _base(tmp_path, chain, 4).copied_rows == 0
    assert _state(checkpoint.load(tmp_path / checkpoint.checkpoint_name(4, 0))[1]) == _state(s)


def test_bases_copying_frames_load_to_the_state_under_random_appends_and_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mostly new keys (appends), some overwrites and deletes, deltas and bases at
    random: every checkpoint loads to the live state, and bases copy rows."""
    monkeypatch.setattr(ckpt_writer, "ROWS_PER_FRAME", 32)
    rng = random.Random(11)
    s = _mixed_storage()
    chain = checkpoint.CheckpointChain(s)
    copied = 0
    next_order = 1000
    for epoch in range(1, 40):
        for _ in range(rng.randrange(0, 30)):
            r = rng.random()
            if r < 0.8:
                next_order += 1
                _txn(s, {("new_order", (1 + next_order % 3, 1, next_order)): (next_order, 1, 1)})
            elif r < 0.9:
                _txn(s, {("account", (rng.randrange(2100),)): (rng.randrange(99),)})
            else:
                o = rng.randrange(1, next_order)
                _txn(
                    s, {("new_order", (1 + o % 3, 1, o)): None if rng.random() < 0.5 else (o, 1, 1)}
                )
        if rng.random() < 0.4:
            writer = _base(tmp_path, chain, epoch)
            copied += writer.copied_rows
            path = writer.path
        else:
            path = _checkpoint(tmp_path, chain, epoch)
        assert _state(checkpoint.load(path)[1]) == _state(s)
    assert copied > 10_000


def test_a_cloned_storage_writes_bases_of_its_own_rows(tmp_path: Path) -> None:
    """The simulator's genesis clones share rows, not encodings (a copy of them would go
    stale at the clone's first write): a base of a clone is the clone's state."""
    from executor.deterministic.workloads import clone_storage

    clone = clone_storage(_storage(50))
    _txn(clone, {("account", (1,)): (7,), ("account", (2,)): None})
    path = _checkpoint(tmp_path, checkpoint.CheckpointChain(clone), 1)
    assert _state(checkpoint.load(path)[1]) == _state(clone)


# Rows loaded pending: keys from their frames, rows decoded on first read ----------------
def test_a_loaded_chain_keeps_rows_pending_and_behaves_as_the_state_it_loads(
    tmp_path: Path,
) -> None:
    """A chain loads without decoding a row; reads, scans, overwrites, deletes and
    inserts of pending rows (a random sequence) then answer and hash as the live
    storage that wrote the chain does, and the change record and encoded rows agree."""
    live, paths, _ = _history(tmp_path, epochs=4)
    _, loaded = checkpoint.load(paths[-1])
    assert not loaded.tables["account"] and len(loaded.pending["account"]) == 2000
    assert loaded.row_count() == live.row_count()
    for s in (live, loaded):
        s.track_changes()
    rng = random.Random(5)
    for step in range(400):
        op = rng.randrange(5)
        if op == 0:
            key = ("account", (rng.randrange(2100),))
            assert loaded.get(*key) == live.get(*key), (step, key)
        elif op == 1:
            key = ("item", (rng.randrange(600),))
            assert loaded.get(*key) == live.get(*key), (step, key)
        elif op == 2:
            prefix = rng.choice([(1, 1), (2, 2), (1,), (1, 1, 320)])
            assert loaded.scan("new_order", prefix) == live.scan("new_order", prefix), step
        else:
            writes: dict[tuple[str, tuple], tuple | None] = {}
            for _ in range(rng.randrange(1, 6)):
                a = rng.randrange(2100)
                writes[("account", (a,))] = None if rng.random() < 0.3 else (step, a)
                o = rng.randrange(1, 400)
                writes[("new_order", (1, 1, o))] = None if rng.random() < 0.5 else (o, 1, 1)
            _txn(live, writes)
            _txn(loaded, writes)
        assert loaded.state_hash == live.state_hash, step
    assert loaded.take_changes() == live.take_changes()
    assert loaded.pending  # some rows were never read
    assert loaded.lend_encoded("account") == live.lend_encoded("account")
    assert loaded.recompute_hash() == (live.state_hash, live.static_hash)
    assert _state(loaded) == _state(live)


def _rewrite_keys(path: Path, change: Callable[[list], list], version: int | None = None) -> None:
    """Rewrite every rows frame's keys through ``change``, CRCs valid; with ``version``
    (2) write the file in that format instead (no keys)."""
    frames = _frames_of(path)
    head = list(msgpack.unpackb(frames[0]))
    if version is not None:
        head[1] = version
    out = [msgpack.packb(head)]
    for payload in frames[1:-1]:
        table, keys, deleted, parts = msgpack.unpackb(payload[1:])
        if version is None:
            out.append(b"R" + msgpack.packb([table, change(keys), deleted, parts]))
        else:
            lengths = struct.pack(f"<{len(parts)}I", *map(len, parts))
            array_header = msgpack.Packer().pack_array_header(len(parts))
            out.append(
                b"R" + struct.pack("<I", len(parts)) + lengths + array_header + b"".join(parts)
            )
    _rewrite(path, [*out, frames[-1]])


def test_keys_naming_another_row_fail_where_the_row_is_decoded(
    tmp_path: Path,
) -> None:
    """A frame's keys are the writer's word (CRCs vouch for their bytes): a load trusts
    them, and wherever a row is decoded its table and key must be the ones it was
    loaded under; a full check decodes every row and names the file."""
    s = _storage(100)
    path = _write(tmp_path, 3, s)
    _rewrite_keys(path, lambda keys: [keys[1], keys[0], *keys[2:]])
    info, loaded = checkpoint.load(path)  # the same bytes: the same hash
    assert loaded.state_hash == s.state_hash
    with pytest.raises(InvariantViolation, match="not the row of its key"):
        loaded.get("account", (0,))
    reads = cover_set([("account", (1,))])
    ctx = TxnContext(1, 0, 0, reads, frozenset(), loaded.get, loaded.scan)
    with pytest.raises(InvariantViolation):  # stops the process, never a call's result
        run_body(lookup("bank.balance"), (1,), ctx)
    with pytest.raises(checkpoint.CheckpointInvalid, match="do not name its rows") as bad:
        checkpoint.check(path)
    assert bad.value.epoch == 3
    with pytest.raises(InvariantViolation, match="not the row of its key"):
        checkpoint.load(path)[1].materialize()


def test_version_2_files_without_keys_still_load(tmp_path: Path) -> None:
    _, paths, states = _history(tmp_path, epochs=3)
    for p in [*paths, *tmp_path.glob("static-*.ckpt")]:
        _rewrite_keys(p, lambda keys: keys, version=2)
    assert checkpoint.read_info(paths[-1]).version == 2
    for path, state in zip(paths, states, strict=True):
        assert _state(checkpoint.load(path)[1]) == state


def test_a_checkpoint_carries_the_partitions_recent_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition restarted from a checkpoint answers a retry of a call it ran before
    the checkpoint (whose answer a crash lost) as it answered it then: the checkpoint
    carries the most recent answers, bounded in count and bytes, in frames a load skips."""
    monkeypatch.setattr(limits, "checkpoint_answers_max", 50)
    monkeypatch.setattr(limits, "checkpoint_frame_bytes_max", 4096)  # several frames
    r = LocalReplica(1)
    batches = [
        make_batch(e, (e - 1) * 20, 1000 + e, e, [("bank.open", (a, 1, 100)) for a in range(20)], 1)
        for e in range(1, 4)
    ]
    for b in batches[:2]:
        r.apply(b)
    part = r.parts[0]
    answers = part.answers.recent()
    assert len(answers) == 40 and [a[0] for a in answers] == list(range(40))
    answers += [(40 + i, 0, ("x" * 300,)) for i in range(60)]  # bounded: the newest 50
    path = checkpoint.write_checkpoint(
        tmp_path, part.storage, replica=0, partition=0, partitions=1, epoch=2,
        next_txn_id=part.next_txn_id, txns_applied=part.txns_applied, answers=answers,
    )  # fmt: skip
    info, storage = checkpoint.load(path)
    assert info.version == checkpoint.VERSION and storage.state_hash == part.storage.state_hash
    carried = checkpoint.read_answers(path)
    assert carried == answers[-50:]
    restored = LocalReplica(1, [storage]).parts[0]
    restored.restore(info.epoch, info.next_txn_id, info.txns_applied)
    restored.answers.remember(carried[:5])
    restored.answers.remember(carried[5:])
    assert restored.answers.lookup((99,)) == (0, ("x" * 300,))
    assert restored.answers.lookup((3,))[1][0] == "result_unknown"  # older than carried
    monkeypatch.setattr(limits, "checkpoint_answers_bytes_max", 1000)
    assert recent_answers(answers) == answers[-3:]  # 3 x ~310 bytes fit in 1000, 4 do not
