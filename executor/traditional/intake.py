"""A coordinator's client intake: validation, exactly-once retries, admission control.

The calls of a client frame are checked (shape, procedure, arguments) and
deduplicated against the retry cache, as at the sequencer: a retry of an answered
call gets the same answer again, a retry of a call in flight is attached to it (the
answer goes to the retry's connection), and ids reused for another call are refused.
A new call gets its priority (start_us, coordinator, seq) and its body seed here,
from the handed-in clock and Random, and is admitted: at most ``active_max`` calls
run at once (counting those waiting to restart), the others wait in FIFO order
(2PL thrashes when far more transactions than records-in-conflict run together).
Every admitted call gets exactly one answer (``reply``), which frees its slot for
the next waiting call.

Invariants (InvariantViolation is a bug):
- admitted calls not yet answered never exceed ``active_max`` and never go below zero
  (an answer without an admission is a bug);
- accepted calls not yet answered never exceed limits.traditional_calls_max: beyond
  it a call is refused (ERR_OVERLOADED) and nothing of it is kept;
- a bad request is answered with an error and never reaches a body or the log; so is
  ``ordo.deploy`` (code goes through the deterministic engine's log only).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from executor.traditional.attempt import Call
from executor.traditional.shared import PartitionState
from sequencer.retry_cache import Done, RetryCache, call_body, call_digest
from txn_library import limits
from txn_library.deployed import DEPLOY_PROC
from txn_library.errors import (
    ERR_MALFORMED,
    ERR_OVERLOADED,
    ERR_UNAVAILABLE,
    ERROR,
    OK,
    BadRequest,
    invariant,
)
from txn_library.procedure import lookup

CLIENT_ID_BYTES_MAX = 64


class Intake:
    """Accepts client calls for one coordinator and answers each exactly once."""

    def __init__(
        self,
        state: PartitionState,
        *,
        next_seq: Callable[[], int],
        start: Callable[[Call], None],
    ) -> None:
        self.state = state
        self._next_seq = next_seq  # the coordinator's counter (attempt ids share it)
        self._start = start  # runs an admitted call's first attempt
        self.in_system = 0  # admitted calls not yet answered
        self.admission: deque[Call] = deque()  # accepted, waiting for a slot
        self.retries = RetryCache()  # exactly-once retries, as at the sequencer

    # Requests -----------------------------------------------------------------------------
    def on_calls(self, identity: bytes, client_id: Any, calls: Any) -> None:
        """A client's REQ_CALLS frame (decoded): validate, dedup, accept each call."""
        if not isinstance(client_id, bytes) or len(client_id) > CLIENT_ID_BYTES_MAX:
            self.error(identity, None, ERR_MALFORMED, "client_id must be bytes (<= 64)")
            return
        if not isinstance(calls, (tuple, list)) or len(calls) > limits.calls_per_frame_max:
            self.error(identity, None, ERR_MALFORMED, "calls must be an array of calls")
            return
        for c in calls:
            if not isinstance(c, (tuple, list)) or len(c) not in (3, 4):
                self.error(identity, None, ERR_MALFORMED, "a call is [req_id, procedure, args]")
                continue
            req_id, name, args = c[:3]
            if not isinstance(req_id, int) or isinstance(req_id, bool):
                self.error(identity, None, ERR_MALFORMED, "req_id must be an integer")
                continue
            try:
                self._accept(identity, client_id, req_id, name, args)
            except BadRequest as e:
                self.error(identity, req_id, e.code, e.message)

    def error(self, identity: bytes, req_id: Any, code: str, message: str) -> None:
        """An ERROR answer to a request that was not accepted (it holds no slot)."""
        self.state.client_out.setdefault(identity, []).append((req_id, ERROR, (code, message)))

    def _accept(self, identity: bytes, client_id: bytes, req_id: int, name: Any, args: Any) -> None:
        st = self.state
        proc = lookup(name)
        if proc is DEPLOY_PROC:  # code through the log: the deterministic engine's
            raise BadRequest(ERR_UNAVAILABLE, "ordo deploy needs the deterministic engine")
        proc.validate(args)
        args = tuple(args)
        digest = call_digest(call_body(proc.name, args))
        key = (client_id, req_id)
        seen = self.retries.retry_of(key, digest) if client_id else None
        if seen is not None:
            st.stats.duplicate_calls += 1
            if isinstance(seen, Done):
                st.client_out.setdefault(identity, []).append((req_id, seen.status, seen.value))
            else:
                seen.identity = identity  # in flight: answer the retry's connection
            return
        if self.calls_in_flight >= limits.traditional_calls_max:
            raise BadRequest(ERR_OVERLOADED, "too many calls in flight; retry later")
        seq = self._next_seq()
        now = st.clock()
        prio = (now, st.partition, seq)
        seed = st.rng.getrandbits(63)
        call = Call(identity, client_id, req_id, proc, args, digest, prio, now // 1000, seed)
        if client_id:
            self.retries.start(key, call)
        if self.in_system < st.options.active_max and not self.admission:
            self._admit(call)
        else:
            self.admission.append(call)

    def _admit(self, call: Call) -> None:
        self.in_system += 1
        self._start(call)

    # Answers ------------------------------------------------------------------------------
    def reply(self, call: Call, status: int, value: Any) -> None:
        """The call's final answer: frees its admission slot."""
        self.state.client_out.setdefault(call.identity, []).append((call.req_id, status, value))
        if call.client_id:
            self.retries.finish((call.client_id, call.req_id), status, value, call.digest)
        self.in_system -= 1
        invariant(self.in_system >= 0, "more answers than admitted calls")
        while self.admission and self.in_system < self.state.options.active_max:
            self._admit(self.admission.popleft())

    def recovered_result(
        self, client_id: bytes, req_id: int, value: Any, digest: int | None
    ) -> None:
        """A committed call found in the log: a retry of it gets this answer again."""
        if client_id:
            self.retries.finish((client_id, req_id), OK, value, digest)

    # Introspection ------------------------------------------------------------------------
    @property
    def calls_in_flight(self) -> int:
        """Calls accepted and not yet answered (admitted or waiting for admission)."""
        return self.in_system + len(self.admission)

    def idle(self) -> bool:
        return not self.in_system and not self.admission

    def check_invariants(self) -> None:
        invariant(self.in_system <= self.state.options.active_max, "admission bound broken")
