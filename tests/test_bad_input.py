"""Bad input gets a clear error, changes nothing, and kills nothing.

Raw ZeroMQ clients send malformed frames, unknown procedures, wrong argument types,
oversized messages and garbage to internal ports; the cluster answers each with an
error, keeps running, logs nothing for them, and still executes a good call.
"""

from __future__ import annotations

import msgpack
import pytest
import zmq

from sequencer import wire
from sequencer.log import iter_frames
from txn_library.client import Client
from txn_library.errors import ERROR, CallFailed


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
    logged = [t for _e, data in iter_frames(cfg.log_dir) for t in wire.unpack(data)[wire.B_TXNS]]
    assert [t[wire.T_PROC] for t in logged] == ["kv.put"]
