"""Where a replica's history lives: what a worker needs to replay it, and the log's extent.

A replica's history is complete without the replica: the command log (epochs 1..N,
sequencer.log), the replica's checkpoints (executor.replay.boundaries) and the genesis
state (epoch 0). ``ReplaySpec`` names all of it with plain values (paths as strings,
the procedure modules, the genesis function and its arguments), so it pickles into a
Spark task. It is built by the layer that knows the cluster's configuration
(``cluster.replay_cli.replay_spec``); the executor does not read ``cluster.json``.

Invariants
- The log is read only through ``sequencer.log.iter_frames``; the extent of the log
  comes from segment file names, plus the frames of the last segment for its end.
- Nothing here writes to the log directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sequencer.log import LogCorruption, iter_frames
from txn_library.procedure import load_modules
from txn_library.wire import sequencer as wire

_SEGMENT_NAME = re.compile(r"segment-(\d{12,})\.log")


@dataclass(frozen=True)
class ReplaySpec:
    """Everything a worker needs to replay: picklable, paths as strings.

    ``genesis`` is "module:function" called as fn(partition, partitions,
    **genesis_args) (None: empty tables); ``procedure_modules`` register the
    procedures and tables the log names.
    """

    log_dir: str
    partitions: int
    procedure_modules: tuple[str, ...]
    genesis: str | None = None
    genesis_args: dict[str, Any] = field(default_factory=dict)

    def prepare(self) -> None:
        """Register the procedures and tables (every worker, before replaying)."""
        load_modules(self.procedure_modules)


def log_segments(log_dir: str | Path) -> list[int]:
    """First epoch of every segment file, in order (from the names alone)."""
    return sorted(
        int(m.group(1))
        for name in os.listdir(log_dir)
        if (m := _SEGMENT_NAME.fullmatch(name)) is not None
    )


def log_first_epoch(log_dir: str | Path) -> int:
    """First epoch the log holds, from segment names alone (0: no segment)."""
    firsts = log_segments(log_dir)
    return firsts[0] if firsts else 0


def log_last_epoch(log_dir: str | Path) -> int:
    """Last whole epoch in the log (reads only the last segment; 0 for an empty log)."""
    return _log_end(log_dir)[0]


def _log_end(log_dir: str | Path) -> tuple[int, bytes | None]:
    """(the last whole epoch in the log, its batch's bytes) from the last segment."""
    firsts = log_segments(log_dir)
    if not firsts:
        return 0, None
    last, payload = firsts[-1] - 1, None
    for last, payload in iter_frames(log_dir, firsts[-1]):  # noqa: B007  (the last one)
        pass
    return last, payload


def planned_log_end(log_dir: str | Path) -> tuple[int | None, int | None]:
    """The log's last epoch and the txn id after its batch, for planning only (sizing
    the tail): None where the log does not read to its end or that batch does not
    decode; the verification itself reports those."""
    try:
        last, payload = _log_end(log_dir)
    except (LogCorruption, OSError):
        return None, None
    try:
        next_txn_id = None if payload is None else wire.decode_batch(payload).next_txn_id
    except Exception:  # a bad batch: the verification reports it
        next_txn_id = None
    return last, next_txn_id
