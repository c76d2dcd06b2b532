"""Reading the log's batches, checking them as the sequencer did, and applying them.

A batch is applied through ``LocalReplica``: the very Partition code (locks, read
exchange, execution) that runs live, with peer messages moved in memory.

Invariants
- The log is read only through ``sequencer.log.iter_frames`` (streaming, one frame in
  memory, stops at a torn tail exactly like the sequencer, raises LogCorruption for a
  bad frame in the middle). A reader of epochs a..b never pulls a frame past b + 1, and
  reads b + 1 only to check b's bytes against the digest it records (``prev_digest``).
- Batches are applied strictly in epoch order, and each is checked before it is
  applied (``BatchInvalid`` names the epoch): frame epoch == batch epoch, prev epoch ==
  epoch - 1, first txn id == the previous batch's next, every call names a registered
  procedure with schema-valid arguments, and its logged participants are exactly those
  the sequencer computes from the footprint. After a batch every partition is idle
  (in-process delivery finishes every transaction of the batch), or ``ReplayError``.
- Every ``ReplayFailure`` names its epoch and the interval verdict it implies
  (executor.replay.verdicts), and survives pickling (Spark ships task exceptions).
- Nothing here writes to the log.
- What outlives a batch is frozen (``heap.settle_turn``, as a partition's loop does
  each turn): replay makes no reference cycles (tests/unit/test_replay.py checks).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.core.heap import settle_turn
from executor.deterministic.replica import LocalReplica
from executor.replay.verdicts import (
    BATCH_INVALID,
    BY_DIGEST,
    LOG_MISSING,
    REPLAY_ERROR,
)
from sequencer.calls import participants as sequencer_participants
from sequencer.log import LogCorruption, iter_frames
from txn_library.errors import ABORTED, ERROR, BadRequest
from txn_library.procedure import Procedure, lookup_at
from txn_library.streams import batch_txns
from txn_library.wire import sequencer as wire


class ReplayFailure(Exception):
    """Replay cannot go on at ``epoch``; ``kind`` is the interval verdict it implies."""

    kind = REPLAY_ERROR

    def __init__(self, epoch: int, reason: str) -> None:
        super().__init__(f"epoch {epoch}: {reason}")
        self.epoch = epoch
        self.reason = reason

    def __reduce__(self) -> tuple[type[ReplayFailure], tuple[int, str]]:
        return (type(self), (self.epoch, self.reason))  # Spark pickles task exceptions


class BatchInvalid(ReplayFailure):
    """A logged batch that its frame's CRC vouches for but that no sequencer wrote."""

    kind = BATCH_INVALID


class BatchAltered(BatchInvalid):
    """A well-formed batch whose bytes are not those its successor vouches for
    (``prev_digest``): it was changed after it was logged."""

    located_by = BY_DIGEST


class LogGap(ReplayFailure):
    """The log does not hold ``epoch`` (pruned before it, or it ends earlier)."""

    kind = LOG_MISSING


class ReplayError(ReplayFailure):
    """Applying a batch failed (an invariant of the executor did not hold)."""

    kind = REPLAY_ERROR


def iter_batches(
    log_dir: str | Path, first: int, last: int | None = None
) -> Iterator[tuple[int, wire.Batch, int]]:
    """(epoch, batch, frame bytes) for first..last (None: to the end), structure-checked.

    Streams through iter_frames. Every batch's bytes are checked against the digest its
    successor records (``prev_digest``), so the frame after ``last`` is read too, only
    for that (its own problems are left to whoever reads it as part of its range). The
    newest batch of the log has no successor yet and cannot be checked. Raises LogGap
    if an epoch in the range is absent, BatchAltered for a batch changed after it was
    logged, LogCorruption / BatchInvalid otherwise.
    """
    if last is not None and last < first:
        return
    expected = first
    prev: bytes | None = None
    frames = iter_frames(log_dir, first, None if last is None else last + 1)
    try:
        for epoch, payload in frames:
            if last is not None and epoch > last:
                _vouch(prev, epoch, payload)
                return
            if epoch != expected:
                raise LogGap(expected, f"the log holds no epochs {expected}..{epoch - 1}")
            try:
                raw = wire.unpack(payload)
            except Exception as e:
                raise BatchInvalid(epoch, f"undecodable batch: {e}") from None
            batch = _checked_batch(epoch, raw)
            if prev is not None and batch.prev_digest is not None:
                _check_digest(epoch, batch.prev_digest, prev)
            yield epoch, batch, len(payload)
            prev = payload
            expected += 1
    except LogCorruption as e:
        if last is None or e.epoch <= last:
            raise  # (a bad frame after ``last`` is the next reader's to report)
    finally:
        frames.close()
    if last is not None and expected <= last:
        raise LogGap(expected, f"the log ends at epoch {expected - 1} (torn tail or truncated)")


def _check_digest(epoch: int, recorded: Any, prev: bytes) -> None:
    if type(recorded) is not int:
        raise BatchInvalid(epoch, f"prev_digest must be an int, got {recorded!r}")
    actual = wire.batch_digest(prev)
    if recorded != actual:
        raise BatchAltered(
            epoch - 1,
            f"batch {epoch - 1} is not the batch the sequencer logged: batch {epoch} "
            f"records digest {recorded:016x} of it, its bytes hash to {actual:016x} "
            f"(changed after it was written, e.g. re-encoded with a valid frame CRC)",
        )


def _vouch(prev: bytes | None, epoch: int, payload: bytes) -> None:
    """Check the batch before ``epoch`` against ``epoch``'s digest of it, if readable."""
    if prev is None:
        return
    try:
        batch = wire.unpack(payload)
    except Exception:
        return  # malformed: reported by the reader whose range holds it
    if isinstance(batch, tuple) and len(batch) in (8, 9, 10):
        recorded = batch[7]  # Batch.prev_digest
        if type(recorded) is int:  # anything else is the next reader's to report
            _check_digest(epoch, recorded, prev)


def _checked_batch(epoch: int, raw: Any) -> wire.Batch:
    problem = wire.batch_problem(raw)
    if problem is not None:
        raise BatchInvalid(epoch, problem)
    batch = wire.named_batch(raw)
    if batch.epoch != epoch or batch.prev_epoch != epoch - 1:
        raise BatchInvalid(
            epoch, f"frame {epoch} holds batch {batch.epoch} (prev {batch.prev_epoch})"
        )
    if batch.prev_digest is not None and type(batch.prev_digest) is not int:
        raise BatchInvalid(epoch, f"prev_digest must be an int, got {batch.prev_digest!r}")
    return batch


def _check_call(epoch: int, txn_id: int, txn: wire.Txn, partitions: int) -> Procedure:
    """The checks the sequencer made before logging the call, repeated on the log."""
    name, args, logged = txn.proc, txn.args, txn.participants
    try:
        proc = lookup_at(name, epoch)  # the version in force then
        if not isinstance(args, tuple):
            raise BadRequest("bad_arguments", "arguments must be an array")
        declared = len(proc.args)
        extra = len(args) - declared
        if extra not in ((0, 1) if proc.dependent else (0,)):
            raise BadRequest("bad_arguments", f"{len(args)} arguments, {declared} declared")
        proc.validate(args[:declared])
        expected = sequencer_participants(proc, args, partitions)
    except BadRequest as e:
        raise BatchInvalid(epoch, f"txn {txn_id} ({name!r}): {e.message}") from None
    if tuple(logged) != expected:
        raise BatchInvalid(
            epoch,
            f"txn {txn_id} ({name}{args!r}): logged participants {tuple(logged)}, "
            f"its footprint touches {expected}",
        )
    return proc


@dataclass
class ReplayStats:
    epochs: int = 0
    txns: int = 0
    multi_partition: int = 0
    aborted: int = 0
    errors: int = 0
    frame_bytes: int = 0
    first_ts_ms: int | None = None
    last_ts_ms: int | None = None


class Replayer:
    """Applies checked batches to a LocalReplica in epoch order.

    ``record_hashes`` keeps (epoch, replica hash) after every epoch, for locating a
    divergence against the serial oracle (two ints per epoch).
    """

    def __init__(self, replica: LocalReplica, partitions: int, record_hashes: bool = False) -> None:
        self.replica = replica
        self.partitions = partitions
        self.next_txn_id = replica.parts[0].next_txn_id
        self.last_epoch = replica.last_epoch
        self.stats = ReplayStats()
        self.hashes: list[tuple[int, int]] | None = [] if record_hashes else None

    def apply(self, epoch: int, batch: wire.Batch, frame_bytes: int = 0) -> None:
        if epoch != self.last_epoch + 1:
            raise LogGap(self.last_epoch + 1, f"next batch read is epoch {epoch}")
        first = batch.first_txn_id
        if first != self.next_txn_id:
            raise BatchInvalid(epoch, f"first txn id {first}, expected {self.next_txn_id}")
        txns = batch_txns(batch, self.partitions)  # a weak-recovery batch's steps too
        for i, txn in enumerate(txns):
            _check_call(epoch, first + i, txn, self.partitions)
        replica = self.replica
        try:
            replica.apply(batch)
        except Exception as e:
            raise ReplayError(epoch, f"{type(e).__name__}: {e}") from None
        if not replica.idle():
            stuck = sorted(t for p in replica.parts for t in p._active)[:5]
            raise ReplayError(epoch, f"transactions did not complete (e.g. txn ids {stuck})")
        self._count(batch, txns, frame_bytes)
        self.next_txn_id = first + len(txns)
        self.last_epoch = epoch
        if self.hashes is not None:
            self.hashes.append((epoch, replica.state_hash))
        settle_turn()  # what outlived the batch is never scanned, as in a partition's loop

    def _count(self, batch: wire.Batch, txns: tuple[wire.Txn, ...], frame_bytes: int) -> None:
        s = self.stats
        s.epochs += 1
        s.txns += len(txns)
        s.frame_bytes += frame_bytes
        s.multi_partition += sum(1 for t in txns if len(t.participants) > 1)
        ts = batch.timestamp_ms
        s.first_ts_ms = ts if s.first_ts_ms is None else s.first_ts_ms
        s.last_ts_ms = ts
        results = self.replica.results
        for status, _value in results.values():
            if status == ABORTED:
                s.aborted += 1
            elif status == ERROR:
                s.errors += 1
        results.clear()  # constant memory: the results are not needed, only counted

    def run(self, log_dir: str | Path, last: int | None) -> ReplayStats:
        for epoch, batch, nbytes in iter_batches(log_dir, self.last_epoch + 1, last):
            self.apply(epoch, batch, nbytes)
        return self.stats
