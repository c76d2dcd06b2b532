"""Ordered lock manager: grants locks strictly in the global transaction order.

Each partition requests *all* local locks of a transaction before any lock of a later
transaction (the caller feeds transactions in sequence order). Each lock name has one
FIFO queue of requests; a request is granted when it reaches the head (exclusive) or
when everything ahead of it is shared (shared). A transaction is ready when all its
local locks are granted. Because the order of requests is the global order fixed by
the sequencer, there are no deadlocks and the execution is equivalent to that order.

Uncontended fast path (``bypass``): a transaction none of whose lock names is queued
(no earlier transaction holds or waits for any of them) conflicts with no unfinished
earlier transaction, so running it at once, before it is ever entered here, gives the
same serial order; its caller must run it to the end before the next request (a
partition runs single-partition bodies synchronously). Nothing is queued and nothing
is released for it. If it must keep its locks after all (a benchmark hold),
``request_free`` enters them, granted, before any later request.

Invariants (checked by ``check_invariants``; cheap ones on every release):
- request order in every queue is increasing in txn id (grants follow global order);
- granted requests form a prefix of the queue: either one exclusive request, or a
  run of shared requests;
- a transaction's waiting count equals its number of ungranted requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from txn_library.errors import invariant

SHARED = 0
EXCLUSIVE = 1


class _Queue:
    __slots__ = ("entries", "n_exclusive")

    def __init__(self, entries: list[list], n_exclusive: int) -> None:
        # entries: [txn_id, mode, granted], in txn order (a list: queues are short)
        self.entries = entries
        self.n_exclusive = n_exclusive


class LockManager:
    """Locks for one partition. Not thread-safe: one partition, one thread."""

    def __init__(self) -> None:
        self._queues: dict[Hashable, _Queue] = {}
        self._waiting: dict[int, int] = {}  # txn id -> locks not yet granted
        self._held: dict[int, list[Hashable]] = {}  # txn id -> lock names requested
        self._last_txn = -1
        # Contention counters (monotonic): requests not granted when made, and
        # transactions that had at least one such request.
        self.lock_waits = 0
        self.txn_waits = 0
        self.bypassed = 0  # transactions that took the uncontended fast path

    def __len__(self) -> int:
        """Transactions that hold or wait for locks here."""
        return len(self._held)

    def request(
        self, txn_id: int, shared: Iterable[Hashable], exclusive: Iterable[Hashable]
    ) -> bool:
        """Enqueue all locks of ``txn_id``; return True if it is ready at once.

        A name in both sets is taken exclusively. Must be called in txn id order.
        """
        invariant(txn_id > self._last_txn, f"lock requests out of order: {txn_id}")
        self._last_txn = txn_id
        excl = dict.fromkeys(exclusive)
        names = list(excl)
        names.extend(n for n in dict.fromkeys(shared) if n not in excl)
        waiting = 0
        queues = self._queues
        for name in names:
            q = queues.get(name)
            if name in excl:
                if q is None:  # the common case: nobody else wants this lock
                    queues[name] = _Queue([[txn_id, EXCLUSIVE, True]], 1)
                    continue
                q.entries.append([txn_id, EXCLUSIVE, False])
                q.n_exclusive += 1
                waiting += 1
            else:
                if q is None:
                    queues[name] = _Queue([[txn_id, SHARED, True]], 0)
                    continue
                granted = q.n_exclusive == 0
                q.entries.append([txn_id, SHARED, granted])
                if not granted:
                    waiting += 1
        self._held[txn_id] = names
        if waiting:
            self._waiting[txn_id] = waiting
            self.lock_waits += waiting
            self.txn_waits += 1
            return False
        return True

    def bypass(
        self, txn_id: int, shared: Iterable[Hashable], exclusive: Iterable[Hashable]
    ) -> bool:
        """True if no lock of ``txn_id`` is queued: the caller runs it now, entering
        nothing (see the module docstring). False: nothing happened, ``request`` it.
        Counts as a request for the txn id order."""
        invariant(txn_id > self._last_txn, f"lock requests out of order: {txn_id}")
        queues = self._queues
        for name in exclusive:
            if name in queues:
                return False
        for name in shared:
            if name in queues:
                return False
        self._last_txn = txn_id
        self.bypassed += 1
        return True

    def request_free(
        self, txn_id: int, shared: Iterable[Hashable], exclusive: Iterable[Hashable]
    ) -> None:
        """Enter the locks of the transaction just bypassed, all granted (it ran and
        keeps them); before any later request, so they are still free."""
        invariant(txn_id == self._last_txn, f"txn {txn_id} was not the last bypassed")
        self._last_txn = txn_id - 1
        ready = self.request(txn_id, shared, exclusive)
        invariant(ready, f"txn {txn_id}: a bypassed transaction's locks were taken")

    def release(self, txn_id: int) -> list[int]:
        """Release every lock of ``txn_id``; return txns that became ready, in order."""
        names = self._held.pop(txn_id)
        invariant(txn_id not in self._waiting, f"txn {txn_id} released before it was ready")
        ready: list[int] = []
        queues = self._queues
        waiting = self._waiting
        for name in names:
            q = queues[name]
            entries = q.entries
            # The released request is granted, so it sits in the granted prefix.
            if entries[0][0] == txn_id:
                entry = entries.pop(0)
            else:
                entry = next(e for e in entries if e[0] == txn_id)
                invariant(entry[2], f"txn {txn_id} released an ungranted lock on {name}")
                entries.remove(entry)
            if entry[1] == EXCLUSIVE:
                q.n_exclusive -= 1
            if not entries:
                del queues[name]
                continue
            head = entries[0]
            if head[2]:
                continue  # head already granted (shared prefix still running)
            if head[1] == EXCLUSIVE:
                head[2] = True
                self._grant(head[0], waiting, ready)
            else:
                for e in entries:
                    if e[1] == EXCLUSIVE:
                        break
                    if not e[2]:
                        e[2] = True
                        self._grant(e[0], waiting, ready)
        ready.sort()
        return ready

    @staticmethod
    def _grant(txn_id: int, waiting: dict[int, int], ready: list[int]) -> None:
        left = waiting[txn_id] - 1
        if left:
            waiting[txn_id] = left
        else:
            del waiting[txn_id]
            ready.append(txn_id)

    @property
    def blocked(self) -> int:
        """Transactions waiting for at least one lock right now."""
        return len(self._waiting)

    def is_ready(self, txn_id: int) -> bool:
        return txn_id in self._held and txn_id not in self._waiting

    def check_invariants(self) -> None:
        """Full check of every queue; O(locks). Used by tests and debug builds."""
        ungranted: dict[int, int] = {}
        for name, q in self._queues.items():
            ids = [e[0] for e in q.entries]
            invariant(ids == sorted(ids), f"queue {name} not in txn order: {ids}")
            invariant(len(set(ids)) == len(ids), f"queue {name} has duplicate txn: {ids}")
            invariant(
                q.n_exclusive == sum(1 for e in q.entries if e[1] == EXCLUSIVE),
                f"queue {name}: exclusive count drifted",
            )
            granted = [e for e in q.entries if e[2]]
            invariant(bool(granted), f"queue {name}: nobody holds the head")
            invariant(
                q.entries[0][2] and all(e[2] for e in list(q.entries)[: len(granted)]),
                f"queue {name}: granted requests are not a prefix",
            )
            if any(e[1] == EXCLUSIVE for e in granted):
                invariant(len(granted) == 1, f"queue {name}: exclusive grant shared")
            else:
                nxt = list(q.entries)[len(granted) :]
                invariant(
                    not nxt or nxt[0][1] == EXCLUSIVE,
                    f"queue {name}: a shared request waits behind shared holders",
                )
            for e in q.entries:
                if not e[2]:
                    ungranted[e[0]] = ungranted.get(e[0], 0) + 1
        invariant(ungranted == self._waiting, "waiting counts disagree with queues")
