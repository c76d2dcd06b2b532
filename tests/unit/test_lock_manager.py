"""Ordered lock manager: unit cases and property tests against a serial reference.

The property: for random workloads of transactions with random read/write sets,
executing whatever becomes ready, in a random order among ready txns, through the
lock manager gives the same final state and the same per-txn observations as
running the transactions one by one in sequence order.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.lock_manager import LockManager


def test_exclusive_waits_for_earlier_exclusive() -> None:
    lm = LockManager()
    assert lm.request(1, [], ["a"])
    assert not lm.request(2, [], ["a"])
    assert lm.release(1) == [2]
    assert lm.release(2) == []
    lm.check_invariants()


def test_readers_share_then_writer_waits_for_all() -> None:
    lm = LockManager()
    assert lm.request(1, ["a"], [])
    assert lm.request(2, ["a"], [])
    assert not lm.request(3, [], ["a"])
    assert not lm.request(4, ["a"], [])  # behind a writer: FIFO, no overtaking
    lm.check_invariants()
    assert lm.release(2) == []
    assert lm.release(1) == [3]
    assert lm.release(3) == [4]
    lm.check_invariants()


def test_ready_only_when_all_locks_granted() -> None:
    lm = LockManager()
    assert lm.request(1, [], ["a"])
    assert lm.request(2, [], ["b"])
    assert not lm.request(3, ["a"], ["b"])
    assert lm.release(1) == []
    assert not lm.is_ready(3)
    assert lm.release(2) == [3]
    assert lm.is_ready(3)


def test_name_in_both_sets_is_exclusive() -> None:
    lm = LockManager()
    assert lm.request(1, ["a"], ["a"])
    assert not lm.request(2, ["a"], [])
    assert lm.release(1) == [2]


def test_bypass_only_when_no_lock_is_queued_and_request_free_enters_it_granted() -> None:
    lm = LockManager()
    assert lm.bypass(1, ["a"], ["b"])  # nothing queued: runs at once, nothing entered
    assert len(lm) == 0 and lm.bypassed == 1
    assert lm.request(2, ["a"], [])
    assert not lm.bypass(3, [], ["a"])  # "a" is held: it must queue
    assert not lm.request(3, [], ["a"])
    assert lm.bypass(4, ["c"], [])
    lm.request_free(4, ["c"], [])  # it keeps its locks after all (a hold)
    assert lm.is_ready(4) and not lm.request(5, [], ["c"])
    assert lm.release(4) == [5]
    lm.check_invariants()


def test_requests_out_of_order_are_refused() -> None:
    from txn_library.errors import InvariantViolation

    lm = LockManager()
    lm.request(5, [], ["a"])
    try:
        lm.request(4, [], ["b"])
    except InvariantViolation:
        return
    raise AssertionError("out-of-order request accepted")


txn_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(0, 7), max_size=4),  # reads
        st.lists(st.integers(0, 7), max_size=3),  # writes
    ),
    min_size=1,
    max_size=40,
)


def _effect(txn_id: int, seen: tuple) -> int:
    return hash((txn_id, seen)) & 0xFFFF  # ints only: stable within a process


@settings(max_examples=300, deadline=None)
@given(txns=txn_strategy, seed=st.integers(0, 2**32), fast=st.booleans())
def test_lock_manager_equals_serial_order(txns: list, seed: int, fast: bool) -> None:
    """With ``fast``, admission first tries the uncontended fast path (``bypass``): a
    transaction whose locks nobody holds or waits for runs at once, never entered."""
    # Serial reference.
    ref_state = dict.fromkeys(range(8), 0)
    ref_seen = {}
    for i, (reads, writes) in enumerate(txns):
        seen = tuple(ref_state[k] for k in sorted(set(reads) | set(writes)))
        ref_seen[i] = seen
        for k in writes:
            ref_state[k] = _effect(i, seen)
    # Lock manager with random execution order among ready txns.
    rng = random.Random(seed)
    lm = LockManager()
    state = dict.fromkeys(range(8), 0)
    seen_by = {}
    ready: list[int] = []
    pending = list(range(len(txns)))
    while pending or ready:
        # Interleave: admit some txns (in order), then run a random ready one.
        for _ in range(rng.randint(0, 3)):
            if pending:
                i = pending.pop(0)
                reads, writes = txns[i]
                shared, exclusive = [f"k{k}" for k in reads], [f"k{k}" for k in writes]
                if fast and lm.bypass(i, shared, exclusive):
                    seen = tuple(state[k] for k in sorted(set(reads) | set(writes)))
                    seen_by[i] = seen
                    for k in writes:
                        state[k] = _effect(i, seen)
                    continue
                if lm.request(i, shared, exclusive):
                    ready.append(i)
        lm.check_invariants()
        if not ready:
            continue
        i = ready.pop(rng.randrange(len(ready)))
        reads, writes = txns[i]
        seen = tuple(state[k] for k in sorted(set(reads) | set(writes)))
        seen_by[i] = seen
        for k in writes:
            state[k] = _effect(i, seen)
        ready.extend(lm.release(i))
        lm.check_invariants()
    assert seen_by == ref_seen
    assert state == ref_state
    assert len(lm) == 0
