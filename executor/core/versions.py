"""Recent versions of a partition's rows, for queries that read a past epoch without
locks (TSpoon's queryable state; docs/QUERIES.md).

The Storage holds the current state; ``Versions`` keeps, for every key written in the
last epochs, the row it held before each epoch that wrote it: ``entries[table][key]``
is a flat list ``[e1, before1, e2, before2, ...]`` with e1 < e2 < ..., where
``before_i`` is the row (a tuple; the bytes of a row loaded but never decoded; None: no
row) the key held just before epoch ``e_i``'s first write of it. The row at the end of
epoch E is then ``before_i`` of the first ``e_i > E``, or the current row if the key
was not written after E. ``Storage.apply`` calls ``note`` before it changes a key, with
``epoch`` set by the partition to the writing transaction's epoch.

Invariants:
- A key's entries are in epoch order and one per epoch (only the first write of an
  epoch is noted): transactions that conflict apply in serial order, so a key's writes
  come in epoch order.
- A snapshot at E is exact for E >= ``oldest`` (every entry of an epoch after ``oldest``
  is kept). ``retire(horizon)`` drops entries of epochs <= horizon (no snapshot at
  E >= horizon needs them: it needs the first entry after E) and raises ``oldest`` to
  the horizon; ``bytes`` (an estimate: 64 plus the written row's encoded size per
  entry) past ``limits.versions_bytes_max`` retires the oldest epochs early.
- Keys deleted since an epoch kept here are in ``gone`` (a snapshot scan finds them
  there; the ordered index has only the keys present now).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from executor.core.rows import _decoded
from txn_library import limits
from txn_library.errors import invariant

ENTRY_BYTES = 64  # a noted version's bookkeeping, besides its row (an estimate)


class Versions:
    __slots__ = ("epoch", "entries", "gone", "oldest", "bytes", "_noted")

    def __init__(self, oldest: int = 0) -> None:
        self.epoch = oldest  # the epoch of the writes being applied (set by the partition)
        self.entries: dict[str, dict[tuple, list[Any]]] = {}
        self.gone: dict[str, set[tuple]] = {}
        # the oldest epoch a snapshot may be taken at: versions of later epochs are kept
        self.oldest = oldest
        self.bytes = 0
        # per epoch noted, in order: (epoch, [(table, key, bytes), ...])
        self._noted: deque[tuple[int, list[tuple[str, tuple, int]]]] = deque()

    def note(self, table: str, key: tuple, before: Any, nbytes: int, deleted: bool) -> None:
        """``key`` of ``table`` is about to change in ``epoch``; ``before`` is its row
        now (a tuple, a pending row's bytes, or None). ``nbytes``: the new row's
        encoded size (the estimate of what a version costs)."""
        e = self.epoch
        d = self.entries.get(table)
        if d is None:
            d = self.entries[table] = {}
        entry = d.get(key)
        if entry is None:
            d[key] = [e, before]
        elif entry[-2] != e:
            entry.append(e)
            entry.append(before)
        else:
            if deleted:
                self._gone(table).add(key)
            elif before is None:
                g = self.gone.get(table)
                if g is not None:
                    g.discard(key)
            return
        cost = ENTRY_BYTES + nbytes
        self.bytes += cost
        noted = self._noted
        if not noted or noted[-1][0] != e:
            noted.append((e, []))
        noted[-1][1].append((table, key, cost))
        if deleted:
            self._gone(table).add(key)
        elif before is None:
            g = self.gone.get(table)
            if g is not None:
                g.discard(key)

    def _gone(self, table: str) -> set[tuple]:
        g = self.gone.get(table)
        if g is None:
            g = self.gone[table] = set()
        return g

    def retire(self, horizon: int) -> None:
        """Forget what no snapshot at an epoch >= ``horizon`` needs."""
        if horizon <= self.oldest:
            return
        noted, entries = self._noted, self.entries
        while noted and noted[0][0] <= horizon:
            e, keys = noted.popleft()
            for table, key, cost in keys:
                self.bytes -= cost
                entry = entries[table].get(key)
                if entry is None:
                    continue
                i = 0
                while i < len(entry) and entry[i] <= horizon:
                    i += 2
                if i:
                    del entry[:i]
                if not entry:
                    del entries[table][key]
                    g = self.gone.get(table)
                    if g is not None:
                        g.discard(key)
        self.oldest = horizon

    def bound(self, completed: int) -> None:
        """Keep ``limits.versions_epochs_max`` epochs before ``completed`` and at most
        ``limits.versions_bytes_max`` bytes (the oldest epochs go first)."""
        self.retire(completed - limits.versions_epochs_max)
        noted = self._noted
        while self.bytes > limits.versions_bytes_max and noted:
            self.retire(noted[0][0])

    def row_at(self, table: str, key: tuple, epoch: int, current: Any) -> tuple | None:
        """The row of ``key`` at the end of ``epoch`` (>= ``oldest``): ``current()`` if
        it was not written after ``epoch``."""
        d = self.entries.get(table)
        entry = d.get(key) if d is not None else None
        if entry is not None:
            for i in range(0, len(entry), 2):
                if entry[i] > epoch:
                    before = entry[i + 1]
                    if type(before) is bytes:
                        return _decoded(table, key, before)
                    return before  # type: ignore[no-any-return]
        return current(table, key)  # type: ignore[no-any-return]

    def keys_gone(self, table: str, prefix: tuple) -> list[tuple]:
        """Keys of ``table`` starting with ``prefix`` deleted since ``oldest``."""
        g = self.gone.get(table)
        if not g:
            return []
        n = len(prefix)
        return [k for k in g if k[:n] == prefix]

    def check(self) -> None:
        """The invariants (tests)."""
        for d in self.entries.values():
            for entry in d.values():
                es = entry[0::2]
                invariant(es == sorted(set(es)), f"versions out of order: {es}")
                invariant(not es or es[0] > self.oldest, "a retired version is kept")
