"""Recent versions of a partition's rows, for queries that read a past epoch without
locks (TSpoon's queryable state; docs/QUERIES.md).

The Storage holds the current state; ``Versions`` keeps, per epoch written in the last
epochs, an undo map: ``by_epoch[e][(table, key)]`` is the row (a tuple; the bytes of a
row loaded but never decoded; None: no row) that key held just before epoch ``e``'s
first write of it. The row at the end of epoch E is then the undo entry of the first
epoch after E that wrote the key, or the current row if none did. ``Storage.apply``
calls ``note`` before it changes a key, with ``epoch`` set by the partition to the
writing transaction's epoch.

Why one map per epoch rather than a version chain per key: a write costs one probe of
a small map that stays in cache, and retiring an epoch drops its whole map at once (a
chain per key made every write probe, and every retirement edit, a map of every key
written in the retention window: that cost New Order about a third of its
throughput). Reads pay instead: a key read at E probes the maps of the epochs after E
(a snapshot at a completed epoch is a few epochs old, so a few probes); a query that
reads many keys merges those maps once (``undo_after``) and probes the merge.

Invariants:
- One entry per key and epoch, the row before the epoch's first write of the key:
  transactions that conflict apply in serial order, so a key's writes come in epoch
  order and the first write of an epoch sees the row at the end of the epochs before.
- A snapshot at E is exact for E >= ``oldest`` (the map of every epoch after ``oldest``
  is kept). ``retire(horizon)`` drops the maps of epochs <= horizon (no snapshot at
  E >= horizon needs them) and raises ``oldest`` to the horizon; ``bytes`` (an
  estimate: 64 plus the written row's encoded size per entry) past
  ``limits.versions_bytes_max`` retires the oldest epochs early (``bound``).
- ``bytes`` is the sum of the kept epochs' bytes.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from executor.core.rows import _decoded
from txn_library import limits
from txn_library.errors import invariant

ENTRY_BYTES = 64  # a noted version's bookkeeping, besides its row (an estimate)


class Versions:
    __slots__ = ("epoch", "oldest", "bytes", "by_epoch", "_bytes", "_open", "_cur", "_sorted")

    def __init__(self, oldest: int = 0) -> None:
        self.epoch = oldest  # the epoch of the writes being applied (set by the partition)
        # the oldest epoch a snapshot may be taken at: the maps of later epochs are kept
        self.oldest = oldest
        self.bytes = 0
        # epoch -> {(table, key): the row before the epoch's first write of it}
        self.by_epoch: dict[int, dict[tuple, Any]] = {}
        self._bytes: dict[int, int] = {}  # epoch -> its entries' bytes
        self._open = -1  # the epoch ``_cur`` is the map of (-1: none)
        self._cur: dict[tuple, Any] = {}
        self._sorted: list[int] | None = None  # the kept epochs in order (None: stale)

    def _switch(self, e: int) -> dict[tuple, Any]:
        cur = self.by_epoch.get(e)
        if cur is None:
            cur = self.by_epoch[e] = {}
            self._bytes[e] = 0
            self._sorted = None
        self._open, self._cur = e, cur
        return cur

    def note(self, table: str, key: tuple, before: Any, nbytes: int) -> None:
        """``key`` of ``table`` is about to change in ``epoch``; ``before`` is its row
        now (a tuple, a pending row's bytes, or None). ``nbytes``: the new row's
        encoded size (the estimate of what a version costs)."""
        e = self.epoch
        cur = self._cur if e == self._open else self._switch(e)
        k = (table, key)
        if k in cur:
            return
        cur[k] = before
        cost = ENTRY_BYTES + nbytes
        self._bytes[e] += cost
        self.bytes += cost

    def retire(self, horizon: int) -> None:
        """Forget what no snapshot at an epoch >= ``horizon`` needs (the maps of epochs
        <= horizon: a snapshot at E reads the first map after E)."""
        if horizon <= self.oldest:
            return
        by_epoch, sizes = self.by_epoch, self._bytes
        for e in [e for e in by_epoch if e <= horizon]:
            del by_epoch[e]
            self.bytes -= sizes.pop(e)
            self._sorted = None
            if e == self._open:
                self._open, self._cur = -1, {}
        self.oldest = horizon

    def bound(self, completed: int) -> None:
        """Keep ``limits.versions_epochs_max`` epochs before ``completed`` and at most
        ``limits.versions_bytes_max`` bytes (the oldest epochs go first)."""
        self.retire(completed - limits.versions_epochs_max)
        while self.bytes > limits.versions_bytes_max and self.by_epoch:
            self.retire(self._epochs()[0])

    def _epochs(self) -> list[int]:
        order = self._sorted
        if order is None:
            order = self._sorted = sorted(self.by_epoch)
        return order

    def after(self, epoch: int) -> list[dict[tuple, Any]]:
        """The maps of the epochs after ``epoch``, oldest first."""
        order = self._epochs()
        by_epoch = self.by_epoch
        return [by_epoch[e] for e in order[bisect_right(order, epoch) :]]

    def row_at(self, table: str, key: tuple, epoch: int, current: Any) -> tuple | None:
        """The row of ``key`` at the end of ``epoch`` (>= ``oldest``): ``current()`` if
        it was not written after ``epoch``."""
        k = (table, key)
        for undo in self.after(epoch):
            if k in undo:
                return self.row_in(undo, table, key, current)
        return current(table, key)  # type: ignore[no-any-return]

    def undo_after(self, epoch: int) -> dict[tuple, Any]:
        """One map for many reads at ``epoch``: each key written after it, to the row it
        held at the end of ``epoch`` (``row_in``). Costs the entries after ``epoch``
        once; a read then costs one probe, however many epochs follow."""
        merged: dict[tuple, Any] = {}
        maps = self.after(epoch)
        i = len(maps) - 1
        while i >= 0:  # the newest first: older ones win (mypyc: no reversed() here)
            merged.update(maps[i])
            i -= 1
        return merged

    @staticmethod
    def row_in(undo: dict[tuple, Any], table: str, key: tuple, current: Any) -> tuple | None:
        """The row of ``key`` in ``undo`` (from ``undo_after``), else ``current()``'s."""
        k = (table, key)
        if k in undo:
            before = undo[k]
            if type(before) is bytes:
                return _decoded(table, key, before)
            return before  # type: ignore[no-any-return]
        return current(table, key)  # type: ignore[no-any-return]

    def check(self) -> None:
        """The invariants (tests)."""
        invariant(all(e > self.oldest for e in self.by_epoch), "a retired epoch is kept")
        invariant(self.bytes == sum(self._bytes.values()), "versions' bytes drifted")
        invariant(self._bytes.keys() == self.by_epoch.keys(), "epochs' bytes drifted")
