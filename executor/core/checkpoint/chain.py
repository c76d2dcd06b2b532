"""A partition's checkpoint chain (``CheckpointChain``): what its next checkpoint is, a
base or a delta of the keys written since its tip, and the tip it follows once written.

When a partition writes a base (chain policy, one home: ``CheckpointChain``): its first
checkpoint (a partition started from genesis with periodic checkpoints writes its
genesis state as a base at epoch 0, before it serves), after a failed writer, and once
the chain since the base holds ``limits.checkpoint_chain_depth_max`` deltas or would
cost a load more than ``limits.checkpoint_chain_load_excess_max`` beyond a base of the
same state (``ChainTip.wants_base``; a delta's row costs ``DELTA_ROW_LOAD_WEIGHT`` of
a base's). So writing a checkpoint costs the rows written since the last one, and
loading one costs at most a bounded multiple of the partition's own data; the static
tables cost one file per content.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from executor.core.checkpoint.format import Answer, CheckpointInfo
from executor.core.checkpoint.plan import ChainTip, PlannedCheckpoint, next_tip
from executor.core.checkpoint.writer import BaseFrames, CheckpointWriter
from executor.core.storage import Storage


class CheckpointChain:
    """A partition's checkpoint chain: what its next checkpoint is, and what it follows.

    The rule (one home for it): the next checkpoint is a delta of the keys written since
    the tip (the newest *written* checkpoint) unless there is no tip (genesis, a failed
    writer) or the tip wants a base (``ChainTip.wants_base``, checked as the record
    grows: ``bound_record``). Changes are recorded from the first checkpoint on, a key
    at most once (so the record never outgrows the partition): a delta is the record,
    and a base is the storage's encoded rows with the record folded in
    (``Storage.encoded``), so neither packs a row.
    Writing is the owner's: ``plan`` at the boundary, then ``writer`` (stepped by the
    owner's loop) or ``write`` (at once), then ``written`` or ``failed``.
    """

    def __init__(self, storage: Storage, restored: CheckpointInfo | None = None) -> None:
        self.storage = storage
        self.tip: ChainTip | None = None if restored is None else restored.tip
        self.written_epoch = 0 if restored is None else restored.epoch
        self.base: BaseFrames | None = None  # the last base written here (frames to copy)
        self._writing: CheckpointWriter | None = None
        if self.tip is not None:
            storage.track_changes()

    def bound_record(self) -> None:
        """Once the record has grown past what a delta may hold, the next checkpoint is a
        base. Recording goes on (it holds a key at most once, so it never outgrows the
        partition): the base's encoded rows are the storage's updated with it."""
        tip, storage = self.tip, self.storage
        if (
            tip is not None
            and storage.tracking
            and tip.wants_base(storage.changed_count(), storage.partitioned_row_count())
        ):
            self.tip = None

    def plan(self, epoch: int) -> PlannedCheckpoint:
        """The checkpoint of ``epoch`` (the state now); recording restarts from here."""
        storage = self.storage
        parent = self.tip
        changes = storage.take_changes() if parent is not None and storage.tracking else None
        rows = 0 if changes is None else sum(map(len, changes.values()))
        if (
            parent is None
            or changes is None
            or parent.wants_base(rows, storage.partitioned_row_count())
        ):
            parent, changes = None, None
            rows = storage.partitioned_row_count()
            storage.track_changes()  # the next delta records from this base on
        tip = next_tip(parent, epoch, storage.state_hash, storage.static_hash, rows)
        return PlannedCheckpoint(epoch, parent, changes, self.written_epoch, tip, rows)

    def writer(
        self,
        directory: Path,
        planned: PlannedCheckpoint,
        *,
        replica: int,
        partition: int,
        partitions: int,
        next_txn_id: int,
        txns_applied: int,
        answers: Sequence[Answer] = (),
    ) -> CheckpointWriter:
        """Start writing ``planned`` (call at its boundary: it captures the state now),
        with the partition's recent ``answers`` (format.py)."""
        self._writing = CheckpointWriter(
            directory,
            self.storage,
            planned,
            replica=replica,
            partition=partition,
            partitions=partitions,
            next_txn_id=next_txn_id,
            txns_applied=txns_applied,
            copy_from=self.base if planned.parent is None else None,
            answers=answers,
        )
        return self._writing

    def write(self, directory: Path, planned: PlannedCheckpoint, **ids: int) -> Path:
        """Write ``planned`` now, from the state at its boundary (the state now);
        ``ids`` as ``writer`` takes them."""
        w = self.writer(
            directory,
            planned,
            replica=ids["replica"],
            partition=ids["partition"],
            partitions=ids["partitions"],
            next_txn_id=ids["next_txn_id"],
            txns_applied=ids["txns_applied"],
        )
        return w.finish()

    def written(self, planned: PlannedCheckpoint) -> None:
        self.tip = planned.tip
        self.written_epoch = planned.epoch
        writer, self._writing = self._writing, None
        if planned.parent is None:  # the next base copies from this one if it can
            mine = writer is not None and writer.planned is planned
            self.base = writer.base_frames() if mine else None  # type: ignore[union-attr]
        self.storage.return_encoded()

    def failed(self) -> None:
        """The planned checkpoint was not written: its changes are lost to the chain (the
        next checkpoint is a base, which packs every row; recording goes on, for its
        encoded rows)."""
        self.tip = None
        self.base = self._writing = None
        self.storage.return_encoded()
