"""The checkpoints a partition process writes: when, and the writer that writes them.

After a flagged epoch the partition stops applying batches until its active
transactions drain, then captures the rows of its checkpoint (a delta of the keys
written since the last written checkpoint, or a base: executor.core.checkpoint) and
goes straight back to work; the loop packs the captured rows a slice per turn and a
thread writes them. The partition stalls only for the drain and the capture, never
for an old writer: a boundary reached while one runs is recorded but not written (its
changes go into the next checkpoint; see ``take_boundary``). The boundary (epoch,
hash) is recorded at the capture, but the checkpoint counts (status
``newest_checkpoint_epoch``, which ``ordo dump``, ``ordo checkpoint`` and log pruning
trust) only once the loop, which turns at least every 50 ms, finds the writer done
(``advance_writer``): the file renamed into place and its directory fsynced. A
partition started from genesis with periodic checkpoints writes the genesis state as
its first base before it serves (``write_genesis_base``).

No sockets here: the partition server (cluster/partition_server.py) owns one
``PartitionCheckpoints``, lets held batches resume when a boundary is taken, and tells
the sequencer and its peers when a checkpoint becomes durable.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from cluster.config import ClusterConfig
from cluster.metrics.buckets import LATENCY_BOUNDS_S, Buckets
from executor.core import checkpoint
from executor.deterministic.partition import Partition

log = logging.getLogger("ordo.replica")

WRITER_STEP_S = 0.004  # checkpoint packing per loop turn while transactions run ...
WRITER_STEP_IDLE_S = 0.03  # ... and while the partition is idle
CHECKPOINT_BOUNDS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class PartitionCheckpoints:
    """The checkpoint chain of one partition of one replica and the file being written
    (one at a time)."""

    def __init__(
        self,
        config: ClusterConfig,
        replica: int,
        partition: int,
        part: Partition,
        checkpoint_dir: Path,
        restored: checkpoint.CheckpointInfo | None,
    ) -> None:
        self.config = config
        self.replica = replica
        self.partition_id = partition
        self.part = part
        self.checkpoint_dir = checkpoint_dir
        self.skipped = 0  # boundaries not written: the previous writer was busy
        self.failed = 0  # checkpoint files whose writing failed
        # For cluster.metrics: boundary to durable, and the batches' stop (drain, capture).
        self.write_seconds = Buckets(CHECKPOINT_BOUNDS_S)
        self.pause_seconds = Buckets(LATENCY_BOUNDS_S)
        # What the next checkpoint is (a delta since the newest written one, or a base).
        self._chain = checkpoint.CheckpointChain(
            part.storage, restored if restored is not None and config.checkpoint_keep > 0 else None
        )
        self.writer: checkpoint.CheckpointWriter | None = None  # the file being written
        self._drain_started: float | None = None  # when a due checkpoint was first seen

    def take_boundary(self) -> bool:
        """At a drained checkpoint boundary record it and start writing its file (a delta
        of the keys written since the last written checkpoint, or a base). True when the
        boundary was taken: batches held for it may resume.

        The writer (executor.core.checkpoint.CheckpointWriter) captures the boundary's
        rows at once, then packs them a slice per loop turn and a thread writes them:
        the partition never stops for it. It never waits for an old writer either: a
        boundary reached while the previous file is still being written is recorded
        (its hash is compared across replicas as always) but not written here, and its
        changes go into the next checkpoint, whose header names the last written one.
        One writer at a time, as PostgreSQL never runs two checkpoints at once and
        Redis refuses a BGSAVE while one runs: two would only compete for the same CPU
        and disk. Logged and counted (``skipped``); status shows it as
        ``newest_checkpoint_epoch`` behind ``boundary_epoch``.
        """
        part = self.part
        self._chain.bound_record()
        if part.checkpoint_due is not None and self._drain_started is None:
            self._drain_started = time.monotonic()
        if not part.checkpoint_ready():
            return False
        keep = self.config.checkpoint_keep
        if keep > 0 and self.writer is not None and part.checkpoint_requested:
            # A client asked for this boundary (ordo checkpoint, ordo dump): batches wait
            # here while advance_writer finishes the previous file unpaced, then it is
            # written like any other (PostgreSQL's CHECKPOINT likewise finishes the
            # running checkpoint at full speed). Status goes on meanwhile.
            return False
        drain_s = time.monotonic() - (self._drain_started or time.monotonic())
        self._drain_started = None
        if keep <= 0:
            part.checkpoint_taken()  # a boundary to compare, no file: never durable
            return True
        epoch = part.checkpoint_due
        assert epoch is not None
        if self.writer is not None:
            self.skipped += 1
            try:
                checkpoint.mark_skipped(
                    self.checkpoint_dir, epoch, self.partition_id, self.writer.planned.epoch
                )
            except OSError as e:  # the next checkpoint's header still tells
                log.warning("could not mark the skipped checkpoint %d: %s", epoch, e)
            log.warning(
                "checkpoint at epoch %d not written: the one of epoch %d is still being "
                "written (its changes go into the next checkpoint; %d skipped so far)",
                epoch,
                self.writer.planned.epoch,
                self.skipped,
            )
            part.checkpoint_taken()
            return True
        t0 = time.monotonic()
        planned = self._chain.plan(epoch)
        self.writer = self._chain.writer(
            self.checkpoint_dir, planned, answers=part.answers.recent(), **self._checkpoint_ids()
        )
        part.checkpoint_writing = epoch
        self._writer_started = t0
        self._drain_s = drain_s
        self._capture_s = time.monotonic() - t0
        self._writer_cpu_s = 0.0
        self.pause_seconds.add(drain_s + self._capture_s)
        part.checkpoint_taken()  # boundary recorded, batches resume; not durable yet
        return True

    def advance_writer(self, block: bool) -> bool:
        """Advance the checkpoint writer (``block``: to its end); once its file is in
        place and the directory fsynced, the checkpoint counts (``checkpoint_durable``)
        and is the next delta's parent: True then. After a failed writer the next one is
        a base."""
        writer = self.writer
        if writer is None:
            return False
        part = self.part
        if block:
            writer.complete()
        else:
            cpu0 = time.process_time()
            # unpaced while a requested boundary waits for it (take_boundary)
            waited_for = part.checkpoint_requested and part.checkpoint_due is not None
            writer.step(WRITER_STEP_IDLE_S if part.idle() else WRITER_STEP_S, pace=not waited_for)
            self._writer_cpu_s += time.process_time() - cpu0
        outcome = writer.outcome
        if outcome is None:
            return False
        self.writer = None
        part.checkpoint_writing = -1
        planned = writer.planned
        if outcome is not True:
            log.error(
                "checkpoint at epoch %d failed (%s); the next one is a base",
                planned.epoch,
                outcome,
            )
            self._chain.failed()
            self.failed += 1
            return False
        self._chain.written(planned)
        self.part.checkpoint_durable(planned.epoch)
        self.write_seconds.add(time.monotonic() - self._writer_started)
        removed = checkpoint.prune(
            self.checkpoint_dir, self.partition_id, self.config.checkpoint_keep
        )
        log.info(
            "checkpoint at epoch %d written (%s, %d rows, %d copied from the last base) in "
            "%.2fs: drain %.1fms, capture %.1fms, packing %.2fs CPU in the loop; pruned %d old",
            planned.epoch,
            "base" if planned.parent is None else f"delta {planned.tip.depth}",
            planned.rows,
            writer.copied_rows,
            time.monotonic() - self._writer_started,
            1000 * self._drain_s,
            1000 * self._capture_s,
            self._writer_cpu_s,
            len(removed),
        )
        return True

    def _checkpoint_ids(self) -> dict[str, int]:
        """Who writes a checkpoint and the counters it records (the writer's header)."""
        part = self.part
        return dict(
            replica=self.replica,
            partition=self.partition_id,
            partitions=self.config.partitions,
            next_txn_id=part.next_txn_id,
            txns_applied=part.txns_applied,
        )

    def periodic(self) -> bool:
        c = self.config
        return c.checkpoint_keep > 0 and (c.checkpoint_every_epochs > 0 or c.checkpoint_every_s > 0)

    def write_genesis_base(self) -> None:
        """Write the genesis state as the base of the chain (epoch 0), before serving.

        With periodic checkpoints the first one would otherwise be a base written while
        serving (every row of the partition); written now it costs start-up time
        instead, and every checkpoint after it can be a delta. A restart before the
        first periodic checkpoint loads it instead of generating the genesis again.
        """
        t0 = time.monotonic()
        planned = self._chain.plan(0)
        try:
            self._chain.write(self.checkpoint_dir, planned, **self._checkpoint_ids())
        except OSError as e:
            log.error("genesis base not written (%s); the first checkpoint is a base", e)
            self._chain.failed()
            return
        self._chain.written(planned)
        log.info("genesis base written (%d rows) in %.1fs", planned.rows, time.monotonic() - t0)
