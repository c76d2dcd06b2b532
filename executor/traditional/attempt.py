"""A coordinator's per-call state: the call, its attempts, and the body's context.

A ``Call`` is one client request accepted by a coordinator; it lives until it is
answered. Each run of its body is an ``Attempt`` with its own aid (coordinator, seq)
and its own greenlet; a call whose attempt died under wait-die starts a new attempt
with the same priority. A body runs with a TxnContext whose ``on_write`` hook (the
coordinator's) takes the exclusive lock as each write happens.

Invariants:
- a call's priority (start_us, coordinator, seq) is fixed at acceptance and kept
  across restarts, so it only gets older relative to newcomers;
- an attempt's body runs only in its own greenlet; ``Killed`` thrown into it unwinds
  it (a BaseException, so that procedure code catching Exception cannot swallow it).
"""

from __future__ import annotations

from typing import Any

import greenlet

from executor.core.rows import PreparedWrite
from executor.traditional.messages import Aid, Prio
from executor.traditional.options import HistoryEntry
from txn_library.procedure import Procedure

# Attempt states
S_RUN, S_WAIT_ACKS, S_PREPARING = 0, 1, 2
HOLD = ("hold",)  # what a body suspended by ctx.hold_locks waits on


class Killed(BaseException):
    """Thrown into a suspended body to unwind it (wait-die death, timeout).

    A BaseException so that run_body and procedure code that catches Exception do
    not swallow it.
    """


class Call:
    __slots__ = (
        "identity",
        "client_id",
        "req_id",
        "proc",
        "args",
        "prio",
        "seed",
        "ts_ms",
        "restarts",
        "recon",
        "dep_restarts",
        "digest",
    )

    def __init__(
        self,
        identity: bytes,
        client_id: bytes,
        req_id: int,
        proc: Procedure,
        args: tuple,
        digest: int,
        prio: Prio,
        ts_ms: int,
        seed: int,
    ) -> None:
        self.identity = identity
        self.client_id = client_id
        self.req_id = req_id
        self.proc = proc
        self.args = args
        self.digest = digest  # of (procedure, arguments): a retry must be the same call
        self.prio = prio
        self.ts_ms = ts_ms  # what the body sees as ctx.timestamp_ms, with ctx.rng's seed
        self.seed = seed
        self.restarts = 0
        self.dep_restarts = 0
        self.recon = proc.recon is not None


class Attempt:
    __slots__ = (
        "aid",
        "call",
        "proc",
        "args",
        "reads",
        "writes",
        "glet",
        "suspended",
        "wake",
        "waiting_on",
        "doomed",
        "kill_reason",
        "parts",
        "remote_locks",
        "rows",
        "scans",
        "acks_pending",
        "outcome",
        "state",
        "deadline_us",
        "votes",
        "yes",
        "local_writes",
        "local_prepared",
        "hist",
    )

    def __init__(
        self, aid: Aid, call: Call, proc: Procedure, reads: frozenset, writes: frozenset
    ) -> None:
        self.aid = aid
        self.call = call
        self.proc = proc
        self.args = call.args
        self.reads = reads
        self.writes = writes
        self.glet: greenlet.greenlet | None = None
        self.suspended = True
        self.wake = 0
        self.waiting_on: Any = None
        self.doomed = False
        self.kill_reason: tuple | None = None
        self.parts: dict[int, int] = {}  # participant -> lock requests sent to it
        self.remote_locks: dict[tuple, int] = {}  # lock name -> strongest mode asked for
        self.rows: dict[tuple, Any] = {}
        self.scans: dict[tuple, Any] = {}
        self.acks_pending = 0
        self.outcome: tuple | None = None
        self.state = S_RUN
        self.deadline_us = 0
        self.votes: set[int] = set()
        self.yes: list[int] = []
        self.local_writes: tuple = ()
        self.local_prepared: list[PreparedWrite] = []  # local_writes with their row digests
        self.hist: HistoryEntry | None = None
