"""Start-up from genesis: the initial database a partition holds.

A genesis is named "module:function" (ClusterConfig.genesis); the function yields
(table, key, row) for the rows one partition holds. Invariant: the rows depend only on
(genesis, its arguments, partition, partitions), never on the process, so every
replica of a partition starts from the same state hash.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

from executor.core.heap import settle_heap
from executor.core.storage import Storage
from txn_library.procedure import module_name


def genesis_rows(
    genesis: str | None, genesis_args: dict, partition: int, partitions: int
) -> Iterator[tuple]:
    """Rows of the initial database held by ``partition`` (see ClusterConfig.genesis)."""
    if not genesis:
        return iter(())
    module, _, fn = genesis.partition(":")
    return getattr(importlib.import_module(module_name(module)), fn)(
        partition, partitions, **genesis_args
    )


def genesis_storage(
    genesis: str | None, genesis_args: dict, partition: int, partitions: int
) -> Storage:
    """A partition's genesis database, with the collector kept off it (settle_heap)."""
    s = Storage()
    s.load(genesis_rows(genesis, genesis_args, partition, partitions))
    settle_heap()  # the rows live as long as the process
    return s
