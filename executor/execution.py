"""Running one procedure body and turning its outcome into a result.

Shared by the live partition, the single-process serial executor, recovery replay
and Spark replay, so that all of them compute exactly the same thing.

Invariant: a body's outcome is a pure function of (args, rows read, timestamp,
seed). Exceptions are outcomes too: a FootprintViolation is a logical abort and any
other exception an ERROR result; in both cases no write is applied. Either way the
outcome is the same on every replica, because the inputs are.
"""

from __future__ import annotations

from typing import Any

import msgpack

from executor.context import TxnContext
from txn_library.errors import ABORTED, ERR_PROCEDURE_FAILED, ERROR, OK, RESTART, FootprintViolation
from txn_library.procedure import Abort, Procedure, Restart

_PLAIN = (int, str, float, bool, type(None), bytes)


def run_body(proc: Procedure, args: tuple, ctx: TxnContext) -> tuple[int, Any]:
    """Run the body; return (status, value). Writes stay in ctx.writes (apply on OK)."""
    try:
        out = proc.body(ctx, *args)
    except FootprintViolation as e:
        return ABORTED, f"footprint violation: {e}"
    except Exception as e:  # a bug in the procedure: deterministic, so identical everywhere
        return ERROR, (ERR_PROCEDURE_FAILED, f"{proc.name} raised {type(e).__name__}: {e}")
    if isinstance(out, Abort):
        return ABORTED, out.reason
    if isinstance(out, Restart):
        return RESTART, out.prediction
    if not isinstance(out, _PLAIN):
        try:
            msgpack.packb(out)
        except Exception as e:
            return ERROR, (ERR_PROCEDURE_FAILED, f"{proc.name} returned unencodable {e}")
    return OK, out
