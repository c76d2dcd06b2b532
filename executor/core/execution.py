"""Running one procedure body and turning its outcome into a result.

Shared by the live partition, the single-process serial executor, recovery replay,
Spark replay and the traditional (2PL) mode, so that all of them compute exactly the
same thing.

Invariants:
- A body's outcome is a pure function of (args, rows read, timestamp, seed).
  Exceptions are outcomes too: a FootprintViolation is a logical abort and any other
  Exception an ERROR result (ERR_PROCEDURE_FAILED); either way the outcome is the
  same on every replica, because the inputs are.
- Nothing a procedure produces can stop a partition: its returned value (or abort
  reason, or restart prediction) must encode with msgpack within
  ``limits.result_bytes_max`` bytes, and its whole write set must pass
  ``Storage.prepare_writes``; otherwise the result is ERROR (ERR_PROCEDURE_FAILED) and
  no write is applied anywhere. These checks look only at what the body produced, so
  every executor, the serial oracle and replay reach the same outcome.
- ``run_txn`` returns writes only with status OK; applying them cannot fail.
"""

from __future__ import annotations

from typing import Any, cast

import msgpack

from executor.core.context import TxnContext
from executor.core.rows import (
    KEY_INT_MAX,
    KEY_INT_MIN,
    PreparedWrite,
    encode_failure,
    failure_text,
)
from executor.core.storage import Storage
from txn_library import limits
from txn_library.errors import (
    ABORTED,
    ERR_PROCEDURE_FAILED,
    ERROR,
    OK,
    RESTART,
    FootprintViolation,
    InvariantViolation,
)
from txn_library.procedure import Abort, Procedure, Restart

_packb = msgpack.packb


def pack_value(value: Any) -> tuple[bytes, None] | tuple[None, str]:
    """A procedure's value as it travels (its msgpack bytes, packed here once and
    carried to the client as they are), or why it cannot travel."""
    if type(value) is int and not KEY_INT_MIN <= value <= KEY_INT_MAX:
        return None, "integer out of range for msgpack"
    try:
        data = _packb(value)
    # The value is the procedure's: packing it may run its code (subclasses), so
    # anything it raises is the procedure's failure, identical on every replica.
    except Exception as e:
        return None, encode_failure(e)
    if len(data) > limits.result_bytes_max:
        return None, f"{len(data)} bytes exceeds result_bytes_max ({limits.result_bytes_max})"
    return data, None


def run_body(proc: Procedure, args: tuple, ctx: TxnContext) -> tuple[int, Any, bytes]:
    """Run the body; return (status, value, the value packed). Writes stay in ctx.writes
    (see run_txn)."""
    try:
        out = proc.body(ctx, *args)
    except FootprintViolation as e:
        return _outcome(ABORTED, f"footprint violation: {e}")
    except InvariantViolation:
        # Ordo's own state is wrong where the body read it (a loaded row under another
        # key: executor.core.pending.fault): the process stops; it is never the call's result.
        raise
    except Exception as e:  # a bug in the procedure: deterministic, so identical everywhere
        return _outcome(ERROR, (ERR_PROCEDURE_FAILED, f"{proc.name} raised {failure_text(e)}"))
    value: Any  # not the abort reason's str: mypy would infer it (mypyc enforces it)
    if isinstance(out, Abort):
        # Read untyped: a body may put anything in it (mypyc would check for str here).
        status, value, what = ABORTED, cast(Any, out).reason, "abort reason"
    elif isinstance(out, Restart):
        status, value, what = RESTART, out.prediction, "restart prediction"
    else:
        status, value, what = OK, out, "result"
    data, problem = pack_value(value)
    if data is None:
        return _outcome(ERROR, (ERR_PROCEDURE_FAILED, f"{proc.name}: {what} rejected: {problem}"))
    return status, value, data


def _outcome(status: int, value: Any) -> tuple[int, Any, bytes]:
    """An outcome the executor made (a reason: strings and ints, bounded by
    failure_text), with its value packed."""
    return status, value, _packb(value)


def run_txn(
    proc: Procedure, args: tuple, ctx: TxnContext, storage: Storage
) -> tuple[int, Any, bytes, list[PreparedWrite]]:
    """Run the body and validate its whole write set: (status, value, the value packed,
    writes).

    ``writes`` is empty unless status is OK; pass it to ``Storage.apply`` (an executor
    of a multi-partition txn applies only its local ones). ``storage`` only lends its
    packer: the outcome does not depend on what it holds.
    """
    status, value, data = run_body(proc, args, ctx)
    body_writes: Any = ctx.writes  # a body may have replaced it: prepare_writes checks
    if status != OK or (type(body_writes) is dict and not body_writes):
        return status, value, data, []
    writes, problem = storage.prepare_writes(body_writes)
    if problem is not None:
        return (*_outcome(ERROR, (ERR_PROCEDURE_FAILED, f"{proc.name}: {problem}")), [])
    return OK, value, data, writes
