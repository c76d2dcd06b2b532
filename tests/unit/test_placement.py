"""The one placement rule (txn_library/placement.py) gives, on random footprints, the
same answers as each of the five places that used to compute it on their own. The
old code is kept here, verbatim in substance, as the reference."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txn_library import catalog, placement
from txn_library.catalog import REPLICATED, Table, place_by_first_int, register_table
from txn_library.errors import BadRequest
from txn_library.procedure import Footprint, Procedure

HASHED = register_table(Table("pl_hashed", key_len=2, columns=("v",)))
BY_INT = register_table(
    Table(
        "pl_by_int",
        key_len=3,
        lock_len=2,
        place_len=1,
        placement=place_by_first_int,
        ordered=True,
        key_types=(int, int, int),
        columns=("v",),
    )
)
REPL = register_table(Table("pl_repl", key_len=1, replicated=True, columns=("v",)))


# --- the old call sites -------------------------------------------------------------
def old_catalog_partition_of(table_name: str, key: tuple, partitions: int) -> int:
    t = catalog.table(table_name)
    if t.replicated:
        return REPLICATED
    n = t.place_prefix
    if partitions == 1:
        return 0
    return t.placement(key[:n], partitions)


def old_sequencer_participants(reads: tuple, writes: tuple, partitions: int) -> tuple:
    if partitions == 1:
        return (0,)
    parts = set()
    for entries in (reads, writes):
        for t, key in entries:
            spec = catalog.table(t)
            if not spec.replicated:
                parts.add(spec.placement(key[: spec.place_prefix], partitions))
    return tuple(sorted(parts)) if parts else (0,)


def old_reporter_of(reads: tuple, writes: tuple, participants: tuple, partitions: int) -> int:
    if len(participants) == 1:
        return participants[0]
    writes_at = {old_catalog_partition_of(t, k, partitions) for t, k in writes}
    writes_at.discard(REPLICATED)
    return min(writes_at) if writes_at else min(participants)


def old_admit(reads: tuple, writes: tuple, participants: tuple, me: int, n: int) -> dict:
    """Partition._admit's inlined placement, as it was."""
    table = catalog.table
    shared: list = []
    exclusive: list = []
    out: dict[str, Any] = {}
    if len(participants) == 1:
        for t, key in reads:
            spec = table(t)
            if not spec.replicated:
                shared.append((t, key[: spec.lock_prefix]))
        for t, key in writes:
            exclusive.append((t, key[: table(t).lock_prefix]))
        out.update(executor=True, reporter=True, local_reads=(), send_to=(), need=set())
    else:
        reads_at: set[int] = set()
        writes_at: set[int] = set()
        local_reads = []
        for t, key in reads:
            spec = table(t)
            if spec.replicated:
                continue
            p = spec.placement(key[: spec.place_prefix], n)
            reads_at.add(p)
            if p == me:
                local_reads.append((t, key))
                shared.append((t, key[: spec.lock_prefix]))
        for t, key in writes:
            spec = table(t)
            p = spec.placement(key[: spec.place_prefix], n)
            writes_at.add(p)
            if p == me:
                exclusive.append((t, key[: spec.lock_prefix]))
        executors = sorted(writes_at) if writes_at else [min(participants)]
        executor = me in executors
        out.update(
            executor=executor,
            reporter=executors[0] == me,
            local_reads=tuple(local_reads),
            send_to=tuple(q for q in executors if q != me) if local_reads else (),
            need={q for q in reads_at if q != me} if executor else set(),
        )
    out.update(shared=shared, exclusive=exclusive)
    return out


def old_home_partition(reads: tuple, writes: tuple, partitions: int) -> int:
    for t, key in reads + writes:
        p = old_catalog_partition_of(t, key, partitions)
        if p != REPLICATED:
            return p
    return 0


# --- random footprints --------------------------------------------------------------
ints = st.integers(min_value=1, max_value=40)
hashed_key = st.tuples(st.one_of(ints, st.text(max_size=3)), ints)
by_int_key = st.one_of(st.tuples(ints, ints), st.tuples(ints, ints, ints))  # lock prefix or key
entry = st.one_of(
    hashed_key.map(lambda k: ("pl_hashed", k)),
    by_int_key.map(lambda k: ("pl_by_int", k)),
)
read_entry = st.one_of(entry, ints.map(lambda i: ("pl_repl", (i,))))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    reads=st.lists(read_entry, max_size=6).map(tuple),
    writes=st.lists(entry, max_size=6).map(tuple),
    partitions=st.integers(min_value=1, max_value=5),
)
def test_placement_equals_every_old_call_site(reads: tuple, writes: tuple, partitions: int) -> None:
    parts = old_sequencer_participants(reads, writes, partitions)
    for t, key in reads + writes:
        assert placement.partition_of(t, key, partitions) == old_catalog_partition_of(
            t, key, partitions
        )
    assert placement.home(reads, writes, partitions) == old_home_partition(
        reads, writes, partitions
    )
    if writes or reads:
        assert placement.reporter(writes, parts, partitions) == old_reporter_of(
            reads, writes, parts, partitions
        )
    for me in parts:
        old = old_admit(reads, writes, parts, me, partitions)
        if len(parts) == 1:
            shared, exclusive = placement.single_partition_locks(reads, writes)
            assert (shared, exclusive) == (old["shared"], old["exclusive"])
            continue
        share = placement.LocalShare(reads, writes, parts, me, partitions)
        got = {name: getattr(share, name) for name in old}
        assert got == old
        # Each non-replicated entry placed once, as partition_of places it.
        assert share.placed == {
            (t, key): placement.partition_of(t, key, partitions)
            for t, key in (*reads, *writes)
            if placement.partition_of(t, key, partitions) != REPLICATED
        }
    # The participants, computed with the footprint's checks in one pass
    # (Procedure.participants_of: the sequencer, replay), are the old sequencer's.
    for read_only in (False, True):
        proc = Procedure(
            "pl_call", (), lambda: Footprint(reads, writes), lambda ctx: None, read_only=read_only
        )
        try:
            proc.footprint_of(())
        except BadRequest as e:
            with pytest.raises(BadRequest, match=re.escape(e.message)):
                proc.participants_of((), partitions)
            continue
        assert proc.participants_of((), partitions) == parts
