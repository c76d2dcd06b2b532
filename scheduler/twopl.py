"""Lock table for strict two-phase locking with wait-die deadlock prevention.

Used by the traditional (baseline) mode: a transaction asks for a lock at the moment
its procedure touches a record, holds every lock until it commits or aborts (strict
2PL), and a request that cannot be granted either WAITs or DIEs under wait-die.

Priorities. Every owner carries a priority fixed when its transaction first started
(a tuple that sorts by start time; smaller is older). A transaction restarted after a
die keeps its priority, so it only gets older relative to newcomers and cannot starve.

Queue discipline (per lock name). ``holders`` maps owner -> mode. ``waiters`` is one
list: upgrade requests (an owner that holds SHARED and wants EXCLUSIVE) first, in
arrival order, then ordinary requests in arrival order. A waiter is granted when it is
compatible with every holder and with every waiter ahead of it; the grant pass scans
the whole list, so a request that conflicts with nobody ahead of it is not held back.

Wait-die, generalised to every edge of the waits-for graph. A request by T *waits
for* the holders whose mode conflicts with it and for the waiters ahead of it whose
mode conflicts with it. T may wait only if it is older than every one of them;
otherwise it DIEs (nothing changes in the table; the caller aborts T and releases its
locks). Inserting an upgrade at the front of the queue adds edges from the waiters
behind it, so those are re-checked and any that are now younger than something they
wait for are killed (reported in ``take_events``). Grants never add an edge that was
not already there, so no other re-check is needed.

Invariants (checked by ``check_invariants``; an InvariantViolation is a bug):
- every waits-for edge points from an older owner to a younger one, so the graph is
  acyclic: no deadlock, locally or across partitions (priorities are global);
- holders of one name are either a single EXCLUSIVE owner or only SHARED owners;
- an owner waits on at most one name (per lock table), and never waits for a mode it
  already holds;
- ``_held`` and ``_waiting`` agree with the per-name holders and waiters.

Events. ``acquire`` and ``release_all`` never call back; grants of waiters and kills
of waiters accumulate in an event list that the caller drains with ``take_events``
(in the order they happened). This keeps the table usable from inside a transaction
body's greenlet without re-entering the caller.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from txn_library.errors import invariant

SHARED = 0
EXCLUSIVE = 1

GRANTED = "granted"
WAIT = "wait"
DIE = "die"

EV_GRANTED = "granted"  # (EV_GRANTED, owner, name, mode): a waiter now holds the lock
EV_KILLED = "killed"  # (EV_KILLED, owner, name, mode): a waiter must die (wait-die re-check)

Owner = Hashable
Priority = Any  # totally ordered (tuples); smaller = older


def conflicts(a: int, b: int) -> bool:
    return a == EXCLUSIVE or b == EXCLUSIVE


class _Request:
    __slots__ = ("owner", "prio", "mode", "upgrade")

    def __init__(self, owner: Owner, prio: Priority, mode: int, upgrade: bool) -> None:
        self.owner = owner
        self.prio = prio
        self.mode = mode
        self.upgrade = upgrade


class _Lock:
    __slots__ = ("holders", "waiters")

    def __init__(self) -> None:
        self.holders: dict[Owner, int] = {}
        self.waiters: list[_Request] = []


class LockTable:
    """Locks of one partition. Not thread-safe: one partition, one thread."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, _Lock] = {}
        self._prio: dict[Owner, Priority] = {}
        self._held: dict[Owner, dict[Hashable, int]] = {}
        self._waiting: dict[Owner, Hashable] = {}
        self._events: list[tuple[str, Owner, Hashable, int]] = []
        self.deaths = 0  # requests answered DIE plus waiters killed
        self.waits = 0  # requests answered WAIT (queued)

    # Queries ------------------------------------------------------------------
    def __len__(self) -> int:
        """Owners that hold or wait for a lock here."""
        return len(self._prio)

    def mode_held(self, owner: Owner, name: Hashable) -> int | None:
        held = self._held.get(owner)
        return None if held is None else held.get(name)

    def held_by(self, owner: Owner) -> dict[Hashable, int]:
        return dict(self._held.get(owner, {}))

    @property
    def blocked(self) -> int:
        """Owners waiting for a lock right now."""
        return len(self._waiting)

    def waiting_on(self, owner: Owner) -> Hashable | None:
        return self._waiting.get(owner)

    def lock_count(self) -> int:
        return len(self._locks)

    def take_events(self) -> list[tuple[str, Owner, Hashable, int]]:
        ev, self._events = self._events, []
        return ev

    def has_events(self) -> bool:
        return bool(self._events)

    # Acquire ------------------------------------------------------------------
    def acquire(self, owner: Owner, prio: Priority, name: Hashable, mode: int) -> str:
        """Ask for ``name`` in ``mode``: GRANTED, WAIT (queued) or DIE (no change)."""
        known = self._prio.get(owner)
        invariant(known is None or known == prio, f"owner {owner!r} changed priority")
        invariant(owner not in self._waiting, f"owner {owner!r} already waits on a lock")
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = _Lock()
        have = lock.holders.get(owner)
        if have is not None and have >= mode:
            return GRANTED
        upgrade = have is not None
        pos = self._insert_position(lock, upgrade)
        verdict = self._may_wait(owner, prio, mode, lock, lock.waiters[:pos])
        if verdict is None:
            self._hold(owner, prio, lock, name, mode)
            if upgrade and lock.waiters:
                self._recheck(lock, name, 0)  # the stronger mode is a new edge for waiters
            return GRANTED
        if not verdict:
            self.deaths += 1
            return DIE
        self.waits += 1
        self._prio[owner] = prio
        self._held.setdefault(owner, {})
        lock.waiters.insert(pos, _Request(owner, prio, mode, upgrade))
        self._waiting[owner] = name
        if pos < len(lock.waiters) - 1:
            self._recheck(lock, name, pos + 1)
        return WAIT

    @staticmethod
    def _insert_position(lock: _Lock, upgrade: bool) -> int:
        if not upgrade:
            return len(lock.waiters)
        pos = 0
        for w in lock.waiters:
            if not w.upgrade:
                break
            pos += 1
        return pos

    def _may_wait(
        self, owner: Owner, prio: Priority, mode: int, lock: _Lock, ahead: list[_Request]
    ) -> bool | None:
        """None if nothing blocks the request; else whether it is older than all blockers.

        Blockers: holders with a conflicting mode, and waiters ahead with one.
        """
        blocked = False
        prios = self._prio
        for h, hmode in lock.holders.items():
            if h != owner and conflicts(hmode, mode):
                if not prio < prios[h]:
                    return False
                blocked = True
        for w in ahead:
            if w.owner != owner and conflicts(w.mode, mode):
                if not prio < w.prio:
                    return False
                blocked = True
        return True if blocked else None

    def _hold(self, owner: Owner, prio: Priority, lock: _Lock, name: Hashable, mode: int) -> None:
        lock.holders[owner] = mode
        self._prio[owner] = prio
        self._held.setdefault(owner, {})[name] = mode

    def _recheck(self, lock: _Lock, name: Hashable, start: int) -> None:
        """Kill waiters from ``start`` on that now wait for someone older than they are."""
        i = start
        while i < len(lock.waiters):
            w = lock.waiters[i]
            ok = self._may_wait(w.owner, w.prio, w.mode, lock, lock.waiters[:i])
            if ok is False:
                del lock.waiters[i]
                del self._waiting[w.owner]
                self.deaths += 1
                self._events.append((EV_KILLED, w.owner, name, w.mode))
                self._forget_if_idle(w.owner)
                continue
            i += 1
        self._grant_pass(lock, name)

    # Release ------------------------------------------------------------------
    def release_all(self, owner: Owner) -> None:
        """Drop every lock ``owner`` holds and its waiting request, if any.

        Waiters that become grantable are granted (EV_GRANTED events, in order).
        """
        name = self._waiting.pop(owner, None)
        if name is not None:
            lock = self._locks[name]
            lock.waiters = [w for w in lock.waiters if w.owner != owner]
            self._grant_pass(lock, name)
            self._drop_if_empty(name, lock)
        for name in self._held.pop(owner, {}):
            lock = self._locks[name]
            del lock.holders[owner]
            self._grant_pass(lock, name)
            self._drop_if_empty(name, lock)
        self._prio.pop(owner, None)

    def _grant_pass(self, lock: _Lock, name: Hashable) -> None:
        waiters = lock.waiters
        if not waiters:
            return
        i = 0
        while i < len(waiters):
            w = waiters[i]
            blocked = any(
                h != w.owner and conflicts(m, w.mode) for h, m in lock.holders.items()
            ) or any(conflicts(a.mode, w.mode) for a in waiters[:i])
            if blocked:
                i += 1
                continue
            del waiters[i]
            del self._waiting[w.owner]
            self._hold(w.owner, w.prio, lock, name, w.mode)
            self._events.append((EV_GRANTED, w.owner, name, w.mode))

    def _drop_if_empty(self, name: Hashable, lock: _Lock) -> None:
        if not lock.holders and not lock.waiters:
            del self._locks[name]

    def _forget_if_idle(self, owner: Owner) -> None:
        if not self._held.get(owner) and owner not in self._waiting:
            self._held.pop(owner, None)
            self._prio.pop(owner, None)

    # Invariants ---------------------------------------------------------------
    def check_invariants(self) -> None:
        """Full check; O(locks x queue^2). Used by tests and debug builds."""
        held: dict[Owner, dict[Hashable, int]] = {}
        waiting: dict[Owner, Hashable] = {}
        for name, lock in self._locks.items():
            invariant(bool(lock.holders or lock.waiters), f"lock {name!r} is empty but kept")
            modes = list(lock.holders.values())
            invariant(
                EXCLUSIVE not in modes or len(modes) == 1,
                f"lock {name!r}: exclusive holder shares with {lock.holders}",
            )
            for h, m in lock.holders.items():
                held.setdefault(h, {})[name] = m
            seen_plain = False
            for i, w in enumerate(lock.waiters):
                invariant(w.owner not in waiting, f"{w.owner!r} waits on two locks")
                waiting[w.owner] = name
                have = lock.holders.get(w.owner)
                invariant(w.upgrade == (have is not None), f"{w.owner!r}: upgrade flag wrong")
                invariant(have is None or have < w.mode, f"{w.owner!r} waits for a held mode")
                invariant(not (w.upgrade and seen_plain), f"lock {name!r}: upgrade behind plain")
                seen_plain = seen_plain or not w.upgrade
                ok = self._may_wait(w.owner, w.prio, w.mode, lock, lock.waiters[:i])
                invariant(ok is True, f"lock {name!r}: {w.owner!r} waits for a younger-than-it")
                invariant(self._prio.get(w.owner) == w.prio, f"{w.owner!r}: priority drifted")
        invariant(waiting == self._waiting, "waiting map disagrees with the queues")
        for owner, names in self._held.items():
            invariant(held.get(owner, {}) == names, f"held map of {owner!r} disagrees")
        for owner in held:
            invariant(owner in self._held, f"{owner!r} holds locks it does not know of")
        invariant(
            set(self._prio) == set(self._held) | set(self._waiting),
            "priority map disagrees with owners",
        )
