"""The reader role in process (executor/reader/): fed a sequencer's batches out of order
and with gaps, it applies them in epoch order, its per-partition state hashes equal a
replica's (LocalReplica, the live Partition code) and its total the serial oracle's at
every epoch, its snapshot answers equal the oracle's state at the epoch they name, and
a replica hash that differs from its own is reported as a determinism violation. And
the client's query channel: readers first, then the replicas."""

from __future__ import annotations

import random
from concurrent.futures import Future
from pathlib import Path

import msgpack
import pytest
import zmq

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from executor.reader.follower import Follower
from executor.reader.queries import ReaderQueries
from sequencer.log import CommandLog
from sequencer.sequencer import Sequencer
from txn_library import limits
from txn_library.client.queries import READER, QueryChannel, QueryItem
from txn_library.errors import ERR_BAD_ARGUMENTS, ERR_NOT_READY, ERROR, OK, CallFailed
from txn_library.wire import sequencer as wire
from txn_library.workloads.bank import make_transfers

PARTITIONS = 2
ACCOUNTS = 60
START = 1_000


def history(tmp: Path, epochs: int, seed: int = 1) -> list[bytes]:
    """A sequencer's batches: the accounts opened, then transfers (most across
    partitions), a few calls per epoch; as published (bytes)."""
    seq = Sequencer(CommandLog(tmp / "log", fsync=False), 1, PARTITIONS, seed_source=lambda: 7)
    out = []
    seq.on_calls(b"c", b"client", ((0, "bank.open", (0, ACCOUNTS, START)),))
    transfers = make_transfers(epochs * 5, ACCOUNTS, PARTITIONS, 0.8, seed)
    now = 1_000
    req = 1
    for e in range(epochs):
        data = seq.tick(now)
        assert data is not None
        out.append(data)
        now += 10
        for src, dst, amount in transfers[e * 5 : e * 5 + 5]:
            seq.on_calls(b"c", b"client", ((req, "bank.transfer", (src, dst, amount)),))
            req += 1
    return out


def ask(q: ReaderQueries, proc: str, args: tuple, isolation: str = "snapshot", at: int = -1):
    frame = msgpack.packb([wire.REQ_QUERY, b"me", [[1, proc, list(args), isolation, at]]])
    q.on_client_frame(b"id", frame)
    return q.take_replies().get(b"id", [])


def test_the_reader_follows_out_of_order_batches_and_agrees_with_replica_and_oracle(
    tmp_path: Path,
) -> None:
    batches = history(tmp_path, 80)
    f = Follower(PARTITIONS)
    q = ReaderQueries(f, "reader 0", lambda: 0.0)
    replica = LocalReplica(PARTITIONS)
    oracle = SerialExecutor()
    balances_at: dict[int, dict[int, int]] = {}
    # Delivery shuffled within windows of 8, every 7th batch lost (fetched "from the
    # log" below, as the server repairs a gap).
    rng = random.Random(3)
    order = list(range(len(batches)))
    for i in range(0, len(order), 8):
        window = order[i : i + 8]
        rng.shuffle(window)
        order[i : i + 8] = window
    lost = set(range(6, len(batches), 7))
    for i in order:
        if i not in lost:
            f.offer(batches[i], published=True, publisher=0)
        f.apply_ready(1_000)
    assert f.applied_epoch < len(batches)  # stuck at the first lost epoch
    f.heartbeat(len(batches))
    while (wanted := f.repair(now=1.0e9, retry_s=0.0)) is not None:
        first, last = wanted
        f.log_reply(batches[first - 1 : last], len(batches))
        f.apply_ready(1_000)
    assert f.applied_epoch == len(batches) and f.live and not f.held
    for data in batches:
        b = wire.decode_batch(data)
        replica.apply(b)
        oracle.apply(b)
        rows = oracle.storage.whole_tables().get("account", {})
        balances_at[b.epoch] = {k[0]: r[0] for k, r in rows.items()}
        # The reader's hashes at every epoch: the replica's, partition by partition.
        assert f.hashes[b.epoch] == tuple(p.storage.state_hash for p in replica.parts)
        assert sum(f.hashes[b.epoch]) % (1 << 64) == oracle.state_hash
    assert f.state_hashes() == tuple(p.storage.state_hash for p in replica.parts)
    # Snapshots at every epoch kept: the oracle's state at that epoch.
    total = ACCOUNTS * START
    for e in range(max(2, f.versions_oldest), f.applied_epoch + 1):
        [(qid, status, packed, epoch)] = ask(q, "bank.total", (0, ACCOUNTS), at=e)
        assert (status, msgpack.unpackb(packed), epoch) == (OK, total, e)
        a = e % ACCOUNTS
        [(_, status, packed, epoch)] = ask(q, "bank.balance", (a,), at=e)
        assert (status, msgpack.unpackb(packed), epoch) == (OK, balances_at[e][a], e)
    # Unnamed: the applied epoch; read committed likewise.
    for isolation in ("snapshot", "read_committed"):
        [(_, status, packed, epoch)] = ask(q, "bank.total", (0, ACCOUNTS), isolation)
        assert (status, msgpack.unpackb(packed), epoch) == (OK, total, f.applied_epoch)


def test_retention_future_epochs_and_a_reader_still_catching_up(tmp_path: Path) -> None:
    batches = history(tmp_path, 60)  # a batch every 10 ms
    clock = [0.0]
    f = Follower(PARTITIONS, retention_s=0.2)  # 20 epochs' worth of batch time
    q = ReaderQueries(f, "reader 3", lambda: clock[0])
    for data in batches[:10]:
        f.offer(data, published=True)
    f.apply_ready(1_000)
    # Not caught up (no heartbeat yet): unnamed queries refused, applied epochs served.
    [(_, status, packed, _)] = ask(q, "bank.total", (0, ACCOUNTS))
    code, message = msgpack.unpackb(packed)
    assert status == ERROR and code == ERR_NOT_READY and "reader 3 is catching up" in message
    [(_, status, _, epoch)] = ask(q, "bank.total", (0, ACCOUNTS), at=5)
    assert (status, epoch) == (OK, 5)
    # Caught up with what the log said so far: live.
    n = len(batches) - 20
    for data in batches[10:n]:
        f.offer(data, published=True)
    f.heartbeat(n)
    f.apply_ready(10_000)
    assert f.live
    # A future epoch waits, then is answered once applied ...
    assert ask(q, "bank.total", (0, ACCOUNTS), at=n + 2) == []
    assert q.waiting == 1
    for data in batches[n:]:
        f.offer(data, published=True)
    f.apply_ready(5)
    q.tick()
    [(_, status, _, epoch)] = q.take_replies()[b"id"]
    assert (status, epoch) == (OK, n + 2)
    f.apply_ready(10_000)
    # ... one never applied is refused once its wait is over.
    far = f.applied_epoch + 100
    assert ask(q, "bank.total", (0, ACCOUNTS), at=far) == []
    clock[0] += limits.query_watermark_wait_s + 0.1
    q.tick()
    [(_, status, packed, _)] = q.take_replies()[b"id"]
    assert status == ERROR and msgpack.unpackb(packed)[0] == ERR_NOT_READY
    # Past the retention: refused, naming the oldest epoch served. Epoch X is served
    # while the batch after it is at most 0.2 s older than the newest: X + 1 >= E - 20.
    oldest = f.applied_epoch - 21
    assert f.versions_oldest == oldest
    [(_, status, _, epoch)] = ask(q, "bank.total", (0, ACCOUNTS), at=oldest)
    assert (status, epoch) == (OK, oldest)
    [(_, status, packed, _)] = ask(q, "bank.total", (0, ACCOUNTS), at=oldest - 1)
    code, message = msgpack.unpackb(packed)
    assert status == ERROR and code == ERR_BAD_ARGUMENTS
    assert f"still serves, {oldest}" in message and "0.2 s of batch time" in message
    # Writes are refused as queries.
    [(_, status, packed, _)] = ask(q, "bank.transfer", (1, 2, 3))
    assert status == ERROR and "not read-only" in msgpack.unpackb(packed)[1]


def test_a_replica_hash_that_differs_is_a_determinism_violation(tmp_path: Path) -> None:
    batches = history(tmp_path, 20)
    f = Follower(PARTITIONS)
    for data in batches:
        f.offer(data)
    f.apply_ready(100)
    replica = LocalReplica(PARTITIONS)
    replica.apply_all(wire.decode_batch(b) for b in batches)
    rows = [
        {
            "replica": 0,
            "partition": p.partition,
            "last_epoch": 20,
            "active": 0,
            "state_hash": f"{p.storage.state_hash:016x}",
            "boundary_epoch": 10,
            "boundary_hash": f"{f.hashes[10][p.partition]:016x}",
        }
        for p in replica.parts
    ]
    assert f.compare_status(rows) == [] and f.hashes_checked == 4
    rows[1]["state_hash"] = f"{(f.hashes[20][1] + 1) % (1 << 64):016x}"
    [v] = f.compare_status(rows)
    assert (v.replica, v.partition, v.epoch) == (0, 1, 20)
    assert "DETERMINISM VIOLATION" in str(v)
    assert f.compare_status(rows) == []  # reported once
    assert f.violations_count == 1


@pytest.mark.parametrize("published", [True, False])
def test_a_deposed_leaders_batches_are_ignored_but_the_log_is_history(
    tmp_path: Path, published: bool
) -> None:
    batches = history(tmp_path, 3)
    f = Follower(PARTITIONS)
    f.heartbeat(0, term=2, leader=1)
    f.offer(batches[0], published=published, publisher=0)  # term 0 < 2
    f.apply_ready(10)
    assert f.applied_epoch == (0 if published else 1)


# The client's query channel with readers ---------------------------------------------
def _channel(monkeypatch: pytest.MonkeyPatch, readers: int) -> QueryChannel:
    ch = QueryChannel(
        zmq.Context.instance(),
        [["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]],
        b"client",
        0.2,
        {},
        [f"tcp://127.0.0.1:{10 + i}" for i in range(readers)],
    )
    monkeypatch.setattr(ch, "_put", lambda item, poller: None)  # no socket is made
    return ch


def _item(qid: int, reader: int | None = None) -> QueryItem:
    return QueryItem(
        qid, Future(), "bank.total", (0, 10), "snapshot", -1, None, 0.0, 1e9, reader=reader
    )


def _reply(qid: int, status: int, value: object, epoch: int = 7) -> bytes:
    return msgpack.packb([wire.REP_QUERY, [[qid, status, value, epoch]]])


def test_the_channel_asks_readers_first_then_the_replicas_and_ignores_late_refusals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ch = _channel(monkeypatch, readers=2)
    poller = zmq.Poller()
    item = _item(1)
    ch.send(item, poller, 0.0)
    first = item.target
    assert first[0] == READER
    refusal = _reply(1, ERROR, [ERR_NOT_READY, "catching up"], -1)
    ch.on_frame(refusal, poller, first)
    second = item.target
    assert second[0] == READER and second != first  # the other reader
    ch.on_frame(refusal, poller, first)  # late, from the first reader: ignored
    assert item.target == second and not item.future.done()
    ch.on_frame(refusal, poller, second)
    assert item.target[0] == 0  # past the readers: the replica's partition
    ch.on_frame(_reply(1, OK, 42), poller, item.target)
    assert item.future.result(0).value == 42 and not ch.pending
    # Pinned to a reader: its refusal is the answer.
    pinned = _item(2, reader=1)
    ch.send(pinned, poller, 0.0)
    assert pinned.target == (READER, 1)
    ch.on_frame(_reply(2, ERROR, [ERR_NOT_READY, "catching up"], -1), poller, pinned.target)
    with pytest.raises(CallFailed):
        pinned.future.result(0)
    # Without readers: the replica, as before.
    plain = _item(3)
    no_readers = _channel(monkeypatch, readers=0)
    no_readers.send(plain, poller, 0.0)
    assert plain.target[0] == 0
    for ch_ in (ch, no_readers):
        ch_.close()


@pytest.mark.parametrize("weak", [False, True], ids=["strong", "weak"])
def test_the_reader_follows_dataflows_and_derives_weak_recoverys_steps(weak: bool) -> None:
    """Leaderboard pushes (S-Store's benchmark): with weak recovery only the pushes are
    logged and the reader derives the steps, as a partition does; its hashes equal the
    serial oracle's at every epoch, and strong and weak reach the same state."""
    from tests.unit.test_streams import _leaderboard_log, _votes

    log = _leaderboard_log("lb", PARTITIONS, _votes(5, 300), weak=weak)
    f = Follower(PARTITIONS)
    oracle = SerialExecutor()
    for b in log.batches:
        f.offer(msgpack.packb(b), published=True)
        f.apply_ready(1)
        oracle.apply(b)
        assert sum(f.hashes[b.epoch]) % (1 << 64) == oracle.state_hash
    assert f.applied_epoch == len(log.batches)
    strong = _leaderboard_log("lb", PARTITIONS, _votes(5, 300), weak=False)
    replica = LocalReplica(PARTITIONS)
    replica.apply_all(strong.batches)
    assert f.state_hashes() == tuple(p.storage.state_hash for p in replica.parts)


# Configuration ---------------------------------------------------------------------------
def test_readers_in_cluster_json_their_ports_and_older_files_without_them() -> None:
    import json

    from cluster.config import ClusterConfig
    from cluster.security import reader_role, role_names

    cfg = ClusterConfig(replicas=2, partitions=3, readers=2, zookeeper_servers=1, base_port=20_000)
    assert ClusterConfig.from_json(cfg.to_json()) == cfg
    ports = [a.rsplit(":", 1)[1] for a in cfg.reader_addrs]
    taken = {
        *(
            a.rsplit(":", 1)[1]
            for m in range(cfg.sequencers)
            for a in (
                cfg.client_addr_of(m),
                cfg.publish_addr_of(m),
                cfg.log_service_addr_of(m),
                cfg.results_addr_of(m),
            )
        ),
        *(cfg.partition_addr(r, p).rsplit(":", 1)[1] for r in range(2) for p in range(3)),
        *(a.rsplit(":", 1)[1] for row in cfg.query_addrs() for a in row),
        *(str(cfg.zookeeper_client_port(1) + i) for i in range(3)),
    }
    assert len(set(ports)) == 2 and not taken & set(ports)
    assert role_names(cfg)[-2:] == [reader_role(0), reader_role(1)]
    # A cluster.json written before readers existed loads, with none.
    old = json.loads(ClusterConfig(base_port=20_000).to_json())
    del old["readers"], old["reader_hosts"]
    loaded = ClusterConfig.from_json(json.dumps(old))
    assert loaded.readers == 0 and loaded.reader_addrs == []
    with pytest.raises(ValueError):
        ClusterConfig(readers=-1)


def test_a_channel_with_readers_alone_asks_them_and_reports_their_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ch = QueryChannel(zmq.Context.instance(), [], b"client", 0.2, {}, ["tcp://127.0.0.1:10"])
    monkeypatch.setattr(ch, "_put", lambda item, poller: None)
    poller = zmq.Poller()
    item = _item(1)
    ch.send(item, poller, 0.0)
    assert item.target == (READER, 0)
    ch.expire(poller, 1.0)  # silent: asked again, there being nowhere else
    assert item.target == (READER, 0)
    ch.on_frame(_reply(1, ERROR, [ERR_NOT_READY, "catching up"], -1), poller, item.target)
    with pytest.raises(CallFailed):
        item.future.result(0)
    ch.close()
