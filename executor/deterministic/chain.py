"""A push's chain as one unit of work: a run of a dataflow's derived steps that share
this partition, taken as one in the global order and run back to back.

A push derives its dataflow's steps (txn_library.streams.derived_txns) at consecutive
txn ids after every logged transaction of its batch, so the steps of a batch's pushes
form runs of consecutive derived transactions. Where a step's footprint lives on this
partition alone (its streams, windows and state share a home: the common case,
S-Store's), the partition takes such a run as one unit (``chain_end`` finds it):

- **Locks once, in the global order.** The run requests the union of its steps' lock
  names (``ChainLocks``: per procedure, from ``unit_lock_entries``, whose names do not
  depend on the batch id) under its first txn id, where its first step stands in the
  global order. The steps are consecutive, so no other transaction is ordered between
  them; each step's own names are among the union, so every earlier transaction it
  conflicts with has finished before it runs and every later one waits for the run. The
  outcome is the serial order's; holding the union longer changes timing only.
- **Each step its own transaction.** Every step runs its body against its own
  footprint (its own TxnContext: txn id, seed, footprint checks), and its whole write set
  is validated on its own (``run_txn``): a step that aborts or fails changes nothing and
  the run goes on; a nested group is one step, atomic as before. Its footprint's sets
  come from its unit's cached shape (``unit_covers``: the same sets as
  ``footprint(b)``'s, without building the footprint).
- **One pass of bookkeeping.** A step's validated writes go into ``ChainWrites``, a view
  of the storage with the run's writes on top (what each later step reads, as if they
  had been applied), and the run's net writes are applied once at its end (a table a
  step scans gets the run's writes so far first): rows a step appends to a stream
  between two steps and the next step takes by key and deletes never reach the store,
  its indexes, its versions or its hash. The state after the run is the state after
  its steps one by one (the hash is a sum over the rows there are), so replicas, the
  serial oracle (which applies each step) and replay agree hash for hash.

Invariants: a run holds consecutive txn ids of one batch, every one a derived
single-partition transaction of this partition whose procedure has run-wide lock names
(``ChainLocks.of`` is not None), at most ``limit`` of them; ``ChainWrites`` holds, per
key, the last validated write of the run's steps so far not yet applied; a table's
pending writes are applied before it is scanned; no other transaction runs between a
run's first step and the application of its last writes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_txn
from executor.core.rows import PreparedWrite
from executor.core.storage import Storage
from txn_library import placement
from txn_library.errors import ERROR, invariant
from txn_library.procedure import lookup
from txn_library.streams import DERIVED_CLIENT
from txn_library.streams.context import generation
from txn_library.streams.dataflow import unit_covers, unit_lock_entries

# Runs' lock names kept (per set of procedures a run holds): past it the cache starts
# again (a run's names cost one union of its units' cached names to rebuild).
RUN_LOCKS_CACHED_MAX = 1024


class ChainLocks:
    """Lock names of dataflow units (per procedure, for every batch at once) and of
    runs of them (per sorted tuple of their distinct procedures, at most
    ``RUN_LOCKS_CACHED_MAX``). Rebuilt when a dataflow or trigger is declared
    (``streams.context.generation``)."""

    __slots__ = ("_units", "_runs", "_gen")

    def __init__(self) -> None:
        self._units: dict[str, tuple[list, list] | None] = {}
        self._runs: dict[tuple, tuple[list, list]] = {}
        self._gen = -1

    def of(self, proc_name: str) -> tuple[list, list] | None:
        """(shared, exclusive) names of unit ``proc_name`` whatever its batch, or None
        if it has none such (not a unit, or names that depend on the batch id)."""
        if self._gen != generation[0]:
            self._units.clear()
            self._runs.clear()
            self._gen = generation[0]
        units = self._units
        if proc_name in units:
            return units[proc_name]
        entries = unit_lock_entries(proc_name)
        names = None if entries is None else placement.single_partition_locks(*entries)
        units[proc_name] = names
        return names

    def run(self, procs: tuple) -> tuple[list, list]:
        """The union of the names of ``procs`` (sorted, distinct, each with names:
        ``of``)."""
        names = self._runs.get(procs)
        if names is None:
            if len(self._runs) >= RUN_LOCKS_CACHED_MAX:
                self._runs.clear()
            shared: dict[Hashable, None] = {}
            exclusive: dict[Hashable, None] = {}
            for proc_name in procs:
                unit = self.of(proc_name)
                invariant(unit is not None, f"{proc_name} has no run-wide lock names")
                assert unit is not None
                shared.update(dict.fromkeys(unit[0]))
                exclusive.update(dict.fromkeys(unit[1]))
            names = self._runs[procs] = (list(shared), list(exclusive))
        return names


def chain_end(txns: Sequence[Any], start: int, me: int, locks: ChainLocks, limit: int) -> int:
    """One past the last transaction of the run that starts at ``txns[start]`` (``start``
    itself if none starts there): consecutive derived transactions whose only
    participant is ``me`` and whose procedures have run-wide lock names, at most
    ``limit``. A run of one is left to the ordinary path."""
    end = start
    n = min(len(txns), start + limit)
    while end < n:
        txn = txns[end]
        if txn.client_id != DERIVED_CLIENT or txn.participants != (me,):
            break
        if locks.of(txn.proc) is None:
            break
        end += 1
    return end if end - start > 1 else start


class ChainWrites:
    """The storage as a run's steps see it: its rows, with the writes of the run's
    earlier steps on top. ``get`` answers as the storage would after those writes;
    ``scan`` of a table first applies the run's writes to that table (no other
    transaction runs before the run ends, so only the run's later steps see them
    early), so a scan reads the store's index as any transaction's; ``apply``
    installs the rest once."""

    __slots__ = ("storage", "_writes")

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._writes: dict[str, dict[tuple, PreparedWrite]] = {}  # table -> key -> last

    def get(self, table: str, key: tuple) -> tuple | None:
        mine = self._writes.get(table)
        if mine is not None:
            w = mine.get(key)
            if w is not None:
                return w[2]
        return self.storage.get(table, key)

    def scan(self, table: str, prefix: tuple) -> list:
        mine = self._writes.pop(table, None)
        if mine is not None:
            self.storage.apply(mine.values())
        return self.storage.scan(table, prefix)

    def add(self, writes: list[PreparedWrite]) -> None:
        """A step's validated writes (``run_txn``'s): later steps see them."""
        pending = self._writes
        for w in writes:
            t = w[0]
            mine = pending.get(t)
            if mine is None:
                mine = pending[t] = {}
            mine[w[1]] = w

    def apply(self) -> None:
        """Install the run's net writes not applied yet (each key's last)."""
        storage = self.storage
        for mine in self._writes.values():
            storage.apply(mine.values())
        self._writes = {}


def run_chain(
    storage: Storage, steps: Sequence[tuple[int, str, Any]], ts: int, seed: int, epoch: int
) -> list[str]:
    """Run ``steps`` ((txn id, procedure, args), in order), each its own transaction,
    and apply their writes once; the failures (ERROR, as ``Partition._complete`` counts
    them), in order. A step's lock hold (``ctx.hold_locks``, a benchmark hook that
    changes no value) is not honoured in a run."""
    versions = storage.versions
    if versions is not None:
        versions.epoch = epoch  # the rows the run overwrites were those before it
    view = ChainWrites(storage)
    get, scan = view.get, view.scan
    failures: list[str] = []
    for txn_id, proc_name, args in steps:
        proc = lookup(proc_name)
        if len(args) == 1:  # a unit's one argument, its batch id: its footprint's sets
            may_read, may_write = unit_covers(proc_name, args[0])
        else:  # not as derived (a log's bytes were altered): as any transaction
            fp = proc.footprint(*args)
            may_read, may_write = cover_set(fp.reads), cover_set(fp.writes)
        ctx = TxnContext(txn_id, ts, seed, may_read, may_write, get, scan)
        status, value, _, writes = run_txn(proc, args, ctx, storage)
        if writes:
            view.add(writes)
        if status == ERROR:
            failures.append(f"txn {txn_id} {proc.name}: {value!r}"[:300])
    view.apply()
    return failures
