"""What a stream step (and a push) does to streams and windows inside its transaction:
appending a batch to a stream, windows that slide, and EE triggers.

Everything here goes through the transaction's ``Context`` (``get``/``put``/``scan``/
``delete``), so it is checked against the footprint, buffered, validated and applied
(or not) with the rest of the transaction: a stream, a window and a trigger's writes
are transactional, replicated, checkpointed and replayed like any table.

Invariants:
- A stream's batch rows form one list in push order; a listed stream holds at most
  ``retain_batches + max(1, retain_batches // 16)`` batches (past that, the oldest
  go, rows and tuples, down to ``retain_batches``: ``append_batch``).
- A window shows exactly the rows ``visible_from <= seq < visible_to``; a tuple
  inserted since the last slide is staged and invisible. A tuple-based window slides
  when ``slide`` tuples are staged; a batch-based one when ``slide`` batches (each
  batch its owner processed, tuples or not) are staged; after a slide it shows the last
  ``size`` tuples (or the tuples of the last ``size`` batches) and rows before that
  are deleted.
- Only the window's owner (one step of one dataflow) reads or changes it
  (``WindowNotOwned`` otherwise).
- EE triggers run inside the same transaction: ``on_insert`` once per row inserted
  into its target through this module (a stream's tuples, a window's tuples, a table's
  rows inserted with ``StreamContext.insert``), ``on_slide`` after each slide of its
  window. A trigger may insert again (depth bounded by ``limits.trigger_depth_max``).

Retention is trimmed at the stream's home only. A step's footprint names what it
touches of batch b (txn_library.streams.dataflow: the input batch's row and tuples,
the output batch's, the output stream's row, its progress row), so what a
multi-partition step ships its peers does not grow with what the streams keep. What a
trim drops is data (the oldest ids, read at run time), so it is covered by prefix
entries marked ``local`` (txn_library.procedure.Footprint): locked, never shipped, read
only where held. Every participant of a multi-partition step runs the whole body;
``_drop_oldest`` does nothing where ``ctx.holds`` says the stream is not held. That
is safe because a trim decides nothing but writes under the stream's home: the result,
an abort and every other write come from shipped rows (the stream's row, the batch's),
the same at every participant; the trim's writes (deletes of stored keys, the stream's
row of ints) always pass validation, so the whole write set's verdict is the same with
or without them; and a participant that skipped them would drop them anyway (not its
keys). A step or trigger that declares reads of the trimmed tables itself gets them
shipped as before (``dataflow._unshared``). Not chosen: naming the dropped ids in the
footprint (known only from the stream's row at run time); trimming in a transaction of
its own at the home (one more transaction per batch, or per N batches, which sparse
ids cannot say); shipping the prefixes (a step's bytes grew with ``retain_batches``:
at 200,000 its pushes/s fell by two thirds within 40 s, issue 44).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from txn_library import limits
from txn_library.procedure import Context, Footprint, FootprintEntry
from txn_library.streams.spec import (
    STREAM_BATCHES,
    STREAMS,
    WINDOWS,
    Stream,
    Window,
    check_values,
    window_named,
)


class WindowNotOwned(Exception):
    """A step touched a window another step owns (S-Store's rule: one owner)."""


class TriggerDepthExceeded(Exception):
    """Triggers inserting into tables with triggers nested past the bound."""


@dataclass(frozen=True)
class Trigger:
    """An EE trigger: ``fn(ctx, key, row)`` on insert, or ``fn(ctx, view)`` on a slide;
    what it reads and writes besides its target (added to every footprint that
    writes the target)."""

    target: str
    event: str  # "insert" or "slide"
    fn: Callable[..., Any]
    footprint: Footprint


_TRIGGERS: dict[tuple[str, str], list[Trigger]] = {}
generation = [0]  # bumped at every registration: cached footprints are rebuilt


def _register(t: Trigger) -> Trigger:
    _TRIGGERS.setdefault((t.target, t.event), []).append(t)
    generation[0] += 1
    return t


def _entries(entries: Iterable[Any]) -> tuple[FootprintEntry, ...]:
    return tuple((t, tuple(k)) for t, k in entries)


def on_insert(
    target: str, *, reads: Iterable[Any] = (), writes: Iterable[Any] = ()
) -> Callable[[Callable[..., Any]], Trigger]:
    """Decorator: ``fn(ctx, key, row)`` runs in the inserting transaction for every row
    inserted into ``target`` (a stream: key ``(batch_id, seq)``, row its values; a
    window: key ``(batch_id, seq)``; a table: its key and row). ``reads``/``writes``:
    what it touches besides ``target`` ((table, key prefix) pairs)."""

    def wrap(fn: Callable[..., Any]) -> Trigger:
        return _register(
            Trigger(target, "insert", fn, Footprint(_entries(reads), _entries(writes)))
        )

    return wrap


def on_slide(
    window: str, *, reads: Iterable[Any] = (), writes: Iterable[Any] = ()
) -> Callable[[Callable[..., Any]], Trigger]:
    """Decorator: ``fn(ctx, view)`` runs in the owner's transaction after each slide of
    ``window`` (``view.rows()`` is what it shows now)."""

    def wrap(fn: Callable[..., Any]) -> Trigger:
        return _register(Trigger(window, "slide", fn, Footprint(_entries(reads), _entries(writes))))

    return wrap


def triggers(target: str, event: str) -> list[Trigger]:
    return _TRIGGERS.get((target, event), [])


def trigger_footprint(targets: Iterable[str]) -> Footprint:
    """What the triggers on ``targets`` touch (and, transitively, the triggers on what
    they write), for the footprint of a step or push that writes ``targets``."""
    reads: list[FootprintEntry] = []
    writes: list[FootprintEntry] = []
    todo, seen = list(targets), set()
    while todo:
        target = todo.pop()
        if target in seen:
            continue
        seen.add(target)
        for event in ("insert", "slide"):
            for t in triggers(target, event):
                reads += t.footprint.reads
                writes += t.footprint.writes
                todo += [table for table, _ in t.footprint.writes]
    return Footprint(tuple(reads), tuple(writes))


def batch_digest(tuples: Sequence[tuple]) -> int:
    """A batch's tuples' digest: a re-push with the same id is a retry only if equal."""
    return xxhash.xxh3_64_intdigest(msgpack.packb(tuples))


class StreamContext:
    """A step's (or a push's) view: the transaction's Context, plus streams, windows and
    triggers. ``batch_id`` is the batch the step processes."""

    def __init__(self, ctx: Context, batch_id: int, owner: str | None) -> None:
        self.ctx = ctx
        self.batch_id = batch_id
        self.owner = owner
        self._depth = 0
        self._views: dict[str, WindowView] = {}
        self._ended: set[str] = set()  # windows told this batch ended (end_batch)

    # The Context, unchanged ------------------------------------------------------
    @property
    def txn_id(self) -> int:
        return self.ctx.txn_id

    @property
    def timestamp_ms(self) -> int:
        return self.ctx.timestamp_ms

    @property
    def rng(self) -> random.Random:
        return self.ctx.rng

    def get(self, table: str, key: tuple) -> tuple | None:
        return self.ctx.get(table, key)

    def scan(self, table: str, prefix: tuple) -> list[tuple[tuple, tuple]]:
        return self.ctx.scan(table, prefix)

    def put(self, table: str, key: tuple, row: tuple) -> None:
        self.ctx.put(table, key, row)

    def delete(self, table: str, key: tuple) -> None:
        self.ctx.delete(table, key)

    # Inserts that fire triggers ----------------------------------------------------
    def insert(self, table: str, key: tuple, row: tuple) -> bool:
        """Put ``row`` under ``key`` if the key is absent (False if present: nothing
        changes), firing ``table``'s insert triggers."""
        if self.ctx.get(table, key) is not None:
            return False
        self.ctx.put(table, key, row)
        self.fire_insert(table, key, row)
        return True

    def fire_insert(self, target: str, key: tuple, row: tuple) -> None:
        ts = triggers(target, "insert")
        if not ts:
            return
        self._enter()
        try:
            for t in ts:
                t.fn(self, key, row)
        finally:
            self._depth -= 1

    def fire_slide(self, view: WindowView) -> None:
        ts = triggers(view.window.name, "slide")
        if not ts:
            return
        self._enter()
        try:
            for t in ts:
                t.fn(self, view)
        finally:
            self._depth -= 1

    def _enter(self) -> None:
        self._depth += 1
        if self._depth > limits.trigger_depth_max:
            raise TriggerDepthExceeded(
                f"triggers nested deeper than {limits.trigger_depth_max} (limits.trigger_depth_max)"
            )

    # Windows ---------------------------------------------------------------------
    def window(self, name: str) -> WindowView:
        """The window ``name``; only its owner may have it."""
        view = self._views.get(name)
        if view is None:
            w = window_named(name)
            if w.owner != self.owner:
                raise WindowNotOwned(
                    f"window {name} belongs to {w.owner}, not {self.owner or 'this call'}"
                )
            view = self._views[name] = WindowView(self, w)
        return view

    def end_batch(self, windows: Iterable[str]) -> None:
        """The owner has processed its batch: batch-based windows count it (and slide
        every ``slide`` batches). A step may call it itself, to see the slide in the
        same transaction; the dataflow calls it after every step, once per window."""
        for name in windows:
            if name not in self._ended:
                self._ended.add(name)
                self.window(name).end_batch(self.batch_id)

    # Streams ---------------------------------------------------------------------
    def append_batch(
        self,
        s: Stream,
        batch_id: int,
        tuples: Sequence[tuple],
        digest: int,
        result: Any,
        listed: bool = True,
        drop_below: int | None = None,
    ) -> None:
        """Append batch ``batch_id`` (not in ``s`` yet, after its last) with its tuples,
        firing the stream's insert triggers. ``listed`` (a stream clients push to, or a
        sink): the stream's row counts it, and once the stream holds
        ``retain_batches / 16`` (at least one) more than it keeps, the oldest batches go
        (at the stream's home: ``_drop_oldest``), but only those with ids below
        ``drop_below`` when it is given (a border stream keeps what its steps have not
        processed yet); else (a stream between two steps, whose last consumer deletes
        each batch as it takes it) only the batch's row is written."""
        ctx, h, name = self.ctx, s.home, s.name
        put = ctx.put
        if listed:  # before the batch's row: each stream's rows stay in key order
            meta = ctx.get(STREAMS, (h, name))
            first, count, dropped = (meta[0], meta[2], meta[3]) if meta else (None, 0, None)
            put(
                STREAMS,
                (h, name),
                (batch_id if first is None else first, batch_id, count + 1, dropped),
            )
        put(STREAM_BATCHES, (h, name, batch_id), (len(tuples), digest, result))
        ts = triggers(name, "insert")
        for i, t in enumerate(tuples):
            put(name, (h, batch_id, i), t)
            if ts:
                self.fire_insert(name, (batch_id, i), t)
        if listed and count + 1 > s.retain_batches + max(1, s.retain_batches // 16):
            self._drop_oldest(s, count + 1 - s.retain_batches, drop_below)

    def _drop_oldest(self, s: Stream, n: int, drop_below: int | None = None) -> None:
        """Delete the ``n`` oldest batches of a listed stream (rows and tuples left) and
        note the new first batch and the newest dropped in its row. Where the stream's
        rows are not held, nothing (see the module doc: its home does it).

        Batch ids are usually dense: they are walked by key from the stream's first
        batch, n + 1 reads (the first kept too). At a gap before that, one scan of the
        stream's batch rows instead (a gap costs that trim O(retain_batches); spread
        over the ~retain_batches / 16 batches between two trims, a few rows a batch)."""
        ctx, h, name = self.ctx, s.home, s.name
        if not ctx.holds(STREAM_BATCHES, (h, name)):
            return
        get = ctx.get
        meta = get(STREAMS, (h, name))
        assert meta is not None
        oldest: list[tuple[int, int]] = []  # (batch id, its tuples)
        b = meta[0]
        while len(oldest) <= n:
            row = get(STREAM_BATCHES, (h, name, b))
            if row is None:
                break
            oldest.append((b, row[0]))
            b += 1
        if len(oldest) <= n:
            rows = ctx.scan(STREAM_BATCHES, (h, name))
            oldest = [(key[2], row[0]) for key, row in rows[: n + 1]]
        if drop_below is not None:  # not past what a step has yet to process
            n = sum(1 for b, _ in oldest[:n] if b < drop_below)
        gone = oldest[:n]
        if not gone:
            return
        for b, n_tuples in gone:
            for i in range(n_tuples):  # by key: a scan would merge this txn's writes
                if get(name, (h, b, i)) is not None:
                    ctx.delete(name, (h, b, i))
            ctx.delete(STREAM_BATCHES, (h, name, b))
        kept_first = oldest[n][0] if n < len(oldest) else None
        ctx.put(STREAMS, (h, name), (kept_first, meta[1], meta[2] - len(gone), gone[-1][0]))

    def batch_tuples(self, s: Stream, batch_id: int, n: int) -> list[tuple]:
        """The ``n`` tuples of a batch (its batch row says how many), by key: no scan."""
        get, name, h = self.ctx.get, s.name, s.home
        out = []
        for i in range(n):
            row = get(name, (h, batch_id, i))
            if row is not None:
                out.append(row)
        return out

    def drop_tuples(self, s: Stream, batch_id: int, n: int | None = None) -> None:
        """Delete a batch's tuples (its batch row stays: retries still find it); ``n``:
        how many its batch row says (None: look them up)."""
        ctx, name, h = self.ctx, s.name, s.home
        if n is None:
            for key, _ in ctx.scan(name, (h, batch_id)):
                ctx.delete(name, key)
            return
        for i in range(n):
            ctx.delete(name, (h, batch_id, i))


class WindowView:
    """A window as its owner sees it inside one transaction: its state row and rows are
    read once (the first time they are needed) and kept here as they change, every
    change written through the transaction's Context as it happens."""

    def __init__(self, sctx: StreamContext, w: Window) -> None:
        self.sctx = sctx
        self.window = w
        self._key = (w.home, w.name)
        self._st: list[Any] | None = None
        self._rows: dict[int, tuple] | None = None  # seq -> row, visible and staged
        # The rows the last slide took out of the window, (batch_id, *values) each: what
        # an on_slide trigger (or the owner) subtracts to keep an aggregate incrementally.
        self.expired: list[tuple] = []

    def _state(self) -> list[Any]:
        if self._st is None:
            row = self.sctx.ctx.get(WINDOWS, self._key)
            self._st = (
                [0, 0, 0, 0, []]
                if row is None
                else [row[0], row[1], row[2], row[3], [list(b) for b in row[4]]]
            )
        return self._st

    def _save(self) -> None:
        st = self._state()
        self.sctx.ctx.put(WINDOWS, self._key, (*st[:4], tuple(tuple(b) for b in st[4])))

    def _all_rows(self) -> dict[int, tuple]:
        if self._rows is None:
            w = self.window
            self._rows = {k[1]: row for k, row in self.sctx.ctx.scan(w.name, (w.home,))}
        return self._rows

    def insert(self, values: Sequence[Any]) -> None:
        """Stage one tuple (invisible until the window slides)."""
        w, sctx = self.window, self.sctx
        row = (sctx.batch_id, *check_values(f"window {w.name}", values, w.types))
        st = self._state()
        seq = st[0]
        sctx.ctx.put(w.name, (w.home, seq), row)
        if self._rows is not None:
            self._rows[seq] = row
        st[0] = seq + 1
        if w.kind == "batches" and (not st[4] or st[4][-1][0] != sctx.batch_id):
            st[4].append([sctx.batch_id, seq])
        self._save()
        sctx.fire_insert(w.name, (sctx.batch_id, seq), row)
        if w.kind == "tuples" and st[0] - st[2] >= w.slide:
            self._slide()

    def end_batch(self, batch_id: int) -> None:
        """Batch-based windows: the owner processed ``batch_id``; slide every ``slide``
        batches."""
        w = self.window
        if w.kind != "batches":
            return
        st = self._state()
        if not st[4] or st[4][-1][0] != batch_id:
            st[4].append([batch_id, st[0]])  # a batch with no tuples counts too
        st[3] += 1
        self._save()
        if st[3] >= w.slide:
            self._slide()

    def _slide(self) -> None:
        w, ctx = self.window, self.sctx.ctx
        st = self._state()
        st[2] = st[0]  # every staged tuple becomes visible
        if w.kind == "tuples":
            start = max(st[1], st[2] - w.size)
        else:
            st[4] = st[4][-w.size :]
            start = st[4][0][1] if st[4] else st[2]
            st[3] = 0
        rows = self._rows
        expired = []
        for seq in range(st[1], start):
            key = (w.home, seq)
            row = rows.pop(seq, None) if rows is not None else ctx.get(w.name, key)
            if row is not None:
                expired.append(row)
            ctx.delete(w.name, key)
        self.expired = expired
        st[1] = start
        self._save()
        self.sctx.fire_slide(self)

    def tuples(self) -> list[tuple]:
        """The visible rows, oldest first: (batch_id, *values)."""
        st = self._state()
        rows = self._all_rows()
        return [rows[seq] for seq in range(st[1], st[2]) if seq in rows]

    def rows(self) -> list[tuple]:
        """The visible tuples' values, oldest first."""
        return [row[1:] for row in self.tuples()]

    def staged(self) -> int:
        """How many tuples wait for the next slide."""
        st = self._state()
        return st[0] - st[2]
