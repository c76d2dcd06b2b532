"""Bad input gets a clear error, changes nothing, and kills nothing.

Raw ZeroMQ clients send malformed frames, unknown procedures, wrong argument types,
oversized messages and garbage to internal ports; the cluster answers each with an
error, keeps running, logs nothing for them, and still executes a good call. Junk on
a partition's inbox is dropped whole and counted, logged at most about once a second,
and never holds up the partition's transactions or queries.
"""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq

import txn_library.workloads.builtin  # noqa: F401  (registers kv, for placement)
from cluster.launcher import wait_quiescent
from sequencer.log import iter_frames
from txn_library import placement
from txn_library.client import Client
from txn_library.errors import ERROR, CallFailed
from txn_library.wire import sequencer as wire


def _ask(sock: zmq.Socket, frames: list[bytes]) -> tuple:
    sock.send_multipart(frames)
    assert sock.poll(5000), "no reply within 5 s"
    kind, body = wire.unpack(sock.recv())
    assert kind == wire.REP_RESULTS
    return body


def _calls(*calls: object) -> bytes:
    return msgpack.packb([wire.REQ_CALLS, b"raw-client", list(calls)])


@pytest.fixture
def cluster(make_cluster):  # type: ignore[no-untyped-def]
    return make_cluster(replicas=2, partitions=2)


def test_every_kind_of_bad_input_gets_an_error_and_changes_nothing(cluster) -> None:  # type: ignore[no-untyped-def]
    cfg = cluster.config
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(cfg.client_addr)
    try:
        cases = {
            "not msgpack": [b"\xc1\xff garbage"],
            "two frames": [b"a", b"b"],
            "not an array": [msgpack.packb(7)],
            "unknown kind": [msgpack.packb([99, 1])],
            "calls not an array": [msgpack.packb([wire.REQ_CALLS, b"c", "x"])],
            "client id not bytes": [msgpack.packb([wire.REQ_CALLS, 5, []])],
            "call wrong shape": [_calls([1, "bank.transfer"])],
            "req id not int": [_calls(["one", "bank.transfer", [1, 2, 3]])],
            "oversized": [
                msgpack.packb([wire.REQ_CALLS, b"c", [[1, "kv.put", ["k", "x" * (2 << 20)]]]])
            ],
        }
        for name, frames in cases.items():
            body = _ask(sock, frames)
            assert body and all(r[1] == ERROR for r in body), (name, body)
        codes = {
            "unknown procedure": (_calls([1, "no.such", []]), "unknown_procedure"),
            "proc name not str": (_calls([2, 17, []]), "unknown_procedure"),
            "str for int": (_calls([3, "bank.transfer", ["1", 2, 3]]), "bad_arguments"),
            "bool for int": (_calls([4, "bank.transfer", [True, 2, 3]]), "bad_arguments"),
            "too few args": (_calls([5, "bank.transfer", [1, 2]]), "bad_arguments"),
            "args not array": (_calls([6, "bank.transfer", 5]), "bad_arguments"),
            "out of range": (_calls([7, "bank.transfer", [1, 2, -5]]), "bad_arguments"),
            "uint64 overflow": (_calls([8, "bank.transfer", [2**64 - 1, 2, 3]]), "bad_arguments"),
        }
        for name, (frame, code) in codes.items():
            body = _ask(sock, [frame])
            assert len(body) == 1 and body[0][1] == ERROR and body[0][2][0] == code, (name, body)
        # Garbage straight into internal ports must not kill anything either.
        for addr in (cfg.results_addr, cfg.partition_addr(0, 0), cfg.partition_addr(1, 1)):
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 1000)
            push.connect(addr)
            push.send(b"\x00garbage")
            push.send(msgpack.packb([1, "x"]))
            push.close()
    finally:
        sock.close()

    with Client(cfg.client_addr) as c:
        with pytest.raises(CallFailed) as err:
            c.call("bank.transfer", "a", "b", 1)
        assert err.value.code == "bad_arguments"
        assert c.call("kv.put", "hello", "world").ok
        assert c.call("kv.get", "hello").value == "world"
    cluster.check_alive()
    # Only the one good write reached the log.
    logged = [t for _e, data in iter_frames(cfg.log_dir) for t in wire.decode_batch(data).txns]
    assert [t.proc for t in logged] == ["kv.put"]


def test_junk_on_a_partition_inbox_is_dropped_with_rate_limited_warnings(cluster) -> None:  # type: ignore[no-untyped-def]
    """Stray or hostile messages on a partition's PULL socket (wrong shapes, wrong
    types, partitions that are not peers, a flood) kill nothing, are logged at most
    about once a second, and the partition still executes."""
    from txn_library.wire import partition as ewire

    cfg = cluster.config
    q = 10**9  # query ids the sequencer never uses: their answers are ignored
    dropped = [
        [ewire.MSG_READS, 0, [[1, 2]]],  # an entry of the wrong shape
        [ewire.MSG_READS, 1, [[10**6, [["kv", ["k"], None]], "prefixes?"]]],
        [ewire.MSG_READS, 1, [[10**6, [["kv", [{"a": 1}], None]], []]]],  # unhashable key
        [ewire.MSG_READS, 7, [[10**6, [], []]]],  # well formed, but not from a peer
        [ewire.MSG_READS, 0, [[10**6, [], []]]],  # ... or from itself (partition 0)
        [ewire.MSG_QUERY, 0, [[q, 0, "kv.get", ["k"], "later"]]],  # str min_txn_id
        [ewire.MSG_QUERY, 0, [[q, 0, "kv.get", "k", 0]]],  # args not an array
        [ewire.MSG_RESEND, "p1", 0],
        [ewire.MSG_RESEND, 9, 0],  # not a peer
        [ewire.MSG_RESEND_GAP, 1, "x"],
        [ewire.MSG_STATUS_REQUEST, 1],
        [ewire.MSG_RESULTS, 0, 0, [], [], []],  # outbound kind, wrong way
        [True, 1, []],
        [],
        {"kind": 1},
        7,
    ]
    answered = [  # well formed: the partition answers them (with errors), drops nothing
        [ewire.MSG_QUERY, 0, [[q + 1, 0, "no.such", [], 0], [q + 2, 0, "kv.put", ["k", 1], 0]]],
        [ewire.MSG_QUERY, 0, [[q + 3, 0, "bank.total", [0, True], 0]]],
        [ewire.MSG_STATUS_REQUEST],
        [ewire.MSG_QUERY, 0, [[q + 4, 0, "kv.get", ["k"], 2**62]]],  # waits (nearly) forever
    ]
    flood = 3_000
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(cfg.partition_addr(0, 0))
    t0 = time.monotonic()
    try:
        for msg in dropped + answered:
            push.send(msgpack.packb(msg))
        push.send(b"\xc1\xff not msgpack")
        for i in range(flood):
            push.send(msgpack.packb([ewire.MSG_READS, 0, [[i, 2]]]))
    finally:
        push.close()
    expected = len(dropped) + 1 + flood
    log_path = cluster.logs_dir / "replica-0-partition-0.log"

    def reports() -> list[str]:
        return [x for x in log_path.read_text().splitlines() if "dropped" in x]

    def reported() -> int:
        return sum(int(x.split("dropped ")[1].split()[0]) for x in reports())

    deadline = time.monotonic() + 20
    while reported() < expected and time.monotonic() < deadline:
        time.sleep(0.1)  # reports come at most once a second
    here = next(f"k{i}" for i in range(100) if placement.partition_of("kv", (f"k{i}",), 2) == 0)
    with Client(cfg.client_addr) as c:
        assert c.call("kv.put", here, 1).ok
        assert c.call("bank.open", 500, 20, 100).value == 20  # both partitions
        assert c.call("bank.transfer", 500, 519, 7).ok
        assert c.call("bank.total", 500, 20).value == 2_000
        # Served by r0p0 although the query that waits for txn 2**62 came first.
        assert c.call("kv.get", here, replica=0, timeout_s=10).value == 1
        wait_quiescent(c, 2, 2)
    cluster.check_alive()
    assert reported() == expected, reports()
    assert len(reports()) <= time.monotonic() - t0 + 2, reports()  # not a line per message


def test_a_flood_of_resend_requests_costs_one_resend_per_second(cluster) -> None:  # type: ignore[no-untyped-def]
    """MSG_RESEND makes a partition send every read it retains to the asking peer; a
    flood of them (forged, or a peer in a crash loop) is merged into at most one resend
    per peer per second, and the partition keeps executing."""
    from txn_library.wire import partition as ewire

    cfg = cluster.config
    with Client(cfg.client_addr) as c:
        assert c.call("bank.open", 700, 20, 100).value == 20  # multi-partition: reads sent
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(cfg.partition_addr(0, 0))
        t0 = time.monotonic()
        try:
            for _ in range(2_000):
                push.send(msgpack.packb([ewire.MSG_RESEND, 1, 0]))
        finally:
            push.close()
        assert c.call("bank.transfer", 700, 719, 7).ok
        assert c.call("bank.total", 700, 20).value == 2_000
        wait_quiescent(c, 2, 2)
    elapsed = time.monotonic() - t0
    cluster.check_alive()
    log_path = cluster.logs_dir / "replica-0-partition-0.log"
    resends = [x for x in log_path.read_text().splitlines() if "resending its reads" in x]
    assert 1 <= len(resends) <= elapsed + 2, resends
