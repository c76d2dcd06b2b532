"""A transaction's state at the partition that admitted it (executor.deterministic.
partition): what it runs, its locks' share of the footprint, and its read exchange
(the reads it sends its peers, those it waits for, and its body's view of both).

A run of a dataflow's derived steps taken as one unit (executor.deterministic.chain)
is one TxnState too (``chain_state``): its first step's txn id, its steps in ``chain``.

Invariants: ``single`` states send and wait for no reads (``send_to`` and ``need``
empty); a chain's state is single, derived, its own executor and reporter, and its
``chain`` holds consecutive txn ids from ``txn_id`` on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from executor.core.context import scan_of_reads
from executor.core.storage import Storage
from txn_library import catalog, placement
from txn_library.procedure import Procedure

REPLICATED = catalog.REPLICATED


class TxnState:
    """A transaction admitted at this partition and not finished: what it runs, its
    share of the footprint (txn_library.placement) and the reads it waits for."""

    __slots__ = (
        "txn_id",
        "proc",
        "args",
        "ts",
        "seed",
        "reads",
        "writes",
        "local_reads",
        "send_to",
        "need",
        "executor",
        "reporter",
        "locked",
        "exact",
        "prefixes",
        "single",
        "bypass",
        "placed",
        "derived",
        "epoch",
        "chain",
    )
    txn_id: int
    proc: Procedure
    args: Any
    ts: int
    seed: int
    reads: frozenset
    writes: frozenset
    local_reads: tuple
    send_to: tuple[int, ...]
    need: set[int]
    executor: bool
    reporter: bool
    locked: bool
    exact: dict[tuple[str, tuple], Any]
    prefixes: dict[tuple[str, tuple], Any]
    single: bool
    bypass: tuple[list, list] | None  # (shared, exclusive): ran on the fast path
    placed: dict[tuple, int]  # multi-partition only: placement.LocalShare.placed
    derived: bool  # a dataflow's step (txn_library.streams): no client waits for it
    epoch: int  # its batch's: row versions are noted under it (executor.core.versions)
    # A run of derived steps taken as one (executor.deterministic.chain): (txn id,
    # procedure, args) of each, this txn the first; None: one transaction.
    chain: list[tuple[int, str, Any]] | None

    # The read exchange of a multi-partition transaction --------------------------
    def merge(self, q: int, exact: Sequence[Any], prefixes: Sequence[Any]) -> None:
        """Reads participant ``q`` sent (a duplicate is dropped: reads are idempotent)."""
        if q not in self.need:
            return  # a duplicate (the sender restarted and resent)
        self.need.discard(q)
        mine = self.exact
        for t, key, row in exact:
            mine[(t, key)] = row
        for t, prefix, rows in prefixes:
            self.prefixes[(t, prefix)] = rows
            for key, row in rows:
                mine[(t, key)] = row

    def reads_entry(self, storage: Storage) -> tuple:
        """What this participant sends: (txn id, exact rows, prefixes' rows) of its
        local reads, ``local`` footprint entries excepted (placement.LocalShare)."""
        key_len: dict[str, int] = {}
        exact = []
        prefixes = []
        for t, key in self.local_reads:
            n = key_len.get(t)
            if n is None:
                n = key_len[t] = catalog.table(t).key_len
            if len(key) == n:
                exact.append((t, key, storage.get(t, key)))
            else:
                prefixes.append((t, key, storage.scan(t, key)))
        return (self.txn_id, exact, prefixes)

    def is_here(self, t: str, key: tuple, me: int, partitions: int) -> bool:
        """Whether ``key`` of ``t`` (a key the transaction may touch) lives on partition
        ``me``: its footprint entry's placement if it is one (``LocalShare.placed``),
        else placed now (a key under a prefix entry, or of a replicated table)."""
        p = self.placed.get((t, key))
        if p is None:
            p = placement.partition_of(t, key, partitions)
        return p == me or p == REPLICATED

    def remote_view(self, storage: Storage, me: int, partitions: int) -> tuple:
        """(get, scan, holds) for its body at executor ``me``: its own partition's rows
        from ``storage``, the others' from the reads its peers sent."""
        exact, prefixes = self.exact, self.prefixes
        is_here = self.is_here

        def get(t: str, key: tuple) -> tuple | None:
            if is_here(t, key, me, partitions):
                return storage.get(t, key)
            return exact.get((t, key))

        def scan(t: str, prefix: tuple) -> list:
            if is_here(t, prefix, me, partitions):
                return storage.scan(t, prefix)
            return scan_of_reads(exact, prefixes, t, prefix)

        def holds(t: str, key: tuple) -> bool:
            return is_here(t, key, me, partitions)

        return get, scan, holds


def chain_state(
    steps: list[tuple[int, str, Any]], first: Procedure, ts: int, seed: int, epoch: int
) -> TxnState:
    """The state of a run of derived single-partition steps admitted as one (its locks
    wait under the first step's txn id; ``first``: that step's procedure)."""
    st = TxnState()
    st.txn_id, st.proc, st.args, st.ts, st.seed = steps[0][0], first, (), ts, seed
    st.reads = st.writes = frozenset()
    st.locked = False
    st.exact = {}
    st.prefixes = {}
    st.bypass = None
    st.derived = True
    st.epoch = epoch
    st.chain = steps
    st.single = True
    st.local_reads = ()
    st.send_to = ()
    st.need = set()
    st.executor = st.reporter = True
    return st
