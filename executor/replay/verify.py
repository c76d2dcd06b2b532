"""Verifying a replica's history: intervals verified in runs, planned over the whole history.

Verifying an interval (a, b] between consecutive boundaries (genesis = 0): start from
the state at a, replay a+1..b, compare the replica's state hash (the sum of partition
hashes) with the sum of b's checkpoint header hashes, then check b's checkpoint files
themselves (executor.core.checkpoint.check: a delta against the replayed state and the
changes recorded while replaying, a base by its bytes). On a mismatch,
executor.replay.diagnosis locates the bad epoch. Planning cuts the history at every
boundary (plus the tail after the last checkpoint); once every interval is back,
``annotate_results`` draws the conclusions that need several intervals or the other
replicas' checkpoints.

Intervals run in *runs* of consecutive intervals (``verify_run``; Spark gives each
worker one run, executor.replay.spark_jobs): the first interval of a run loads its start
state (falling back to an earlier boundary if a's checkpoint is invalid); each later one
starts from the state the previous one replayed, once that state was found equal to the
boundary (hashes) and the boundary's files valid. Otherwise it loads its start as the
first does. So a run loads one state however many intervals it verifies.

Invariants
- ``verify_interval`` / ``verify_run`` never raise for bad data: every failure becomes a
  verdict (executor.replay.verdicts) with the epoch and how it was located, in one row.
- An interval's row does not depend on how intervals are grouped into runs: a carried
  state is the boundary's state (equal hashes, valid files), exactly what a load gives.
- Every checkpoint file at an interval's end is validated by that interval (when its
  hashes agree) or by the diagnosis (when they do not).
- Nothing here writes to the log or checkpoint directories.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from executor.core import checkpoint
from executor.core.checkpoint import CheckpointInvalid
from executor.core.heap import release_heap, release_retired, retire
from executor.deterministic.replica import LocalReplica
from executor.replay.batches import Replayer, ReplayFailure, ReplayStats
from executor.replay.boundaries import (
    GENESIS,
    Boundary,
    load_boundary,
    peer_checkpoint_dirs,
    scan_checkpoints,
)
from executor.replay.diagnosis import diagnose
from executor.replay.intervals import IntervalResult, IntervalTask, join_detail
from executor.replay.spec import ReplaySpec, log_first_epoch, planned_log_end
from executor.replay.verdicts import (
    BAD_CHECKPOINT,
    BY_BATCH,
    BY_CHECKPOINT,
    BY_LOG,
    LOG_CORRUPT,
    LOG_MISSING,
    OK_VERDICT,
    PASSED,
    PRUNED,
    REPLAY_ERROR,
    TAIL,
)
from sequencer.log import LogCorruption


# Verification of one interval -----------------------------------------------------------
def _hex(h: int | None) -> str | None:
    return None if h is None else f"{h:016x}"


def _hexes(hs: Sequence[int | None]) -> str:
    return ",".join(_hex(h) or "-" for h in hs)


def verify_interval(task: IntervalTask) -> dict[str, Any]:
    """Verify one interval; returns an IntervalResult row (never raises for bad data)."""
    return _verify(task, None)[0]


def verify_run(tasks: Iterable[IntervalTask], *, keep: bool = False) -> list[dict[str, Any]]:
    """Verify consecutive intervals in order in this process (one Spark task); each
    starts from the state the previous one verified, when it verified it.

    The run's last state is freed before returning, or with ``keep`` retired
    (``heap.retire``: freed when this process next loads a state; Spark tasks)."""
    release_retired()
    rows = []
    carried: LocalReplica | None = None
    last: LocalReplica | None = None
    for task in tasks:
        if carried is None:
            last = None  # not carried on: freed before the next state loads
        row, last, verified = _verify(task, carried)
        carried = last if verified else None
        rows.append(row)
    if keep:
        retire(last)
        return rows
    del carried, last
    release_heap()  # the run's states are gone; the worker runs other tasks next
    return rows


def _verify(
    task: IntervalTask, carried: LocalReplica | None
) -> tuple[dict[str, Any], LocalReplica | None, bool]:
    """(the interval's row, the replica it replayed if any, whether that replica's
    state is the verified end state)."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    spec = task.spec
    spec.prepare()
    end = task.end
    res = IntervalResult(
        interval=task.index,
        start_epoch=task.start.epoch,
        end_epoch=None if end is None else end.epoch,
        start_source="genesis" if task.start.epoch == 0 and not task.start.paths else "checkpoint",
        worker=f"{socket.gethostname()}:{os.getpid()}",
        started_at=int(time.time() * 1000),
    )
    if end is not None:
        res.expected_hash = _hex(end.state_hash)
        res.partition_hashes_expected = _hexes(end.hashes)
    try:
        replica, verified = _verify_into(task, res, carried)
    finally:
        res.total_s = round(time.perf_counter() - t_start, 4)
        res.cpu_s = round(time.process_time() - cpu_start, 4)
    return res.to_row(), replica, verified


def _verify_into(
    task: IntervalTask, res: IntervalResult, carried: LocalReplica | None
) -> tuple[LocalReplica | None, bool]:
    spec, end = task.spec, task.end
    last = None if end is None else end.epoch
    if task.start.epoch + 1 < task.log_first_epoch:
        res.verdict = PRUNED
        res.detail = (
            f"the log starts at epoch {task.log_first_epoch}: epochs "
            f"{task.start.epoch + 1}..{task.log_first_epoch - 1} were pruned"
        )
        return None, False
    t0 = time.perf_counter()
    if carried is not None and carried.last_epoch == task.start.epoch:
        loaded: tuple[LocalReplica, Boundary] | None = (carried, task.start)
        res.replayed_from_epoch = task.start.epoch
    else:
        loaded = _load_with_fallback(task, res)
    res.load_s = round(time.perf_counter() - t0, 4)
    if loaded is None:
        return None, False
    replica, used = loaded
    res.start_source = "genesis" if used.epoch == 0 and not used.paths else "checkpoint"
    replayer = Replayer(replica, spec.partitions, record_hashes=task.locate)
    t1 = time.perf_counter()
    # After a fallback, first replay up to the interval's start: the end checkpoint's
    # deltas are checked against the state there and the changes made since.
    failure = used.epoch < task.start.epoch and _run_replay(
        replayer, spec.log_dir, task.start.epoch, used.epoch, res
    )
    start_hashes = [p.storage.state_hash for p in replica.parts]
    if not failure:
        for part in replica.parts:
            part.storage.track_changes()
        failure = _run_replay(replayer, spec.log_dir, last, used.epoch, res)
    res.replay_s = round(time.perf_counter() - t1, 4)
    _record_stats(res, replayer.stats)
    res.actual_hash = _hex(replica.state_hash)
    res.partition_hashes_actual = _hexes([p.storage.state_hash for p in replica.parts])
    if failure:
        return replica, False
    t2 = time.perf_counter()
    try:
        _judge(task, res, replica, replayer, used)
        if (
            res.verdict == OK_VERDICT
            and _genesis_files_valid(task, res)
            and _end_files_valid(task, res, replica, start_hashes)
        ):
            for part in replica.parts:
                part.storage.stop_tracking()
            return replica, True
    finally:
        res.check_s = round(time.perf_counter() - t2, 4)
    return replica, False


def _end_files_valid(
    task: IntervalTask, res: IntervalResult, replica: LocalReplica, start_hashes: list[int]
) -> bool:
    """Check the end boundary's files (the replay reproduced their header hashes): a
    delta against the replayed state at the interval's start (``start_hashes``) and the
    changes recorded since, each file on its own merits (a corrupt older delta is its
    own interval's finding). An invalid one makes the interval ``bad-checkpoint``."""
    end = task.end
    assert end is not None
    problems = []
    bad_epochs = []
    for p, part in enumerate(replica.parts):
        storage = part.storage
        try:
            checkpoint.check(Path(end.paths[p]), storage, (task.start.epoch, start_hashes[p]))
        except CheckpointInvalid as e:
            problems.append(f"p{p}: {e}")
            bad_epochs.append(end.epoch if e.epoch is None else e.epoch)
    if not problems:
        return True
    res.verdict = BAD_CHECKPOINT
    res.bad_epoch = min(bad_epochs)
    res.located_by = BY_CHECKPOINT
    res.detail = join_detail(
        res.detail,
        f"the replay reproduces the header hashes of the checkpoint at epoch {end.epoch}, "
        f"but its files are invalid: " + "; ".join(problems),
    )
    return False


def _genesis_files_valid(task: IntervalTask, res: IntervalResult) -> bool:
    """The epoch-0 base files (partitions write the genesis state as their first base)
    are a start no interval ends at: the interval from epoch 0 reports them if they did
    not load (it then started from the genesis function)."""
    if task.start.epoch != 0 or res.start_invalid_epoch != 0:
        return True
    res.verdict = BAD_CHECKPOINT
    res.bad_epoch = 0
    res.located_by = BY_CHECKPOINT
    return False


def _load_with_fallback(
    task: IntervalTask, res: IntervalResult
) -> tuple[LocalReplica, Boundary] | None:
    """Load the start state; if its checkpoint is invalid, the newest earlier one (not
    one whose chain holds a file already found invalid)."""
    problems = []
    bad: set[int] = set()
    for boundary in (task.start, *task.fallbacks):
        if bad and boundary.epoch > 0 and _chain_holds(boundary, bad):
            continue
        try:
            replica = load_boundary(task.spec, boundary)
        except CheckpointInvalid as e:
            problems.append(str(e))
            bad.add(boundary.epoch if e.epoch is None else e.epoch)
            if res.start_invalid_epoch is None:
                res.start_invalid_epoch = boundary.epoch if e.epoch is None else e.epoch
            continue
        res.replayed_from_epoch = boundary.epoch
        if problems:
            res.detail = (
                f"start checkpoint at epoch {task.start.epoch} is invalid ({problems[0]}); "
                f"replayed from epoch {boundary.epoch} instead"
            )
        return replica, boundary
    res.verdict = BAD_CHECKPOINT
    res.bad_epoch = task.start.epoch if res.start_invalid_epoch is None else res.start_invalid_epoch
    res.located_by = BY_CHECKPOINT
    res.detail = "no valid state to start from: " + " | ".join(problems)
    return None


def _chain_holds(boundary: Boundary, epochs: set[int]) -> bool:
    return any(
        not epochs.isdisjoint(checkpoint.chain_epochs(Path(path)))
        for path in boundary.paths
        if path
    )


def _run_replay(
    replayer: Replayer, log_dir: str, last: int | None, start_epoch: int, res: IntervalResult
) -> bool:
    """Replay; on failure fill in the verdict and return True."""
    try:
        replayer.run(log_dir, last)
    except LogCorruption as e:
        res.verdict = LOG_CORRUPT
        res.bad_epoch = e.epoch
        res.located_by = BY_LOG
        where = "" if e.epoch > start_epoch else " (before this interval, in the same segment)"
        res.detail = join_detail(res.detail, f"corrupt log frame at epoch {e.epoch}{where}: {e}")
        return True
    except ReplayFailure as e:
        res.verdict = e.kind
        res.bad_epoch = e.epoch
        res.located_by = getattr(e, "located_by", BY_BATCH if e.kind != LOG_MISSING else BY_LOG)
        res.detail = join_detail(res.detail, str(e))
        return True
    except Exception as e:  # anything else is still this epoch's failure, reported as such
        res.verdict = REPLAY_ERROR
        res.bad_epoch = replayer.last_epoch + 1
        res.located_by = BY_BATCH
        res.detail = join_detail(res.detail, f"epoch {res.bad_epoch}: {type(e).__name__}: {e}")
        return True
    return False


def _record_stats(res: IntervalResult, s: ReplayStats) -> None:
    res.epochs, res.txns = s.epochs, s.txns
    res.multi_partition_txns, res.aborted_txns, res.error_txns = (
        s.multi_partition,
        s.aborted,
        s.errors,
    )
    res.log_bytes = s.frame_bytes
    res.first_batch_ts, res.last_batch_ts = s.first_ts_ms, s.last_ts_ms
    if res.replay_s > 0:
        res.replay_txns_per_s = round(s.txns / res.replay_s, 1)


def _judge(
    task: IntervalTask,
    res: IntervalResult,
    replica: LocalReplica,
    replayer: Replayer,
    used: Boundary,
) -> None:
    end = task.end
    if end is None:
        res.verdict = TAIL
        return
    if not end.usable:
        res.verdict = BAD_CHECKPOINT
        res.bad_epoch = end.epoch
        res.located_by = BY_CHECKPOINT
        mismatched = [
            p
            for p, h in enumerate(end.hashes)
            if h is not None and h != replica.parts[p].storage.state_hash
        ]
        res.detail = join_detail(
            res.detail,
            f"end checkpoint at epoch {end.epoch}: {'; '.join(end.problems)}"
            + (f"; readable partitions that differ: {mismatched}" if mismatched else ""),
        )
        return
    if replica.state_hash == end.state_hash and all(
        h == p.storage.state_hash for h, p in zip(end.hashes, replica.parts, strict=True)
    ):
        res.verdict = OK_VERDICT
        return
    diagnose(task, res, replica, replayer, used)


# Planning a whole-history verification ---------------------------------------------------
def plan_verify(
    spec: ReplaySpec,
    boundaries: Sequence[Boundary],
    *,
    log_first_epoch: int = 1,
    tail: bool = True,
    locate: bool = True,
    log_last_epoch: int | None = None,
    log_next_txn_id: int | None = None,
) -> list[IntervalTask]:
    """One task per interval between consecutive boundaries (genesis first), plus the tail.

    Boundaries past the end of the log are kept: their intervals report the missing
    epochs. Each task may fall back to earlier usable boundaries if its start is bad.
    ``log_last_epoch`` and ``log_next_txn_id`` (optional) size the tail for balancing
    runs; the tail replays to the end of the log whatever they say.
    """
    # Genesis first: the partitions' epoch-0 base files if they wrote them (loading them
    # is cheaper than running the genesis function; a wrong one cannot reproduce the
    # first checkpoint), else (and as the last fallback) the genesis function.
    start = next((b for b in boundaries if b.epoch == 0 and b.usable), GENESIS)
    points = [start, *[b for b in boundaries if b.epoch > 0]]
    last_resort = () if start is GENESIS else (GENESIS,)
    tasks = []
    for i in range(len(points) - 1):
        fallbacks = (*(b for b in reversed(points[:i]) if b.usable), *last_resort)
        tasks.append(
            IntervalTask(
                i, spec, points[i], points[i + 1], fallbacks, max(1, log_first_epoch), locate
            )
        )
    if tail:
        i = len(points) - 1
        fallbacks = (*(b for b in reversed(points[:i]) if b.usable), *last_resort)
        tasks.append(
            IntervalTask(
                i,
                spec,
                points[i],
                None,
                fallbacks,
                max(1, log_first_epoch),
                locate,
                log_last_epoch,
                log_next_txn_id,
            )
        )
    return tasks


def plan_history(
    spec: ReplaySpec, checkpoint_dir: str | Path, *, tail: bool = True, locate: bool = True
) -> list[IntervalTask]:
    """``plan_verify`` over the replica's checkpoints and its log as they are now (the
    log's extent read once: its first epoch, and its last epoch and txn id to size the
    tail)."""
    last_epoch, next_txn_id = planned_log_end(spec.log_dir)
    return plan_verify(
        spec,
        scan_checkpoints(checkpoint_dir, spec.partitions),
        log_first_epoch=log_first_epoch(spec.log_dir),
        tail=tail,
        locate=locate,
        log_last_epoch=last_epoch,
        log_next_txn_id=next_txn_id,
    )


def annotate_results(
    rows: list[dict[str, Any]], peers: dict[int, list[Boundary]] | None = None
) -> list[dict[str, Any]]:
    """Cross-interval conclusions the driver draws once every task is back.

    - A task that could not load its start state marks the interval ending at the file
      at fault ``bad-checkpoint`` (``start_invalid_epoch``: the start's own file or an
      older file of its chain), if that interval had not found it already.
    - ``replicas_agree``: the other replicas' checkpoint hashes at the interval's end
      equal this replica's (None when no other replica checkpointed that epoch).
    """
    rows = sorted(rows, key=lambda r: r["interval"])
    by_end = {r["end_epoch"]: r for r in rows if r["end_epoch"] is not None}
    for r in rows:
        bad = r["start_invalid_epoch"]
        if bad is None:
            continue
        prev = by_end.get(bad)
        if prev is not None and prev["verdict"] in PASSED:
            prev["verdict"] = BAD_CHECKPOINT
            prev["bad_epoch"] = bad
            prev["located_by"] = BY_CHECKPOINT
            why = r["detail"]
            if "is invalid (" in why and "); replayed from" in why:
                why = why[why.index("is invalid (") + 12 : why.index("); replayed from")]
            prev["detail"] = join_detail(
                prev["detail"],
                f"its end checkpoint (epoch {bad}) has the right header hash "
                f"but does not load (found by interval {r['interval']}): {why}",
            )
    if peers:
        for r in rows:
            end = r["end_epoch"]
            mine = r["partition_hashes_expected"]
            if end is None or mine is None:
                continue
            verdicts = []
            for boundaries in peers.values():
                b = next((b for b in boundaries if b.epoch == end), None)
                if b is not None and b.usable:
                    verdicts.append(_hexes(b.hashes) == mine)
            r["replicas_agree"] = all(verdicts) if verdicts else None
    return rows


def verify_local(
    spec: ReplaySpec,
    checkpoint_dir: str | Path,
    *,
    tail: bool = True,
    locate: bool = True,
    run: Callable[[list[IntervalTask]], list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Plan, run (default: one run of every interval in this process, ``verify_run``)
    and annotate a verification."""
    spec.prepare()
    tasks = plan_history(spec, checkpoint_dir, tail=tail, locate=locate)
    rows = run(tasks) if run is not None else verify_run(tasks)
    peers = {
        r: scan_checkpoints(d, spec.partitions)
        for r, d in peer_checkpoint_dirs(checkpoint_dir).items()
    }
    return annotate_results(rows, peers)
