"""TPC-C as a workload of the cluster simulator (executor.deterministic.simulator).

Each simulated client is one terminal (clause 2.8.1.1) drawing the standard mix from
its own ``TpccInputs`` (seeded from the run's seed): New-Order with remote lines,
Payment by id and by last name (dependent: reconnaissance, prediction, re-check),
Order-Status, Delivery (dependent) and Stock-Level. The database is the genesis
``tpcc.loader:genesis``, built once per process and cloned (simulator workloads).

Checker: consistency conditions 1-12 (tpcc.consistency) on the serial oracle, and 1-9,
11 and 12 for every replica on each warehouse at the partition that holds it.

Registered in ``executor.deterministic.workloads.WORKLOADS`` as "tpcc"; it lives here
because the simulator, in the executor layer, does not import the tpcc layer; this
module depends only on the contract in txn_library.workloads.contract.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from tpcc.consistency import check_local, check_whole
from tpcc.inputs import TpccInputs, terminals_for
from tpcc.schema import WAREHOUSE
from txn_library import placement
from txn_library.workloads.contract import Call, FinalState

GENESIS = "tpcc.loader:genesis"
LOAD_SEED = 20_250_101  # one database per process: every seed runs on the same genesis
LOAD_TS_MS = 1_700_000_000_000


@dataclass
class TpccWorkload:
    rng: random.Random
    partitions: int
    name: str = "tpcc"
    procedure_modules: tuple[str, ...] = ("tpcc.transactions",)
    history_tables: frozenset[str] = frozenset()
    warehouses: int = 2
    # The shape is fixed so the genesis image (~0.6 M rows per warehouse) is built once
    # per process. Checkpoints are files, as live: each process writes one base of its
    # state, then deltas (a seed takes ~30% longer than with checkpoints in memory).
    defaults: ClassVar[dict[str, Any]] = {
        "replicas": 2,
        "partitions": 2,
        "calls": 120,
        "checkpoint_store": "file",
        "checkpoint_every_epochs": 16,
        "checkpoint_write_max_us": 50_000,
    }

    def genesis_args(self) -> dict[str, Any]:
        return {"warehouses": self.warehouses, "seed": LOAD_SEED, "load_ts_ms": LOAD_TS_MS}

    def genesis(self) -> tuple[str | None, dict[str, Any]]:
        return GENESIS, self.genesis_args()

    def setup_calls(self) -> list[Call]:
        return []

    def client_calls(self, client: int, clients: int) -> Iterator[Call]:
        inputs = TpccInputs(
            self.warehouses,
            self.partitions,
            seed=self.rng.getrandbits(32),
            load_seed=LOAD_SEED,
            mix="standard",
            remote_line_pct=self.rng.choice((1, 10)),
        )
        terminal = terminals_for(clients, self.warehouses)[client]
        while True:
            call = inputs.next(terminal)
            yield (call.proc, call.args)

    def point_read(self, proc: str, args: tuple) -> tuple[str, tuple] | None:
        return None

    def check(self, final: FinalState) -> list[str]:
        warehouses = range(1, self.warehouses + 1)
        oracle = final.oracle.whole_tables()
        # The oracle is the whole database: conditions 1-12; a replica's partitions (the
        # same states: checked equal to the oracle's) each those of its own rows, each
        # state once (replicas whose partition hashes to the same value hold the same
        # rows: checking the second copy would find what the first did).
        out = [f"tpcc oracle: {v}" for v in check_whole(oracle, warehouses)]
        checked: set[tuple[int, object]] = set()
        for r, parts in enumerate(final.replicas):
            if len(parts) != final.partitions:
                continue  # a partition is down: reported by the replica checks
            for w in warehouses:
                p = placement.partition_of(WAREHOUSE, (w,), final.partitions)
                state = (w, getattr(parts[p], "state_hash", r))  # no hash: check each
                if state in checked:
                    continue
                checked.add(state)
                for v in check_local(parts[p].whole_tables(), [w]):
                    out.append(f"tpcc replica {r}: {v}")
        return out


@dataclass
class TpccOneWarehouse(TpccWorkload):
    """TPC-C at W=1 on one replica of one partition ("tpcc-w1"): a genesis a third the
    size of W=2's, small enough to build from pure Python in CI, where the compiled and
    pure engines are compared on the same seeds (tests/unit/test_native.py)."""

    name: str = "tpcc-w1"
    warehouses: int = 1
    defaults: ClassVar[dict[str, Any]] = {
        **TpccWorkload.defaults,
        "replicas": 1,
        "partitions": 1,
        "calls": 80,
    }
