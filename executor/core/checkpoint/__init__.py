"""Partition checkpoints: consistent snapshots at epoch boundaries, written atomically
as chains of a base and deltas.

A partition checkpoints after epoch E when E's batch carries the checkpoint flag
(the sequencer sets it every N epochs / seconds, or on request), so every partition
of every replica snapshots at the *same* boundaries and the history splits into
intervals that replay tooling can verify independently.

The package, one module per job (each opens with the invariants it keeps):
  plan       the tip of a partition's chain and the rule for when the next checkpoint
             is a base (``ChainTip``, ``next_tip``, ``PlannedCheckpoint``)
  format     the files: names, header, rows and footer frames (the whole format is
             described there), ``CheckpointInfo``, ``CheckpointInvalid``
  reader     one file read back: header, frames (CRCs, footer, counts), digests
  writer     writing: ``CheckpointWriter`` (in process, paced), ``write_checkpoint``,
             the static tables file (``ensure_static``)
  chain      ``CheckpointChain``: a partition's chain, what its next checkpoint is
  loader     a chain loaded and validated: ``load``, ``load_newest``, ``check``,
             ``iter_rows``, ``chain_of``, ``chain_epochs``, ``list_checkpoints``
  retention  what stays on disk: ``prune``, ``CheckpointHold``, temp files, skip
             markers, ``complete_epochs``, ``reads_floor``, ``copy_newest_complete``
Imports go one way: plan < format < reader < writer < chain, reader < loader <
retention (which also takes the writer's directory fsync).

This ``__init__`` re-exports the public API, which many callers use as
``from executor.core import checkpoint`` then ``checkpoint.load(...)``. A private
name, or a module global that a test patches (``writer.ROWS_PER_FRAME``,
``writer._static_seen``), is reached in its own module.
"""

from executor.core.checkpoint.chain import CheckpointChain
from executor.core.checkpoint.format import (
    BASE,
    DELTA,
    END,
    MAGIC,
    NAME_RE,
    SKIP_NAME_RE,
    STATIC,
    VERSION,
    CheckpointInfo,
    CheckpointInvalid,
    checkpoint_name,
    skip_name,
    static_name,
)
from executor.core.checkpoint.loader import (
    chain_epochs,
    chain_of,
    check,
    iter_rows,
    list_checkpoints,
    load,
    load_newest,
)
from executor.core.checkpoint.plan import (
    DELTA_ROW_LOAD_WEIGHT,
    ChainTip,
    PlannedCheckpoint,
    next_tip,
)
from executor.core.checkpoint.reader import read_answers, read_info
from executor.core.checkpoint.retention import (
    HOLDS_DIR,
    CheckpointHold,
    complete_epochs,
    copy_newest_complete,
    mark_skipped,
    prune,
    reads_floor,
    remove_temp_files,
)
from executor.core.checkpoint.writer import (
    BaseFrames,
    CheckpointWriter,
    ensure_static,
    write_checkpoint,
)

__all__ = [
    "BASE",
    "DELTA",
    "DELTA_ROW_LOAD_WEIGHT",
    "END",
    "HOLDS_DIR",
    "MAGIC",
    "NAME_RE",
    "SKIP_NAME_RE",
    "STATIC",
    "VERSION",
    "BaseFrames",
    "ChainTip",
    "CheckpointChain",
    "CheckpointHold",
    "CheckpointInfo",
    "CheckpointInvalid",
    "CheckpointWriter",
    "PlannedCheckpoint",
    "chain_epochs",
    "chain_of",
    "check",
    "checkpoint_name",
    "complete_epochs",
    "copy_newest_complete",
    "ensure_static",
    "iter_rows",
    "list_checkpoints",
    "load",
    "load_newest",
    "mark_skipped",
    "next_tip",
    "prune",
    "read_answers",
    "read_info",
    "reads_floor",
    "remove_temp_files",
    "skip_name",
    "static_name",
    "write_checkpoint",
]
