"""Benchmark-only tables, procedures and genesis for the seed paper's experiments.

Used by ``scripts/paper_experiments.py`` (register with
``ClusterConfig.procedure_modules=(..., "txn_library.workloads.bench_procedures")`` and
``genesis="txn_library.workloads.bench_procedures:genesis"``).

Tables (one small int per row, to keep 1M rows affordable in memory):
  bench_rec  key (rid,)  row (value,)  placed on partition rid % partitions
  bench_tag  key (tag,)  row (rid,)    placed on partition tag % partitions; a
             secondary index: tag -> the record it currently points to

Slots: tag t may point to any of the records t + j*tags for j in [0, slots). With
``tags % partitions == 0`` every slot of a tag lives on the tag's partition, so an
index lookup plus its update is a single-partition transaction in both modes.

Procedures:
  bench.update(rids, delta)                 add delta to each record (known keys)
  bench.stall(rids, delta, stall_ms)        bench.update, then hold its locks stall_ms
  bench.tag_recon(tag, delta)               read-only recon: the rid tag points to
  bench.tag_update(tag, delta) + predicted  dependent (recon above): re-check, Restart
  bench.tag_update_locking(tag, delta, tags, slots)
                                            no recon: footprint covers every slot of the
                                            tag; a 2PL engine locks only what it touches
  bench.tag_move(tag, rid)                  re-point tag to rid (the index "volatility")

``bench.stall`` emulates a transaction that holds its locks while stalled on slow
I/O (the paper's Figure 1) with the engine hook ``ctx.hold_locks(ms)``: the live
engine (either mode) keeps that transaction's locks for ms after its body ran while
the partition goes on serving everything else. The hold reads no clock in the body
and changes no value, so results and state stay a pure function of (args, reads).

Invariants: the genesis is a pure function of its arguments; a partition yields only
the rows placed on it; every record starts at value 0 and every tag at slot 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from txn_library.catalog import Table, register_table
from txn_library.errors import ERR_BAD_ARGUMENTS, BadRequest
from txn_library.procedure import Abort, Arg, Footprint, Restart, procedure

REC = "bench_rec"
TAG = "bench_tag"
RIDS_PER_CALL_MAX = 64
STALL_MS_MAX = 10_000
SLOTS_MAX = 64


def place_by_int_mod(prefix: tuple, partitions: int) -> int:
    """Integer key modulo the partition count (stable, no hashing)."""
    return prefix[0] % partitions


register_table(Table(REC, key_len=1, placement=place_by_int_mod, columns=("value",)))
register_table(Table(TAG, key_len=1, placement=place_by_int_mod, columns=("rid",)))


def slot_rids(tag: int, tags: int, slots: int) -> list[int]:
    """The records tag may point to; all on the tag's partition when partitions | tags."""
    return [tag + j * tags for j in range(slots)]


def genesis(
    partition: int, partitions: int, records: int = 1_000_000, tags: int = 0
) -> Iterator[tuple[str, tuple, tuple]]:
    """Rows of ``partition``: records rid in [0, records) with rid % partitions ==
    partition (value 0), and tags t in [0, tags) on it pointing at record t."""
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} not in [0, {partitions})")
    if tags and (tags % partitions or tags > records):
        raise ValueError("tags must be a multiple of partitions and <= records")
    zero = (0,)
    for rid in range(partition, records, partitions):
        yield (REC, (rid,), zero)
    for t in range(partition, tags, partitions):
        yield (TAG, (t,), (t,))


def _rec_keys(rids: Sequence[int]) -> tuple:
    return tuple((REC, (r,)) for r in rids)


def _update_footprint(rids: Sequence[int], delta: int, *_: Any) -> Footprint:
    if not all(type(r) is int and r >= 0 for r in rids):
        raise BadRequest(ERR_BAD_ARGUMENTS, "rids must be non-negative integers")
    keys = _rec_keys(sorted(set(rids)))
    return Footprint(reads=keys, writes=keys)


def _add(ctx: Any, rids: Sequence[int], delta: int) -> Any:
    for r in sorted(set(rids)):
        row = ctx.get(REC, (r,))
        if row is None:
            return Abort(f"no record {r}")
        ctx.put(REC, (r,), (row[0] + delta,))
    return len(rids)


_RIDS = Arg("rids", "list", max_len=RIDS_PER_CALL_MAX)
_DELTA = Arg("delta", "int", min_value=-1_000_000, max_value=1_000_000)


@procedure("bench.update", [_RIDS, _DELTA], _update_footprint)
def update(ctx: Any, rids: Sequence[int], delta: int) -> Any:
    """Add delta to every record in rids (in key order); aborts on a missing record."""
    return _add(ctx, rids, delta)


@procedure(
    "bench.stall",
    [_RIDS, _DELTA, Arg("stall_ms", "int", min_value=0, max_value=STALL_MS_MAX)],
    _update_footprint,
)
def stall(ctx: Any, rids: Sequence[int], delta: int, stall_ms: int) -> Any:
    """bench.update, then keep the locks for stall_ms (an emulated I/O stall)."""
    out = _add(ctx, rids, delta)
    ctx.hold_locks(stall_ms)
    return out


_TAG = Arg("tag", "int", min_value=0)


@procedure(
    "bench.tag_recon",
    [_TAG, _DELTA],
    lambda tag, delta: Footprint(reads=((TAG, (tag,)),)),
    read_only=True,
)
def tag_recon(ctx: Any, tag: int, delta: int) -> int | None:
    """Reconnaissance: the record the tag points to now (None if no such tag)."""
    row = ctx.get(TAG, (tag,))
    return None if row is None else row[0]


def _tag_update_footprint(tag: int, delta: int, predicted_rid: Any) -> Footprint:
    if predicted_rid is None:
        return Footprint(reads=((TAG, (tag,)),))
    if type(predicted_rid) is not int or predicted_rid < 0:
        raise BadRequest(ERR_BAD_ARGUMENTS, f"bad prediction {predicted_rid!r}")
    rec = ((REC, (predicted_rid,)),)
    return Footprint(reads=((TAG, (tag,)),) + rec, writes=rec)


@procedure("bench.tag_update", [_TAG, _DELTA], _tag_update_footprint, recon="bench.tag_recon")
def tag_update(ctx: Any, tag: int, delta: int, predicted_rid: int | None) -> Any:
    """Dependent: add delta to the record the tag points to. Re-reads the index entry
    under its lock; a changed entry returns Restart(actual) before any write."""
    row = ctx.get(TAG, (tag,))
    actual = None if row is None else row[0]
    if actual != predicted_rid:
        return Restart(actual)
    if actual is None:
        return Abort(f"no tag {tag}")
    return _add(ctx, (actual,), delta)


def _tag_locking_footprint(tag: int, delta: int, tags: int, slots: int) -> Footprint:
    if not 0 <= tag < tags:
        raise BadRequest(ERR_BAD_ARGUMENTS, f"tag {tag} not in [0, {tags})")
    recs = _rec_keys(slot_rids(tag, tags, slots))
    return Footprint(reads=((TAG, (tag,)),) + recs, writes=recs)


@procedure(
    "bench.tag_update_locking",
    [
        _TAG,
        _DELTA,
        Arg("tags", "int", min_value=1),
        Arg("slots", "int", min_value=1, max_value=SLOTS_MAX),
    ],
    _tag_locking_footprint,
)
def tag_update_locking(ctx: Any, tag: int, delta: int, tags: int, slots: int) -> Any:
    """Lookup-then-update without reconnaissance. The footprint allows every slot of
    the tag; a locking engine locks the index entry and the one record it reaches
    (a deterministic engine would lock all slots: not used there)."""
    row = ctx.get(TAG, (tag,))
    if row is None:
        return Abort(f"no tag {tag}")
    return _add(ctx, (row[0],), delta)


@procedure(
    "bench.tag_move",
    [_TAG, Arg("rid", "int", min_value=0)],
    lambda tag, rid: Footprint(reads=((TAG, (tag,)),), writes=((TAG, (tag,)),)),
)
def tag_move(ctx: Any, tag: int, rid: int) -> Any:
    """Re-point the index entry of tag to record rid (the caller keeps rid a slot of
    tag); returns the previous rid."""
    row = ctx.get(TAG, (tag,))
    if row is None:
        return Abort(f"no tag {tag}")
    ctx.put(TAG, (tag,), (rid,))
    return row[0]
