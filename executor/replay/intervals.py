"""One interval of a verification: the task a worker runs and the row it returns.

An interval (a, b] lies between consecutive boundaries (genesis = 0); the tail
(a, end of log] follows the last checkpoint. ``IntervalTask`` is what a Spark task
receives (picklable: a ReplaySpec and Boundaries); ``IntervalResult`` is the one small
row it sends back, whose fields are the columns of the verify table
(``VERIFY_COLUMNS``, the Parquet/Spark schema).

Invariant: ``VERIFY_COLUMNS`` and the fields of ``IntervalResult`` name the same
columns in the same order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from executor.replay.boundaries import Boundary
from executor.replay.spec import ReplaySpec
from executor.replay.verdicts import PASSED, REPLAY_ERROR, UNCHECKED


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
    log_last_epoch: int | None = None  # the log's last epoch when planned (the tail's size)
    log_next_txn_id: int | None = None  # the txn id after the log's last batch then

    @property
    def cost(self) -> int:
        """Rough size in epochs, for balancing runs (the tail: up to the log's last
        epoch when planned, if known)."""
        if self.end is None:
            if self.log_last_epoch is None:
                return 1
            return max(1, self.log_last_epoch - self.start.epoch)
        return self.end.epoch - self.start.epoch

    @property
    def txns(self) -> int | None:
        """Transactions it replays, for balancing runs, from the boundaries' (or for the
        tail, the log's last batch's) next txn ids: None if unknown."""
        end = self.log_next_txn_id if self.end is None else self.end.next_txn_id
        if not end:  # a header that does not say (0), or a log not read
            return None
        return max(0, end - self.start.next_txn_id)


# Parquet/Spark schema of the verify table: (column, type) with types in
# {"int", "str", "float", "bool", "ts"}; every column but interval/start/end nullable.
VERIFY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("interval", "int"),
    ("start_epoch", "int"),  # exclusive: the state at the end of this epoch is loaded
    ("end_epoch", "int"),  # inclusive; null for the tail
    ("start_source", "str"),  # genesis | checkpoint
    ("replayed_from_epoch", "int"),  # differs from start_epoch after a fallback
    ("start_invalid_epoch", "int"),  # the checkpoint file that made loading the start fail
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
    start_invalid_epoch: int | None = None
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


def join_detail(a: str, b: str) -> str:
    """A result's ``detail`` with one more finding appended."""
    return f"{a}; {b}" if a else b
