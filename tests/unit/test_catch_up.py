"""A restarted partition catching up (executor.deterministic.delivery.BatchFeed): when it
counts as live, and how it paces batches while it is behind (issue 44: partitions under
streaming load were live again only once the load stopped)."""

from __future__ import annotations

import txn_library.workloads.builtin  # noqa: F401  (registers tables and procedures)
from executor.deterministic.delivery import BACKLOG_HOLD_MAX, BatchFeed
from executor.deterministic.partition import Partition
from sequencer.calls import make_batch
from txn_library import placement
from txn_library.wire import sequencer as wire
from txn_library.wire.sequencer import Batch

N = 2
START = 1_000


def _transfers(epochs: int) -> list[Batch]:
    """Epoch 1 opens accounts 0-7; each later epoch moves 1 from an account of partition
    0 to one of partition 1 (a multi-partition txn: each side waits for the other's
    read)."""
    at = [placement.partition_of("account", (k,), N) for k in range(8)]
    a, b = at.index(0), at.index(1)
    batches = [make_batch(1, 0, 1000, 7, [("bank.open", (0, 8, START))], N)]
    for e in range(2, epochs + 1):
        batches.append(make_batch(e, 10 * e, 1000 + e, e, [("bank.transfer", (a, b, 1))], N))
    return batches


def _exchange(p0: Partition, p1: Partition) -> None:
    """Move the reads each partition queues for the other until none are left."""
    moved = True
    while moved:
        moved = False
        for src, dst in ((p0, p1), (p1, p0)):
            for q, entries in src.take_peer_out().items():
                assert q == dst.partition
                dst.on_reads(src.partition, tuple(entries))
                moved = True


def test_a_partition_is_live_once_the_history_it_replayed_has_run_though_new_txns_wait() -> None:
    """Live: the log's end heard, every epoch known applied, and every transaction of
    the epochs applied when it first got there finished. A transaction of a later epoch
    waiting for its peer (live traffic: under load there always is one) does not keep
    it from being live; one of the replayed history does."""
    batches = _transfers(5)
    p0, p1 = Partition(0, 0, N), Partition(0, 1, N)
    for x in batches[:4]:
        p1.on_batch(x)
    feed = BatchFeed(p0, 0.5)
    assert not feed.caught_up()  # nothing heard yet
    feed.log_reply([wire.pack(x) for x in batches[:4]], 4)
    assert p0.last_epoch == 4 and feed.behind() == 0
    assert not feed.caught_up()  # epochs 2-4's transfers wait for partition 1's reads
    _exchange(p0, p1)
    assert p0.idle() and feed.caught_up()
    feed.offer(wire.pack(batches[4]), published=True)  # live traffic
    assert p0.last_epoch == 5 and not p0.idle()
    assert feed.caught_up()  # epoch 5's transfer waits: still live


def test_a_partition_with_a_backlog_runs_ahead_though_its_cores_are_contended() -> None:
    """While cores are contended a partition holds its next batch for peers' reads;
    with more than BACKLOG_HOLD_MAX batches waiting it runs them all instead (a
    partition catching up would wait a round trip to its peer for every batch)."""
    batches = _transfers(3 + BACKLOG_HOLD_MAX + 1)
    p0, p1 = Partition(0, 0, N), Partition(0, 1, N)
    for p in (p0, p1):
        p.on_batch(batches[0])
    _exchange(p0, p1)
    feed = BatchFeed(p0, 0.5, peer_hold_max=0.1, peer_hold_retry=1.0)
    feed.pace(0.0, contended=True)
    feed.offer(wire.pack(batches[1]))  # its transfer waits for partition 1
    feed.offer(wire.pack(batches[2]))
    assert p0.last_epoch == 2 and feed.held_for_peers()
    assert not feed.pace(0.01, contended=True) and feed.hold_for_peers  # one waiting: held
    for x in batches[3:]:
        feed.offer(wire.pack(x))
    assert feed.behind() > BACKLOG_HOLD_MAX and p0.last_epoch == 2
    assert not feed.pace(0.02, contended=True)  # not a hold that ran out
    assert not feed.hold_for_peers and p0.last_epoch == len(batches)
