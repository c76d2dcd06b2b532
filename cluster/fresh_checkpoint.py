"""A fresh checkpoint for the commands that need one: ``ordo checkpoint``, ``ordo dump``
(and what is built on it: ``ordo tpcc check --whole``).

The command asks the sequencer for a checkpoint; the reply names the epoch E whose
batch carries FLAG_CHECKPOINT_REQUESTED. Every partition writes that boundary: one
whose previous checkpoint is still being written finishes that one first instead of
skipping E (cluster.partition_server), so several dumps at once, dumps during periodic
checkpoints of any cadence and a dump while a partition recovers (it writes E when it
replays E's batch) all get E. What can still go wrong is told apart from a slow
writer by each partition's status (``boundary_epoch``, ``checkpoint_writing``,
``newest_checkpoint_epoch``): a partition past E that writes nothing and has nothing
durable at or after E lost its writer (a full disk, say); the command then asks
again, at most ``limits.checkpoint_asks_max`` times, and then names the partition.

A reader of the files (``hold_fresh_checkpoint``) holds the replica's checkpoints
(executor.core.checkpoint.CheckpointHold) from before it asks until it has read
them, so pruning (which runs after every checkpoint a partition writes, with
periodic checkpoints as often as every epoch) never deletes the files it waits for or
reads. It takes the first epoch at or after E at which every partition of the replica
has a checkpoint file.

Invariants: a reader gets one epoch, the same on every partition of the replica, at or
after the epoch it asked for; it never opens a file outside its hold.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.config import ClusterConfig
from executor.core import checkpoint as ckpt
from txn_library import limits
from txn_library.client import Client
from txn_library.errors import OrdoError
from txn_library.wire import sequencer as wire

POLL_S = 0.1  # between two looks at the partitions' status


class CheckpointUnavailable(Exception):
    """No fresh checkpoint within the command's time, or its writers keep failing:
    the message names the partitions and the cause."""


@dataclass(frozen=True)
class Wait:
    """Where a requested checkpoint stands on the partitions a command waits for."""

    durable: frozenset[tuple[int, int]]  # (replica, partition) with a durable one >= E
    failed: frozenset[tuple[int, int]]  # past E, writing nothing, nothing durable >= E
    down: frozenset[tuple[int, int]]

    def done(self, want: frozenset[tuple[int, int]]) -> bool:
        return want <= self.durable


def assess(asked: int, rows: Sequence[dict[str, Any]], want: frozenset[tuple[int, int]]) -> Wait:
    """Read the sequencer's status rows (``ordo status --json`` partitions) for the
    checkpoint of epoch ``asked``."""
    durable, failed, down = set(), set(), set()
    for row in rows:
        rp = (row["replica"], row["partition"])
        if rp not in want:
            continue
        if row["newest_checkpoint_epoch"] >= asked:
            durable.add(rp)
        elif row.get("boundary_epoch", -1) >= asked and row.get("checkpoint_writing", -1) < asked:
            failed.add(rp)  # passed E with nothing durable at or after it, not writing it
        if row["down"]:
            down.add(rp)
    return Wait(frozenset(durable), frozenset(failed), frozenset(down))


def _status_rows(c: Client) -> list[dict[str, Any]]:
    try:
        return list(c.status()["partitions"])
    except OrdoError as e:
        raise CheckpointUnavailable(f"no status from {c.address}: {e}") from None


def _ask(c: Client) -> int:
    try:
        return int(c.control(wire.CheckpointRequest()))
    except OrdoError as e:
        raise CheckpointUnavailable(f"checkpoint not requested ({c.address}): {e}") from None


def _names(rps: Iterator[tuple[int, int]] | frozenset[tuple[int, int]], down: frozenset) -> str:
    return ", ".join(
        f"replica {r} partition {p}" + (" (down)" if (r, p) in down else "") for r, p in sorted(rps)
    )


def wait_fresh_checkpoint(
    c: Client,
    replicas: Sequence[int],
    partitions: int,
    timeout_s: float,
    progress: Any = None,
) -> int:
    """Ask for a checkpoint and wait until every partition of ``replicas`` reports one
    durable at or after it; returns the epoch asked for (the last one, if a failed
    writer made it ask again). ``progress(text)`` is told whenever the count changes."""
    want = frozenset((r, p) for r in replicas for p in range(partitions))
    deadline = time.monotonic() + timeout_s
    asked, asks = _ask(c), 1
    shown = None
    while True:
        w = assess(asked, _status_rows(c), want)
        if progress is not None and len(w.durable) != shown:
            shown = len(w.durable)
            progress(
                f"waiting for checkpoint at epoch {asked}: {shown}/{len(want)} partitions durable"
            )
        if w.done(want):
            return asked
        if w.failed:
            if asks >= limits.checkpoint_asks_max:
                raise CheckpointUnavailable(
                    f"checkpoint writers failed {asks} times on {_names(w.failed, w.down)} "
                    f"(their logs say why: a full disk, say)"
                )
            asked, asks = _ask(c), asks + 1
            continue
        if time.monotonic() >= deadline:
            raise CheckpointUnavailable(
                f"checkpoint at epoch {asked} not durable within {timeout_s:g} s on "
                f"{_names(want - w.durable, w.down)}"
            )
        time.sleep(POLL_S)


def _common_epoch(directory: Path, partitions: int, at_least: int) -> int | None:
    """The first epoch >= ``at_least`` with a checkpoint file of every partition."""
    for epoch in ckpt.complete_epochs(directory, partitions):
        if epoch >= at_least:
            return epoch
    return None


@contextmanager
def hold_fresh_checkpoint(
    c: Client, cfg: ClusterConfig, replica: int, timeout_s: float, progress: Any = None
) -> Iterator[tuple[int, list[Path]]]:
    """A fresh checkpoint of every partition of ``replica``, held against pruning while
    the ``with`` block reads it: (its epoch, each partition's file, partition order)."""
    directory = cfg.checkpoint_dir(replica)
    try:
        hold = ckpt.CheckpointHold(directory)
    except OSError as e:
        raise CheckpointUnavailable(f"cannot hold checkpoints in {directory}: {e}") from None
    with hold:
        # Before asking: whatever the request's epoch, nothing at or after the sequencer's
        # epoch now is pruned while this command looks for it.
        try:
            now = int(c.status()["epoch"])
        except (OrdoError, KeyError, TypeError, ValueError) as e:
            raise CheckpointUnavailable(f"no status from {c.address}: {e}") from None
        hold.keep_from(now)
        asked = wait_fresh_checkpoint(c, [replica], cfg.partitions, timeout_s, progress)
        epoch = _common_epoch(directory, cfg.partitions, asked)
        if epoch is None:
            raise CheckpointUnavailable(
                f"replica {replica} reports its checkpoint at epoch {asked} durable, but "
                f"{directory} holds no checkpoint of every partition at or after it (is this "
                f"the replica's checkpoint directory, on this machine?)"
            )
        hold.keep_only(epoch)
        files = [directory / ckpt.checkpoint_name(epoch, p) for p in range(cfg.partitions)]
        yield epoch, files
