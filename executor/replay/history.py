"""Deterministic replay of one replica's history: the pure-Python core of Spark replay.

A replica's history is complete without the replica: the command log (epochs 1..N,
sequencer.log), the replica's checkpoints (executor.core.checkpoint: every partition
snapshots at the same checkpoint-flagged epochs) and the genesis state (epoch 0,
``ClusterConfig.genesis``). The state at the end of any epoch E is rebuilt by loading
the nearest known state at or before E and replaying the logged batches through
``LocalReplica``: the very Partition code (locks, read exchange, execution) that runs
live, with peer messages moved in memory. This module has no Spark in it; Spark
(executor.replay.spark_jobs) only decides where each piece runs.

Invariants
- The log is read only through ``sequencer.log.iter_frames`` (streaming, one frame in
  memory, stops at a torn tail exactly like the sequencer, raises LogCorruption for a
  bad frame in the middle). A reader of epochs a..b never pulls a frame past b.
- Batches are applied strictly in epoch order, and each is checked before it is
  applied (``BatchInvalid`` names the epoch): frame epoch == batch epoch, prev epoch ==
  epoch - 1, first txn id == the previous batch's next, every call names a registered
  procedure with schema-valid arguments, and its logged participants are exactly those
  the sequencer computes from the footprint. After a batch every partition is idle
  (in-process delivery finishes every transaction of the batch), or ``ReplayError``.
- A state is trusted only when fully validated (``checkpoint.load``: frame CRCs, footer,
  row count, rows hash == header hash). A checkpoint whose header is unreadable is
  still a boundary (its epoch comes from the file name): it is reported, never
  silently merged away.
- Nothing here writes to the log or checkpoint directories.

Verifying an interval (a, b] between consecutive boundaries (genesis = 0): load the
state at a (falling back to an earlier boundary if a's checkpoint is invalid), replay
a+1..b, compare the replica's state hash (the sum of partition hashes) with the sum
of b's checkpoint header hashes.

Locating a divergence inside an interval. The live system has no state at inner
epochs to compare with: partitions pipeline epochs (txns of e+1 finish before those
of e), and drain only at checkpoint-flagged epochs. So only these references exist,
and each is used for what it can prove:

1. Log framing and batch structure: exact. LogCorruption and BatchInvalid name the
   epoch (a flipped byte, a bad epoch/txn-id sequence, a call whose logged
   participants do not match its arguments).
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
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cluster.config import CONFIG_FILE, ClusterConfig
from executor.core import checkpoint
from executor.core.checkpoint import CheckpointInfo, CheckpointInvalid
from executor.core.genesis import genesis_rows, genesis_storage
from executor.core.storage import MASK64, Storage, row_digest
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from sequencer.log import LogCorruption, iter_frames
from sequencer.sequencer import participants as sequencer_participants
from txn_library import catalog, placement, wire
from txn_library.errors import ABORTED, ERROR, BadRequest
from txn_library.procedure import Procedure, load_modules, lookup, procedures

# Verdicts of a verified interval. PASSED and UNCHECKED do not fail a verification.
OK_VERDICT = "ok"
TAIL = "unchecked-tail"  # after the last checkpoint: nothing to compare with
PRUNED = "skipped-pruned"  # the log no longer holds these epochs
DIVERGED = "diverged"
BAD_CHECKPOINT = "bad-checkpoint"
LOG_CORRUPT = "log-corrupt"
LOG_MISSING = "log-missing"
BATCH_INVALID = "batch-invalid"
REPLAY_ERROR = "replay-error"
PASSED = frozenset({OK_VERDICT})
UNCHECKED = frozenset({TAIL, PRUNED})

# How a bad epoch was located (IntervalResult.located_by).
BY_LOG = "log-frame"
BY_BATCH = "batch-check"
BY_DIGEST = "batch-digest"  # the successor's prev_digest does not match the bytes
BY_SERIAL = "serial-oracle"
BY_DEPENDENCY = "dependency"
BY_CHECKPOINT = "checkpoint"

DIFF_SAMPLE_MAX = 20  # differing rows named in a report
DEPENDENCY_TARGETS_MAX = 64  # rows of D used to localize (a subset keeps the set sound)

_CKPT_NAME = re.compile(r"(\d{12})-p(\d+)\.ckpt")
_SEGMENT_NAME = re.compile(r"segment-(\d{12,})\.log")


# Where the history lives ---------------------------------------------------------------
@dataclass(frozen=True)
class ReplaySpec:
    """Everything a worker needs to replay: picklable, paths as strings."""

    log_dir: str
    partitions: int
    procedure_modules: tuple[str, ...]
    genesis: str | None = None
    genesis_args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: ClusterConfig, log_dir: str | Path) -> ReplaySpec:
        return cls(
            log_dir=str(log_dir),
            partitions=cfg.partitions,
            procedure_modules=tuple(cfg.procedure_modules),
            genesis=cfg.genesis,
            genesis_args=dict(cfg.genesis_args),
        )

    def prepare(self) -> None:
        """Register the procedures and tables (every worker, before replaying)."""
        load_modules(self.procedure_modules)


def find_config(log_dir: str | Path, config_path: str | Path | None = None) -> ClusterConfig:
    """The cluster.json that describes LOG_DIR: ``config_path``, else LOG_DIR/../cluster.json."""
    if config_path is not None:
        return ClusterConfig.from_json(Path(config_path).read_text())
    parent = Path(log_dir).resolve().parent
    path = parent / CONFIG_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no {CONFIG_FILE} next to {log_dir} (looked in {parent}); pass --config PATH"
        )
    return ClusterConfig.from_json(path.read_text())


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
    firsts = log_segments(log_dir)
    if not firsts:
        return 0
    last = firsts[-1] - 1
    for epoch, _payload in iter_frames(log_dir, firsts[-1]):
        last = epoch
    return last


# Boundaries: states known without replay -------------------------------------------------
@dataclass(frozen=True)
class Boundary:
    """A known state at the end of ``epoch``: genesis (0) or one checkpoint per partition.

    ``problems`` lists what is wrong with it as far as the headers tell (missing
    partition, unreadable header, header disagreeing with its file name); the rows
    are validated only when the state is loaded.
    """

    epoch: int
    paths: tuple[str, ...] = ()  # per partition ("" = missing); empty for genesis
    hashes: tuple[int | None, ...] = ()  # header state hash per partition
    next_txn_id: int = 0
    problems: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return not self.problems

    @property
    def state_hash(self) -> int | None:
        if self.epoch == 0 or any(h is None for h in self.hashes):
            return None
        return sum(h for h in self.hashes if h is not None) & MASK64


GENESIS = Boundary(0)


def scan_checkpoints(checkpoint_dir: str | Path, partitions: int) -> list[Boundary]:
    """Every checkpoint epoch in a replica's directory, oldest first (headers only).

    An epoch is a boundary as soon as one file names it, so a corrupt or missing file
    makes the boundary unusable and reported, never silently skipped.
    """
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint directory {directory}")
    files: dict[int, dict[int, Path]] = {}
    for entry in sorted(directory.iterdir()):
        m = _CKPT_NAME.fullmatch(entry.name)
        if m is not None:
            files.setdefault(int(m.group(1)), {})[int(m.group(2))] = entry
    out = []
    for epoch in sorted(files):
        by_part = files[epoch]
        paths: list[str] = []
        hashes: list[int | None] = []
        next_ids: set[int] = set()
        problems: list[str] = []
        for p in sorted(set(by_part) - set(range(partitions))):
            problems.append(f"p{p}: checkpoint of a partition the cluster does not have")
        for p in range(partitions):
            path = by_part.get(p)
            if path is None:
                paths.append("")
                hashes.append(None)
                problems.append(f"p{p}: missing")
                continue
            paths.append(str(path))
            try:
                info = checkpoint.read_info(path)
                _check_header(info, epoch, p, partitions)
            except CheckpointInvalid as e:
                hashes.append(None)
                problems.append(f"p{p}: {e}")
                continue
            hashes.append(info.state_hash)
            next_ids.add(info.next_txn_id)
        if len(next_ids) > 1:
            problems.append(f"partitions disagree on the next txn id: {sorted(next_ids)}")
        out.append(
            Boundary(
                epoch,
                tuple(paths),
                tuple(hashes),
                next_ids.pop() if len(next_ids) == 1 else -1,
                tuple(problems),
            )
        )
    return out


def _check_header(info: CheckpointInfo, epoch: int, partition: int, partitions: int) -> None:
    if (info.epoch, info.partition, info.partitions) != (epoch, partition, partitions):
        raise CheckpointInvalid(
            f"{info.path}: header says epoch {info.epoch}, partition "
            f"{info.partition}/{info.partitions}; expected {epoch}, {partition}/{partitions}"
        )


def peer_checkpoint_dirs(checkpoint_dir: str | Path) -> dict[int, Path]:
    """Other replicas' checkpoint directories beside ``data_dir/replica-R/checkpoints``."""
    own = Path(checkpoint_dir).resolve()
    out: dict[int, Path] = {}
    if own.name != "checkpoints" or re.fullmatch(r"replica-\d+", own.parent.name) is None:
        return out  # not in a cluster directory: no peers to compare with
    for d in sorted(own.parent.parent.glob("replica-*/checkpoints")):
        m = re.fullmatch(r"replica-(\d+)", d.parent.name)
        if m is not None and d.resolve() != own and d.is_dir():
            out[int(m.group(1))] = d
    return out


def load_boundary(spec: ReplaySpec, boundary: Boundary) -> LocalReplica:
    """A LocalReplica in the state of ``boundary``, fully validated (CheckpointInvalid)."""
    n = spec.partitions
    if boundary.epoch == 0:
        storages = [genesis_storage(spec.genesis, spec.genesis_args, p, n) for p in range(n)]
        return LocalReplica(n, storages)
    if not boundary.usable:
        raise CheckpointInvalid(
            f"checkpoint at epoch {boundary.epoch}: " + "; ".join(boundary.problems)
        )
    loaded = []
    for p, path in enumerate(boundary.paths):
        info, storage = checkpoint.load(Path(path))
        _check_header(info, boundary.epoch, p, n)
        loaded.append((info, storage))
    replica = LocalReplica(n, [s for _, s in loaded])
    for part, (info, _) in zip(replica.parts, loaded, strict=True):
        part.restore(info.epoch, info.next_txn_id, info.txns_applied)
    return replica


def boundary_rows(spec: ReplaySpec, boundary: Boundary) -> Iterator[tuple[str, tuple, tuple]]:
    """Every row of every partition at ``boundary`` (replicated tables repeat per partition)."""
    for p in range(spec.partitions):
        if boundary.epoch == 0:
            yield from genesis_rows(spec.genesis, spec.genesis_args, p, spec.partitions)
        else:
            yield from checkpoint.iter_rows(Path(boundary.paths[p]))


# Reading and applying batches ----------------------------------------------------------
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
) -> Iterator[tuple[int, tuple, int]]:
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
                batch = wire.unpack(payload)
            except Exception as e:
                raise BatchInvalid(epoch, f"undecodable batch: {e}") from None
            _check_batch_shape(epoch, batch)
            if prev is not None and len(batch) > wire.B_PREV_DIGEST:
                _check_digest(epoch, batch[wire.B_PREV_DIGEST], prev)
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
    if isinstance(batch, tuple) and len(batch) > wire.B_PREV_DIGEST:
        recorded = batch[wire.B_PREV_DIGEST]
        if type(recorded) is int:  # anything else is the next reader's to report
            _check_digest(epoch, recorded, prev)


def _check_batch_shape(epoch: int, batch: Any) -> None:
    if not isinstance(batch, tuple) or len(batch) < 6:
        raise BatchInvalid(epoch, "a batch is an array of at least 6 fields")
    head = batch[: wire.B_TXNS]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in head):
        raise BatchInvalid(epoch, "epoch, prev, first txn id, timestamp and seed must be ints")
    if batch[wire.B_EPOCH] != epoch or batch[wire.B_PREV] != epoch - 1:
        raise BatchInvalid(
            epoch,
            f"frame {epoch} holds batch {batch[wire.B_EPOCH]} (prev {batch[wire.B_PREV]})",
        )
    txns = batch[wire.B_TXNS]
    if not isinstance(txns, tuple) or not all(isinstance(t, tuple) and len(t) >= 3 for t in txns):
        raise BatchInvalid(epoch, "txns must be arrays [proc, args, participants, ...]")


def _check_call(epoch: int, txn_id: int, txn: tuple, partitions: int) -> Procedure:
    """The checks the sequencer made before logging the call, repeated on the log."""
    name, args, logged = txn[wire.T_PROC], txn[wire.T_ARGS], txn[wire.T_PARTS]
    try:
        proc = lookup(name)
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

    def apply(self, epoch: int, batch: tuple, frame_bytes: int = 0) -> None:
        if epoch != self.last_epoch + 1:
            raise LogGap(self.last_epoch + 1, f"next batch read is epoch {epoch}")
        first = batch[wire.B_FIRST_TXN]
        if first != self.next_txn_id:
            raise BatchInvalid(epoch, f"first txn id {first}, expected {self.next_txn_id}")
        txns = batch[wire.B_TXNS]
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

    def _count(self, batch: tuple, txns: tuple, frame_bytes: int) -> None:
        s = self.stats
        s.epochs += 1
        s.txns += len(txns)
        s.frame_bytes += frame_bytes
        s.multi_partition += sum(1 for t in txns if len(t[wire.T_PARTS]) > 1)
        ts = batch[wire.B_TS]
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


# Verification of one interval -----------------------------------------------------------
@dataclass(frozen=True)
class IntervalTask:
    """Verify (start.epoch, end.epoch]; ``end`` None: the tail after the last checkpoint."""

    index: int
    spec: ReplaySpec
    start: Boundary
    end: Boundary | None
    fallbacks: tuple[Boundary, ...] = ()  # earlier boundaries to start from, newest first
    log_first_epoch: int = 1
    locate: bool = True

    @property
    def cost(self) -> int:
        """Rough size, for scheduling the longest intervals first."""
        if self.end is None:
            return 1
        return self.end.epoch - self.start.epoch


# Parquet/Spark schema of the verify table: (column, type) with types in
# {"int", "str", "float", "bool", "ts"}; every column but interval/start/end nullable.
VERIFY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("interval", "int"),
    ("start_epoch", "int"),  # exclusive: the state at the end of this epoch is loaded
    ("end_epoch", "int"),  # inclusive; null for the tail
    ("start_source", "str"),  # genesis | checkpoint
    ("replayed_from_epoch", "int"),  # differs from start_epoch after a fallback
    ("epochs", "int"),
    ("txns", "int"),
    ("multi_partition_txns", "int"),
    ("aborted_txns", "int"),
    ("error_txns", "int"),
    ("log_bytes", "int"),
    ("first_batch_ts", "ts"),
    ("last_batch_ts", "ts"),
    ("load_s", "float"),
    ("replay_s", "float"),
    ("check_s", "float"),
    ("total_s", "float"),
    ("cpu_s", "float"),  # this task's process CPU time: total_s >> cpu_s means contention
    ("replay_txns_per_s", "float"),
    ("expected_hash", "str"),
    ("actual_hash", "str"),
    ("partition_hashes_expected", "str"),
    ("partition_hashes_actual", "str"),
    ("verdict", "str"),
    ("bad_epoch", "int"),
    ("located_by", "str"),
    ("suspect_first_epoch", "int"),
    ("suspect_last_epoch", "int"),
    ("suspect_txns", "int"),
    ("diff_rows", "int"),
    ("diff_sample", "str"),  # differing rows, each with the epoch it last changed in replay
    ("replicas_agree", "bool"),
    ("detail", "str"),
    ("worker", "str"),
    ("started_at", "ts"),
)


@dataclass
class IntervalResult:
    interval: int
    start_epoch: int
    end_epoch: int | None
    start_source: str = "genesis"
    replayed_from_epoch: int | None = None
    epochs: int = 0
    txns: int = 0
    multi_partition_txns: int = 0
    aborted_txns: int = 0
    error_txns: int = 0
    log_bytes: int = 0
    first_batch_ts: int | None = None  # ms since the epoch
    last_batch_ts: int | None = None
    load_s: float = 0.0
    replay_s: float = 0.0
    check_s: float = 0.0
    total_s: float = 0.0
    cpu_s: float = 0.0
    replay_txns_per_s: float | None = None
    expected_hash: str | None = None
    actual_hash: str | None = None
    partition_hashes_expected: str | None = None
    partition_hashes_actual: str | None = None
    verdict: str = REPLAY_ERROR
    bad_epoch: int | None = None
    located_by: str | None = None
    suspect_first_epoch: int | None = None
    suspect_last_epoch: int | None = None
    suspect_txns: int | None = None
    diff_rows: int | None = None
    diff_sample: str | None = None
    replicas_agree: bool | None = None
    detail: str = ""
    worker: str = ""
    started_at: int = 0  # ms since the epoch

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def failed(self) -> bool:
        return self.verdict not in PASSED and self.verdict not in UNCHECKED


def _hex(h: int | None) -> str | None:
    return None if h is None else f"{h:016x}"


def _hexes(hs: Sequence[int | None]) -> str:
    return ",".join(_hex(h) or "-" for h in hs)


def verify_interval(task: IntervalTask) -> dict[str, Any]:
    """Verify one interval; returns an IntervalResult row (never raises for bad data)."""
    t_start, cpu_start = time.perf_counter(), time.process_time()
    spec = task.spec
    spec.prepare()
    end = task.end
    res = IntervalResult(
        interval=task.index,
        start_epoch=task.start.epoch,
        end_epoch=None if end is None else end.epoch,
        start_source="genesis" if task.start.epoch == 0 else "checkpoint",
        worker=f"{socket.gethostname()}:{os.getpid()}",
        started_at=int(time.time() * 1000),
    )
    if end is not None:
        res.expected_hash = _hex(end.state_hash)
        res.partition_hashes_expected = _hexes(end.hashes)
    try:
        _verify_into(task, res)
    finally:
        res.total_s = round(time.perf_counter() - t_start, 4)
        res.cpu_s = round(time.process_time() - cpu_start, 4)
    return res.to_row()


def _verify_into(task: IntervalTask, res: IntervalResult) -> None:
    spec, end = task.spec, task.end
    last = None if end is None else end.epoch
    if task.start.epoch + 1 < task.log_first_epoch:
        res.verdict = PRUNED
        res.detail = (
            f"the log starts at epoch {task.log_first_epoch}: epochs "
            f"{task.start.epoch + 1}..{task.log_first_epoch - 1} were pruned"
        )
        return
    t0 = time.perf_counter()
    loaded = _load_with_fallback(task, res)
    res.load_s = round(time.perf_counter() - t0, 4)
    if loaded is None:
        return
    replica, used = loaded
    replayer = Replayer(replica, spec.partitions, record_hashes=task.locate)
    t1 = time.perf_counter()
    failure = _run_replay(replayer, spec.log_dir, last, used.epoch, res)
    res.replay_s = round(time.perf_counter() - t1, 4)
    _record_stats(res, replayer.stats)
    res.actual_hash = _hex(replica.state_hash)
    res.partition_hashes_actual = _hexes([p.storage.state_hash for p in replica.parts])
    if failure:
        return
    t2 = time.perf_counter()
    try:
        _judge(task, res, replica, replayer, used)
    finally:
        res.check_s = round(time.perf_counter() - t2, 4)


def _load_with_fallback(
    task: IntervalTask, res: IntervalResult
) -> tuple[LocalReplica, Boundary] | None:
    """Load the start state; if its checkpoint is invalid, the newest earlier one."""
    problems = []
    for boundary in (task.start, *task.fallbacks):
        try:
            replica = load_boundary(task.spec, boundary)
        except CheckpointInvalid as e:
            problems.append(str(e))
            continue
        res.replayed_from_epoch = boundary.epoch
        if problems:
            res.detail = (
                f"start checkpoint at epoch {task.start.epoch} is invalid ({problems[0]}); "
                f"replayed from epoch {boundary.epoch} instead"
            )
        return replica, boundary
    res.verdict = BAD_CHECKPOINT
    res.bad_epoch = task.start.epoch
    res.located_by = BY_CHECKPOINT
    res.detail = "no valid state to start from: " + " | ".join(problems)
    return None


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
        res.detail = _join(res.detail, f"corrupt log frame at epoch {e.epoch}{where}: {e}")
        return True
    except ReplayFailure as e:
        res.verdict = e.kind
        res.bad_epoch = e.epoch
        res.located_by = getattr(e, "located_by", BY_BATCH if e.kind != LOG_MISSING else BY_LOG)
        res.detail = _join(res.detail, str(e))
        return True
    except Exception as e:  # anything else is still this epoch's failure, reported as such
        res.verdict = REPLAY_ERROR
        res.bad_epoch = replayer.last_epoch + 1
        res.located_by = BY_BATCH
        res.detail = _join(res.detail, f"epoch {res.bad_epoch}: {type(e).__name__}: {e}")
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


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


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
        res.detail = _join(
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
    _diagnose(task, res, replica, replayer, used)


# Locating a divergence ----------------------------------------------------------------------
@dataclass
class RowDiff:
    rows: int = 0
    sample: list[tuple[str, tuple]] = field(default_factory=list)
    keys: list[tuple[str, tuple]] = field(default_factory=list)  # up to a bound, for locating


def diff_against_checkpoint(storage: Storage, path: Path, diff: RowDiff) -> str | None:
    """Compare a replayed partition with its checkpoint row by row, streaming the file.

    Returns why the checkpoint itself is invalid (CRC, footer, rows hash != header
    hash), or None if it is valid; differing rows are added to ``diff``.
    """
    try:
        info = checkpoint.read_info(path)
        state = static = 0
        seen: set[tuple[str, tuple]] = set()
        for table, key, row in checkpoint.iter_rows(path):
            d = row_digest(table, key, row)
            if catalog.table(table).replicated:
                static += d
            else:
                state += d
            seen.add((table, key))
            mine = storage.get(table, key)
            if mine is None or row_digest(table, key, mine) != d:
                _add_diff(diff, table, key)
    except CheckpointInvalid as e:
        return str(e)
    if (state & MASK64, static & MASK64) != (info.state_hash, info.static_hash):
        return f"{path}: rows hash to {state & MASK64:016x}, its header says {info.state_hash:016x}"
    for table, rows in storage.tables.items():
        for key in rows:
            if (table, key) not in seen:
                _add_diff(diff, table, key)
    return None


def _add_diff(diff: RowDiff, table: str, key: tuple) -> None:
    diff.rows += 1
    if len(diff.sample) < DIFF_SAMPLE_MAX:
        diff.sample.append((table, key))
    if len(diff.keys) < 100_000:
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
        txn_id = batch[wire.B_FIRST_TXN]
        for txn in batch[wire.B_TXNS]:
            proc = lookup(txn[wire.T_PROC])
            if not proc.read_only:
                fp = proc.footprint(*txn[wire.T_ARGS])
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


def _diagnose(
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
        res.detail = _join(
            res.detail, f"end checkpoint at epoch {end.epoch} invalid: " + "; ".join(bad)
        )
        return
    res.verdict = DIVERGED
    res.diff_rows = diff.rows
    named = ", ".join(f"{t}{k!r}" for t, k in diff.sample[:5])
    if not task.locate:
        res.detail = _join(res.detail, f"{diff.rows} rows differ from the checkpoint ({named})")
        return
    assert replayer.hashes is not None
    watch = diff.sample[:DIFF_SAMPLE_MAX]
    check = serial_check(task.spec, used, replayer.hashes, watch)
    if check.diverged_at is not None:
        res.bad_epoch = check.diverged_at
        res.located_by = BY_SERIAL
        res.detail = _join(
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
    res.detail = _join(
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


# Planning a whole-history verification ---------------------------------------------------
def plan_verify(
    spec: ReplaySpec,
    boundaries: Sequence[Boundary],
    *,
    log_first_epoch: int = 1,
    tail: bool = True,
    locate: bool = True,
) -> list[IntervalTask]:
    """One task per interval between consecutive boundaries (genesis first), plus the tail.

    Boundaries past the end of the log are kept: their intervals report the missing
    epochs. Each task may fall back to earlier usable boundaries if its start is bad.
    """
    points = [GENESIS, *[b for b in boundaries if b.epoch > 0]]
    tasks = []
    for i in range(len(points) - 1):
        fallbacks = tuple(b for b in reversed(points[:i]) if b.usable)
        tasks.append(
            IntervalTask(
                i, spec, points[i], points[i + 1], fallbacks, max(1, log_first_epoch), locate
            )
        )
    if tail:
        i = len(points) - 1
        fallbacks = tuple(b for b in reversed(points[:i]) if b.usable)
        tasks.append(
            IntervalTask(i, spec, points[i], None, fallbacks, max(1, log_first_epoch), locate)
        )
    return tasks


def annotate_results(
    rows: list[dict[str, Any]], peers: dict[int, list[Boundary]] | None = None
) -> list[dict[str, Any]]:
    """Cross-interval conclusions the driver draws once every task is back.

    - A task that could not load its start checkpoint marks the interval ending there
      ``bad-checkpoint`` (the checkpoint's rows do not match its header, found only
      when loading it).
    - ``replicas_agree``: the other replicas' checkpoint hashes at the interval's end
      equal this replica's (None when no other replica checkpointed that epoch).
    """
    rows = sorted(rows, key=lambda r: r["interval"])
    by_end = {r["end_epoch"]: r for r in rows if r["end_epoch"] is not None}
    for r in rows:
        started = r["replayed_from_epoch"]
        if r["verdict"] == PRUNED or r["start_epoch"] == 0:
            continue
        if started is None or started != r["start_epoch"]:
            prev = by_end.get(r["start_epoch"])
            if prev is not None and prev["verdict"] in PASSED:
                prev["verdict"] = BAD_CHECKPOINT
                prev["bad_epoch"] = r["start_epoch"]
                prev["located_by"] = BY_CHECKPOINT
                why = r["detail"]
                if "is invalid (" in why and "); replayed from" in why:
                    why = why[why.index("is invalid (") + 12 : why.index("); replayed from")]
                prev["detail"] = _join(
                    prev["detail"],
                    f"its end checkpoint (epoch {r['start_epoch']}) has the right header hash "
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
    """Plan, run (default: one after another in this process) and annotate a verification."""
    spec.prepare()
    boundaries = scan_checkpoints(checkpoint_dir, spec.partitions)
    tasks = plan_verify(
        spec, boundaries, log_first_epoch=log_first_epoch(spec.log_dir), tail=tail, locate=locate
    )
    rows = run(tasks) if run is not None else [verify_interval(t) for t in tasks]
    peers = {
        r: scan_checkpoints(d, spec.partitions)
        for r, d in peer_checkpoint_dirs(checkpoint_dir).items()
    }
    return annotate_results(rows, peers)


# Rebuilding the state at an epoch ----------------------------------------------------------
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
    candidates = [b for b in reversed(boundaries) if 0 < b.epoch <= epoch and b.usable]
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


# History as rows -----------------------------------------------------------------------------
# Fixed columns of the history table; then one column per flattened argument.
HISTORY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("epoch", "int"),
    ("txn_id", "int"),
    ("seq", "int"),  # position within the epoch's batch (0-based): the global order
    ("procedure", "str"),
    ("participants", "int_list"),
    ("multi_partition", "bool"),
    ("batch_ts", "ts"),
    ("batch_ts_ms", "int"),
    ("client_id", "str"),  # hex; empty for calls without one
    ("req_id", "str"),  # JSON
    ("args_json", "str"),  # every argument (incl. a dependent txn's prediction), as JSON
)

# Arg.type -> column type ("list": an array of int64 when every element is an int)
_ARG_COLUMN_TYPES = {
    "int": "int",
    "str": "str",
    "bytes": "bytes",
    "float": "float",
    "bool": "bool",
    "list": "int_list",
    "any": "json",
}
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class HistoryLayout:
    """Which column each procedure's arguments go to: ``arg_<name>`` when every
    procedure that has an argument of that name gives it the same type, else
    ``arg_<procedure>_<name>`` (dots as underscores)."""

    arg_columns: tuple[tuple[str, str], ...]  # (column, type)
    by_proc: dict[str, tuple[tuple[int, int, str], ...]]  # proc -> (arg pos, column idx, type)

    @property
    def columns(self) -> tuple[tuple[str, str], ...]:
        return HISTORY_COLUMNS + self.arg_columns


def history_layout(procs: dict[str, Procedure] | None = None) -> HistoryLayout:
    procs = procedures() if procs is None else procs
    types: dict[str, set[str]] = {}
    for p in procs.values():
        for a in p.args:
            types.setdefault(a.name, set()).add(_ARG_COLUMN_TYPES[a.type])
    columns: dict[str, str] = {}
    named: dict[str, list[tuple[int, str, str]]] = {}
    for name in sorted(procs):
        for pos, a in enumerate(procs[name].args):
            kind = _ARG_COLUMN_TYPES[a.type]
            shared = len(types[a.name]) == 1
            col = f"arg_{a.name}" if shared else f"arg_{name.replace('.', '_')}_{a.name}"
            columns.setdefault(col, kind)
            named.setdefault(name, []).append((pos, col, kind))
    ordered = tuple(sorted(columns.items()))
    index = {c: len(HISTORY_COLUMNS) + i for i, (c, _) in enumerate(ordered)}
    by_proc = {p: tuple((pos, index[c], k) for pos, c, k in es) for p, es in named.items()}
    return HistoryLayout(ordered, by_proc)


def to_json(value: Any) -> str:
    """JSON for logged values: bytes as hex, tuples as arrays, anything else as text."""

    def default(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.hex()
        return str(v)

    return json.dumps(value, default=default, separators=(",", ":"))


def _arg_cell(kind: str, v: Any) -> Any:
    """A logged argument as its column's type, or None (args_json keeps every value)."""
    if kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v <= _INT64[1]
        return v if ok else None
    if kind == "int_list":
        if isinstance(v, (list, tuple)) and all(
            isinstance(x, int) and not isinstance(x, bool) and _INT64[0] <= x <= _INT64[1]
            for x in v
        ):
            return list(v)
        return None
    if kind == "json":
        return to_json(v)
    if kind == "float":
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    expected = {"str": str, "bytes": bytes, "bool": bool}[kind]
    return v if isinstance(v, expected) else None


def history_rows(
    spec: ReplaySpec, layout: HistoryLayout, first: int, last: int | None
) -> Iterator[tuple]:
    """One tuple per logged transaction of epochs first..last, in ``layout.columns`` order."""
    width = len(layout.columns)
    for epoch, batch, _ in iter_batches(spec.log_dir, first, last):
        txn_id = batch[wire.B_FIRST_TXN]
        ts = batch[wire.B_TS]
        for seq, txn in enumerate(batch[wire.B_TXNS]):
            name, args, parts = txn[wire.T_PROC], txn[wire.T_ARGS], txn[wire.T_PARTS]
            client = txn[wire.T_CLIENT] if len(txn) > wire.T_CLIENT else b""
            req = txn[wire.T_REQ] if len(txn) > wire.T_REQ else None
            row: list[Any] = [None] * width
            row[:11] = [
                epoch,
                txn_id + seq,
                seq,
                name,
                list(parts),
                len(parts) > 1,
                ts,
                ts,
                client.hex() if isinstance(client, bytes) else to_json(client),
                to_json(req),
                to_json(args),
            ]
            for pos, idx, kind in layout.by_proc.get(name, ()):
                if isinstance(args, tuple) and pos < len(args):
                    row[idx] = _arg_cell(kind, args[pos])
            yield tuple(row)


def split_epochs(first: int, last: int, pieces: int) -> list[tuple[int, int]]:
    """first..last cut into at most ``pieces`` contiguous ranges of near-equal length."""
    if last < first:
        return []
    pieces = max(1, min(pieces, last - first + 1))
    size, extra = divmod(last - first + 1, pieces)
    out, lo = [], first
    for i in range(pieces):
        hi = lo + size - 1 + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi + 1
    return out


# Tables as columns (for Parquet) --------------------------------------------------------------
@dataclass(frozen=True)
class TableLayout:
    """How one table is written: column names (catalog), key positions, partition column."""

    name: str
    columns: tuple[str, ...]
    key_positions: tuple[int, ...]  # key parts written (those the row does not repeat)
    row_width: int
    partition_by: str | None  # a warehouse-like column for tables placed by it
    replicated: bool


def table_layout(name: str) -> TableLayout:
    spec = catalog.table(name)
    names, key_pos, width = spec.output_columns()
    partition_by = None
    if spec.placement is catalog.place_by_first_int and not spec.replicated:
        key_names = list(spec.key_columns) or [f"key_{i}" for i in range(spec.key_len)]
        partition_by = key_names[0]  # the warehouse id for TPC-C (placement prefix)
    return TableLayout(name, tuple(names), tuple(key_pos), width, partition_by, spec.replicated)


def table_columns(storages: Sequence[Storage], layout: TableLayout) -> tuple[list[list[Any]], int]:
    """The table's rows across partitions as column lists (replicated: once), sorted by key."""
    sources = storages[:1] if layout.replicated else storages
    keys_rows: list[tuple[tuple, tuple]] = []
    for s in sources:
        t = s.tables.get(layout.name)
        if t:
            keys_rows.extend(t.items())
    keys_rows.sort(key=lambda kr: kr[0])
    cols: list[list[Any]] = [[] for _ in layout.columns]
    nk = len(layout.key_positions)
    width = layout.row_width
    for key, row in keys_rows:
        for j, pos in enumerate(layout.key_positions):
            cols[j].append(key[pos])
        for j in range(width):
            cols[nk + j].append(row[j] if j < len(row) else None)
    return cols, len(keys_rows)
