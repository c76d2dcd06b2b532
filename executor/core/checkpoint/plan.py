"""The plan of a partition's next checkpoint: the tip of its chain (``ChainTip``), the
rule for when the next one is a base (``ChainTip.wants_base``), the tip after it
(``next_tip``), and what the checkpoint of a boundary will be (``PlannedCheckpoint``).

Values only, no I/O: ``CheckpointChain`` (chain.py) applies the rule, the writer writes
what is planned, and replay's run planning shares ``DELTA_ROW_LOAD_WEIGHT``.

Invariant (``wants_base``): a chain holds at most ``limits.checkpoint_chain_depth_max``
deltas, and a load of it costs at most ``1 + limits.checkpoint_chain_load_excess_max``
times a load of a base of the same state, a delta's row counting
``DELTA_ROW_LOAD_WEIGHT`` of a base's.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.core.changes import Changes
from txn_library import limits

# A delta's row costs a load about this many base rows (it lands in a full table: a
# TPC-C chain of seven deltas, W=2, measured 2026-11-25); chain policy and replay's
# run planning (executor.replay.spark_jobs.load_epochs) share it. Since rows load
# pending (2026-11-26) a base row costs 0.40-0.49 us and a delta row 0.6-1.05 us (an
# overwrite finds its key in a full dict), ~2x; kept at 1.5: a higher weight writes
# bases more often, which costs live throughput, and the loads are half as long as
# when it was set.
DELTA_ROW_LOAD_WEIGHT = 1.5


@dataclass(frozen=True)
class ChainTip:
    """The newest written checkpoint of a partition's chain, as its successor needs it."""

    epoch: int
    state_hash: int
    static_hash: int
    base_epoch: int
    depth: int  # deltas since the base (0: the base itself)
    base_rows: int
    chain_rows: int  # rows in the base and every delta up to this one

    def wants_base(self, delta_rows: int, state_rows: int) -> bool:
        """Whether the next checkpoint, ``delta_rows`` rows as a delta of a state of
        ``state_rows`` partitioned rows, should be a base.

        The rule bounds what a load of the chain costs against a load of a base of the
        same state (``state_rows`` rows): a base's rows, plus every delta row at
        ``DELTA_ROW_LOAD_WEIGHT`` (it lands in a full table, overwriting or growing it),
        at most ``1 + limits.checkpoint_chain_load_excess_max`` times as much. New
        keys count too: a delta row costs a load more than the same row in a base.
        (2026-11-25: a rule that counted only overwritten rows wrote a TPC-C base every
        17th checkpoint; the chains took 1.6x as long to load at recovery, for no
        live throughput the benchmark could tell from noise.)"""
        if self.depth + 1 > limits.checkpoint_chain_depth_max:
            return True
        deltas = self.chain_rows - self.base_rows + delta_rows
        cost = self.base_rows + DELTA_ROW_LOAD_WEIGHT * deltas
        return cost > (1 + limits.checkpoint_chain_load_excess_max) * max(state_rows, 1)


def next_tip(
    parent: ChainTip | None, epoch: int, state_hash: int, static_hash: int, rows: int
) -> ChainTip:
    """The tip after writing a checkpoint of ``rows`` rows at ``epoch`` (a base if no parent)."""
    if parent is None:
        return ChainTip(epoch, state_hash, static_hash, epoch, 0, rows, rows)
    return ChainTip(
        epoch,
        state_hash,
        static_hash,
        parent.base_epoch,
        parent.depth + 1,
        parent.base_rows,
        parent.chain_rows + rows,
    )


@dataclass(frozen=True)
class PlannedCheckpoint:
    """What the checkpoint of one boundary will be (``CheckpointChain.plan``)."""

    epoch: int
    parent: ChainTip | None  # None: a base
    changes: Changes | None  # a delta's keys (with the rows they held at the parent)
    previous_epoch: int
    tip: ChainTip  # the chain's tip once it is written
    rows: int
