"""The contract between a workload and the whole-cluster simulator.

A workload (the bank in executor.deterministic.workloads, TPC-C in tpcc.sim_workload)
says which procedures it needs, what the database holds at genesis, which calls each
simulated client makes, how to check a read-only answer against the oracle's history,
and which invariant its final state must satisfy. It sees the final databases only as
tables of rows, so a workload depends on this contract and never on the executor.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class Tables(Protocol):
    """A database as the checkers read it: table name -> {key: row}."""

    def whole_tables(self) -> dict[str, dict[tuple, tuple]]: ...


Call = tuple[str, tuple]


@dataclass
class LoggedTxn:
    """One transaction of the final command log with the oracle's result for it."""

    txn_id: int
    proc: str
    args: tuple
    client_id: bytes
    req_id: Any
    result: tuple[int, Any]


@dataclass
class FinalState:
    """What a workload checker sees after a run."""

    oracle: Tables
    replicas: list[list[Tables]]  # [replica][partition]
    txns: list[LoggedTxn]
    partitions: int


class Workload(Protocol):
    name: str
    procedure_modules: tuple[str, ...]
    history_tables: frozenset[str]  # tables whose per-key history checks read-only answers

    def genesis(self) -> tuple[str | None, dict[str, Any]]:
        """The genesis ("module:function" or None) and its arguments."""
        ...

    def setup_calls(self) -> list[Call]: ...

    def client_calls(self, client: int, clients: int) -> Iterator[Call]: ...

    def point_read(self, proc: str, args: tuple) -> tuple[str, tuple] | None:
        """The (table, key) whose first column a single-key read-only call returns."""
        ...

    def check(self, final: FinalState) -> list[str]: ...
