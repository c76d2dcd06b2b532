"""Bank transfers through the load generator: the running half of the bank workload.

``txn_library.workloads.bank`` makes the transfers and opens the accounts (it sits on the
contract, below the cluster); ``run_transfers`` here submits a list of transfers to a
live cluster through ``cluster.loadgen`` and returns its ``Window``: every transfer
answered or timed out, each counted as ok, aborted (insufficient funds) or error, with
latencies.

Load shape: ``clients`` client identities, each a closed-loop terminal with at most
``in_flight_per_client`` transfers outstanding over its own share of the list
(``transfers[i::clients]``, in order); the run ends when every share is answered. In
all at most clients x in_flight_per_client calls are outstanding, which must be within
``limits.loadgen_in_flight_max``.
"""

from __future__ import annotations

from collections.abc import Sequence

import txn_library.workloads.builtin  # noqa: F401  (registers the bank; routing looks procedures up)
from cluster.load_shapes import Call, ClosedLoop, home_router
from cluster.loadgen import LoadGenerator
from cluster.measure import Window

TRANSFER = "transfer"  # the kind transfers are counted under


def run_transfers(
    targets: str | Sequence[str],
    transfers: list[tuple[int, int, int]],
    clients: int,
    in_flight_per_client: int = 500,
    timeout_s: float = 60.0,
) -> Window:
    """Submit ``transfers`` (src, dst, amount) from ``clients`` concurrent clients and
    wait for every answer (or timeout).

    ``targets``: the sequencer's client address, or a traditional cluster's
    per-partition client addresses (each transfer then goes to its home partition).
    """
    shares = [iter(transfers[i::clients]) for i in range(clients)]

    def next_transfer(terminal: int) -> Call | None:
        t = next(shares[terminal], None)
        return None if t is None else Call("bank.transfer", t, TRANSFER)

    routed = not isinstance(targets, str) and len(targets) > 1
    with LoadGenerator(
        targets,
        next_transfer,
        ClosedLoop(terminals=clients, in_flight_per_terminal=in_flight_per_client),
        route=home_router(len(targets)) if routed else None,
        connections=clients,
        timeout_s=timeout_s,
    ) as gen:
        return gen.run(drain_s=0.0)
