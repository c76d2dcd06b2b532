"""Where things live and who does what: the one placement rule of Ordo.

Every engine asks this module, so they cannot drift apart (if two copies of this rule
disagreed, replicas would silently diverge): the sequencer (participants of a call),
the partition role (its share of a transaction), the 2PL baseline (a call's home),
replay, the workloads' generators and the tools.

Rules:
- A key lives on ``placement(key[:place_len], partitions)`` of its table (crc32c of
  the msgpack-encoded prefix, or e.g. the TPC-C warehouse number); a replicated
  table's keys live everywhere (``REPLICATED``) and are never locked.
- The *participants* of a transaction are the partitions its footprint touches
  (sorted); a footprint of replicated tables only goes to partition 0. They are
  computed where the footprint's entries are checked, in the same pass over them
  (``Procedure.participants_of``: the sequencer, replay, the simulator's checks), by
  this rule: a key's partition as above.
- Its *executors* are the participants holding some of its writes (all of them run
  the whole body and apply their local writes); if it writes nothing, the lowest
  participant. Its *reporter* (the one partition per replica that answers) is the
  lowest executor.
- A lock name is ``(table, key[:lock_len])``; ``place_len <= lock_len``, so every
  lock is local to one partition.
- A call's *home* (2PL baseline: where a client sends it) is the partition of the
  first non-replicated key of its declared footprint (of its reconnaissance's for a
  dependent procedure), else 0.

Invariant: all of these are functions of (catalog, footprint, partitions) only
(``call_home`` gets the footprint from the procedure registry).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from txn_library import catalog
from txn_library.catalog import REPLICATED
from txn_library.procedure import lookup

FootprintEntries = Iterable[tuple[str, tuple]]


def partition_of(table_name: str, key: tuple, partitions: int) -> int:
    """The partition holding ``key`` (or REPLICATED). ``key`` may be a prefix."""
    t = catalog.table(table_name)
    if t.replicated:
        return REPLICATED
    n = t.place_prefix
    if len(key) < n:
        raise ValueError(f"{table_name} key {key!r} shorter than its placement prefix ({n})")
    if partitions == 1:
        return 0
    return t.placement(key[:n], partitions)


def lock_name(table_name: str, key: tuple) -> tuple:
    return (table_name, key[: catalog.table(table_name).lock_prefix])


def executors(writes: FootprintEntries, participants_: tuple, partitions: int) -> tuple:
    """The participants that run the body: those holding writes, else the lowest."""
    if len(participants_) == 1:
        return participants_
    at = {partition_of(t, k, partitions) for t, k in writes}
    at.discard(REPLICATED)
    return tuple(sorted(at)) if at else (min(participants_),)


def reporter(writes: FootprintEntries, participants_: tuple, partitions: int) -> int:
    """The partition (per replica) that reports a transaction's result."""
    return executors(writes, participants_, partitions)[0]


def home(reads: FootprintEntries, writes: FootprintEntries, partitions: int) -> int:
    """Where a client best sends a call in the 2PL baseline: the partition of the first
    non-replicated key of its footprint, else 0."""
    for entries in (reads, writes):
        for t, key in entries:
            p = partition_of(t, key, partitions)
            if p != REPLICATED:
                return p
    return 0


def call_home(proc_name: str, args: Iterable[Any], partitions: int) -> int:
    """``home`` of a call: of its footprint, or of its reconnaissance's for a dependent
    procedure. Any partition can coordinate any call in the 2PL baseline; sending it
    home saves remote lock requests (a single-partition call never leaves it)."""
    proc = lookup(proc_name)
    if proc.recon is not None:
        proc = lookup(proc.recon)
    fp = proc.footprint_of(tuple(args))
    return home(fp.reads, fp.writes, partitions)


class LocalShare:
    """One partition's share of a multi-partition transaction, in one pass over its
    footprint (this runs for every transaction at every participant).

    ``placed``: each non-replicated footprint entry (table, key or prefix) -> its
    partition, each placed once (an entry both read and written, as in ``bank.open``,
    is placed once): the executor's reads and the filter of its writes look a key up
    here before placing it.

    ``local`` (``Footprint.local``): read entries locked like the others but never
    sent to another participant, nor awaited from one (each is written at its own
    partition, which reads it there)."""

    __slots__ = (
        "shared", "exclusive", "local_reads", "executor", "reporter", "send_to", "need",
        "placed",
    )  # fmt: skip

    def __init__(
        self, reads: FootprintEntries, writes: FootprintEntries, participants_: tuple,
        me: int, partitions: int, local: FootprintEntries = (),
    ) -> None:  # fmt: skip
        table = catalog.table
        unshipped = frozenset(local)
        shared: list[tuple] = []
        exclusive: list[tuple] = []
        local_reads: list[tuple[str, tuple]] = []
        reads_at: set[int] = set()
        writes_at: set[int] = set()
        placed: dict[tuple, int] = {}
        for entry in reads:
            t, key = entry
            spec = table(t)
            if spec.replicated:
                continue
            p = placed[entry] = spec.placement(key[: spec.place_prefix], partitions)
            if unshipped and entry in unshipped:
                if p == me:
                    shared.append((t, key[: spec.lock_prefix]))
                continue
            reads_at.add(p)
            if p == me:
                local_reads.append(entry)
                shared.append((t, key[: spec.lock_prefix]))
        for entry in writes:
            t, key = entry
            spec = table(t)
            p = placed.get(entry, -1)
            if p < 0:
                p = placed[entry] = spec.placement(key[: spec.place_prefix], partitions)
            writes_at.add(p)
            if p == me:
                exclusive.append((t, key[: spec.lock_prefix]))
        runs = sorted(writes_at) if writes_at else [min(participants_)]
        self.shared = shared
        self.exclusive = exclusive
        self.executor = me in runs
        self.reporter = runs[0] == me
        self.local_reads = tuple(local_reads)
        self.send_to = tuple(q for q in runs if q != me) if local_reads else ()
        self.need = {q for q in reads_at if q != me} if self.executor else set()
        self.placed = placed


# (replicated, lock prefix length) by table name, filled as transactions meet tables: a
# registered table never changes (catalog.register_table). Saves a call into the
# catalog and two attribute look-ups per footprint entry (single_partition_locks).
_lock_shapes: dict[str, tuple[bool, int]] = {}


def _lock_shape(table_name: str) -> tuple[bool, int]:
    shape = _lock_shapes.get(table_name)
    if shape is None:
        spec = catalog.table(table_name)  # raises for a table not registered: not kept
        shape = _lock_shapes[table_name] = (spec.replicated, spec.lock_prefix)
    return shape


def single_partition_locks(
    reads: FootprintEntries, writes: FootprintEntries
) -> tuple[list[tuple], list[tuple]]:
    """(shared, exclusive) lock names of a single-partition transaction."""
    shared = []
    for t, key in reads:
        replicated, n = _lock_shape(t)
        if not replicated:
            shared.append((t, key[:n]))
    exclusive = [(t, key[: _lock_shape(t)[1]]) for t, key in writes]
    return shared, exclusive
