"""A read-only procedure for the queries benchmark (scripts/bench_queries.py): the sum
of a given list of bank accounts, so that a query can select k accounts that all live
on one partition (``bank.total`` reads a range of accounts, which the placement rule
spreads over every partition).

Register with ``ClusterConfig.procedure_modules=("txn_library.workloads.builtin",
"txn_library.workloads.query_bench")`` (it uses the bank's ``account`` table).

  qbench.sum(accounts)   sum of the balances of the listed accounts (missing ones
                         count 0); read-only: a snapshot or read-committed query, or a
                         call through the sequencer

Invariant: the footprint is exactly the listed accounts (duplicates once, in key
order), and the body reads nothing else and writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import txn_library.workloads.builtin  # noqa: F401  (the account table)
from txn_library.errors import ERR_BAD_ARGUMENTS, BadRequest
from txn_library.procedure import Arg, Footprint, procedure

ACCOUNTS_PER_QUERY_MAX = 10_000  # as bank.total


def _accounts(accounts: Sequence[Any]) -> list[int]:
    if not all(type(a) is int and a >= 0 for a in accounts):
        raise BadRequest(ERR_BAD_ARGUMENTS, "accounts must be non-negative integers")
    return sorted(set(accounts))


@procedure(
    "qbench.sum",
    [Arg("accounts", "list", max_len=ACCOUNTS_PER_QUERY_MAX)],
    lambda accounts: Footprint(reads=tuple(("account", (a,)) for a in _accounts(accounts))),
    read_only=True,
)
def qbench_sum(ctx: Any, accounts: Sequence[int]) -> int:
    """Sum of the balances of the listed accounts (each counted once)."""
    total = 0
    for a in _accounts(accounts):
        row = ctx.get("account", (a,))
        if row is not None:
            total += row[0]
    return total
