"""A client of the 2PL baseline: one txn_library.client.Client per partition.

Any partition of a traditional cluster can coordinate any call; ``RoutingClient``
sends each call to its home partition (txn_library.placement.call_home), which saves
remote lock requests: a single-partition call then never leaves its partition.

Invariant: ``clients[p]`` talks to partition p; the number of partitions is
``len(clients)``, so a call's home is computed against the cluster's real size.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from txn_library.client.core import Client, Result
from txn_library.placement import call_home


class RoutingClient:
    """One txn_library.client.Client per partition; each call goes to its home partition.

    Any partition can coordinate any call; sending it home saves remote lock requests
    (a single-partition call then never leaves its partition).
    """

    def __init__(self, addrs: Sequence[str], **client_kw: Any) -> None:
        self.clients = [Client(a, **client_kw) for a in addrs]

    def submit(self, proc: str, *args: Any) -> Future:
        return self.clients[call_home(proc, args, len(self.clients))].submit(proc, *args)

    def call(self, proc: str, *args: Any, timeout_s: float | None = None) -> Result:
        c = self.clients[call_home(proc, args, len(self.clients))]
        return c.call(proc, *args, timeout_s=timeout_s)

    def status(self, timeout_s: float = 5.0) -> dict:
        return self.clients[0].status(timeout_s)

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def __enter__(self) -> RoutingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
