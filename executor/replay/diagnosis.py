"""Locating a divergence: which side is wrong when an interval's end hash differs, and where.

The live system has no state at inner epochs to compare with: partitions pipeline
epochs (txns of e+1 finish before those of e), and drain only at checkpoint-flagged
epochs. So only these references exist, and each is used for what it can prove:

1. Log framing and batch structure: exact. LogCorruption and BatchInvalid name the
   epoch (a flipped byte, a bad epoch/txn-id sequence, a call whose logged
   participants do not match its arguments). These are raised while reading
   (executor.replay.batches) and reported by executor.replay.verify.
2. An independent executor: the SerialExecutor (one Storage, txns one at a time in
   id order, no locks, no partitions) replays the same epochs from the same start
   state; its hash after every epoch is compared with the LocalReplica's recorded
   per-epoch hashes. The first epoch where they differ is exact; it means partitioned
   execution (locks, read exchange, partition code) is wrong there.
3. The end checkpoint, row by row: the rows that differ between the replayed state
   and the checkpoint (D). If the executors agree at every epoch, the log does not
   reproduce what the replicas executed (history was changed after the fact, or the
   procedure code differs from the code that ran). The changed epoch cannot be
   decided exactly from boundary data alone: two different live histories can end in
   the same checkpoint. What is sound is a candidate set: a transaction t can explain
   the difference on its own only if every row of D is reachable from t's writes
   through the declared footprints of later transactions (t writes a key that a later
   txn reads before writing, ... , a key of D). We compute, for each row of D, the
   txns that reach it (one backward pass over the interval's footprints, at lock
   granularity, never killing a key: a declared write may not happen), and intersect.
   If a single transaction was changed without changing its footprint, it is in this
   set; the report gives the set's first and last epoch. The other replica's
   checkpoints tell the remaining cause apart: replicas that agree with each other
   but not with the replay mean the log changed, not one replica.

Invariants: the serial pass and the row diff run only for a failing interval; memory
is bounded (DIFF_SAMPLE_MAX rows named, DIFF_KEYS_MAX differing keys kept,
DEPENDENCY_TARGETS_MAX of them used to localize, which only enlarges the set).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from executor.core import checkpoint
from executor.core.checkpoint import CheckpointInvalid
from executor.core.rows import row_digest
from executor.core.storage import Storage
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from executor.replay.batches import Replayer, iter_batches
from executor.replay.boundaries import Boundary, boundary_rows
from executor.replay.intervals import IntervalResult, IntervalTask, join_detail
from executor.replay.spec import ReplaySpec
from executor.replay.verdicts import (
    BAD_CHECKPOINT,
    BY_CHECKPOINT,
    BY_DEPENDENCY,
    BY_SERIAL,
    DIVERGED,
)
from txn_library import catalog, placement
from txn_library.procedure import lookup_at
from txn_library.streams import batch_txns

DIFF_SAMPLE_MAX = 20  # differing rows named in a report
DEPENDENCY_TARGETS_MAX = 64  # rows of D used to localize (a subset keeps the set sound)
DIFF_KEYS_MAX = 100_000  # differing keys kept for localizing (beyond: counted only)


@dataclass
class RowDiff:
    rows: int = 0
    sample: list[tuple[str, tuple]] = field(default_factory=list)
    keys: list[tuple[str, tuple]] = field(default_factory=list)  # up to a bound, for locating


def diff_against_checkpoint(storage: Storage, path: Path, diff: RowDiff) -> str | None:
    """Compare a replayed partition with its checkpoint row by row.

    Returns why the checkpoint itself is invalid (``checkpoint.load`` of its chain: CRC,
    footer, links, rows hash != header hash), or None if it is valid; differing rows
    (partitioned tables: replicated ones never change) are added to ``diff``.
    """
    try:
        _, saved = checkpoint.load(path)
    except CheckpointInvalid as e:
        return str(e)
    saved_tables, my_tables = saved.whole_tables(), storage.whole_tables()
    for table in sorted(set(saved_tables) | set(my_tables)):
        if saved.is_replicated(table):
            continue
        mine, theirs = my_tables.get(table, {}), saved_tables.get(table, {})
        for key in sorted(theirs.keys() | mine.keys()):
            a, b = mine.get(key), theirs.get(key)
            if a is None or b is None or row_digest(table, key, a) != row_digest(table, key, b):
                _add_diff(diff, table, key)
    return None


def _add_diff(diff: RowDiff, table: str, key: tuple) -> None:
    diff.rows += 1
    if len(diff.sample) < DIFF_SAMPLE_MAX:
        diff.sample.append((table, key))
    if len(diff.keys) < DIFF_KEYS_MAX:
        diff.keys.append((table, key))


@dataclass
class SerialCheck:
    """The serial oracle over an interval: where it first disagrees with the replica's
    per-epoch hashes (None: never), and the last epoch each watched row changed."""

    diverged_at: int | None
    last_changed: dict[tuple[str, tuple], int]


def serial_check(
    spec: ReplaySpec,
    start: Boundary,
    hashes: Sequence[tuple[int, int]],
    watch: Sequence[tuple[str, tuple]] = (),
) -> SerialCheck:
    """Replay ``hashes``' epochs with the SerialExecutor from the same start state.

    The oracle holds all partitions' rows in one Storage and runs txns one at a time
    in id order. Watched rows are compared after every epoch (a digest per row), so
    the report can say when each differing row last changed in the replay.
    """
    out = SerialCheck(None, {})
    if not hashes:
        return out
    storage = Storage()
    storage.load(boundary_rows(spec, start))
    serial = SerialExecutor(storage)
    want = dict(hashes)

    def digest(t: str, k: tuple) -> int | None:
        row = storage.get(t, k)
        return None if row is None else row_digest(t, k, row)

    seen = {w: digest(*w) for w in watch}
    for epoch, batch, _ in iter_batches(spec.log_dir, start.epoch + 1, hashes[-1][0]):
        serial.apply(batch)
        if serial.state_hash != want[epoch]:
            out.diverged_at = epoch
            return out
        for w, before in seen.items():
            now = digest(*w)
            if now != before:
                seen[w] = now
                out.last_changed[w] = epoch
    return out


@dataclass(frozen=True)
class Suspects:
    """Transactions that could alone explain a set of differing rows (see module doc)."""

    txns: tuple[tuple[int, int], ...]  # (epoch, txn id), in order
    complete: bool  # False: no single txn reaches every row; these reach the most


def _lock(table: str, key: tuple) -> tuple:
    return placement.lock_name(table, key)


def footprints(
    spec: ReplaySpec, first: int, last: int
) -> list[tuple[int, int, frozenset, frozenset]]:
    """(epoch, txn id, read locks, write locks) of every writing txn in first..last."""
    out = []
    for epoch, batch, _ in iter_batches(spec.log_dir, first, last):
        txn_id = batch.first_txn_id
        for txn in batch_txns(batch, spec.partitions):
            proc = lookup_at(txn.proc, epoch)
            if not proc.read_only:
                fp = proc.footprint(*txn.args)
                reads = frozenset(
                    _lock(t, k) for t, k in fp.reads if not catalog.table(t).replicated
                )
                writes = frozenset(_lock(t, k) for t, k in fp.writes)
                out.append((epoch, txn_id, reads, writes))
            txn_id += 1
    return out


def dependency_suspects(
    txns: Sequence[tuple[int, int, frozenset, frozenset]], targets: Sequence[tuple]
) -> Suspects:
    """Txns whose writes reach every target lock through later txns' declared footprints.

    One backward pass per target: ``need`` holds the locks whose value at that point
    can influence the target's final value; a txn writing into ``need`` reaches the
    target, and its reads join ``need``. Nothing leaves ``need`` (a declared write may
    not happen: aborts). Using a subset of the targets only enlarges the result.
    """
    counts = [0] * len(txns)
    chosen = sorted(set(targets), key=repr)[:DEPENDENCY_TARGETS_MAX]
    for target in chosen:
        need = {target}
        for i in range(len(txns) - 1, -1, -1):
            _e, _t, reads, writes = txns[i]
            if not writes.isdisjoint(need):
                counts[i] += 1
                need |= reads
    best = max(counts, default=0)
    if best == 0:
        return Suspects((), False)
    picked = tuple((txns[i][0], txns[i][1]) for i, c in enumerate(counts) if c == best)
    return Suspects(picked, best == len(chosen))


def diagnose(
    task: IntervalTask,
    res: IntervalResult,
    replica: LocalReplica,
    replayer: Replayer,
    used: Boundary,
) -> None:
    """The hash differs at the end boundary: which side is wrong, and where."""
    end = task.end
    assert end is not None
    diff = RowDiff()
    bad = []
    for p, part in enumerate(replica.parts):
        if end.hashes[p] == part.storage.state_hash:
            continue  # this partition agrees: its rows cannot differ (up to the hash)
        problem = diff_against_checkpoint(part.storage, Path(end.paths[p]), diff)
        if problem is not None:
            bad.append(f"p{p}: {problem}")
    if bad:
        res.verdict = BAD_CHECKPOINT
        res.bad_epoch = end.epoch
        res.located_by = BY_CHECKPOINT
        res.detail = join_detail(
            res.detail, f"end checkpoint at epoch {end.epoch} invalid: " + "; ".join(bad)
        )
        return
    res.verdict = DIVERGED
    res.diff_rows = diff.rows
    named = ", ".join(f"{t}{k!r}" for t, k in diff.sample[:5])
    if not task.locate:
        res.detail = join_detail(
            res.detail, f"{diff.rows} rows differ from the checkpoint ({named})"
        )
        return
    assert replayer.hashes is not None
    watch = diff.sample[:DIFF_SAMPLE_MAX]
    check = serial_check(task.spec, used, replayer.hashes, watch)
    if check.diverged_at is not None:
        res.bad_epoch = check.diverged_at
        res.located_by = BY_SERIAL
        res.detail = join_detail(
            res.detail,
            f"partitioned execution differs from the serial executor from epoch "
            f"{check.diverged_at} on (an executor bug, not the log); {diff.rows} rows differ "
            f"at epoch {end.epoch} ({named})",
        )
        return
    changed = [f"{t}{k!r}@{check.last_changed.get((t, k), used.epoch)}" for t, k in watch]
    res.diff_sample = ", ".join(changed)
    fps = footprints(task.spec, used.epoch + 1, end.epoch)
    suspects = dependency_suspects(fps, [_lock(t, k) for t, k in diff.keys])
    res.located_by = BY_DEPENDENCY
    res.suspect_txns = len(suspects.txns)
    if suspects.txns:
        res.suspect_first_epoch = suspects.txns[0][0]
        res.suspect_last_epoch = suspects.txns[-1][0]
        if res.suspect_first_epoch == res.suspect_last_epoch:
            res.bad_epoch = res.suspect_first_epoch
    res.detail = join_detail(
        res.detail,
        f"the log does not reproduce the checkpointed state (serial and partitioned replay "
        f"agree at every epoch): {diff.rows} rows differ at epoch {end.epoch}; "
        f"{_explain(suspects)}; the differing rows last changed in the replay at "
        f"(row@epoch): {', '.join(changed[:5])}",
    )


def _explain(s: Suspects) -> str:
    if not s.txns:
        return "no transaction of the interval can reach the differing rows"
    first, last = s.txns[0], s.txns[-1]
    if s.complete:
        return (
            f"a single changed transaction would be one of {len(s.txns)} txns in epochs "
            f"{first[0]}..{last[0]} (latest: txn {last[1]} in epoch {last[0]})"
        )
    return (
        f"no single transaction reaches every differing row; the {len(s.txns)} that reach "
        f"the most are in epochs {first[0]}..{last[0]}"
    )
