"""Workloads the simulator drives, each paired with its checker, and genesis images.

A workload says which procedures it needs, what the database holds at genesis, which
calls each simulated client makes, how to check a read-only answer against the
oracle's history, and which invariant its final state must satisfy. Workloads are
found by name (``WORKLOADS``: "module:attribute", like ClusterConfig.genesis), so the
simulator does not import the layers above it (tpcc registers its own).

Genesis images are built once per process and cloned for every partition, oracle and
restart: a clone is a copy of the tables' dicts and indexes (rows are immutable
tuples, shared), much cheaper than generating or loading the rows again.

Bank: client 0 opens ``accounts`` accounts first; then every client sends random
transfers, balances, totals and kv puts/adds/gets. Checker: money is conserved (the
total equals what the committed ``bank.open`` calls created) on the oracle and on
every replica, and no balance is negative.
"""

from __future__ import annotations

import gc
import importlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from executor.core.genesis import genesis_rows
from executor.core.state_hash import MASK64
from executor.core.storage import Storage
from txn_library import catalog
from txn_library.errors import OK, invariant
from txn_library.workloads.contract import Call, FinalState, Workload

WORKLOADS: dict[str, str] = {
    "bank": "executor.deterministic.workloads:BankWorkload",
    "tpcc": "tpcc.sim_workload:TpccWorkload",
    "tpcc-w1": "tpcc.sim_workload:TpccOneWarehouse",
    "stream": "txn_library.workloads.stream_sim:StreamWorkload",
}


@dataclass
class GenesisImage:
    """Template storages (never mutated): one per partition, and the whole database."""

    partitions: list[Storage]
    whole: Storage


def workload_genesis(workload: Workload, partitions: int) -> GenesisImage:
    name, args = workload.genesis()
    return genesis_image(name, args, partitions)


def workload_class(name: str) -> Any:
    """The class registered for ``name``; it has ``defaults`` (SimOptions fields it sets
    unless the caller does) and is built as ``cls(rng, partitions)``."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}")
    module, _, attr = WORKLOADS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


# Genesis images --------------------------------------------------------------------
def clone_storage(src: Storage) -> Storage:
    """A copy of ``src`` that shares its (immutable) rows; same hashes, same indexes."""
    dst = Storage()
    for name, rows in src.whole_tables().items():
        # Storage._table registers a table exactly as a first write would (its
        # replicated flag, its ordered index); the simulator copies, it never loads.
        dst._table(name)
        dst.tables[name] = rows.copy()
        index = src.index(name)
        if index is not None:
            dst.indexes[name] = index.copy()
    dst.state_hash = src.state_hash
    dst.static_hash = src.static_hash
    return dst


_images: dict[tuple[str, str, int], GenesisImage] = {}


def genesis_image(
    genesis: str | None, genesis_args: dict[str, Any], partitions: int
) -> GenesisImage:
    """The genesis database split over ``partitions``, built once per process."""
    key = (genesis or "", repr(sorted(genesis_args.items())), partitions)
    image = _images.get(key)
    if image is not None:
        return image
    thresholds = gc.get_threshold()
    try:
        parts = []
        for p in range(partitions):
            s = Storage()
            s.load(genesis_rows(genesis, genesis_args, p, partitions))
            parts.append(s)
    finally:  # a genesis may tune the collector for a partition process: not ours
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    whole = clone_storage(parts[0])
    for s in parts[1:]:  # replicated tables are on every partition: take them once
        _merge_partition(whole, s)
    image = _images[key] = GenesisImage(parts, whole)
    return image


def _merge_partition(whole: Storage, part: Storage) -> None:
    """Add ``part``'s partitioned rows to ``whole`` as ``Storage.load`` would, without
    encoding and hashing them again: partitions hold disjoint keys, so the whole's
    state hash is the sum of theirs (a row's digest does not depend on where it is)."""
    for name, rows in part.whole_tables().items():
        if catalog.table(name).replicated:
            continue
        table = whole._table(name)
        before = len(table)
        table.update(rows)
        invariant(len(table) == before + len(rows), f"genesis partitions share keys of {name}")
        index = whole.index(name)
        if index is not None:
            index.update(rows.keys())
    whole.state_hash = (whole.state_hash + part.state_hash) & MASK64


def forget_genesis_images() -> None:
    """Drop the cached images (a TPC-C one holds ~0.5 GB per warehouse pair)."""
    _images.clear()


# Bank ------------------------------------------------------------------------------
BALANCE_INITIAL = 1_000
KV_KEYS = ("k0", "k1", "k2", "k3", "k4")


@dataclass
class BankWorkload:
    rng: random.Random
    partitions: int
    name: str = "bank"
    procedure_modules: tuple[str, ...] = ("txn_library.workloads.builtin",)
    defaults: ClassVar[dict[str, Any]] = {}
    history_tables: frozenset[str] = frozenset(("account", "kv"))
    accounts: int = 0

    def __post_init__(self) -> None:
        self.accounts = self.rng.randint(4, 40)  # few accounts: lots of contention
        self._mix = self.rng.choice(
            (
                (("transfer", 60), ("balance", 15), ("total", 5), ("kv", 20)),
                (("transfer", 85), ("balance", 5), ("total", 5), ("kv", 5)),
                (("transfer", 30), ("balance", 40), ("total", 10), ("kv", 20)),
            )
        )

    def genesis(self) -> tuple[str | None, dict[str, Any]]:
        return None, {}

    def setup_calls(self) -> list[Call]:
        return [("bank.open", (0, self.accounts, BALANCE_INITIAL))]

    def client_calls(self, client: int, clients: int) -> Iterator[Call]:
        rng = random.Random(self.rng.getrandbits(64))
        n = self.accounts
        kinds = [k for k, _ in self._mix]
        weights = [w for _, w in self._mix]
        while True:
            kind = rng.choices(kinds, weights)[0]
            if kind == "transfer":
                yield ("bank.transfer", (rng.randrange(n), rng.randrange(n), rng.randint(1, 600)))
            elif kind == "balance":
                yield ("bank.balance", (rng.randrange(n + 1),))  # n: an account never opened
            elif kind == "total":
                yield ("bank.total", (0, n))
            else:
                key = rng.choice(KV_KEYS)
                r = rng.random()
                if r < 0.4:
                    yield ("kv.add", (key, rng.randint(-50, 50)))
                elif r < 0.7:
                    yield (
                        "kv.put",
                        (key, rng.choice((rng.randint(0, 99), f"v{rng.randint(0, 9)}"))),
                    )
                else:
                    yield ("kv.get", (key,))

    def point_read(self, proc: str, args: tuple) -> tuple[str, tuple] | None:
        if proc == "bank.balance":
            return ("account", (args[0],))
        if proc == "kv.get":
            return ("kv", (args[0],))
        return None

    def check(self, final: FinalState) -> list[str]:
        opened = sum(
            t.args[1] * t.args[2] for t in final.txns if t.proc == "bank.open" and t.result[0] == OK
        )
        out = []
        stores = [("oracle", [final.oracle])] + [
            (f"replica {r}", parts) for r, parts in enumerate(final.replicas)
        ]
        for what, parts in stores:
            accounts = [s.whole_tables().get("account", {}) for s in parts]
            balances = [row[0] for rows in accounts for row in rows.values()]
            if sum(balances) != opened:
                out.append(f"bank: {what} holds {sum(balances)} cents, bank.open created {opened}")
            if any(b < 0 for b in balances):
                out.append(f"bank: {what} has a negative balance")
        return out
