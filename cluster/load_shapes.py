"""What the load generator drives: calls, their sources and routes, and the shape of the
load (closed or open loop), with the bounds a load must fit.

Load shapes:
- ``ClosedLoop``: ``terminals`` terminals, each with at most ``in_flight_per_terminal``
  calls outstanding; a terminal sends its next call when one answers (after an optional
  think time, fixed or exponential, seeded).
- ``OpenLoop``: calls at ``rate_per_s`` (fixed spacing or Poisson arrivals, seeded)
  whatever the answers, drawn from the terminals round robin; a call due while
  ``in_flight_max`` are outstanding is not sent and is counted as skipped (the schedule
  moves on: an open loop that waited would hide the backlog it exists to show).

The workload is a ``CallSource``: ``source(terminal)`` gives the terminal's next call
(anything with ``proc``, ``args``, ``kind`` and ``multi_partition``, such as ``Call``)
or None when that terminal has no more work (a finite workload, e.g. a list of
transfers). Targets: one sequencer address; one address per partition of a traditional
(2PL) cluster with ``route`` choosing the partition of each call; or every sequencer of
a replicated ordering layer, failed over between.

Invariant: a load fits the generator's bounds (``check_shape``, when a generator is
built): at most ``limits.loadgen_in_flight_max`` calls outstanding in all (closed loop:
terminals x in_flight_per_terminal; open loop: in_flight_max), at most
``limits.loadgen_connections_max`` connections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from txn_library import limits
from txn_library.placement import call_home


class CallLike(Protocol):
    """What a call source returns (``Call`` here, tpcc.inputs.Call, ...)."""

    @property
    def proc(self) -> str: ...
    @property
    def args(self) -> Sequence[Any]: ...
    @property
    def kind(self) -> str: ...
    @property
    def multi_partition(self) -> bool: ...


class Call(NamedTuple):
    """One call: procedure, arguments, the kind it is counted under, and whether the
    workload made it multi-partition (counted per kind, for the share)."""

    proc: str
    args: Sequence[Any]
    kind: str = "call"
    multi_partition: bool = False


# source(terminal) -> the terminal's next call, or None when it has no more work
CallSource = Callable[[int], CallLike | None]
# route(proc, args) -> index of the target address the call goes to
Router = Callable[[str, Sequence[Any]], int]


def home_router(partitions: int) -> Router:
    """Route each call to its home partition (txn_library.placement.call_home): the
    targets are a traditional cluster's per-partition client addresses."""

    def route(proc: str, args: Sequence[Any]) -> int:
        return call_home(proc, args, partitions)

    return route


@dataclass(frozen=True)
class ClosedLoop:
    """``terminals`` terminals, each with at most ``in_flight_per_terminal`` calls
    outstanding; after an answer, a terminal waits ``think_s`` (``think`` "fixed", or
    "exponential" with that mean) before its next call."""

    terminals: int
    in_flight_per_terminal: int = 1
    think_s: float = 0.0
    think: str = "fixed"

    @property
    def in_flight_max(self) -> int:
        return self.terminals * self.in_flight_per_terminal


@dataclass(frozen=True)
class OpenLoop:
    """Calls at ``rate_per_s`` (``arrivals`` "fixed" spacing or "poisson"), drawn from
    ``terminals`` terminals round robin, at most ``in_flight_max`` outstanding."""

    rate_per_s: float
    in_flight_max: int
    terminals: int = 1
    arrivals: str = "fixed"


Load = ClosedLoop | OpenLoop


def check_shape(
    load: Load,
    targets: int,
    route: Router | None,
    connections: int,
    timeout_s: float,
    retry_s: float,
    failover: bool = False,
) -> None:
    """Raise ValueError unless the load fits the generator's bounds."""
    if targets < 1 or (targets > 1 and route is None and not failover):
        raise ValueError(
            "one target, or several with a route choosing among them, "
            "or several sequencers to fail over between"
        )
    if failover and route is not None:
        raise ValueError("failover moves between sequencers: no route")
    if not 1 <= connections <= limits.loadgen_connections_max:
        raise ValueError(f"connections must be in 1..{limits.loadgen_connections_max}")
    if timeout_s <= 0 or retry_s <= 0:
        raise ValueError("timeout_s and retry_s must be > 0")
    if isinstance(load, ClosedLoop):
        if load.terminals < 1 or load.in_flight_per_terminal < 1:
            raise ValueError("a closed loop needs terminals >= 1 and in_flight_per_terminal >= 1")
        if load.think_s < 0 or load.think not in ("fixed", "exponential"):
            raise ValueError('think_s >= 0 and think "fixed" or "exponential"')
        in_flight = load.in_flight_max
    else:
        if load.rate_per_s <= 0 or load.terminals < 1 or load.in_flight_max < 1:
            raise ValueError("an open loop needs rate_per_s > 0, terminals and in_flight_max >= 1")
        if load.arrivals not in ("fixed", "poisson"):
            raise ValueError('arrivals must be "fixed" or "poisson"')
        in_flight = load.in_flight_max
    if in_flight > limits.loadgen_in_flight_max:
        raise ValueError(
            f"{in_flight} calls in flight; at most {limits.loadgen_in_flight_max} "
            f"(limits.loadgen_in_flight_max)"
        )
