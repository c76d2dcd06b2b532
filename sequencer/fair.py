"""Per-client FIFO queues served round robin: how the sequencer shares its work fairly.

Two places use it: the intake (calls decoded from client frames, waiting to be
validated) and the pending set (accepted calls waiting for a batch). Either way one
client's backlog can delay another client's calls by at most one ``quantum`` per
round, however much that client sends.

Invariants:
- Items of one key leave in the order they came (a client's calls keep their order).
- ``len(self)`` and ``bytes_of(key)`` / ``total_bytes`` always equal the sums over
  the queued items; a key with no items is not kept (memory is bounded by items).
- Service rotates: a key served in a round goes to the back, so the next round (or
  the next ``take``) starts with the key after it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from txn_library.errors import invariant

T = TypeVar("T")


class _Queue(Generic[T]):
    __slots__ = ("items", "sizes", "nbytes")

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self.sizes: deque[int] = deque()
        self.nbytes = 0


class FairQueues(Generic[T]):
    def __init__(self) -> None:
        self._queues: OrderedDict[Hashable, _Queue[T]] = OrderedDict()
        self._count = 0
        self.total_bytes = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def keys(self) -> int:
        return len(self._queues)

    def count_of(self, key: Hashable) -> int:
        q = self._queues.get(key)
        return 0 if q is None else len(q.items)

    def bytes_of(self, key: Hashable) -> int:
        q = self._queues.get(key)
        return 0 if q is None else q.nbytes

    def push(self, key: Hashable, item: T, nbytes: int) -> None:
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _Queue()
        q.items.append(item)
        q.sizes.append(nbytes)
        q.nbytes += nbytes
        self._count += 1
        self.total_bytes += nbytes

    def take(
        self,
        quantum: int,
        max_items: int,
        max_bytes: int | None = None,
        size: Callable[[T], int] | None = None,
    ) -> list[T]:
        """Up to ``max_items`` items (and ``max_bytes`` of ``size``), ``quantum`` per key
        per round. A key whose next item does not fit in the bytes left is passed over
        for the rest of this take (its order is kept: nothing behind it jumps ahead)."""
        out: list[T] = []
        queues = self._queues
        budget = max_bytes
        blocked: set[Hashable] = set()
        while len(out) < max_items and len(blocked) < len(queues):
            for key in list(queues):
                if key in blocked:
                    continue
                q = queues[key]
                taken = 0
                while q.items and taken < quantum and len(out) < max_items:
                    if budget is not None:
                        need = size(q.items[0]) if size is not None else q.sizes[0]
                        if need > budget:
                            blocked.add(key)
                            break
                        budget -= need
                    out.append(q.items.popleft())
                    n = q.sizes.popleft()
                    q.nbytes -= n
                    self.total_bytes -= n
                    taken += 1
                if q.items:
                    queues.move_to_end(key)
                else:
                    del queues[key]
                    blocked.discard(key)
                if len(out) >= max_items:
                    break
        self._count -= len(out)
        invariant(self._count >= 0 and self.total_bytes >= 0, "fair queue accounting")
        return out

    def drain_sized(self) -> list[tuple[Hashable, T, int]]:
        """Every item with its key and size, key by key in order (pushed back in that
        order, a key's items keep their order and the keys theirs)."""
        out = [
            (key, item, size)
            for key, q in self._queues.items()
            for item, size in zip(q.items, q.sizes, strict=True)
        ]
        self._queues.clear()
        self._count = 0
        self.total_bytes = 0
        return out

    def drain(self) -> list[T]:
        """Every item, key by key (for fail-stop: answer everything that waits)."""
        out = [item for q in self._queues.values() for item in q.items]
        self._queues.clear()
        self._count = 0
        self.total_bytes = 0
        return out
