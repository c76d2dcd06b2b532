"""Rebuilding the database at the end of any epoch from the history alone.

The state at the end of any epoch E is rebuilt by loading the nearest known state at
or before E (executor.replay.boundaries) and replaying the logged batches through
``LocalReplica`` (executor.replay.batches), exactly as verification replays them.

Invariants: a checkpoint is used only if it loads fully validated; one that does not
is skipped (and noted), falling back to an earlier one and finally to genesis, which
always loads. Nothing here writes to the log or checkpoint directories.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from executor.core.checkpoint import CheckpointInvalid
from executor.deterministic.replica import LocalReplica
from executor.replay.batches import Replayer, ReplayStats
from executor.replay.boundaries import GENESIS, Boundary, load_boundary
from executor.replay.spec import ReplaySpec


@dataclass
class Reconstruction:
    replica: LocalReplica
    epoch: int
    start_epoch: int
    stats: ReplayStats
    load_s: float
    replay_s: float
    notes: list[str]

    @property
    def state_hash(self) -> int:
        return self.replica.state_hash

    @property
    def partition_hashes(self) -> list[int]:
        return [p.storage.state_hash for p in self.replica.parts]


def reconstruct(spec: ReplaySpec, boundaries: Sequence[Boundary], epoch: int) -> Reconstruction:
    """The database at the end of ``epoch``: the newest valid state at or before it, replayed.

    Raises ReplayFailure / LogCorruption if the log cannot take it there.
    """
    spec.prepare()
    # (epoch-0 files: the partitions' genesis bases, cheaper to load than the genesis)
    candidates = [b for b in reversed(boundaries) if 0 <= b.epoch <= epoch and b.usable and b.paths]
    notes = [
        f"checkpoint at epoch {b.epoch} skipped: {'; '.join(b.problems)}"
        for b in boundaries
        if 0 < b.epoch <= epoch and not b.usable
    ]
    t0 = time.perf_counter()
    replica = None
    start = GENESIS
    for b in [*candidates, GENESIS]:
        try:
            replica = load_boundary(spec, b)
        except CheckpointInvalid as e:
            notes.append(f"checkpoint at epoch {b.epoch} skipped: {e}")
            continue
        start = b
        break
    assert replica is not None  # genesis always loads
    load_s = time.perf_counter() - t0
    replayer = Replayer(replica, spec.partitions)
    t1 = time.perf_counter()
    stats = replayer.run(spec.log_dir, epoch)
    return Reconstruction(
        replica, epoch, start.epoch, stats, load_s, time.perf_counter() - t1, notes
    )
