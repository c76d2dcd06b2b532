"""Replay core (executor.replay), no Spark: verify intervals, rebuild state, find the bad epoch.

Histories are built in-process (the honest LocalReplica writes the log and the
checkpoints exactly as live partitions do), then damaged in each way replay must
catch: a doctored batch with a valid CRC, a doctored routing, a flipped byte, a
corrupt or missing checkpoint, a torn tail, a pruned log, and an executor bug. One
test runs a real cluster and checks replay against the live replicas' hashes.
"""

from __future__ import annotations

import gc
import random
import struct
import sys
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import msgpack
import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from cluster.config import ClusterConfig
from cluster.replay_cli import replay_spec
from executor.core import checkpoint
from executor.core.storage import Storage
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.partition import Partition
from executor.deterministic.replica import LocalReplica
from executor.replay.batches import BatchAltered, LogGap
from executor.replay.boundaries import Boundary, scan_checkpoints
from executor.replay.diagnosis import dependency_suspects
from executor.replay.intervals import IntervalTask
from executor.replay.reconstruct import reconstruct
from executor.replay.spark_daemon import prefer_installed, source_zips
from executor.replay.spark_jobs import (
    LOAD_ROWS_PER_EPOCH,
    interval_costs,
    load_epochs,
    split_runs,
)
from executor.replay.spark_session import (
    ARCHIVE_LOG_OFF,
    DAEMON_MODULE,
    LIGHT_DRIVER_JVM,
    session_settings,
)
from executor.replay.spec import ReplaySpec, log_first_epoch, log_last_epoch
from executor.replay.tables import (
    history_layout,
    history_rows,
    split_epochs,
    table_columns,
    table_layout,
)
from executor.replay.verdicts import (
    BAD_CHECKPOINT,
    BATCH_INVALID,
    BY_BATCH,
    BY_CHECKPOINT,
    BY_DEPENDENCY,
    BY_DIGEST,
    BY_LOG,
    BY_SERIAL,
    DIVERGED,
    LOG_CORRUPT,
    PRUNED,
    TAIL,
)
from executor.replay.verify import (
    plan_history,
    plan_verify,
    verify_interval,
    verify_local,
    verify_run,
)
from sequencer.calls import make_batch
from sequencer.log import CommandLog, encode_frame, iter_frames, rewrite_payloads
from tests.heap_checks import no_cycles
from txn_library import limits, placement
from txn_library.procedure import lookup
from txn_library.wire import sequencer as wire

ACCOUNTS = 200
START = 1_000
TS0 = 1_700_000_000_000


@dataclass
class Built:
    cfg: ClusterConfig
    spec: ReplaySpec
    serial_hashes: dict[int, int]  # epoch -> whole-database hash after it (oracle)
    txn_epochs: dict[int, int]  # txn id -> epoch

    @property
    def ckpt(self) -> Path:
        return self.cfg.checkpoint_dir(0)


@pytest.fixture(autouse=True)
def long_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoint chains as long as these small histories allow: a transfer history
    rewrites most of the 200 accounts between checkpoints, which would otherwise make
    every other checkpoint a base."""
    monkeypatch.setattr(limits, "checkpoint_chain_load_excess_max", 100.0)


def build_history(
    d: Path,
    *,
    partitions: int = 2,
    epochs: int = 60,
    every: int = 10,
    per_epoch: int = 40,
    replicas: int = 1,
    seed: int = 1,
    chained: bool = False,
    deltas: bool = True,
    skip: frozenset[tuple[int, int]] = frozenset(),
    genesis_base: bool = False,
) -> Built:
    """A log of bank transfers and every replica's checkpoints every ``every`` epochs;
    ``chained``: each batch records its predecessor's digest, as the sequencer does;
    ``deltas``: checkpoints are written as live partitions write them (a base, then
    deltas: executor.core.checkpoint.CheckpointChain), else every one a base;
    ``skip``: (partition, epoch) boundaries a partition does not write, as when its
    previous writer is still busy; ``genesis_base``: every partition writes its genesis
    state as the base at epoch 0, as live partitions with periodic checkpoints do."""
    cfg = ClusterConfig(
        replicas=replicas,
        partitions=partitions,
        data_dir=str(d),
        procedure_modules=("txn_library.workloads.builtin",),
    )
    cfg.save()
    rng = random.Random(seed)
    log = CommandLog(cfg.log_dir, fsync=False)
    reps = [LocalReplica(partitions, replica=r, shuffle_seed=r) for r in range(replicas)]
    writers = [
        _writer(cfg, r, partitions, rep, deltas, skip, genesis_base) for r, rep in enumerate(reps)
    ]
    serial = SerialExecutor()
    hashes, txn_epochs, txn_id, prev_digest = {}, {}, 0, 0
    for e in range(1, epochs + 1):
        if e == 1:
            calls = [("bank.open", (0, ACCOUNTS, START))]
        else:
            calls = [
                (
                    "bank.transfer",
                    (rng.randrange(ACCOUNTS), rng.randrange(ACCOUNTS), rng.randint(1, 300)),
                )
                for _ in range(per_epoch)
            ]
        flags = wire.FLAG_CHECKPOINT if e % every == 0 else 0
        batch = make_batch(e, txn_id, TS0 + 10 * e, rng.getrandbits(63), calls, partitions)
        batch = batch._replace(flags=flags, prev_digest=prev_digest)
        # unchained: 7 fields, as logs were before the chain
        payload = wire.pack(batch if chained else batch[:7])
        prev_digest = wire.batch_digest(payload)
        log.append(e, payload)
        for rep, writer in zip(reps, writers, strict=True):
            rep.apply(batch, writer)
        serial.apply(batch)
        hashes[e] = serial.state_hash
        for i in range(len(calls)):
            txn_epochs[txn_id + i] = e
        txn_id += len(calls)
    log.close()
    return Built(cfg, replay_spec(cfg, cfg.log_dir), hashes, txn_epochs)


def _writer(  # type: ignore[no-untyped-def]
    cfg: ClusterConfig,
    r: int,
    partitions: int,
    rep: LocalReplica,
    deltas: bool,
    skip: frozenset[tuple[int, int]] = frozenset(),
    genesis_base: bool = False,
):
    chains = [checkpoint.CheckpointChain(p.storage) for p in rep.parts]

    def on_checkpoint(epoch: int, parts: list[Partition]) -> None:
        for p, chain in zip(parts, chains, strict=True):
            if (p.partition, epoch) in skip:  # its changes go into its next checkpoint
                checkpoint.mark_skipped(cfg.checkpoint_dir(r), epoch, p.partition, 0)
                continue
            if not deltas:
                chain.failed()  # no tip: a base
            planned = chain.plan(epoch)
            chain.write(
                cfg.checkpoint_dir(r),
                planned,
                replica=r,
                partition=p.partition,
                partitions=partitions,
                next_txn_id=p.next_txn_id,
                txns_applied=p.txns_applied,
            )
            chain.written(planned)

    if genesis_base:  # as a partition started from genesis writes it, before serving
        on_checkpoint(0, rep.parts)
    return on_checkpoint


def frame_offset(segment: Path, index: int) -> int:
    data, offset = segment.read_bytes(), 0
    for _ in range(index):
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 8 + length
    return offset


def with_txns(batch: wire.Batch, txns: list[wire.Txn]) -> bytes:
    """``batch`` with other txns, encoded as it was logged (7 fields if unchained)."""
    doctored = batch._replace(txns=tuple(txns))
    return wire.pack(doctored if batch.prev_digest is not None else doctored[:7])


def verdicts(rows: list[dict]) -> list[str]:
    return [r["verdict"] for r in rows]


def by_end(rows: list[dict], end: int | None) -> dict:
    return next(r for r in rows if r["end_epoch"] == end)


# Clean history --------------------------------------------------------------------------
@pytest.mark.parametrize("deltas", [True, False])
def test_every_interval_of_a_clean_history_verifies(tmp_path: Path, deltas: bool) -> None:
    b = build_history(tmp_path, replicas=2, deltas=deltas)
    kinds = {i.kind for i in checkpoint.list_checkpoints(b.ckpt)}
    assert kinds == ({checkpoint.BASE, checkpoint.DELTA} if deltas else {checkpoint.BASE})
    rows = verify_local(b.spec, b.ckpt)
    assert [(r["start_epoch"], r["end_epoch"]) for r in rows] == [
        (0, 10), (10, 20), (20, 30), (30, 40), (40, 50), (50, 60), (60, None)
    ]  # fmt: skip
    assert verdicts(rows) == ["ok"] * 6 + [TAIL]
    assert sum(r["txns"] for r in rows) == 1 + 59 * 40
    assert rows[0]["start_source"] == "genesis" and rows[1]["start_source"] == "checkpoint"
    assert all(r["replicas_agree"] for r in rows[:6])
    for r in rows[:6]:
        assert r["actual_hash"] == r["expected_hash"] == f"{b.serial_hashes[r['end_epoch']]:016x}"


@pytest.mark.parametrize("epoch", [1, 7, 10, 33, 60])
def test_reconstruct_any_epoch_equals_the_serial_oracle(tmp_path: Path, epoch: int) -> None:
    b = build_history(tmp_path)
    rc = reconstruct(b.spec, scan_checkpoints(b.ckpt, 2), epoch)
    assert rc.state_hash == b.serial_hashes[epoch]
    assert rc.start_epoch == epoch // 10 * 10  # the nearest checkpoint at or before
    assert rc.stats.epochs == epoch - rc.start_epoch
    assert rc.replica.last_epoch == epoch


def test_reconstruct_past_the_end_of_the_log_says_where_it_ends(tmp_path: Path) -> None:
    b = build_history(tmp_path, epochs=25)
    with pytest.raises(LogGap, match="ends at epoch 25"):
        reconstruct(b.spec, scan_checkpoints(b.ckpt, 2), 30)
    assert log_last_epoch(b.cfg.log_dir) == 25


# A changed history -------------------------------------------------------------------------
def test_doctored_argument_with_valid_crc_is_located(tmp_path: Path) -> None:
    b = build_history(tmp_path)
    target_epoch = 37
    data = dict(iter_frames(b.cfg.log_dir, target_epoch, target_epoch))[target_epoch]
    batch = wire.decode_batch(data)
    txns = list(batch.txns)
    src, dst, amount = txns[-1].args  # the last transfer of the epoch
    txns[-1] = txns[-1]._replace(args=(src, dst, amount + 1))
    rewrite_payloads(b.cfg.log_dir, {target_epoch: with_txns(batch, txns)})

    rows = verify_local(b.spec, b.ckpt)
    bad = by_end(rows, 40)
    assert bad["verdict"] == DIVERGED
    assert bad["located_by"] == BY_DEPENDENCY
    assert bad["suspect_first_epoch"] <= target_epoch <= bad["suspect_last_epoch"] <= 40
    assert bad["diff_rows"] >= 1
    assert f"account({src},)@" in bad["diff_sample"] or f"account({dst},)@" in bad["diff_sample"]
    assert bad["replicas_agree"] is None  # only one replica here
    others = [r for r in rows if r is not bad]
    assert set(verdicts(others)) == {"ok", TAIL}  # later intervals start from checkpoints


@pytest.mark.parametrize("target_epoch", [37, 40])  # inside an interval, and at its end
def test_doctored_chained_batch_is_located_at_its_exact_epoch(
    tmp_path: Path, target_epoch: int
) -> None:
    """With prev_digest (the sequencer's format) a batch changed after it was logged is
    found exactly, even when its frame CRC is valid: its successor vouches for it."""
    b = build_history(tmp_path, chained=True)
    assert set(verdicts(verify_local(b.spec, b.ckpt))) == {"ok", TAIL}
    data = dict(iter_frames(b.cfg.log_dir, target_epoch, target_epoch))[target_epoch]
    batch = wire.decode_batch(data)
    txns = list(batch.txns)
    src, dst, amount = txns[-1].args
    txns[-1] = txns[-1]._replace(args=(src, dst, amount + 1))
    # its own prev_digest is untouched, and still right
    rewrite_payloads(b.cfg.log_dir, {target_epoch: with_txns(batch, txns)})

    rows = verify_local(b.spec, b.ckpt)
    bad = by_end(rows, 40)
    assert bad["verdict"] == BATCH_INVALID
    assert bad["located_by"] == BY_DIGEST
    assert bad["bad_epoch"] == target_epoch
    assert f"batch {target_epoch} is not the batch the sequencer logged" in bad["detail"]
    others = [r for r in rows if r is not bad]
    assert set(verdicts(others)) == {"ok", TAIL}  # reported once, by its interval
    if target_epoch % 10:  # (a rebuild from checkpoint 40 on trusts that checkpoint)
        with pytest.raises(BatchAltered, match=f"epoch {target_epoch}:"):
            reconstruct(b.spec, scan_checkpoints(b.ckpt, 2), target_epoch)


def test_doctored_routing_is_located_at_its_exact_epoch(tmp_path: Path) -> None:
    b = build_history(tmp_path)
    e = 23
    batch = wire.decode_batch(dict(iter_frames(b.cfg.log_dir, e, e))[e])
    txns = list(batch.txns)
    i = next(i for i, t in enumerate(txns) if len(t.participants) == 2)
    txns[i] = txns[i]._replace(participants=txns[i].participants[:1])  # drop a participant
    rewrite_payloads(b.cfg.log_dir, {e: with_txns(batch, txns)})
    rows = verify_local(b.spec, b.ckpt)
    bad = by_end(rows, 30)
    assert (bad["verdict"], bad["bad_epoch"], bad["located_by"]) == (
        BATCH_INVALID,
        e,
        BY_BATCH,
    )
    assert "logged participants" in bad["detail"]
    assert sum(r["verdict"] != "ok" for r in rows) == 2  # this one and the tail


def test_flipped_byte_mid_log_is_located(tmp_path: Path) -> None:
    b = build_history(tmp_path)
    (segment,) = b.cfg.log_dir.glob("segment-*.log")
    data = bytearray(segment.read_bytes())
    data[frame_offset(segment, 44 - 1) + 8 + 20] ^= 0x10  # inside epoch 44's payload
    segment.write_bytes(bytes(data))
    rows = verify_local(b.spec, b.ckpt)
    bad = by_end(rows, 50)
    assert (bad["verdict"], bad["bad_epoch"], bad["located_by"]) == (
        LOG_CORRUPT,
        44,
        BY_LOG,
    )
    assert verdicts(rows)[:4] == ["ok"] * 4
    # Frames after a corrupt one in the same segment cannot be read: reported, not skipped.
    assert by_end(rows, 60)["verdict"] == LOG_CORRUPT
    assert "before this interval" in by_end(rows, 60)["detail"]


def test_torn_tail_is_cut_like_the_sequencer_does(tmp_path: Path) -> None:
    b = build_history(tmp_path, epochs=55)
    (segment,) = b.cfg.log_dir.glob("segment-*.log")
    segment.write_bytes(segment.read_bytes()[:-7])  # epoch 55 torn
    rows = verify_local(b.spec, b.ckpt)
    assert verdicts(rows) == ["ok"] * 5 + [TAIL]
    assert by_end(rows, None)["epochs"] == 4  # 51..54
    assert log_last_epoch(b.cfg.log_dir) == 54


def test_pruned_and_corrupt_segments_affect_only_their_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "segment_bytes_max", 16 * 1024)
    b = build_history(tmp_path, epochs=80)
    segments = sorted(b.cfg.log_dir.glob("segment-*.log"))
    assert len(segments) >= 4
    segments[0].unlink()  # pruned: the log now starts later
    first = log_first_epoch(b.cfg.log_dir)
    rows = verify_local(b.spec, b.ckpt)
    for r in rows:
        if r["start_epoch"] + 1 < first:
            assert r["verdict"] == PRUNED
        else:
            assert r["verdict"] in ("ok", TAIL), r
    assert any(r["verdict"] == PRUNED for r in rows)


# Broken checkpoints ----------------------------------------------------------------------
def test_corrupt_checkpoint_rows_are_reported_and_replay_falls_back(tmp_path: Path) -> None:
    b = build_history(tmp_path)
    path = b.ckpt / checkpoint.checkpoint_name(20, 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the rows: the header still reads fine
    path.write_bytes(bytes(data))
    rows = verify_local(b.spec, b.ckpt)
    ending, starting = by_end(rows, 20), by_end(rows, 30)
    assert (ending["verdict"], ending["bad_epoch"]) == (BAD_CHECKPOINT, 20)
    # The next interval is still verified, from the checkpoint before the bad one.
    assert (starting["verdict"], starting["replayed_from_epoch"]) == ("ok", 10)
    assert "invalid" in starting["detail"]
    assert sum(r["verdict"] == BAD_CHECKPOINT for r in rows) == 1


def test_replay_leaves_no_reference_cycles(tmp_path: Path) -> None:
    """Replay freezes what outlives each batch (Replayer.apply: heap.settle_turn), as
    partitions do each loop turn: verifying (a corrupt checkpoint among the files, so
    the reporting and fallback paths run too) and reconstructing must make no cycles."""
    b = build_history(tmp_path)
    path = b.ckpt / checkpoint.checkpoint_name(20, 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with no_cycles():
        rows = verify_local(b.spec, b.ckpt)
        rc = reconstruct(b.spec, scan_checkpoints(b.ckpt, 2), 33)
    assert sum(r["verdict"] == BAD_CHECKPOINT for r in rows) == 1
    assert rc.state_hash == b.serial_hashes[33]


def test_a_verify_run_gives_what_it_froze_back(tmp_path: Path) -> None:
    """Replay freezes what outlives each batch; a run ends with ``release_heap``, so a
    Spark worker, which runs many tasks, keeps nothing frozen between them."""
    b = build_history(tmp_path, epochs=20)
    rows = verify_local(b.spec, b.ckpt)
    assert verdicts(rows) == ["ok", "ok", TAIL]
    assert gc.get_freeze_count() == 0


def test_a_spark_run_retires_its_state_and_the_next_run_frees_it_first(tmp_path: Path) -> None:
    """A Spark task's run keeps its last state (freeing it would delay the rows); the
    next run in that worker frees it and gives the frozen heap back before loading."""
    from executor.core import heap

    b = build_history(tmp_path, epochs=20)
    tasks = plan_verify(b.spec, scan_checkpoints(b.ckpt, 2))
    assert verdicts(verify_run(tasks, keep=True)) == ["ok", "ok", TAIL]
    (state,) = heap._retired
    retired = weakref.ref(state)
    del state
    assert gc.get_freeze_count() > 0
    assert verdicts(verify_run(tasks[:1])) == ["ok"]
    assert retired() is None and not heap._retired
    assert gc.get_freeze_count() == 0


def _doctor_hash(path: Path) -> None:
    """Change the state hash in header and footer alike, with valid CRCs."""
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 0)
    header = list(msgpack.unpackb(data[8 : 8 + length]))
    header[8] ^= 1  # state_hash
    offset, frames = 0, []
    while offset < len(data):
        (n,) = struct.unpack_from("<I", data, offset)
        frames.append(data[offset + 8 : offset + 8 + n])
        offset += 8 + n
    footer = list(msgpack.unpackb(frames[-1]))
    footer[2] ^= 1
    frames[0], frames[-1] = msgpack.packb(header), msgpack.packb(footer)
    path.write_bytes(b"".join(encode_frame(f) for f in frames))


@pytest.mark.parametrize("epoch", [10, 40])  # a base, a delta
def test_checkpoint_with_a_doctored_hash_and_valid_crcs_is_reported(
    tmp_path: Path, epoch: int
) -> None:
    b = build_history(tmp_path)
    path = b.ckpt / checkpoint.checkpoint_name(epoch, 0)
    assert checkpoint.read_info(path).kind == (checkpoint.BASE if epoch == 10 else "delta")
    _doctor_hash(path)
    rows = verify_local(b.spec, b.ckpt)
    bad = by_end(rows, epoch)
    assert (bad["verdict"], bad["bad_epoch"], bad["located_by"]) == (
        BAD_CHECKPOINT,
        epoch,
        BY_CHECKPOINT,
    )
    assert "hash to" in bad["detail"]  # the rows' hash, recomputed, against the header's
    assert by_end(rows, epoch + 10)["verdict"] == "ok"
    assert sum(r["verdict"] == BAD_CHECKPOINT for r in rows) == 1


def test_missing_and_unreadable_checkpoints_do_not_merge_intervals(tmp_path: Path) -> None:
    b = build_history(tmp_path)
    (b.ckpt / checkpoint.checkpoint_name(30, 1)).unlink()
    (b.ckpt / checkpoint.checkpoint_name(50, 0)).write_bytes(b"\0" * 5)
    rows = verify_local(b.spec, b.ckpt)
    assert [r["end_epoch"] for r in rows] == [10, 20, 30, 40, 50, 60, None]
    assert by_end(rows, 30)["verdict"] == by_end(rows, 50)["verdict"] == BAD_CHECKPOINT
    assert "p1: missing" in by_end(rows, 30)["detail"]
    assert by_end(rows, 40)["replayed_from_epoch"] == 20
    assert by_end(rows, 40)["verdict"] == by_end(rows, 60)["verdict"] == "ok"


# An executor bug ----------------------------------------------------------------------------
def test_executor_bug_is_located_exactly_by_the_serial_oracle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = build_history(tmp_path)
    bug_txn = 1 + 40 * 25 + 3  # some transfer of epoch 27
    original = LocalReplica.apply

    # A lost update, as a broken executor would make: the replica's state is off by one
    # right after the batch holding bug_txn (planted around LocalReplica.apply, which
    # runs interpreted: Partition may be compiled, where patching a method changes no
    # compiled caller).
    def buggy(self: LocalReplica, batch, on_checkpoint=None) -> None:  # type: ignore[no-untyped-def]
        original(self, batch, on_checkpoint)
        first, txns = batch[2], batch[5]
        if not first <= bug_txn < first + len(txns):
            return
        for t, key in (
            lookup(txns[bug_txn - first][0]).footprint_of(txns[bug_txn - first][1]).writes
        ):
            part = self.parts[placement.partition_of(t, key, 2)]
            row = part.storage.get(t, key)
            part.storage.put(t, key, (row[0] + 1,))
            break

    monkeypatch.setattr(LocalReplica, "apply", buggy)
    rows = verify_local(b.spec, b.ckpt)
    bad = by_end(rows, 30)
    assert (bad["verdict"], bad["located_by"], bad["bad_epoch"]) == (
        DIVERGED,
        BY_SERIAL,
        b.txn_epochs[bug_txn],
    )
    assert [r["verdict"] for r in rows if r is not bad] == ["ok"] * 5 + [TAIL]


# Localization logic ------------------------------------------------------------------------
def _fp(epoch: int, txn: int, reads: set, writes: set) -> tuple:
    return (epoch, txn, frozenset(reads), frozenset(writes))


def test_dependency_suspects_follow_reads_into_writes() -> None:
    a, b, c, d = ("t", (1,)), ("t", (2,)), ("t", (3,)), ("t", (4,))
    txns = [
        _fp(1, 0, {a}, {a}),  # writes a; txn 2 reads a and writes c
        _fp(2, 1, {b}, {b}),  # writes b only
        _fp(3, 2, {a}, {c}),
        _fp(4, 3, {d}, {d}),  # unrelated
        _fp(5, 4, {b}, {b}),  # a later writer of b
    ]
    s = dependency_suspects(txns, [c])
    assert s.complete and s.txns == ((1, 0), (3, 2))
    s = dependency_suspects(txns, [b])
    assert s.txns == ((2, 1), (5, 4))  # a declared write may not happen: no kill
    s = dependency_suspects(txns, [c, b])
    assert not s.complete  # no single txn reaches both; the best reach one each
    assert s.txns == ((1, 0), (2, 1), (3, 2), (5, 4))
    assert dependency_suspects(txns, [("t", (9,))]).txns == ()


# History rows -----------------------------------------------------------------------------
def test_history_rows_flatten_arguments_per_procedure(tmp_path: Path) -> None:
    b = build_history(tmp_path, epochs=5)
    layout = history_layout()
    cols = [c for c, _ in layout.columns]
    assert {"arg_src", "arg_dst", "arg_amount", "arg_first", "arg_count"} <= set(cols)
    rows = [dict(zip(cols, r, strict=True)) for r in history_rows(b.spec, layout, 1, 5)]
    assert len(rows) == 1 + 4 * 40
    assert [r["txn_id"] for r in rows] == list(range(len(rows)))
    first, t = rows[0], rows[1]
    assert (first["procedure"], first["arg_first"], first["arg_count"]) == ("bank.open", 0, 200)
    assert first["arg_src"] is None and first["multi_partition"] is True
    assert t["procedure"] == "bank.transfer" and t["seq"] == 0 and t["epoch"] == 2
    assert t["args_json"] == f"[{t['arg_src']},{t['arg_dst']},{t['arg_amount']}]"
    assert t["batch_ts_ms"] == TS0 + 20
    assert t["multi_partition"] == (len(t["participants"]) > 1)


def test_history_layout_qualifies_conflicting_argument_names() -> None:
    from txn_library.procedure import Arg, Footprint, Procedure

    def proc(name: str, args: list[Arg]) -> Procedure:
        return Procedure(name, tuple(args), lambda *a: Footprint(), lambda ctx, *a: None)

    procs = {
        "x.a": proc("x.a", [Arg("k", "int"), Arg("ids", "list")]),
        "x.b": proc("x.b", [Arg("k", "str"), Arg("v", "any")]),
    }
    layout = history_layout(procs)
    assert dict(layout.arg_columns) == {
        "arg_x_a_k": "int",
        "arg_x_b_k": "str",
        "arg_ids": "int_list",
        "arg_v": "json",
    }


def test_split_epochs_covers_the_range_exactly() -> None:
    assert split_epochs(1, 10, 3) == [(1, 4), (5, 7), (8, 10)]
    assert split_epochs(5, 6, 8) == [(5, 5), (6, 6)]
    assert split_epochs(3, 2, 4) == []


def test_the_code_shipped_to_remote_spark_executors_holds_the_engine_and_workloads() -> None:
    """A remote master's executors import Ordo from this zip alone (addPyFile)."""
    import zipfile

    from executor.replay.spark_session import _code_zip

    with zipfile.ZipFile(_code_zip()) as z:
        names = set(z.namelist())
    for module in (
        "executor/replay/spark_jobs.py",
        "executor/deterministic/replica.py",
        "executor/core/storage.py",
        "sequencer/log.py",
        "scheduler/lock_manager.py",
        "txn_library/wire/sequencer.py",
        "tpcc/transactions/new_order.py",
    ):
        assert module in names, module
    assert not any(n.startswith("cluster/") for n in names)  # tasks never need the top


# Checkpoint chains and runs ---------------------------------------------------------------
def test_a_boundary_a_busy_partition_skipped_is_merged_but_a_lost_file_is_reported(
    tmp_path: Path,
) -> None:
    b = build_history(tmp_path, skip=frozenset({(1, 20)}))
    p1 = checkpoint.read_info(b.ckpt / checkpoint.checkpoint_name(30, 1))
    assert (p1.kind, p1.parent_epoch, p1.previous_epoch) == (checkpoint.DELTA, 10, 10)
    rows = verify_local(b.spec, b.ckpt)
    assert [r["end_epoch"] for r in rows] == [10, 30, 40, 50, 60, None]
    assert verdicts(rows) == ["ok"] * 5 + [TAIL]
    (b.ckpt / checkpoint.skip_name(20, 1)).unlink()  # the next header tells it alone
    again = verify_local(b.spec, b.ckpt)
    assert [r["end_epoch"] for r in again] == [10, 30, 40, 50, 60, None]
    assert verdicts(again) == ["ok"] * 5 + [TAIL]
    (b.ckpt / checkpoint.checkpoint_name(40, 1)).unlink()  # p1's 50 says it wrote 40
    rows = verify_local(b.spec, b.ckpt)
    assert [r["end_epoch"] for r in rows] == [10, 30, 40, 50, 60, None]
    assert by_end(rows, 40)["verdict"] == BAD_CHECKPOINT
    assert "p1: missing" in by_end(rows, 40)["detail"]


def test_a_skip_at_the_end_of_a_history_is_told_by_its_marker(tmp_path: Path) -> None:
    """At the last boundary no later checkpoint says the partition skipped it (its
    writer was busy when the history ended): the skip marker does. Without it the
    missing file is reported, as a lost one must be."""
    b = build_history(tmp_path, skip=frozenset({(1, 60)}))
    rows = verify_local(b.spec, b.ckpt)
    assert [r["end_epoch"] for r in rows] == [10, 20, 30, 40, 50, None]
    assert verdicts(rows) == ["ok"] * 5 + [TAIL]
    (b.ckpt / checkpoint.skip_name(60, 1)).unlink()
    rows = verify_local(b.spec, b.ckpt)
    assert by_end(rows, 60)["verdict"] == BAD_CHECKPOINT
    assert "p1: missing" in by_end(rows, 60)["detail"]


def test_a_run_of_intervals_loads_one_state_and_reports_what_single_intervals_do(
    tmp_path: Path,
) -> None:
    """Grouping intervals into runs (one Spark task each) changes no row but timings."""
    b = build_history(tmp_path)
    tasks = plan_verify(b.spec, scan_checkpoints(b.ckpt, 2))
    alone = [verify_interval(t) for t in tasks]
    runs = split_runs(tasks, 2)
    in_runs = [row for run in runs for row in verify_run(run)]
    assert [len(run) for run in runs] == [3, 4]
    timing = {"load_s", "replay_s", "check_s", "total_s", "cpu_s", "replay_txns_per_s"}
    timing |= {"worker", "started_at"}
    for a, r in zip(alone, in_runs, strict=True):
        assert {k: v for k, v in a.items() if k not in timing} == {
            k: v for k, v in r.items() if k not in timing
        }
    assert verdicts(in_runs) == ["ok"] * 6 + [TAIL]
    carried = [r["interval"] for r in in_runs if r["load_s"] == 0]
    assert in_runs[3]["load_s"] > 0 and {1, 2, 4, 5, 6} <= set(carried)  # run 2 loads once


def test_a_corrupt_delta_is_reported_once_and_the_intervals_after_it_verify(
    tmp_path: Path,
) -> None:
    """The chain after a corrupt delta does not load, but every later file is still
    checked on its own (against the replayed state) and the history verifies."""
    b = build_history(tmp_path)
    path = b.ckpt / checkpoint.checkpoint_name(30, 0)
    assert checkpoint.read_info(path).kind == checkpoint.DELTA
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x08
    path.write_bytes(bytes(data))
    rows = verify_local(b.spec, b.ckpt)
    assert by_end(rows, 30)["verdict"] == BAD_CHECKPOINT
    assert by_end(rows, 30)["bad_epoch"] == 30
    assert [r["verdict"] for r in rows if r["end_epoch"] != 30] == ["ok"] * 5 + [TAIL]
    assert by_end(rows, 40)["replayed_from_epoch"] == 20  # 30 does not load
    assert by_end(rows, 40)["start_invalid_epoch"] == 30


def test_the_genesis_bases_are_the_first_start_and_a_corrupt_one_is_reported(
    tmp_path: Path,
) -> None:
    b = build_history(tmp_path, genesis_base=True)
    assert checkpoint.read_info(b.ckpt / checkpoint.checkpoint_name(10, 0)).parent_epoch == 0
    rows = verify_local(b.spec, b.ckpt)
    assert verdicts(rows) == ["ok"] * 6 + [TAIL]
    assert rows[0]["start_source"] == "checkpoint" and rows[0]["replayed_from_epoch"] == 0
    rc = reconstruct(b.spec, scan_checkpoints(b.ckpt, 2), 5)
    assert rc.state_hash == b.serial_hashes[5] and rc.start_epoch == 0
    path = b.ckpt / checkpoint.checkpoint_name(0, 1)
    path.write_bytes(path.read_bytes()[:-3])  # torn
    rows = verify_local(b.spec, b.ckpt)
    assert (rows[0]["verdict"], rows[0]["bad_epoch"]) == (BAD_CHECKPOINT, 0)
    assert rows[0]["start_source"] == "genesis"  # replayed from the genesis function
    assert verdicts(rows)[1:] == ["ok"] * 5 + [TAIL]


def test_the_plan_counts_each_intervals_transactions_and_the_tails(tmp_path: Path) -> None:
    b = build_history(tmp_path)
    tasks = plan_history(b.spec, b.ckpt)
    assert [t.txns for t in tasks] == [r["txns"] for r in verify_run(tasks)]
    assert tasks[-1].end is None and tasks[-1].log_next_txn_id == max(b.txn_epochs) + 1


def test_runs_balance_transactions_where_the_boundaries_count_them() -> None:
    """Intervals of equal epochs need not hold equal transactions (live throughput
    varies; a finished run's tail is mostly empty epochs): runs are cut by the
    transactions the boundaries' (and the log's last batch's) txn ids count."""
    spec = ReplaySpec("unused", 2, ())
    ids = [0, 1000, 2000, 3000, 4000, 4100, 4200]  # next txn id at each 100-epoch boundary

    def b(i: int) -> Boundary:
        return Boundary(100 * i, ("a", "b"), (1, 1), next_txn_id=ids[i])

    tasks = [IntervalTask(i, spec, b(i), b(i + 1)) for i in range(6)]
    assert [t.txns for t in tasks] == [1000] * 4 + [100] * 2
    assert sum(interval_costs(tasks)) == pytest.approx(600)  # in epochs of mean density
    assert [len(r) for r in split_runs(tasks, 2)] == [2, 4]  # by epochs: [3, 3]
    tail = IntervalTask(4, spec, b(4), None, log_last_epoch=2000, log_next_txn_id=4010)
    assert (tail.cost, tail.txns) == (1600, 10)
    assert [len(r) for r in split_runs([*tasks[:4], tail], 2)] == [2, 3]  # by epochs: [4, 1]
    unknown = replace(tail, log_next_txn_id=None)  # the log's last batch did not decode
    assert unknown.txns is None and interval_costs([*tasks[:4], unknown])[-1] == 1600


def test_runs_are_cut_where_the_longest_run_is_shortest_counting_each_runs_load() -> None:
    """split_runs balances epochs plus the checkpoint load at each run's start: a cut
    just after a base (cheap to load) beats an even split before a long chain."""
    spec = ReplaySpec("unused", 2, ())

    def task(i: int, start: int, end: int | None, rows: int) -> IntervalTask:
        ends = None if end is None else Boundary(end, ("a", "b"), (1, 1))
        return IntervalTask(i, spec, Boundary(start, ("a", "b"), (1, 1), rows=rows), ends)

    scale = LOAD_ROWS_PER_EPOCH / 7_500  # the rows below are for 7,500 rows per epoch
    even = [task(i, 100 * i, 100 * (i + 1), 0) for i in range(6)]
    assert [len(r) for r in split_runs(even, 2)] == [3, 3]
    assert [len(r) for r in split_runs(even, 3)] == [2, 2, 2]
    # A long chain at 300 (300 epochs' worth to load), a fresh base at 400.
    loads = [round(r * scale) for r in (0, 10_000, 20_000, 3_000_000, 50_000, 60_000)]
    costly = [task(i, 100 * i, 100 * (i + 1), rows) for i, rows in enumerate(loads)]
    cut = split_runs(costly, 2)
    assert [len(r) for r in cut] == [4, 2] and cut[1][0].start.epoch == 400
    assert [t.index for r in split_runs(costly, 8) for t in r] == list(range(6))
    assert split_runs(costly[:1], 2) == [costly[:1]]
    # A chain's delta rows weigh more than a base's: the same rows, cut at the base.
    # At 200: 1,000,000 rows, all in deltas (200 epochs' worth, not 133); at 300: a base
    # of 1,875,000 (250 epochs); elsewhere too costly to start.
    loads = [round(r * scale) for r in (0, 9_000_000, 1_000_000, 1_875_000, 9_000_000, 9_000_000)]
    weighed = [task(i, 100 * i, 100 * (i + 1), rows) for i, rows in enumerate(loads)]
    weighed[2] = replace(weighed[2], start=replace(weighed[2].start, delta_rows=loads[2]))
    assert load_epochs(weighed[2].start) == 200 and load_epochs(weighed[3].start) == 250
    assert [len(r) for r in split_runs(weighed, 2)] == [3, 3]
    weighed[2] = replace(weighed[2], start=replace(weighed[2].start, delta_rows=0))
    assert [len(r) for r in split_runs(weighed, 2)] == [2, 4]
    # The tail counts its epochs up to the log's end when the plan knows it.
    tail = [*even[:4], replace(task(4, 400, None, 0), log_last_epoch=800)]
    assert tail[-1].cost == 400
    assert [len(r) for r in split_runs(tail, 2)] == [4, 1]
    assert [len(r) for r in split_runs([*tail[:-1], task(4, 400, None, 0)], 2)] == [2, 3]


# Exports (`ordo dump`) ------------------------------------------------------------------------
def test_export_writes_every_value_of_a_partition_as_csv_and_parquet(tmp_path: Path) -> None:
    """Each table with rows, sorted by key; in CSV values that are not scalars as JSON
    text (bytes as hex), in Parquet a column of mixed types as JSON text; a table
    declaring no columns keeps its values; replicated tables only from partition 0."""
    import csv

    import pyarrow.parquet as pq

    from executor.replay.export import export_storage
    from txn_library.catalog import Table, register_table

    register_table(Table("t_export_bare", key_len=2))  # no declared columns
    register_table(Table("t_export_copy", key_len=1, replicated=True, columns=("v",)))
    s = Storage()
    s.put("account", (2,), (20,))
    s.put("account", (1,), (b"\x01\xff",))
    s.put("account", (3,), ([1, {"a": None}],))
    s.put("t_export_bare", ("b", 1), (1.5, None, True))
    s.put("t_export_bare", ("a", 9), ("x",))
    s.put("t_export_copy", (1,), ("everywhere",))
    assert export_storage(s, tmp_path / "csv", 0, "csv") == {
        "account": 3,
        "t_export_bare": 2,
        "t_export_copy": 1,
    }
    with open(tmp_path / "csv" / "account" / "part-0000.csv", newline="") as fh:
        assert list(csv.reader(fh)) == [
            ["key_0", "balance"],
            ["1", "01ff"],
            ["2", "20"],
            ["3", '[1, {"a": null}]'],
        ]
    with open(tmp_path / "csv" / "t_export_bare" / "part-0000.csv", newline="") as fh:
        assert list(csv.reader(fh)) == [
            ["key_0", "key_1", "value_0", "value_1", "value_2"],
            ["a", "9", "x", "", ""],
            ["b", "1", "1.5", "", "True"],
        ]
    assert export_storage(s, tmp_path / "pq", 1, "parquet") == {"account": 3, "t_export_bare": 2}
    table = pq.read_table(tmp_path / "pq" / "account" / "part-0001.parquet")
    assert table.to_pydict() == {"key_0": [1, 2, 3], "balance": ['"01ff"', "20", '[1,{"a":null}]']}
    bare = pq.read_table(tmp_path / "pq" / "t_export_bare" / "part-0001.parquet")
    assert bare.to_pydict() == {
        "key_0": ["a", "b"],
        "key_1": [9, 1],
        "value_0": ['"x"', "1.5"],  # a string and a float: one type, JSON text
        "value_1": [None, None],
        "value_2": [None, True],
    }
    assert str(bare.schema.field("value_1").type) == "int64"
    with pytest.raises(ValueError, match="csv or parquet"):
        export_storage(s, tmp_path / "x", 0, "json")


def test_export_of_checkpoints_runs_partitions_side_by_side_and_reports_a_corrupt_one(
    tmp_path: Path,
) -> None:
    """Each partition's checkpoint exported in its own worker process; a corrupt file
    is the CheckpointInvalid it raised there, naming it."""
    from executor.replay.export import export_checkpoints

    paths = []
    for p in range(2):
        s = Storage()
        s.load(("account", (a,), (a * 10,)) for a in range(p, 100, 2))
        paths.append(
            checkpoint.write_checkpoint(
                tmp_path / "ck",
                s,
                replica=0,
                partition=p,
                partitions=2,
                epoch=3,
                next_txn_id=1,
                txns_applied=0,
            )
        )
    modules = ["txn_library.workloads.builtin"]
    assert export_checkpoints(paths, tmp_path / "out", "csv", modules) == {"account": 100}
    assert sorted(f.name for f in (tmp_path / "out" / "account").iterdir()) == [
        "part-0000.csv",
        "part-0001.csv",
    ]
    data = bytearray(paths[1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    paths[1].write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointInvalid, match=paths[1].name):
        export_checkpoints(paths, tmp_path / "again", "parquet", modules)


# Output directories --------------------------------------------------------------------------
def test_a_replay_job_that_fails_half_way_leaves_its_out_free_for_the_retry(tmp_path: Path) -> None:
    from executor.replay.export import MARKER, prepare_output, publish_output, staging_dir

    out = prepare_output(tmp_path / "verify", "verify")
    stage = staging_dir(out)
    stage.mkdir()
    (stage / "part-0.parquet").write_bytes(b"half")  # the job dies here
    out = prepare_output(tmp_path / "verify", "verify")  # the retry is not refused
    stage = staging_dir(out)
    assert not stage.exists()  # nor does it inherit the failed run's files
    stage.mkdir()
    (stage / "part-1.parquet").write_bytes(b"whole")
    publish_output(stage, out, "verify", {"rows": 1})
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "part-1.parquet"]
    assert not stage.exists()
    again = prepare_output(tmp_path / "verify", "verify", keep=True)
    stage = staging_dir(again)
    stage.mkdir()
    (stage / "part-2.parquet").write_bytes(b"half")  # a later run dies: the output stays
    assert sorted(p.name for p in again.iterdir()) == [MARKER, "part-1.parquet"]
    stage = staging_dir(prepare_output(tmp_path / "verify", "verify", keep=True))
    stage.mkdir()
    (stage / "part-3.parquet").write_bytes(b"whole")
    publish_output(stage, again, "verify", {"rows": 1})  # and its retry replaces it whole
    assert sorted(p.name for p in again.iterdir()) == [MARKER, "part-3.parquet"]
    again = prepare_output(tmp_path / "verify", "verify")  # without keep: emptied now
    assert not again.exists() or not any(again.iterdir())


def test_session_settings_light_driver_only_for_local_masters() -> None:
    """Verify and state run their work in Python tasks: on a local master their driver
    JVM compiles with tier 1 only; a remote master, or a job without light_driver,
    keeps the JVM's default, and the user's own conf wins."""
    key = "spark.driver.extraJavaOptions"
    assert session_settings("local[2]", None, True)[key] == LIGHT_DRIVER_JVM
    assert key not in session_settings("local[2]", None, False)
    assert key not in session_settings("spark://10.1.2.3:7077", None, True)
    assert key not in session_settings("spark://127.0.0.1:7077", None, True)
    mine = session_settings("local[*]", {key: "-Xss4m"}, True)
    assert mine[key] == "-Xss4m" and mine["spark.driver.host"] == "127.0.0.1"


def test_session_settings_map_the_driver_archive_on_any_master(tmp_path: Path) -> None:
    """With set-up's archive the driver JVM maps it, silently, on any master (the
    driver runs here), beside tier 1 where that applies; the user's conf replaces all."""
    key, archive = "spark.driver.extraJavaOptions", tmp_path / "driver.jsa"
    maps = f"-XX:SharedArchiveFile={archive} {ARCHIVE_LOG_OFF}"
    assert session_settings("local[2]", None, True, archive)[key] == f"{LIGHT_DRIVER_JVM} {maps}"
    assert session_settings("local[2]", None, False, archive)[key] == maps
    assert session_settings("spark://10.1.2.3:7077", None, True, archive)[key] == maps
    assert session_settings("local[2]", {key: "-Xss4m"}, True, archive)[key] == "-Xss4m"
    spaced = tmp_path / "a b" / "driver.jsa"  # the options are split at spaces
    assert key not in session_settings("local[2]", None, False, spaced)


def test_session_settings_daemon_module_only_for_local_masters() -> None:
    """On a local master the workers run this interpreter, so Spark starts Ordo's
    daemon (PySpark's, without the source zips); elsewhere Spark's own."""
    key = "spark.python.daemon.module"
    assert session_settings("local[2]", None, False)[key] == DAEMON_MODULE
    assert key not in session_settings("spark://127.0.0.1:7077", None, True)
    assert key not in session_settings("spark://10.1.2.3:7077", None, True)


def test_spark_daemon_drops_only_the_installed_source_zips(tmp_path: Path) -> None:
    """The zips go only when the pyspark found without them is the install that holds
    them; a zip from any other Spark home, or no installed pyspark, keeps the path."""
    import pyspark

    installed = Path(pyspark.__file__).parent
    zips = [str(installed / "python" / "lib" / z) for z in ("py4j-src.zip", "pyspark.zip")]
    path = [*zips, "/somewhere/else", *sys.path]
    kept = prefer_installed(path)
    assert kept == ["/somewhere/else", *sys.path]
    assert source_zips(kept) == []
    other = str(tmp_path / "pyspark" / "python" / "lib" / "pyspark.zip")  # another Spark home
    assert source_zips([other]) == [other]
    assert prefer_installed([other, *sys.path]) == [other, *sys.path]
    assert prefer_installed([*zips]) == [*zips]  # nothing installed on that path


def test_table_columns_sort_across_partitions_and_fit_rows_to_the_columns(tmp_path: Path) -> None:
    """A table as columns: every partition's rows sorted by key, pending rows decoded,
    a short row padded with None and a long one's extra value in a column of its own."""
    a, b = Storage(), Storage()
    for n in range(0, 9000, 2):
        a.put("account", (n,), (n * 10,))
    for n in range(1, 9000, 2):
        b.put("account", (n,), (n * 10,))
    b.put("account", (3,), ())  # short: padded
    b.put("account", (5,), (50, "extra"))  # long: one more column
    path = checkpoint.write_checkpoint(
        tmp_path, a, replica=0, partition=0, partitions=2, epoch=1, next_txn_id=1, txns_applied=0
    )
    loaded = checkpoint.load(path)[1]  # rows pending, in chunks of several decodings
    assert loaded.get("account", (8,)) == (80,) and loaded.pending
    names, cols, n = table_columns([loaded, b], table_layout("account"))
    assert n == 9000 and not loaded.pending
    assert names == ["key_0", "balance", "value_1"]
    assert cols[0] == list(range(9000))
    assert cols[1][:7] == [0, 10, 20, None, 40, 50, 60]
    assert cols[1][8999] == 89990
    assert cols[2][:7] == [None] * 5 + ["extra", None] and cols[2].count(None) == 8999
