"""Ordo's small error hierarchy and the result statuses every role agrees on.

A new exception class exists only where some caller handles it differently:
bad request (client's fault, nothing changed), overloaded (try later), not ready,
timeout, and internal bug. A logical abort is a *status*, never an exception.
"""

from __future__ import annotations

import logging

# Result statuses on the wire: [status, value]
OK = 0  # value: the procedure's return value
ABORTED = 1  # value: reason string; a logical abort applied identically everywhere
RESTART = 2  # internal: a dependent txn's prediction was stale; value: new prediction
ERROR = 3  # value: [code, message]; the call did not execute (or raised)

STATUS_NAMES = {OK: "ok", ABORTED: "aborted", RESTART: "restart", ERROR: "error"}

# Error codes carried in ERROR results
ERR_MALFORMED = "malformed"
ERR_UNKNOWN_PROCEDURE = "unknown_procedure"
ERR_BAD_ARGUMENTS = "bad_arguments"
ERR_TOO_LARGE = "too_large"
ERR_OVERLOADED = "overloaded"
ERR_NOT_READY = "not_ready"
ERR_PROCEDURE_FAILED = "procedure_failed"
ERR_RESTARTS_EXHAUSTED = "restarts_exhausted"
ERR_UNAVAILABLE = "unavailable"
ERR_REQUEST_ID_REUSED = "request_id_reused"  # same (client_id, req_id), different call
ERR_RETRY_EXPIRED = "retry_expired"  # a retry older than the retry cache: outcome unknown
# Not the leader of the replicated ordering layer: the call was not sequenced here; the
# client resends it, same ids, to the leader (the message names it when known).
ERR_NOT_LEADER = "not_leader"


class OrdoError(Exception):
    """Base of every error Ordo raises on purpose."""


class BadRequest(OrdoError):
    """The caller's input is wrong; nothing was logged or changed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class BatchesGone(BadRequest):
    """A stream no longer keeps batches a subscriber has not seen: no batch id in
    ``first_missing..last_missing`` is kept (``last_missing`` at least was pushed, and
    dropped by the stream's retention before this subscriber read it). ``oldest_kept``:
    the oldest batch id the stream keeps (None if none). A subscriber that falls behind
    gets this rather than a silent skip; one that would rather go on asks to be told
    (``Client.subscribe(on_gap=...)``). A BadRequest, code ``bad_arguments``, as a
    subscription from a batch no longer kept always was."""

    def __init__(
        self, stream: str, first_missing: int, last_missing: int, oldest_kept: int | None
    ) -> None:
        span = (
            f"batch {first_missing}"
            if first_missing == last_missing
            else f"batches {first_missing}..{last_missing}"
        )
        kept = "none" if oldest_kept is None else str(oldest_kept)
        super().__init__(
            ERR_BAD_ARGUMENTS,
            f"stream {stream} no longer keeps {span}, not yet delivered to this "
            f"subscriber (the oldest batch kept is {kept})",
        )
        self.stream = stream
        self.first_missing = first_missing
        self.last_missing = last_missing
        self.oldest_kept = oldest_kept


class Overloaded(OrdoError):
    """The system is at a bound; retrying later may succeed."""


class CallTimeout(OrdoError):
    """No answer arrived within the caller's deadline (the call may still commit)."""


class CallFailed(OrdoError):
    """The server answered with an ERROR status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class FootprintViolation(OrdoError):
    """A procedure touched a key outside its declared footprint.

    Raised inside the executor; it aborts that transaction identically on every
    replica (the footprint is a function of the logged arguments).
    """


class InvariantViolation(OrdoError):
    """An internal invariant does not hold: a bug in Ordo, never the client's fault."""


def brief(value: object, limit: int = 80) -> str:
    """A short, safe rendering of a client-supplied value for an error message: never
    longer than ``limit`` and never recursing without bound (deeply nested input)."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deep>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def detached(e: BaseException) -> BaseException:
    """``e`` (and the exceptions chained to it) without tracebacks, to be kept: a kept
    traceback holds the frames it passed through and everything they hold, often in a
    cycle back to the keeper."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        x.__traceback__ = None
        todo += (x.__cause__, x.__context__)
    return e


def invariant(cond: bool, message: str) -> None:
    """Check a state invariant. Unlike assert, survives python -O; never has side effects."""
    if not cond:
        raise InvariantViolation(message)


class DroppedMessages:
    """Counts malformed or misaddressed messages a process dropped, and logs them at most
    once per ``every_s`` with a count and the latest reason: a flood of junk must not
    flood the log (nor write a traceback per message)."""

    def __init__(self, logger: logging.Logger, what: str, every_s: float = 1.0) -> None:
        self.logger = logger
        self.what = what
        self.every_s = every_s
        self.messages = 0  # dropped by this process's own checks
        self.latest = ""
        self._logged = 0  # messages + refused at the last log line
        self._next_log_at = 0.0

    def note(self, reason: str) -> None:
        self.messages += 1
        self.latest = reason

    def report(self, now: float, refused_elsewhere: int = 0) -> None:
        """Log what was dropped since the last line, if anything and if it is time.
        ``refused_elsewhere``: a running count the role itself keeps (e.g. reads)."""
        total = self.messages + refused_elsewhere
        if total == self._logged or now < self._next_log_at:
            return
        self.logger.warning(
            "dropped %d %s since the last report (in all: %d malformed or misaddressed, "
            "latest: %s; %d refused by the role)",
            total - self._logged,
            self.what,
            self.messages,
            self.latest or "-",
            refused_elsewhere,
        )
        self._logged = total
        self._next_log_at = now + self.every_s
