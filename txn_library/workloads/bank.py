"""Bank transfer workload, shared by tests, the demo and benchmarks: its inputs.

Generates random transfers among ``accounts`` accounts, a chosen share of them
multi-partition (source and destination on different partitions), and opens the
accounts. Deterministic: the same seed gives the same transfers. Running them against a
cluster is ``cluster.bank_load.run_transfers`` (the load generator lives in the cluster
layer, which owns sockets). The checker: every call answered, money conserved.
"""

from __future__ import annotations

import random

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from txn_library import placement
from txn_library.client import Client


def make_transfers(
    n: int, accounts: int, partitions: int, multi_share: float, seed: int
) -> list[tuple[int, int, int]]:
    """n (src, dst, amount) with ``multi_share`` of them crossing partitions."""
    rng = random.Random(seed)
    by_part: dict[int, list[int]] = {}
    for a in range(accounts):
        by_part.setdefault(placement.partition_of("account", (a,), partitions), []).append(a)
    parts = sorted(by_part)
    out = []
    for _ in range(n):
        src = rng.randrange(accounts)
        ps = placement.partition_of("account", (src,), partitions)
        if partitions > 1 and rng.random() < multi_share:
            pd = rng.choice([p for p in parts if p != ps])
        else:
            pd = ps
        dst = rng.choice(by_part[pd])
        out.append((src, dst, rng.randint(1, 2_000)))
    return out


def open_accounts(client: Client, accounts: int, balance: int) -> None:
    step = 5_000
    for first in range(0, accounts, step):
        r = client.call("bank.open", first, min(step, accounts - first), balance)
        if not r.ok:
            raise RuntimeError(f"bank.open failed: {r.value}")
