"""Dataflows: stored procedures over streams, triggered per atomic batch (S-Store's PE
triggers), and where their chains are expanded.

A step is declared with ``@stream_procedure(name, input=..., output=...)``: a function
``fn(ctx, batch_id, tuples) -> output tuples | Abort``. A ``Dataflow`` binds steps
into a DAG, which follows from the streams (a step that consumes stream X runs after
the step that produces X); its border stream is the one no step produces, fed by
clients with ``stream.push(stream, batch_id, tuples)`` (the border transaction).

Expansion (docs/STREAMS.md says why here): a push to a dataflow's border stream
*derives* one transaction per step (or per nested group), appended after every
logged transaction of the same batch, in the order of the pushes and, within a push,
in the dataflow's topological order (ties: declaration order). Derivation is a pure
function of the logged batch and the declared dataflows (``derived_txns``), so the
sequencer, every partition, every recovery, the serial oracle and Spark replay get
the same chain at the same txn ids. Strong recovery (the default): the sequencer
writes the derived transactions into the command log after the batch's calls, and a
reader runs what it reads. Weak recovery (``dataflow_recovery = "weak"`` in the
cluster's config): only pushes and OLTP calls are logged; the batch carries
FLAG_DERIVED_UNLOGGED and the count of what it derives (``Batch.derived``), and
every reader derives them again (``batch_txns``). The serial order, and so the state,
is the same either way.

Exactly once and in order: a step records, per dataflow, the last batch it processed
(``ordo_dataflow_progress``); it processes batch b only if b is newer and its input
stream holds b (the upstream step or push committed it), so a repeated push or a
client's direct call never processes a batch twice, and batch ids increase along
every step because they increase along the border stream (a push whose id does not
increase is refused).

Invariants:
- A step belongs to one dataflow; a window to one step of that dataflow; a stream is
  the border of at most one dataflow and is produced by at most one step.
- Derived transactions have ``client_id == DERIVED_CLIENT`` and no request id: nobody
  waits for their results (sinks read their output).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import msgpack

from txn_library import catalog, limits
from txn_library.errors import InvariantViolation
from txn_library.procedure import Abort, Arg, Footprint, FootprintEntry, Procedure, register
from txn_library.streams.context import (
    StreamContext,
    batch_digest,
    generation,
    trigger_footprint,
)
from txn_library.streams.spec import (
    PROGRESS,
    STREAM_BATCHES,
    STREAMS,
    Stream,
    stream_named,
    window_named,
)
from txn_library.wire.sequencer import FLAG_DERIVED_UNLOGGED, Batch, Txn

DERIVED_CLIENT = b"\x00dataflow"  # the client id of derived (triggered) transactions
PUSH = "stream.push"
BATCH_ID_MAX = (1 << 63) - 1

StepFn = Callable[[StreamContext, int, list[tuple]], Any]


@dataclass(eq=False)
class Step:
    """A stream procedure, before a Dataflow binds it."""

    name: str
    input: str
    output: str | None
    fn: StepFn
    reads: tuple[tuple[str, tuple], ...]
    writes: tuple[tuple[str, tuple], ...]
    windows: tuple[str, ...]
    dataflow: Dataflow | None = None
    procedure: Procedure | None = None

    def __rshift__(self, other: Step | Sequence[Step]) -> list[Step]:
        return [self, *([other] if isinstance(other, Step) else other)]


def stream_procedure(
    name: str,
    *,
    input: str,
    output: str | None = None,
    reads: Iterable[Any] = (),
    writes: Iterable[Any] = (),
    windows: Iterable[str] = (),
) -> Callable[[StepFn], Step]:
    """Decorator: a step that processes one batch of ``input`` and returns the tuples it
    appends to ``output`` (as the same batch id), or ``Abort(reason)``. ``reads`` and
    ``writes``: the (table, key prefix) pairs of state it touches besides its streams
    and its own ``windows``."""

    def wrap(fn: StepFn) -> Step:
        return Step(
            name,
            input,
            output,
            fn,
            tuple((t, tuple(k)) for t, k in reads),
            tuple((t, tuple(k)) for t, k in writes),
            tuple(windows),
        )

    return wrap


@dataclass(eq=False)
class Unit:
    """What one derived transaction runs: a step, or a nested group of steps."""

    proc_name: str
    steps: tuple[Step, ...]


@dataclass(eq=False)
class Dataflow:
    """A DAG of steps over streams, run per batch pushed to its border stream.

    ``nested=True``: the whole chain is one transaction (atomic and isolated); a
    group ``nested(a, b)`` among ``steps`` makes just those one transaction.
    ``triggers=False``: no PE triggers; clients call the steps themselves."""

    name: str
    steps: Sequence[Any]
    nested: bool = False
    triggers: bool = True
    order: tuple[Step, ...] = field(init=False)
    units: tuple[Unit, ...] = field(init=False)
    border: Stream = field(init=False)
    consumers: dict[str, tuple[Step, ...]] = field(init=False)

    def __post_init__(self) -> None:
        groups = [g if isinstance(g, _Nested) else _flatten(g) for g in self.steps]
        flat = [s for g in groups for s in (g.steps if isinstance(g, _Nested) else g)]
        self.order = _topological(self.name, flat)
        self.border = _border(self.name, flat)
        self.consumers = {
            s.input: tuple(c for c in self.order if c.input == s.input) for s in self.order
        }
        for s in self.order:
            if s.dataflow is not None:
                raise ValueError(f"step {s.name} is in dataflow {s.dataflow.name} already")
            for w in s.windows:
                if window_named(w).owner != s.name:
                    raise ValueError(f"window {w} belongs to {window_named(w).owner}, not {s.name}")
            s.dataflow = self
        rank = {s.name: i for i, s in enumerate(self.order)}
        if self.nested:
            nested_groups = [tuple(self.order)]
        else:
            nested_groups = [
                tuple(sorted(g.steps, key=lambda s: rank[s.name]))
                for g in groups
                if isinstance(g, _Nested)
            ]
        in_group = {s.name for g in nested_groups for s in g}
        units: list[Unit] = []
        for s in self.order:
            s.procedure = register(_step_procedure(self, (s,), s.name))
            if s.name not in in_group:
                units.append(Unit(s.name, (s,)))
        for i, g in enumerate(nested_groups):
            name = f"{self.name}.nested{i}"
            register(_step_procedure(self, g, name))
            units.append(Unit(name, g))
        units.sort(key=lambda u: rank[u.steps[0].name])
        self.units = tuple(units)
        other = _BORDERS.get(self.border.name)
        if other is not None:
            raise ValueError(f"stream {self.border.name} is the border of {other.name} already")
        _BORDERS[self.border.name] = self
        _DATAFLOWS[self.name] = self
        consumed = {st.input for st in self.order}
        _BETWEEN.update(st.output for st in self.order if st.output in consumed)
        generation[0] += 1

    def last_consumer(self, stream: str) -> Step | None:
        c = self.consumers.get(stream)
        return c[-1] if c else None


@dataclass(frozen=True)
class _Nested:
    steps: tuple[Step, ...]


def nested(*steps: Step) -> _Nested:
    """Steps of a dataflow that run as one transaction (atomic and isolated)."""
    return _Nested(tuple(steps))


def _flatten(x: Any) -> list[Step]:
    if isinstance(x, Step):
        return [x]
    if isinstance(x, (list, tuple)):
        return [s for y in x for s in _flatten(y)]
    raise TypeError(f"a dataflow's steps are steps, lists of steps or nested(...), not {x!r}")


def _topological(name: str, steps: list[Step]) -> tuple[Step, ...]:
    """Kahn's order over the streams, ties in declaration order."""
    if len({s.name for s in steps}) != len(steps):
        raise ValueError(f"dataflow {name}: a step is listed twice")
    producer: dict[str, Step] = {}
    for s in steps:
        if s.output is not None:
            if s.output in producer:
                raise ValueError(f"dataflow {name}: stream {s.output} has two producers")
            producer[s.output] = s
    done: list[Step] = []
    left = list(steps)
    while left:
        ready = [s for s in left if s.input not in producer or producer[s.input] in done]
        if not ready:
            raise ValueError(f"dataflow {name}: its streams form a cycle")
        done.append(ready[0])
        left.remove(ready[0])
    return tuple(done)


def _border(name: str, steps: list[Step]) -> Stream:
    produced = {s.output for s in steps}
    borders = sorted({s.input for s in steps} - produced)
    if len(borders) != 1:
        raise ValueError(f"dataflow {name}: needs one border stream, has {borders}")
    for s in steps:
        for st in (s.input, s.output):
            if st is not None:
                stream_named(st)  # declared
    return stream_named(borders[0])


_BORDERS: dict[str, Dataflow] = {}
_DATAFLOWS: dict[str, Dataflow] = {}
_BETWEEN: set[str] = set()  # streams a step produces and a step consumes


def listed(stream: str) -> bool:
    """A stream clients push to, or a sink: its batches form a list that retries and
    subscribers read (``StreamContext.append_batch``); a stream between two steps keeps
    each batch only until its last consumer takes it."""
    return stream not in _BETWEEN


def dataflows() -> dict[str, Dataflow]:
    return dict(_DATAFLOWS)


def dataflow_named(name: str) -> Dataflow | None:
    return _DATAFLOWS.get(name)


# The procedures ---------------------------------------------------------------------
def _stream_entries(s: Stream) -> list[tuple[str, tuple]]:
    return [
        (s.name, (s.home,)),
        (STREAM_BATCHES, (s.home, s.name)),
        (STREAMS, (s.home, s.name)),
    ]


@dataclass(frozen=True)
class _Shape:
    """A step's (or a push's) footprint without its batch id: the ``per_batch``
    entries' keys end with it (``at`` appends it). ``local`` entries are read and
    written, only at their home (``Footprint.local``: never shipped); none of them is
    among ``reads`` or ``writes`` (``_unshared``)."""

    reads: tuple[FootprintEntry, ...]
    writes: tuple[FootprintEntry, ...]
    reads_per_batch: tuple[FootprintEntry, ...]
    writes_per_batch: tuple[FootprintEntry, ...]
    local: tuple[FootprintEntry, ...]
    # The entries without the batch id, as sets: ``covers`` adds the batch's to them.
    fixed_reads: frozenset[FootprintEntry] = field(init=False, repr=False, compare=False)
    fixed_writes: frozenset[FootprintEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fixed_reads", frozenset(self.reads + self.local))
        object.__setattr__(self, "fixed_writes", frozenset(self.writes + self.local))

    def covers(self, batch_id: int) -> tuple[frozenset[FootprintEntry], frozenset[FootprintEntry]]:
        """The sets of ``at(batch_id)``'s reads and writes (what an executor checks a
        body's accesses against), without building the footprint: the fixed entries'
        sets (hashed once) with the batch's entries added."""
        b = (batch_id,)
        return (
            self.fixed_reads.union([(t, k + b) for t, k in self.reads_per_batch]),
            self.fixed_writes.union([(t, k + b) for t, k in self.writes_per_batch]),
        )

    def at(self, batch_id: int) -> Footprint:
        """The footprint for batch ``batch_id`` (this runs for every step and push at
        every participant: no more than appending the id)."""
        b = (batch_id,)
        local = self.local
        return Footprint(
            self.reads + local + tuple([(t, k + b) for t, k in self.reads_per_batch]),
            self.writes + local + tuple([(t, k + b) for t, k in self.writes_per_batch]),
            local,
        )


def _shape_union(shapes: Iterable[_Shape]) -> _Shape:
    parts = list(shapes)

    def union(name: str) -> tuple[FootprintEntry, ...]:
        return tuple(dict.fromkeys(e for p in parts for e in getattr(p, name)))

    return _Shape(
        union("reads"),
        union("writes"),
        union("reads_per_batch"),
        union("writes_per_batch"),
        union("local"),
    )


def _appended(s: Stream, is_listed: bool) -> _Shape:
    """What appending a batch to ``s`` touches (``StreamContext.append_batch``): its
    row in ``ordo_stream``, the batch's row and tuples; and, for a listed stream, the
    batches retention drops, read only at the stream's home (``local``)."""
    h, name = s.home, s.name
    local: tuple[FootprintEntry, ...] = ()
    if is_listed:
        local = ((STREAM_BATCHES, (h, name)), (name, (h,)))
    meta = ((STREAMS, (h, name)),)
    return _Shape(meta, meta, (), ((STREAM_BATCHES, (h, name)), (name, (h,))), local)


def _taken(s: Stream) -> _Shape:
    """What taking batch b of ``s`` touches (``run_step``): its row and tuples (read;
    deleted by its last consumer)."""
    batch = ((STREAM_BATCHES, (s.home, s.name)), (s.name, (s.home,)))
    return _Shape((), (), batch, batch, ())


def _fixed(reads: Iterable[FootprintEntry], writes: Iterable[FootprintEntry]) -> _Shape:
    return _Shape(tuple(reads), tuple(writes), (), (), ())


def _unshared(shape: _Shape, declared: Iterable[FootprintEntry]) -> _Shape:
    """``shape`` whose ``local`` entries are only those no step or trigger declares
    anything under (or over): a body that reads a trimmed stream itself needs its
    rows shipped, as any read (each participant must read the same rows); such an
    entry becomes an ordinary read and write."""
    found = list(declared)

    def overlaps(e: FootprintEntry) -> bool:
        t, k = e
        return any(u == t and (v[: len(k)] == k or k[: len(v)] == v) for u, v in found)

    shipped = tuple(e for e in shape.local if overlaps(e))
    if not shipped:
        return shape
    return replace(
        shape,
        reads=tuple(dict.fromkeys(shape.reads + shipped)),
        writes=tuple(dict.fromkeys(shape.writes + shipped)),
        local=tuple(e for e in shape.local if e not in shipped),
    )


@lru_cache(maxsize=4096)
def _step_shape(proc_name: str, gen: int) -> _Shape:
    """A step's (or nested group's) footprint: of its input, batch b's row and tuples;
    of its output, batch b's row and tuples and the stream's row (and, for a sink,
    what retention drops: ``local``); its progress row, windows, state and the
    triggers on what it writes. Cached per procedure; the batch id is the only
    argument (``_Shape.at``)."""
    del gen  # part of the cache key: a registration after the first use rebuilds it
    steps = _UNIT_STEPS[proc_name]
    parts = []
    declared: list[FootprintEntry] = []  # by the steps and their triggers
    for s in steps:
        assert s.dataflow is not None
        src = stream_named(s.input)
        progress = [(PROGRESS, (src.home, s.dataflow.name, s.name))]
        parts += [_taken(src), _fixed(progress, progress)]
        written = [s.input]
        if s.output is not None:
            parts.append(_appended(stream_named(s.output), listed(s.output)))
            written.append(s.output)
        entries: list[FootprintEntry] = []
        for w in s.windows:
            win = window_named(w)
            entries.append((w, (win.home,)))
            entries.append(("ordo_window", (win.home, w)))
            written.append(w)
        written += [t for t, _ in s.writes]
        trig = trigger_footprint(written)
        # what a step writes it may read too (its declared ``writes`` imply reads)
        parts.append(_fixed(tuple(entries) + s.reads + s.writes, tuple(entries) + s.writes))
        parts.append(_fixed(trig.reads + trig.writes, trig.writes))
        declared += [*s.reads, *s.writes, *trig.reads, *trig.writes]
    return _unshared(_shape_union(parts), declared)


_UNIT_STEPS: dict[str, tuple[Step, ...]] = {}


def unit_covers(
    proc_name: str, batch_id: int
) -> tuple[frozenset[FootprintEntry], frozenset[FootprintEntry]]:
    """The read and write sets of unit ``proc_name``'s footprint for ``batch_id``: the
    sets of ``lookup(proc_name).footprint(batch_id)``'s entries (``_Shape.covers``)."""
    return _step_shape(proc_name, generation[0]).covers(batch_id)


def unit_lock_entries(
    proc_name: str,
) -> tuple[tuple[FootprintEntry, ...], tuple[FootprintEntry, ...]] | None:
    """The (reads, writes) of a step's (or nested group's) footprint for every batch at
    once, for its lock names: entries whose lock names are those of ``footprint(b)``'s
    for every batch id b (a per-batch entry ``(t, k + (b,))`` is named ``(t, k)``, its
    table's lock prefix being no longer than ``k``). None for a procedure that is no
    dataflow's unit, or whose lock names depend on the batch id: its caller then takes
    each transaction's locks from its own footprint (the executor's chain pass,
    executor.deterministic.chain)."""
    if proc_name not in _UNIT_STEPS:
        return None
    shape = _step_shape(proc_name, generation[0])
    for t, k in shape.reads_per_batch + shape.writes_per_batch:
        if catalog.table(t).lock_prefix > len(k):
            return None
    local = shape.local
    return (
        shape.reads + local + shape.reads_per_batch,
        shape.writes + local + shape.writes_per_batch,
    )


def _step_procedure(df: Dataflow, steps: tuple[Step, ...], name: str) -> Procedure:
    _UNIT_STEPS[name] = steps

    def footprint(batch_id: int) -> Footprint:
        return _step_shape(name, generation[0]).at(batch_id)

    def body(ctx: Any, batch_id: int) -> Any:
        out: list[Any] = []
        for s in steps:
            r = run_step(df, s, ctx, batch_id)
            if isinstance(r, Abort):
                return r if len(steps) == 1 else Abort(f"{s.name}: {r.reason}")
            out.append(r)
        return out[0] if len(steps) == 1 else out

    return Procedure(
        name=name,
        args=(Arg("batch_id", "int", min_value=0, max_value=BATCH_ID_MAX),),
        footprint=footprint,
        body=body,
        doc=f"dataflow {df.name}: " + ", ".join(s.name for s in steps) + " for one batch",
    )


def run_step(df: Dataflow, s: Step, ctx: Any, batch_id: int) -> Any:
    """Process batch ``batch_id`` at step ``s`` (once, in order; see the module doc)."""
    src = stream_named(s.input)
    pkey = (src.home, df.name, s.name)
    prog = ctx.get(PROGRESS, pkey)
    if prog is not None and batch_id <= prog[0]:
        return {
            "batch": batch_id,
            "skipped": f"batch {batch_id} processed already (last {prog[0]})",
        }
    marker = ctx.get(STREAM_BATCHES, (src.home, src.name, batch_id))
    if marker is None:
        return {"batch": batch_id, "skipped": f"stream {src.name} has no batch {batch_id}"}
    sctx = StreamContext(ctx, batch_id, s.name)
    tuples = sctx.batch_tuples(src, batch_id, marker[0])
    out = s.fn(sctx, batch_id, tuples)
    if isinstance(out, Abort):
        return out
    n_out = 0
    if s.output is not None:
        dst = stream_named(s.output)
        values = dst.check_tuples(list(out) if out is not None else [])
        sctx.append_batch(dst, batch_id, values, 0, None, listed=listed(dst.name))
        n_out = len(values)
    sctx.end_batch(s.windows)
    if df.last_consumer(src.name) is s:
        sctx.drop_tuples(src, batch_id, marker[0])
        if not listed(src.name):
            ctx.delete(STREAM_BATCHES, (src.home, src.name, batch_id))
    batches, tin, tout = (prog[1], prog[2], prog[3]) if prog is not None else (0, 0, 0)
    ctx.put(PROGRESS, pkey, (batch_id, batches + 1, tin + len(tuples), tout + n_out))
    return {"batch": batch_id, "in": len(tuples), "out": n_out}


@lru_cache(maxsize=4096)
def _push_shape(stream: str, gen: int) -> _Shape:
    del gen
    s = stream_named(stream)
    trig = trigger_footprint([s.name])
    shape = _shape_union(
        [
            _fixed(_consumers_progress(s), ()),  # what its steps processed (``_push``)
            _appended(s, True),  # a push appends as to a listed stream (``_push``)
            _Shape((), (), ((STREAM_BATCHES, (s.home, s.name)),), (), ()),  # a retry's row
            _fixed(trig.reads + trig.writes, trig.writes),
        ]
    )
    return _unshared(shape, trig.reads + trig.writes)


def _push_footprint(stream: Any, batch_id: int, tuples: Any) -> Footprint:
    stream_named(stream)  # an unknown stream: BadRequest
    return _push_shape(stream, generation[0]).at(batch_id)


def _push_check(stream: Any, batch_id: int, tuples: Any) -> None:
    """Where calls are admitted: the tuples fit the stream (BadRequest if not)."""
    stream_named(stream).check_tuples(tuples)


def _push(ctx: Any, stream: str, batch_id: int, tuples: Any) -> Any:
    """The border transaction: append one atomic batch to ``stream``. A batch id that
    is pushed again with the same tuples gets the first push's answer (exactly once);
    with other tuples, or an id that does not increase, it is refused. (The tuples
    were checked where the call was admitted: a logged push's are whole.)"""
    s = stream_named(stream)
    values = tuple(map(tuple, tuples))
    digest = batch_digest(values)
    marker = ctx.get(STREAM_BATCHES, (s.home, s.name, batch_id))
    if marker is not None:
        if marker[1] == digest:
            return marker[2]
        return Abort(f"batch {batch_id} of stream {s.name} was pushed before with other tuples")
    meta = ctx.get(STREAMS, (s.home, s.name))
    if meta is not None and meta[1] is not None and batch_id <= meta[1]:
        dropped = meta[3] is not None and batch_id <= meta[3]
        return Abort(
            f"batch ids of stream {s.name} must increase: {batch_id} is not after {meta[1]}"
            + (f" (batches up to {meta[3]} are no longer kept)" if dropped else "")
        )
    result = [batch_id, len(values)]
    drop_below = _unprocessed_from(ctx, s)
    StreamContext(ctx, batch_id, None).append_batch(
        s, batch_id, values, digest, result, drop_below=drop_below
    )
    return result


def _consumers_progress(s: Stream) -> tuple[FootprintEntry, ...]:
    """The progress rows of the steps that take ``s`` as the border of a dataflow with
    PE triggers (they run for every batch pushed, in the push's epoch)."""
    df = _BORDERS.get(s.name)
    if df is None or not df.triggers:
        return ()
    return tuple((PROGRESS, (s.home, df.name, st.name)) for st in df.order if st.input == s.name)


def _unprocessed_from(ctx: Any, s: Stream) -> int | None:
    """The oldest batch id of border stream ``s`` some step has not processed yet
    (-1 if one never ran): retention must not drop it. Steps run after every push of
    their epoch, so a stream that keeps fewer batches than one epoch pushes would drop
    batches before their steps saw them (and they would skip them). None: no PE steps."""
    keys = _consumers_progress(s)
    if not keys:
        return None
    lowest: int | None = None
    for t, key in keys:
        prog = ctx.get(t, key)
        nxt = -1 if prog is None else prog[0] + 1
        lowest = nxt if lowest is None else min(lowest, nxt)
    return lowest


register(
    Procedure(
        name=PUSH,
        args=(
            Arg("stream", "str", max_len=256),
            Arg("batch_id", "int", min_value=0, max_value=BATCH_ID_MAX),
            Arg("tuples", "list"),
        ),
        footprint=_push_footprint,
        body=_push,
        check=_push_check,
        doc="Append one atomic batch to a stream (the border transaction of its dataflow).",
    )
)


def _read_footprint(stream: Any, from_batch: int, max_batches: int) -> Footprint:
    return Footprint(reads=tuple(_stream_entries(stream_named(stream))))


def _read(ctx: Any, stream: str, from_batch: int, max_batches: int) -> Any:
    """Batches of ``stream`` with id >= ``from_batch``, oldest first, at most
    ``max_batches``: {"batches": [[batch_id, [tuples]], ...], "first", "last",
    "dropped"} (``dropped``: the newest batch id no longer kept, or None)."""
    s = stream_named(stream)
    meta = ctx.get(STREAMS, (s.home, s.name))
    if meta is None:
        return {"batches": [], "first": None, "last": None, "dropped": None}
    first, last = meta[0], meta[1]
    out: list[Any] = []
    if last is not None and from_batch <= last:
        # Dense ids (the usual case) by key: a poll that is caught up, or a little
        # behind, costs what it returns; a gap in the ids falls back to one scan.
        b = max(from_batch, first if first is not None else from_batch)
        while b <= last and len(out) < max_batches:
            m = ctx.get(STREAM_BATCHES, (s.home, s.name, b))
            if m is None:
                break
            out.append([b, sctx_tuples(ctx, s, b, m[0])])
            b += 1
        if b <= last and len(out) < max_batches:
            for key, m in ctx.scan(STREAM_BATCHES, (s.home, s.name)):
                if key[2] >= b:
                    out.append([key[2], sctx_tuples(ctx, s, key[2], m[0])])
                    if len(out) >= max_batches:
                        break
    return {"batches": out, "first": first, "last": last, "dropped": meta[3]}


def sctx_tuples(ctx: Any, s: Stream, batch_id: int, n: int) -> list[tuple]:
    """A batch's tuples (those still kept) by key."""
    get = ctx.get
    rows = [get(s.name, (s.home, batch_id, i)) for i in range(n)]
    return [r for r in rows if r is not None]


register(
    Procedure(
        name="stream.read",
        args=(
            Arg("stream", "str", max_len=256),
            Arg("from_batch", "int", min_value=0, max_value=BATCH_ID_MAX),
            Arg("max_batches", "int", min_value=1, max_value=limits.stream_read_batches_max),
        ),
        footprint=_read_footprint,
        body=_read,
        read_only=True,
        doc="Batches of a stream from a batch id on, oldest first (what a sink delivers).",
    )
)


def _status_footprint(name: Any) -> Footprint:
    df = _DATAFLOWS.get(name) if type(name) is str else None
    if df is None:
        from txn_library.errors import ERR_BAD_ARGUMENTS, BadRequest, brief

        raise BadRequest(ERR_BAD_ARGUMENTS, f"no dataflow named {brief(name)}")
    homes = {stream_named(s.input).home for s in df.order}
    reads = [(STREAM_BATCHES, (df.border.home, df.border.name))]
    reads += [(STREAMS, (df.border.home, df.border.name))]
    reads += [(PROGRESS, (h, df.name)) for h in sorted(homes)]
    return Footprint(reads=tuple(reads))


def _status(ctx: Any, name: str) -> Any:
    """Per dataflow: the last batch pushed, each step's last batch, the last batch every
    step has processed, and how many pushed batches wait (the backlog)."""
    df = _DATAFLOWS[name]
    b = df.border
    meta = ctx.get(STREAMS, (b.home, b.name))
    pushed = meta[1] if meta is not None else None
    steps = {}
    for s in df.order:
        row = ctx.get(PROGRESS, (stream_named(s.input).home, df.name, s.name))
        steps[s.name] = row[0] if row is not None else None
    done = list(steps.values())
    processed = None if not done or any(v is None for v in done) else min(done)  # type: ignore[type-var]
    backlog = sum(
        1
        for key, _ in ctx.scan(STREAM_BATCHES, (b.home, b.name))
        if processed is None or key[2] > processed
    )
    return {
        "dataflow": name,
        "border": b.name,
        "last_pushed": pushed,
        "last_processed": processed,
        "backlog": backlog,
        "steps": steps,
        "triggers": df.triggers,
    }


register(
    Procedure(
        name="dataflow.status",
        args=(Arg("name", "str", max_len=256),),
        footprint=_status_footprint,
        body=_status,
        read_only=True,
        doc="A dataflow's progress: last batch pushed, last fully processed, backlog.",
    )
)


# Expansion ---------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def _participants(proc_name: str, partitions: int, gen: int) -> tuple[int, ...]:
    del gen
    from txn_library.procedure import lookup

    return lookup(proc_name).participants_of((0,), partitions)


def derived_txns(txns: Iterable[Txn], partitions: int) -> list[Txn]:
    """The transactions the pushes among ``txns`` derive, in order (see the module doc)."""
    if not _BORDERS:
        return []
    out: list[Txn] = []
    gen = generation[0]
    for t in txns:
        if t.proc != PUSH or t.client_id == DERIVED_CLIENT:
            continue
        args = t.args
        df = _BORDERS.get(args[0]) if args and type(args[0]) is str else None
        if df is None or not df.triggers:
            continue
        b = args[1]
        for u in df.units:
            parts = _participants(u.proc_name, partitions, gen)
            out.append(Txn(u.proc_name, (b,), parts, DERIVED_CLIENT, None))
    return out


_TXN_ARRAY = msgpack.packb([None] * 5)[:1]  # a logged txn is a fixarray of 5 fields


@lru_cache(maxsize=4096)
def _unit_bytes(proc_name: str, partitions: int, gen: int) -> tuple[bytes, bytes]:
    """A derived txn's encoding around its arguments: (before, after)."""
    parts = _participants(proc_name, partitions, gen)
    before = _TXN_ARRAY + msgpack.packb(proc_name)
    after = msgpack.packb(parts) + msgpack.packb(DERIVED_CLIENT) + msgpack.packb(None)
    return before, after


def encoded_derived(push_args: Any, partitions: int) -> tuple[bytes, int]:
    """What a push with ``push_args`` derives, encoded as the sequencer logs txns
    (byte-identical to packing ``derived_txns``'s Txns), and how many: (b"", 0) for a
    stream that is no dataflow's border (or one without triggers)."""
    df = _BORDERS.get(push_args[0]) if push_args and type(push_args[0]) is str else None
    if df is None or not df.triggers:
        return b"", 0
    gen = generation[0]
    arg = msgpack.packb((push_args[1],))
    pieces: list[bytes] = []
    for u in df.units:
        before, after = _unit_bytes(u.proc_name, partitions, gen)
        pieces += (before, arg, after)
    return b"".join(pieces), len(df.units)


def batch_txns(batch: Batch, partitions: int) -> tuple[Txn, ...]:
    """Every transaction of ``batch`` in serial order (txn ids from its first_txn_id):
    the logged ones, then (weak recovery: FLAG_DERIVED_UNLOGGED) those its pushes
    derive. Checks the count the batch carries: a reader that loaded other dataflows
    than the sequencer did is refused."""
    if not batch.flags & FLAG_DERIVED_UNLOGGED:
        return batch.txns
    extra = derived_txns(batch.txns, partitions)
    if len(extra) != batch.derived:
        raise InvariantViolation(
            f"batch {batch.epoch} says its pushes derive {batch.derived} transactions; the "
            f"dataflows loaded here derive {len(extra)} (not the sequencer's procedure modules?)"
        )
    return batch.txns + tuple(extra)
