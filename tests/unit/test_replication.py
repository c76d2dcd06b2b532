"""The replicated ordering layer's logic over an in-memory store (sequencer.replication):
fencing by term, commit-before-publish, followers copying, takeover numbering, trim."""

from __future__ import annotations

from pathlib import Path

import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers kv.*)
from sequencer.log import CommandLog
from sequencer.replication import (
    CommitUnknown,
    Deposed,
    MemoryStore,
    ReplicatedLog,
    copy_committed,
    copy_from_peer,
    trim_point,
)
from sequencer.sequencer import Sequencer
from txn_library import limits
from txn_library.errors import ERR_NOT_LEADER, ERROR
from txn_library.wire import sequencer as wire


def leader(tmp: Path, name: str, store: MemoryStore) -> Sequencer:
    local = CommandLog(tmp / name, fsync=False)
    copy_committed(local, store, 10_000)
    term = store.claim_term()
    seq = Sequencer(ReplicatedLog(local, store, term), 1, 2, term=term, seed_source=lambda: 7)
    return seq


def put(seq: Sequencer, client: bytes, req: int, key: str) -> None:
    seq.on_calls(b"conn", client, ((req, "kv.put", (key, req)),))


def test_a_batch_is_committed_with_the_leader_term_before_tick_returns(tmp_path: Path) -> None:
    store = MemoryStore()
    seq = leader(tmp_path, "a", store)
    put(seq, b"c1", 1, "x")
    data = seq.tick(1_000)
    assert data is not None
    assert store.read(1) == data and seq.log.read(1) == data
    assert wire.decode_batch(data).term == seq.term == 1


def test_a_deposed_leader_cannot_commit_and_tells_its_clients_to_go_elsewhere(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    old = leader(tmp_path, "a", store)
    put(old, b"c1", 1, "x")
    assert old.tick(1_000) is not None
    new = leader(tmp_path, "b", store)  # claims term 2 after copying epoch 1
    put(old, b"c1", 2, "y")
    assert old.tick(1_010) is None  # fenced: nothing to publish
    assert old.deposed is not None and store.last_epoch() == 1
    replies = old.take_client_out()[b"conn"]
    assert (2, ERROR) == replies[-1][:2] and replies[-1][2][0] == ERR_NOT_LEADER
    assert old.log.last_epoch == 1  # never appended what was not committed
    put(old, b"c1", 3, "z")  # and it accepts nothing more
    assert old.take_client_out()[b"conn"][-1][2][0] == ERR_NOT_LEADER
    # the new leader continues the numbering and runs the resent call once
    assert new.epoch == 1 and new.next_txn_id == 1
    put(new, b"c1", 2, "y")
    data = new.tick(1_020)
    assert data is not None
    batch = wire.decode_batch(data)
    assert (batch.epoch, batch.prev_epoch, batch.term, batch.first_txn_id) == (2, 1, 2, 1)


def test_a_new_leader_rebuilds_exactly_once_from_the_log(tmp_path: Path) -> None:
    store = MemoryStore()
    old = leader(tmp_path, "a", store)
    put(old, b"c1", 1, "x")
    assert old.tick(1_000) is not None
    new = leader(tmp_path, "b", store)
    put(new, b"c1", 1, "x")  # the client resends its committed call, same ids
    assert not new.has_pending()  # remembered from the log: looked up, not run again
    assert new.stats.duplicate_calls == 1


def test_commit_outcome_unknown_steps_down_without_publishing(tmp_path: Path) -> None:
    store = MemoryStore()
    seq = leader(tmp_path, "a", store)
    put(seq, b"c1", 1, "x")
    store.available = False
    assert seq.tick(1_000) is None
    assert seq.deposed is not None and seq.log.last_epoch == 0


def test_batch_time_never_goes_back_across_leaders(tmp_path: Path) -> None:
    store = MemoryStore()
    old = leader(tmp_path, "a", store)
    put(old, b"c1", 1, "x")
    old.tick(5_000)
    new = leader(tmp_path, "b", store)
    put(new, b"c1", 2, "y")
    data = new.tick(4_000)  # this host's clock is behind
    assert data is not None and wire.decode_batch(data).timestamp_ms == 5_000


def test_a_follower_copies_committed_batches_and_fetches_trimmed_ones_from_a_peer(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    seq = leader(tmp_path, "a", store)
    for i in range(1, 8):
        put(seq, b"c1", i, f"k{i}")
        seq.tick(1_000 + i)
    follower = CommandLog(tmp_path / "f", fsync=False)
    progress = copy_committed(follower, store, 3)
    assert progress.copied == 3 and not progress.caught_up
    assert copy_committed(follower, store, 100).caught_up
    assert [d for _e, d in follower.read_range(1, 7)] == [store.read(e) for e in range(1, 8)]
    # a wiped follower after the tail was trimmed: the gap comes from a peer's log
    store.trim_through(5)
    wiped = CommandLog(tmp_path / "w", fsync=False)
    progress = copy_committed(wiped, store, 100)
    assert progress.gap == (1, 5) and progress.copied == 0
    assert copy_from_peer(wiped, [d for _e, d in follower.read_range(1, 5)]) == 5
    assert copy_committed(wiped, store, 100).caught_up
    assert wiped.last_epoch == 7


def test_a_peer_whose_log_was_pruned_seeds_a_log_that_starts_later(tmp_path: Path) -> None:
    store = MemoryStore()
    seq = leader(tmp_path, "a", store)
    for i in range(1, 5):
        put(seq, b"c1", i, f"k{i}")
        seq.tick(1_000 + i)
    wiped = CommandLog(tmp_path / "w", fsync=False)
    assert copy_from_peer(wiped, [store.read(e) for e in (3, 4)]) == 2  # type: ignore[misc]
    assert (wiped.first_epoch, wiped.last_epoch) == (3, 4)


def test_the_tail_is_trimmed_once_every_member_has_it_and_bounded_anyway() -> None:
    assert trim_point(100, {0: 100, 1: 90, 2: 95}, 3) == 90
    assert trim_point(100, {0: 100, 1: 90}, 3) == 0  # member 2 never reported
    last = limits.zk_tail_epochs_max + 500
    assert trim_point(last, {0: last}, 3) == 500  # a member far behind copies from peers


def test_the_store_fences_stale_terms_and_non_consecutive_epochs() -> None:
    store = MemoryStore()
    t1 = store.claim_term()
    store.commit(t1, 1, b"a")
    t2 = store.claim_term()
    with pytest.raises(Deposed):
        store.commit(t1, 2, b"b")
    with pytest.raises(Deposed):
        store.commit(t2, 3, b"b")
    store.commit(t2, 2, b"b")
    store.available = False
    with pytest.raises(CommitUnknown):
        store.commit(t2, 3, b"c")


def test_partitions_ignore_a_deposed_leaders_publications_but_not_the_log() -> None:
    """BatchFeed: a published batch or heartbeat of an older term is dropped; the same
    batch from the log service (committed history) is applied."""
    from executor.deterministic.delivery import BatchFeed
    from executor.deterministic.partition import Partition
    from sequencer.calls import make_batch

    part = Partition(0, 0, 1)
    feed = BatchFeed(part, 0.5)

    def batch(epoch: int, term: int) -> bytes:
        b = make_batch(epoch, epoch - 1, 1_000 + epoch, 7, [("kv.put", ("k", epoch))], 1)
        return wire.pack(b._replace(term=term, prev_digest=0))

    assert feed.heartbeat(0, term=2, leader=1)
    assert (feed.term, feed.leader) == (2, 1)
    assert not feed.heartbeat(5, term=1, leader=0)  # the old leader still talking
    assert (feed.leader, feed.known_last_epoch) == (1, 0)
    feed.offer(batch(1, 1), published=True)  # published by the deposed leader: ignored
    assert part.last_epoch == 0 and feed.stale_dropped == 2
    feed.log_reply([batch(1, 1)], 1)  # committed under term 1: history, applied
    assert part.last_epoch == 1
    feed.offer(batch(2, 2), published=True)
    assert part.last_epoch == 2
    # A new leader's first batch names it before any heartbeat does: a busy leader
    # publishes batches, not heartbeats, and results sent to the old one are lost.
    feed.offer(batch(3, 3), published=True, publisher=2)
    assert (feed.term, feed.leader, part.last_epoch) == (3, 2, 3)
    feed.offer(batch(4, 2), published=True, publisher=1)  # the deposed one: ignored
    assert (feed.term, feed.leader, part.last_epoch) == (3, 2, 3)
