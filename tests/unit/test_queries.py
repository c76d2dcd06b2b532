"""Queryable state (docs/QUERIES.md), in process: row versions against a plain-Python
history, snapshot queries against the serial oracle at every epoch, the query service's
errors and waits. The live path (sockets, the client) is tests/cluster/test_queries.py."""

from __future__ import annotations

import random
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

import txn_library.workloads.builtin  # noqa: F401  (kv, bank)
from executor.core.storage import Storage
from executor.core.versions import Versions
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.query_service import QueryService
from executor.deterministic.replica import LocalReplica
from executor.deterministic.snapshot import Snapshot, run_query
from sequencer.calls import make_batch
from tests.unit.test_engine import bank_batches
from tpcc import schema as tpcc_schema
from txn_library import limits
from txn_library.errors import ERROR, OK
from txn_library.procedure import lookup
from txn_library.wire import sequencer as wire

ACCOUNTS = 200


def _prepared(s: Storage, writes: list[tuple[str, tuple, tuple | None]]) -> list:
    prepared, problem = s.prepare_writes({(t, k): r for t, k, r in writes})
    assert problem is None
    return prepared


@settings(max_examples=60, deadline=None)
@given(
    epochs=st.lists(
        st.lists(
            st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(-5, 5))),
            max_size=8,
        ),
        min_size=1,
        max_size=12,
    ),
    keep=st.integers(1, 6),
)
def test_versions_give_every_kept_epochs_state(epochs: list[list[tuple]], keep: int) -> None:
    """Writes (None: delete) epoch by epoch; after each, the state is recorded. Every
    key and every prefix scan at every epoch still kept equals the record, after
    retiring what the last ``keep`` epochs do not need."""
    s = Storage()
    s.load([("kv", (f"k{i:02d}",), (i,)) for i in range(0, 12, 3)])  # some rows to start
    s.versions = v = Versions(0)
    states = {0: dict(s.whole_tables().get("kv", {}))}
    for e, writes in enumerate(epochs, start=1):
        v.epoch = e
        for i, val in writes:
            s.apply(_prepared(s, [("kv", (f"k{i:02d}",), None if val is None else (val,))]))
        states[e] = dict(s.whole_tables().get("kv", {}))
    last = len(epochs)
    v.retire(last - keep)
    v.check()
    for e in range(max(0, last - keep), last + 1):
        snap = Snapshot(s, e)
        for i in range(12):
            key = (f"k{i:02d}",)
            assert snap.get("kv", key) == states[e].get(key), (e, key)
    # an unordered table has no prefix scans; kv rows are compared key by key above


@settings(max_examples=40, deadline=None)
@given(
    epochs=st.lists(
        st.lists(
            st.tuples(st.integers(1, 2), st.integers(0, 6), st.booleans()),
            max_size=6,
        ),
        min_size=1,
        max_size=10,
    ),
    keep=st.integers(1, 5),
)
def test_snapshot_scans_of_an_ordered_table_give_every_kept_epochs_rows(
    epochs: list[list[tuple[int, int, bool]]], keep: int
) -> None:
    """Inserts and deletes in an ordered table (TPC-C NEW_ORDER), epoch by epoch: a
    prefix scan at every kept epoch equals the rows recorded then (keys deleted since
    included, keys inserted since left out), and so do single reads after it."""
    table = tpcc_schema.NEW_ORDER
    s = Storage()
    s.load([(table, (1, 1, o), (o, 1, 1)) for o in range(0, 7, 2)])
    s.versions = v = Versions(0)
    states = {0: dict(s.whole_tables().get(table, {}))}
    for e, writes in enumerate(epochs, start=1):
        v.epoch = e
        for d, o, insert in writes:
            s.apply(_prepared(s, [(table, (1, d, o), (o, d, 1) if insert else None)]))
        states[e] = dict(s.whole_tables().get(table, {}))
    last = len(epochs)
    v.retire(last - keep)
    v.check()
    for e in range(max(0, last - keep), last + 1):
        snap = Snapshot(s, e)
        for d in (1, 2):
            want = sorted((k, r) for k, r in states[e].items() if k[:2] == (1, d))
            assert snap.scan(table, (1, d)) == want, (e, d)
            for o in range(7):
                assert snap.get(table, (1, d, o)) == states[e].get((1, d, o)), (e, d, o)


def test_versions_stay_within_their_bytes_bound(monkeypatch: Any) -> None:
    monkeypatch.setattr(limits, "versions_bytes_max", 20_000)
    s = Storage()
    s.versions = v = Versions(0)
    for e in range(1, 200):
        v.epoch = e
        s.apply(_prepared(s, [("kv", (f"k{e % 50}",), (e, "x" * 50))]))
        v.bound(e)
        assert v.bytes <= limits.versions_bytes_max
    assert v.oldest > 0 and v.oldest < 199


def _replica_with_history(
    partitions: int, seed: int
) -> tuple[LocalReplica, dict[int, SerialExecutor]]:
    """A replica that keeps versions, after bank transfers; the oracle's state after
    every epoch."""
    batches = bank_batches(partitions, 1200, seed=seed, per_batch=40)
    r = LocalReplica(partitions)
    for p in r.parts:
        p.keep_versions()
    oracle = SerialExecutor()
    totals = {}
    for b in batches:
        r.apply(b)
        oracle.apply(b)
        totals[b.epoch] = oracle.storage.whole_tables().get("account", {}).copy()
    return r, totals  # type: ignore[return-value]


def _service_mesh(r: LocalReplica) -> list[QueryService]:
    """One QueryService per partition of ``r``, peers delivering to each other at once."""
    services: list[QueryService] = []

    def sender(q: int) -> Any:
        def send(to: int, data: bytes) -> None:
            msg = wire.unpack(data)
            target = services[to]
            kind = msg[0]
            from txn_library.wire import partition as ewire

            if kind == ewire.MSG_QUERY_READS:
                target.on_query_reads(ewire.QueryReads(*msg[1:]))
            elif kind == ewire.MSG_QUERY_READS_REPLY:
                target.on_query_reads_reply(ewire.QueryReadsReply(*msg[1:]))
            elif kind == ewire.MSG_WATERMARK:
                target.on_watermark(ewire.Watermark(*msg[1:]))

        return send

    clock = [0.0]
    for q, p in enumerate(r.parts):
        svc = QueryService(p, sender(q), lambda: clock[0])
        svc.live = True
        services.append(svc)
    return services


def _ask(
    svc: QueryService, proc: str, args: tuple, isolation: str = "snapshot", at: int = -1
) -> tuple:
    frame = msgpack.packb([wire.REQ_QUERY, b"c", [[7, proc, list(args), isolation, at]]])
    svc.on_client_frame(b"id", frame)
    replies = svc.take_replies().get(b"id", [])
    assert len(replies) == 1, replies
    qid, status, packed, epoch = replies[0]
    return status, msgpack.unpackb(packed), epoch


def test_snapshot_queries_equal_the_serial_oracle_at_the_epoch_they_name() -> None:
    """bank.total and bank.balance as snapshot queries, across two partitions, at
    every epoch still kept: the oracle's state after that epoch, exactly."""
    r, states = _replica_with_history(2, seed=3)
    services = _service_mesh(r)
    for svc in services:
        svc.tick(1.0)  # watermarks
    last = max(states)
    opened = sum(row[0] for row in states[last].values())
    for e in range(max(1, last - limits.versions_epochs_max), last + 1):
        for svc in services:
            status, value, epoch = _ask(svc, "bank.total", (0, ACCOUNTS), at=e)
            assert (status, value, epoch) == (OK, opened, e)
            k = random.Random(e).randrange(ACCOUNTS)
            status, value, _ = _ask(svc, "bank.balance", (k,), at=e)
            row = states[e].get((k,))
            assert (status, value) == (OK, None if row is None else row[0]), (e, k)
    status, value, epoch = _ask(services[0], "bank.total", (0, ACCOUNTS))
    assert (status, value, epoch) == (OK, opened, last)


def test_queries_refuse_what_they_cannot_answer_and_never_raise() -> None:
    r, states = _replica_with_history(2, seed=4)
    svc = _service_mesh(r)[0]
    svc.tick(1.0)
    last = max(states)
    status, value, _ = _ask(svc, "bank.transfer", (1, 2, 3))
    assert status == ERROR and "not read-only" in value[1]
    status, value, _ = _ask(svc, "bank.total", (0, 10), isolation="strict")
    assert status == ERROR and "sequencer" in value[1]
    status, value, _ = _ask(svc, "nope", ())
    assert status == ERROR and value[0] == "unknown_procedure"
    for p in r.parts:
        p.storage.versions.retire(last - 3)  # type: ignore[union-attr]
    status, value, _ = _ask(svc, "bank.total", (0, 10), at=1)
    assert status == ERROR and value[0] == "bad_arguments" and "versions_epochs_max" in value[1]
    svc.live = False
    status, value, _ = _ask(svc, "bank.total", (0, 10))
    assert status == ERROR and value[0] == "not_ready" and "recovering" in value[1]
    status, value, _ = _ask(svc, "bank.total", (0, 10), isolation="read_committed")
    assert status == OK  # the state now: served while recovering
    for junk in (b"\xc1", msgpack.packb([wire.REQ_QUERY]), msgpack.packb([1, 2, 3])):
        svc.on_client_frame(b"j", junk)
        (reply,) = svc.take_replies()[b"j"]
        assert reply[1] == ERROR


def test_a_query_for_an_epoch_not_completed_yet_waits_for_it_then_answers() -> None:
    r, states = _replica_with_history(1, seed=5)
    (svc,) = _service_mesh(r)
    last = max(states)
    frame = msgpack.packb(
        [wire.REQ_QUERY, b"c", [[9, "bank.total", [0, ACCOUNTS], "snapshot", last + 1]]]
    )
    svc.on_client_frame(b"id", frame)
    assert svc.take_replies() == {} and svc.waiting == 1
    r.apply(make_batch(last + 1, r.parts[0].next_txn_id, 1, 1, [("bank.transfer", (1, 2, 5))], 1))
    svc.tick(0.5)
    ((qid, status, packed, epoch),) = svc.take_replies()[b"id"]
    assert (qid, status, epoch) == (9, OK, last + 1)
    frame = msgpack.packb(
        [wire.REQ_QUERY, b"c", [[10, "bank.total", [0, 10], "snapshot", last + 50]]]
    )
    svc.on_client_frame(b"id", frame)
    svc.clock = lambda: limits.query_watermark_wait_s + 1  # its wait is over
    svc.tick(limits.query_watermark_wait_s + 1)
    ((qid, status, packed, _),) = svc.take_replies()[b"id"]
    assert qid == 10 and status == ERROR and msgpack.unpackb(packed)[0] == "not_ready"


def test_read_committed_reads_each_partition_now() -> None:
    r, states = _replica_with_history(2, seed=6)
    snap_now = Snapshot(r.parts[0].storage, None)
    proc = lookup("bank.balance")
    k = next(k for k in range(ACCOUNTS) if r.parts[0].storage.get("account", (k,)) is not None)
    status, value, _ = run_query(proc, (k,), snap_now, 0, 2)
    assert (status, value) == (OK, r.parts[0].storage.get("account", (k,))[0])  # type: ignore[index]


def test_a_coordinator_waiting_for_its_peers_reads_is_not_hurt_by_retention(
    monkeypatch: Any,
) -> None:
    """The coordinator takes its own reads when the query begins: versions retired
    while the peers' reads are on their way (a short retention here) cannot mix a
    newer row into the snapshot."""
    monkeypatch.setattr(limits, "versions_epochs_max", 5)
    batches = bank_batches(2, 3000, seed=1, per_batch=40)
    r = LocalReplica(2)
    for p in r.parts:
        p.keep_versions()
    half = len(batches) // 2
    for b in batches[:half]:
        r.apply(b)
    services = _service_mesh(r)
    held: list = []
    real = services[1].send_peer

    def late(to: int, data: bytes) -> None:  # partition 1's messages to 0 wait
        if to == 0:
            held.append(data)
        else:
            real(to, data)

    services[1].send_peer = late
    e = r.parts[0].completed_epoch()
    frame = msgpack.packb([wire.REQ_QUERY, b"c", [[1, "bank.total", [0, ACCOUNTS], "snapshot", e]]])
    services[0].on_client_frame(b"id", frame)
    for b in batches[half:]:
        r.apply(b)
    assert r.parts[0].storage.versions.oldest > e  # type: ignore[union-attr]
    for data in held:
        real(0, data)
    ((_, status, packed, epoch),) = services[0].take_replies()[b"id"]
    assert (status, msgpack.unpackb(packed), epoch) == (OK, ACCOUNTS * 1_000, e)
