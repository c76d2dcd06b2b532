"""The vocabulary of a verification: an interval's verdict and how a bad epoch was located.

These strings are the values of the verify table's ``verdict`` and ``located_by``
columns (executor.replay.intervals.VERIFY_COLUMNS, docs/REPLAY.md). Each
``ReplayFailure`` (executor.replay.batches) carries the verdict it implies.

Invariant: PASSED and UNCHECKED are disjoint, and every verdict in neither is a
failure (``IntervalResult.failed``): only a failure fails a verification.
"""

from __future__ import annotations

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
