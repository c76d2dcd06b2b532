"""Strict-2PL lock table with wait-die: unit cases and a randomized property test.

Priorities are plain ints here (smaller = older). The properties: invariants hold after
every operation (every waits-for edge points from older to younger, so no cycle), the
oldest live owner is never told to die, and releasing everything empties the table.
"""

from __future__ import annotations

import random

import pytest

from scheduler.twopl import DIE, EV_GRANTED, EXCLUSIVE, GRANTED, SHARED, WAIT, LockTable
from txn_library.errors import InvariantViolation

S, X = SHARED, EXCLUSIVE


def granted(lt: LockTable) -> list[tuple[str, str]]:
    return [(owner, name) for kind, owner, name, _m in lt.take_events() if kind == EV_GRANTED]


def test_shared_locks_are_shared_and_exclusive_excludes() -> None:
    lt = LockTable()
    assert lt.acquire("a", 1, "k", S) == GRANTED
    assert lt.acquire("b", 2, "k", S) == GRANTED
    assert lt.acquire("c", 3, "k", X) == DIE  # younger than the holders
    assert lt.acquire("o", 0, "k", X) == WAIT  # older than both holders
    lt.check_invariants()
    lt.release_all("a")
    assert granted(lt) == []
    lt.release_all("b")
    assert granted(lt) == [("o", "k")]
    assert lt.mode_held("o", "k") == X
    lt.check_invariants()


def test_wait_die_older_waits_younger_dies() -> None:
    lt = LockTable()
    assert lt.acquire("mid", 5, "k", X) == GRANTED
    assert lt.acquire("young", 9, "k", S) == DIE
    assert lt.acquire("old", 1, "k", S) == WAIT
    assert lt.waiting_on("old") == "k"
    assert lt.deaths == 1
    # A DIE changes nothing: the young owner is not in the table at all.
    assert lt.held_by("young") == {}
    assert len(lt) == 2
    lt.check_invariants()


def test_reacquiring_a_held_mode_is_free() -> None:
    lt = LockTable()
    assert lt.acquire("a", 1, "k", X) == GRANTED
    assert lt.acquire("a", 1, "k", S) == GRANTED
    assert lt.acquire("a", 1, "k", X) == GRANTED
    assert lt.mode_held("a", "k") == X


def test_sole_reader_upgrades_at_once() -> None:
    lt = LockTable()
    assert lt.acquire("a", 1, "k", S) == GRANTED
    assert lt.acquire("a", 1, "k", X) == GRANTED
    assert lt.mode_held("a", "k") == X
    lt.check_invariants()


def test_upgrade_deadlock_younger_upgrader_dies() -> None:
    """Two readers both want to write: the classic upgrade deadlock."""
    lt = LockTable()
    assert lt.acquire("old", 1, "k", S) == GRANTED
    assert lt.acquire("young", 2, "k", S) == GRANTED
    assert lt.acquire("old", 1, "k", X) == WAIT  # waits for the younger reader
    assert lt.acquire("young", 2, "k", X) == DIE  # would wait for the older one
    lt.check_invariants()
    lt.release_all("young")  # the caller aborts the dead txn
    assert granted(lt) == [("old", "k")]
    assert lt.mode_held("old", "k") == X
    lt.check_invariants()


def test_upgrade_goes_ahead_of_plain_waiters() -> None:
    lt = LockTable()
    assert lt.acquire("r1", 2, "k", S) == GRANTED
    assert lt.acquire("r2", 3, "k", S) == GRANTED
    assert lt.acquire("w", 1, "k", X) == WAIT  # plain waiter, oldest
    assert lt.acquire("r1", 2, "k", X) == WAIT  # upgrade: queued ahead of w
    lt.check_invariants()
    lt.release_all("r2")
    assert granted(lt) == [("r1", "k")]  # the upgrade, not the older plain waiter
    lt.release_all("r1")
    assert granted(lt) == [("w", "k")]
    lt.check_invariants()


def test_reader_does_not_overtake_an_older_waiting_writer() -> None:
    lt = LockTable()
    assert lt.acquire("h", 5, "k", S) == GRANTED
    assert lt.acquire("w", 2, "k", X) == WAIT
    # Compatible with the holder, but it would wait behind w, which is older: dies.
    assert lt.acquire("r", 3, "k", S) == DIE
    # An even older reader queues behind the writer (an old-to-young edge).
    assert lt.acquire("r0", 1, "k", S) == WAIT
    lt.check_invariants()
    lt.release_all("h")
    assert granted(lt) == [("w", "k")]
    lt.release_all("w")
    assert granted(lt) == [("r0", "k")]


def test_release_grants_in_queue_order_and_shares_readers() -> None:
    lt = LockTable()
    assert lt.acquire("holder", 10, "k", X) == GRANTED
    assert lt.acquire("w1", 5, "k", S) == WAIT
    assert lt.acquire("w2", 4, "k", S) == WAIT
    assert lt.acquire("w3", 3, "k", X) == WAIT
    assert lt.acquire("w4", 1, "k", S) == WAIT
    lt.release_all("holder")
    assert granted(lt) == [("w1", "k"), ("w2", "k")]  # readers together, then stop at w3
    lt.release_all("w1")
    assert granted(lt) == []
    lt.release_all("w2")
    assert granted(lt) == [("w3", "k")]
    lt.release_all("w3")
    assert granted(lt) == [("w4", "k")]
    lt.release_all("w4")
    assert len(lt) == 0 and lt.lock_count() == 0
    lt.check_invariants()


def test_cancelled_waiter_unblocks_those_behind_it() -> None:
    lt = LockTable()
    assert lt.acquire("h", 9, "k", S) == GRANTED
    assert lt.acquire("w", 5, "k", X) == WAIT
    assert lt.acquire("r", 1, "k", S) == WAIT  # behind the writer
    lt.release_all("w")  # w aborted elsewhere while waiting
    assert granted(lt) == [("r", "k")]
    lt.check_invariants()


def test_one_wait_at_a_time_and_fixed_priority() -> None:
    lt = LockTable()
    assert lt.acquire("h", 9, "a", X) == GRANTED
    assert lt.acquire("h", 9, "b", X) == GRANTED
    assert lt.acquire("o", 1, "a", X) == WAIT
    with pytest.raises(InvariantViolation):
        lt.acquire("o", 1, "b", X)
    with pytest.raises(InvariantViolation):
        lt.acquire("h", 8, "c", X)


def test_cross_lock_deadlock_is_prevented() -> None:
    """T1 holds a, T2 holds b; each asks for the other's lock: exactly one waits."""
    lt = LockTable()
    assert lt.acquire("t1", 1, "a", X) == GRANTED
    assert lt.acquire("t2", 2, "b", X) == GRANTED
    assert lt.acquire("t1", 1, "b", X) == WAIT
    assert lt.acquire("t2", 2, "a", X) == DIE
    lt.release_all("t2")
    assert granted(lt) == [("t1", "b")]
    lt.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_invariants_and_oldest_never_dies(seed: int) -> None:
    rng = random.Random(seed)
    lt = LockTable()
    names = ["a", "b", "c", "d"]
    live: dict[int, int] = {}  # owner -> priority
    blocked: set[int] = set()
    next_owner = 0
    for _ in range(3000):
        for kind, owner, _n, _m in lt.take_events():
            assert kind == EV_GRANTED, "the re-check never needs to kill a waiter here"
            blocked.discard(owner)
        if live and rng.random() < 0.3:
            victim = rng.choice(sorted(live))
            lt.release_all(victim)
            del live[victim]
            blocked.discard(victim)
        else:
            runnable = [o for o in sorted(live) if o not in blocked]
            if not runnable or rng.random() < 0.2:
                next_owner += 1
                owner, prio = next_owner, rng.randrange(1_000_000)
                live[owner] = prio
                runnable = [owner]
            owner = rng.choice(runnable)
            mode = X if rng.random() < 0.4 else S
            d = lt.acquire(owner, live[owner], rng.choice(names), mode)
            oldest = min(live, key=lambda o: live[o])
            if owner == oldest:
                assert d != DIE, "the oldest transaction must never die"
            if d == DIE:
                lt.release_all(owner)  # the caller aborts it
                del live[owner]
            elif d == WAIT:
                blocked.add(owner)
        lt.check_invariants()
    for owner in list(live):
        lt.release_all(owner)
    lt.take_events()
    lt.check_invariants()
    assert len(lt) == 0 and lt.lock_count() == 0
