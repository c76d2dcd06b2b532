"""One address is enough to query: a Client given only a sequencer's address asks it
where queries go (``cluster.info``) the first time a query needs it, asks again after
a move to another sequencer and when every target it knows fails a query, and a
malformed or hostile reply fails the waiting queries with a clear error, never the
client. The sequencer and the query targets are ROUTERs standing in."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
import zmq

from cluster.launcher import free_base_port
from txn_library import limits
from txn_library.client import Client
from txn_library.errors import ERR_NOT_LEADER, ERROR, OK, BadRequest, CallFailed, CallTimeout
from txn_library.wire import sequencer as wire
from txn_library.wire.curve import ClientCurve


def _router() -> tuple[zmq.Socket, str]:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = free_base_port(1)
    sock.bind(f"tcp://127.0.0.1:{port}")
    return sock, f"tcp://127.0.0.1:{port}"


@pytest.fixture
def routers() -> Iterator[list[tuple[zmq.Socket, str]]]:
    """Four ROUTERs: stand-in sequencers and query targets, as the test uses them."""
    made = [_router() for _ in range(4)]
    try:
        yield made
    finally:
        for sock, _ in made:
            sock.close()


def _next(sock: zmq.Socket, kind: int, timeout_s: float = 10.0) -> tuple[bytes, tuple]:
    """(identity, message) of the next frame of ``kind`` (others are skipped)."""
    while True:
        assert sock.poll(int(timeout_s * 1000)), f"no frame of kind {kind}"
        identity, frame = sock.recv_multipart()
        msg = wire.unpack(frame)
        if msg[0] == kind:
            return identity, msg


def _info(partitions: list[list[str]], readers: list[str] = []) -> dict:  # noqa: B006
    return {
        "partitions": partitions,
        "readers": readers,
        "partition_keys": None,
        "reader_keys": None,
    }


def _tell(seq: zmq.Socket, body: object) -> bytes:
    """Answer the client's next cluster.info request with ``body``; the client's identity."""
    identity, _ = _next(seq, wire.REQ_CLUSTER_INFO)
    seq.send_multipart([identity, msgpack.packb([wire.REP_CLUSTER_INFO, body])])
    return identity


def _serve_query(target: zmq.Socket, value: object, epoch: int) -> None:
    """Answer the next query ``target`` gets with ``value`` as of ``epoch``."""
    identity, msg = _next(target, wire.REQ_QUERY)
    qid = msg[2][0][0]
    target.send_multipart(
        [identity, wire.encode_query_reply([(qid, OK, msgpack.packb(value), epoch)])]
    )


def test_a_client_with_one_address_learns_the_targets_once_and_queries_them(routers) -> None:  # type: ignore[no-untyped-def]
    (seq, seq_addr), (reader, reader_addr), (part, part_addr), _ = routers
    with Client(seq_addr, timeout_s=10, retry_s=5) as c:
        with pytest.raises(BadRequest, match="replica: an int >= 0"):
            c.submit_query("kv.get", "k", replica="0")  # type: ignore[arg-type]
        first = c.submit_query("kv.get", "k")
        _tell(seq, _info([[part_addr]], [reader_addr]))
        _serve_query(reader, "v1", 7)  # with readers, queries go to a reader
        answer = first.result(timeout=10)
        assert (answer.value, answer.epoch) == ("v1", 7)
        second = c.submit_query("kv.get", "k", replica=0)  # named: the partitions
        _serve_query(part, "v2", 8)
        assert second.result(timeout=10).value == "v2"
        assert not seq.poll(0), "asked cluster.info again though it knew the targets"
        later = c.submit_query("kv.get", "k", reader=3)
        with pytest.raises(BadRequest, match="reader 3: 0..0"):
            later.result(timeout=10)


def test_when_every_known_target_is_silent_the_client_asks_again(routers) -> None:  # type: ignore[no-untyped-def]
    (seq, seq_addr), (silent, silent_addr), (part, part_addr), _ = routers
    with Client(seq_addr, timeout_s=20, retry_s=0.2) as c:
        fut = c.submit_query("kv.get", "k")
        _tell(seq, _info([[silent_addr]]))
        _next(silent, wire.REQ_QUERY)  # asked, never answers
        _tell(seq, _info([[part_addr]]))  # the refresh: the cluster moved
        _serve_query(part, "moved", 3)
        assert fut.result(timeout=10).value == "moved"


def test_a_move_to_another_sequencer_asks_the_new_one(routers) -> None:  # type: ignore[no-untyped-def]
    (s0, addr0), (s1, addr1), (part, part_addr), _ = routers
    with Client([addr0, addr1], timeout_s=20, retry_s=5) as c:
        fut = c.submit_query("kv.get", "k")
        _tell(s0, _info([[part_addr]]))
        _serve_query(part, 1, 1)
        assert fut.result(timeout=10).value == 1
        call = c.submit("kv.get", "k")
        identity, msg = _next(s0, wire.REQ_CALLS)
        not_leader = [(r[0], ERROR, (ERR_NOT_LEADER, addr1)) for r in msg[2]]
        s0.send_multipart([identity, wire.encode(wire.ResultsReply(not_leader))])
        _tell(s1, _info([[part_addr]]))  # the new sequencer is asked where queries go
        identity, msg = _next(s1, wire.REQ_CALLS)
        s1.send_multipart([identity, wire.encode(wire.ResultsReply([(msg[2][0][0], OK, "x")]))])
        assert call.result(timeout=10).value == "x"


_KEY = zmq.curve_keypair()[0]
_HOSTILE: list[tuple[str, object]] = [
    ("not a map", [1, 2, 3]),
    ("no address", {}),
    ("fields missing", {"partitions": [["tcp://a:1"]]}),
    ("extra field", {**_info([["tcp://a:1"]]), "secret": b"x"}),
    ("address not a string", _info([[b"tcp://a:1"]])),
    ("empty replica", _info([[]])),
    ("ragged replicas", _info([["tcp://a:1"], ["tcp://b:1", "tcp://c:1"]])),
    ("huge address", _info([["x" * 10_000]])),
    ("not tcp", _info([["inproc://ordo-client-0"]])),
    ("no port", _info([["tcp://a:b"]])),
    ("port 0", _info([["tcp://a:0"]])),
    ("port past 65535", _info([["tcp://a:65536"]])),
    ("a nul byte", _info([["tcp://a\x00:1"]])),
    ("too many", _info([["tcp://a:1"] * (limits.cluster_info_addresses_max + 1)])),
    ("keys half there", {**_info([["tcp://a:1"]]), "partition_keys": [[_KEY]]}),
    ("not a key", {**_info([["tcp://a:1"]]), "partition_keys": [[b"k"]], "reader_keys": []}),
    ("keys misshapen", {**_info([["tcp://a:1"]]), "partition_keys": [[]], "reader_keys": []}),
    (
        "CURVE, no key pair here",
        {**_info([["tcp://a:1"]]), "partition_keys": [[_KEY]], "reader_keys": []},
    ),
]


@pytest.mark.parametrize("body", [b for _, b in _HOSTILE], ids=[n for n, _ in _HOSTILE])
def test_a_hostile_cluster_info_fails_the_query_clearly_and_the_client_asks_again(
    routers,  # type: ignore[no-untyped-def]
    body: object,
) -> None:
    (seq, seq_addr), (part, part_addr), _, _ = routers
    with Client(seq_addr, timeout_s=10, retry_s=5) as c:
        fut = c.submit_query("kv.get", "k")
        _tell(seq, body)
        with pytest.raises(CallFailed, match="answered cluster.info: ") as err:
            fut.result(timeout=10)
        assert err.value.code == "cluster_info"
        assert c.malformed_replies == 1
        again = c.submit_query("kv.get", "k")  # still usable: the next query asks afresh
        identity = _tell(seq, _info([[part_addr]]))
        _serve_query(part, "ok", 1)
        assert again.result(timeout=10).value == "ok"
        # A reply nobody asked for is dropped, and the targets stay.
        unasked = wire.ClusterInfoReply(_info([["tcp://127.0.0.1:1"]]))
        seq.send_multipart([identity, wire.encode(unasked)])
        _wait_for(lambda: c.malformed_replies == 2)
        last = c.submit_query("kv.get", "k")
        _serve_query(part, "still", 2)
        assert last.result(timeout=10).value == "still"


def test_an_undecodable_cluster_info_is_dropped_and_the_query_times_out_clearly(routers) -> None:  # type: ignore[no-untyped-def]
    (seq, seq_addr), _, _, _ = routers
    with Client(seq_addr, timeout_s=1, retry_s=5) as c:
        fut = c.submit_query("kv.get", "k")
        identity, _ = _next(seq, wire.REQ_CLUSTER_INFO)
        seq.send_multipart([identity, b"\x92\x10\x81\x01\x02"])  # [16, {1: 2}]: int key
        with pytest.raises(CallTimeout, match="no cluster.info answer from"):
            fut.result(timeout=10)
        assert c.malformed_replies == 1


def _wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_curve_client_talks_to_the_targets_with_its_own_key_pair() -> None:
    server_public, server_secret = zmq.curve_keypair()
    seq = zmq.Context.instance().socket(zmq.ROUTER)
    seq.setsockopt(zmq.LINGER, 0)
    seq.curve_server = True  # no ZAP handler: any client key pair is let in
    seq.curve_publickey, seq.curve_secretkey = server_public, server_secret
    port = free_base_port(1)
    seq.bind(f"tcp://127.0.0.1:{port}")
    public, secret = zmq.curve_keypair()
    reader_key = zmq.curve_keypair()[0]
    try:
        curve = ClientCurve(public, secret, server_public)
        with Client(f"tcp://127.0.0.1:{port}", timeout_s=10, retry_s=5, curve=curve) as c:
            c.submit_query("kv.get", "k")
            body = _info([["tcp://127.0.0.1:1"]], ["tcp://127.0.0.1:2"])
            body["partition_keys"], body["reader_keys"] = [[_KEY]], [reader_key]
            _tell(seq, body)
            q = c._queries
            _wait_for(lambda: q.has_targets)
            assert q.curves["tcp://127.0.0.1:2"] == ClientCurve(public, secret, reader_key)
            assert q.curves["tcp://127.0.0.1:1"] == ClientCurve(public, secret, _KEY)
    finally:
        seq.close()


def test_the_sequencer_role_answers_cluster_info_with_public_keys_only(tmp_path: Path) -> None:
    from cluster.cluster_info import cluster_info
    from cluster.config import ClusterConfig
    from sequencer.log import CommandLog
    from sequencer.sequencer import Sequencer

    cfg = ClusterConfig(replicas=2, partitions=2, readers=1, data_dir=str(tmp_path))
    keys = {"r0p0": _KEY, "r0p1": _KEY, "r1p0": _KEY, "r1p1": _KEY, "reader-0": _KEY}
    plain = cluster_info(cfg, {})
    assert plain["partitions"] == cfg.query_addrs() and plain["readers"] == cfg.reader_addrs
    assert plain["partition_keys"] is None and plain["reader_keys"] is None
    with_keys = cluster_info(replace(cfg, curve=True), keys)
    assert with_keys["partition_keys"] == [[_KEY, _KEY], [_KEY, _KEY]]
    assert with_keys["reader_keys"] == [_KEY]
    s = Sequencer(CommandLog(tmp_path / "log"), replicas=2, partitions=2)
    s.on_frame(b"who", wire.encode(wire.ClusterInfoRequest()))
    [(identity, reply)] = s.take_control_out()
    assert (identity, wire.cluster_info(reply.info)) == (
        b"who",
        "the sequencer knows no query address",
    )
    s.cluster_info = with_keys
    s.on_frame(b"who", wire.encode(wire.ClusterInfoRequest()))
    [(_, reply)] = s.take_control_out()
    decoded = wire.unpack(wire.encode(reply))  # as a client reads it
    assert decoded[0] == wire.REP_CLUSTER_INFO
    info = wire.cluster_info(decoded[1])
    assert isinstance(info, wire.ClusterInfo)
    assert info.partitions == tuple(tuple(r) for r in cfg.query_addrs())
    assert info.reader_keys == (_KEY,)
    assert info.replica_versions is False  # readers serve snapshots: the replicas keep none


def test_cluster_info_says_whether_the_replicas_keep_versions_and_checks_it() -> None:
    from cluster.cluster_info import cluster_info
    from cluster.config import ClusterConfig

    body = cluster_info(ClusterConfig(replicas=1, partitions=1), {})
    decoded = wire.unpack(msgpack.packb(body))
    info = wire.cluster_info(decoded)
    assert isinstance(info, wire.ClusterInfo) and info.replica_versions is True
    older = {k: v for k, v in decoded.items() if k != "replica_versions"}  # an older sequencer
    assert wire.cluster_info(older).replica_versions is True  # type: ignore[union-attr]
    assert "replica_versions" in str(wire.cluster_info({**decoded, "replica_versions": 1}))
    assert "not a map" in str(wire.cluster_info({**decoded, "something": True}))


def test_a_replica_without_versions_answers_no_snapshot_and_says_why() -> None:
    """Its state may hold writes of the epoch after its completed one (a batch runs while
    the next starts): a snapshot there, even at its completed epoch, could read them."""
    from executor.deterministic.snapshot import epoch_problem

    for epoch in (5, 7, 9):
        code, message = epoch_problem(epoch, 7, 7, versions=False) or ("", "")
        assert code == "bad_arguments" and "keeps no row versions" in message
        assert "readers" in message and "read committed works" in message
    assert epoch_problem(7, 7, 7, versions=True) is None
