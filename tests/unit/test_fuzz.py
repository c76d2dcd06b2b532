"""Hypothesis fuzzing of the sequencer and partition roles in one process (no sockets).

Hostile and unlucky input must not crash a role, stall it, or lose or invent a write:

- Sequencer: ``on_frame`` never raises for any bytes; every well-shaped call gets
  exactly one reply (malformed ones one reply each with req_id None, a malformed
  frame exactly one), or ends up logged and then answered once; a rejected call never
  reaches the log; every batch decodes, chains, stays within ``batch_bytes_max`` and
  is applied by the live partition code exactly as by the serial oracle; a reused
  (client_id, req_id) with another call is refused; one client's flood of bad calls
  does not hold back another client's call; junk on the results path changes nothing.
- Footprints made of client values (a user procedure's "any" arguments in its keys):
  what no partition can take is refused at the sequencer, the rest runs everywhere as
  in the oracle.
- Partition: schema-valid calls with adversarial values (huge, deeply nested, NaN,
  int64/uint64 edges, overflowing adds and transfers) never raise, and the live
  replica agrees with the serial oracle (state hash and results) after every batch;
  whatever ``txn_library.wire.partition.decode_inbound`` accepts from the inbox, the role takes
  without raising, and junk that is not a forged peer read changes no outcome.

A sequencer here talks to one in-process replica (``Harness``): batches go to a
``LocalReplica`` and the ``SerialExecutor``; queries to the replica's partitions;
results come back through ``Sequencer.on_results_message``, as over the wire.
The whole file runs in well under a minute.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import txn_library.workloads.builtin  # noqa: F401  (registers tables and procedures)
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from sequencer.calls import make_batch
from sequencer.log import CommandLog
from sequencer.sequencer import Sequencer
from txn_library import catalog, limits
from txn_library.errors import (
    ABORTED,
    ERR_PROCEDURE_FAILED,
    ERR_REQUEST_ID_REUSED,
    ERROR,
    OK,
    STATUS_NAMES,
)
from txn_library.procedure import Arg, Footprint, lookup, procedure
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire

# CI explores the same examples every run (a red build names a reproducible input);
# ORDO_FUZZ_EXPLORE=1 draws new ones each run, for a longer hunt on a workstation.
FUZZ = settings(
    max_examples=int(os.environ.get("ORDO_FUZZ_EXAMPLES", "120")),
    derandomize=os.environ.get("ORDO_FUZZ_EXPLORE") != "1",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PARTITIONS = 2
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
EDGES = limits.edge_values()  # msgpack int edges, every bound -1/0/+1
# Codes that mean "refused before sequencing": such a call must never be in the log.
NOT_EXECUTED = {
    "malformed",
    "unknown_procedure",
    "bad_arguments",
    "too_large",
    "overloaded",
    "request_id_reused",
    "retry_expired",
    "unavailable",
}
PROCS = ("kv.put", "kv.get", "kv.add", "bank.open", "bank.transfer", "bank.balance", "bank.total")


# Strategies: values as they come off the wire ------------------------------------------
def nest(depth: int) -> tuple:
    v: Any = 0
    for _ in range(depth):
        v = (v,)
    return v


wire_ints = st.one_of(st.sampled_from(EDGES), st.integers(INT64_MIN, UINT64_MAX))
wire_scalars = st.one_of(
    st.none(),
    st.booleans(),
    wire_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
)
# Arrays come off the wire as tuples; maps have str keys (others fail to decode).
wire_values = st.recursive(
    wire_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
    ),
    max_leaves=16,
)
# Depths up to what a frame can carry (msgpack packs and unpacks ~1024 levels in all).
big_or_deep = st.one_of(
    st.sampled_from((10, 100, 511, 512, 1000, 1019, 1020)).map(nest),
    st.sampled_from((1000, 65_536, limits.request_bytes_max - 200, limits.row_bytes_max - 64)).map(
        lambda n: "x" * n
    ),
)
keys = st.one_of(
    st.sampled_from(("", "a", "b", "k", "\x00", "é")),
    st.text(max_size=6),
    st.sampled_from((1023, 1024)).map(lambda n: "k" * n),
)
accounts = st.one_of(
    st.integers(0, 5),
    st.sampled_from((INT64_MAX, INT64_MAX - 1, INT64_MAX - 2, INT64_MIN, INT64_MIN + 1)),
    wire_ints.filter(lambda v: INT64_MIN <= v <= INT64_MAX),
)
int64s = st.one_of(
    st.sampled_from(tuple(v for v in EDGES if INT64_MIN <= v <= INT64_MAX)),
    st.integers(INT64_MIN, INT64_MAX),
)
nonneg64 = int64s.filter(lambda v: v >= 0)
positive64 = int64s.filter(lambda v: v >= 1)


def valid_args(name: str) -> st.SearchStrategy[tuple]:
    """Arguments that pass the procedure's schema (the sequencer would accept them)."""
    if name == "kv.put":
        return st.tuples(keys, st.one_of(wire_values, wire_values, wire_values, big_or_deep))
    if name in ("kv.get",):
        return st.tuples(keys)
    if name == "kv.add":
        return st.tuples(keys, int64s)
    if name == "bank.open":
        first = st.one_of(st.integers(0, 10), st.sampled_from((INT64_MAX - 3, INT64_MAX)))
        count = st.one_of(st.integers(1, 4), st.integers(1, 4), st.just(10_000))
        return st.tuples(first, count, nonneg64)
    if name == "bank.transfer":
        return st.tuples(accounts, accounts, positive64)
    if name == "bank.balance":
        return st.tuples(accounts)
    assert name == "bank.total"
    return st.tuples(st.integers(0, 10), st.integers(1, 20))


def mutated_args(name: str) -> st.SearchStrategy[Any]:
    """Arguments a client may send instead: wrong count, a wrong type, anything."""

    def one_wrong(args: tuple, i: int, v: Any) -> tuple:
        if not args:
            return (v,)
        i %= len(args)
        return args[:i] + (v,) + args[i + 1 :]

    good = valid_args(name)
    return st.one_of(
        good.map(lambda a: a[:-1]),
        good.map(lambda a: a + (1,)),
        st.builds(one_wrong, good, st.integers(0, 3), wire_values),
        st.builds(
            one_wrong, good, st.integers(0, 3), st.sampled_from((True, 1.0, "1", b"1", None))
        ),
        wire_values,
        st.just(tuple(range(limits.args_per_call_max + 1))),
    )


@st.composite
def valid_calls(draw: st.DrawFn) -> tuple[str, tuple]:
    name = draw(
        st.sampled_from(
            ("kv.put", "kv.get", "kv.add", "kv.add", "bank.open", "bank.transfer", "bank.balance")
        )
    )
    args = draw(valid_args(name))
    lookup(name).validate(args)
    return name, args


procedure_names = st.one_of(
    st.sampled_from(PROCS),
    st.sampled_from(("no.such", "", "kv.put\x00", "__result__", "tpcc.no_such")),
    wire_values,
)


@st.composite
def client_calls(draw: st.DrawFn, req_id: int) -> Any:
    """One call as a client sends it: mostly [req_id, procedure, args], often not."""
    name = draw(st.one_of(st.sampled_from(PROCS), st.sampled_from(PROCS), procedure_names))
    if isinstance(name, str) and name in PROCS:
        args = draw(
            st.one_of(valid_args(name), valid_args(name), valid_args(name), mutated_args(name))
        )
    else:
        args = draw(wire_values)
    shape = draw(st.sampled_from(("3",) * 6 + ("replica", "short", "long", "junk")))
    if shape == "3":
        call: Any = (req_id, name, args)
    elif shape == "replica":
        call = (req_id, name, args, draw(st.one_of(st.integers(-1, 2), wire_values)))
    elif shape == "short":
        call = (req_id, name)
    elif shape == "long":
        call = (req_id, name, args, 0, draw(wire_values))
    else:
        call = draw(wire_values)
    return call


req_ids = st.one_of(st.integers(0, 1000), st.integers(0, 1000), st.sampled_from(EDGES))


@st.composite
def client_frames(draw: st.DrawFn, index: int) -> bytes:
    """A REQ_CALLS frame, well formed or with one field mutated (client ids unique per
    ``index``); its calls are mostly well formed, with valid arguments or not."""
    mutate = draw(st.sampled_from(("none", "none", "none", "kind", "client_id", "layout")))
    kind: Any = wire.REQ_CALLS
    if mutate == "kind":
        kind = draw(
            st.one_of(
                st.sampled_from((True, 1.0, "1", b"\x01", 99, 0, -1, None, UINT64_MAX)),
                st.sampled_from((wire.REQ_STATUS, wire.REQ_CHECKPOINT, wire.REQ_PRUNE)),
                wire_values,
            )
        )
    client_id: Any = b"c%d-" % index + draw(st.binary(max_size=8))
    if mutate == "client_id":
        client_id = draw(
            st.one_of(
                st.binary(min_size=limits.client_id_bytes_max - 4, max_size=80).map(
                    lambda b: b"c%d-" % index + b
                ),
                wire_values,
            )
        )
    ids = draw(st.lists(req_ids, max_size=6, unique=True))
    body: Any = tuple(draw(client_calls(r)) for r in ids)
    msg: tuple = (kind, client_id, body)
    if mutate == "layout":
        msg = draw(
            st.sampled_from(
                ((kind,), (kind, client_id), (kind, client_id, body, 0), (kind, body, client_id))
            )
        )
        if draw(st.booleans()):
            msg = (kind, client_id, draw(wire_values))
    try:
        frame = msgpack.packb(msg)
    except ValueError:  # nested past what msgpack packs: not a frame anyone can send
        assume(False)
    return frame


def frame_model(frame: bytes) -> dict:
    """What the sequencer must do with a frame (the wire contract, sequencer/wire.py):
    "error" (one frame-level ERROR reply), "control" (one control reply), or "calls"
    (one reply per call: by req_id when well shaped, else with req_id None)."""
    error: dict[str, Any] = {"kind": "error", "client_id": None}
    if len(frame) > limits.request_bytes_max:
        return error
    try:
        msg = msgpack.unpackb(frame, use_list=False)
    except (ValueError, TypeError):
        return error
    if not (type(msg) is tuple and msg and type(msg[0]) is int):
        return error
    client_id = msg[1] if len(msg) > 1 and type(msg[1]) is bytes else None
    if msg[0] in (wire.REQ_STATUS, wire.REQ_CHECKPOINT, wire.REQ_PRUNE):
        return {"kind": "control", "client_id": client_id}
    if msg[0] != wire.REQ_CALLS or len(msg) != 3:
        return {"kind": "error", "client_id": client_id}
    calls = msg[2]
    if not (
        client_id is not None
        and len(client_id) <= limits.client_id_bytes_max
        and type(calls) is tuple
        and len(calls) <= limits.calls_per_frame_max
    ):
        return {"kind": "error", "client_id": client_id}
    well = [c[0] for c in calls if _well_shaped(c)]
    return {
        "kind": "calls",
        "client_id": client_id,
        "well_shaped": well,
        "malformed_calls": len(calls) - len(well),
    }


def _well_shaped(call: Any) -> bool:
    return (
        type(call) is tuple
        and len(call) in (3, 4)
        and type(call[0]) is int
        and 0 <= call[0] <= limits.req_id_max
    )


def _arr(*items: bytes) -> bytes:
    return bytes([0x90 | len(items)]) + b"".join(items)


def _deep(depth: int) -> bytes:
    return b"\x91" * depth + b"\x00"


@st.composite
def deep_frames(draw: st.DrawFn) -> bytes:
    """Nesting 100 / 1000 / 10000 deep in every field (packb refuses such depths)."""
    d = _deep(draw(st.sampled_from((100, 1000, 1024, 1025, 10_000))))
    p = msgpack.packb
    cid = p(b"deep-" + draw(st.binary(max_size=4)))
    r, kv = p(draw(st.integers(0, 5))), p("kv.put")
    return draw(
        st.sampled_from(
            (
                d,
                _arr(d, cid, p([])),
                _arr(p(1), d, p([])),
                _arr(p(1), cid, d),
                _arr(p(1), cid, _arr(d)),
                _arr(p(1), cid, _arr(_arr(d, kv, p(["k", 1])))),
                _arr(p(1), cid, _arr(_arr(r, d, p([])))),
                _arr(p(1), cid, _arr(_arr(r, kv, d))),
                _arr(p(1), cid, _arr(_arr(r, kv, _arr(p("k"), d)))),
                _arr(p(wire.REQ_PRUNE), d),
            )
        )
    )


raw_frames = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        (b"\xc1", b"\xcf\xff", b"\xd3\x80", b"\xc7\x05\xff\x00\x00\x00\x00\x00")
    ).flatmap(lambda head: st.binary(max_size=20).map(lambda tail: head + tail)),
    wire_values.map(msgpack.packb),
    deep_frames(),
)


# The harness: a sequencer answered by one in-process replica -----------------------------
def _packed(results: dict) -> bytes:
    return msgpack.packb(sorted(results.items()))


class Harness:
    """A Sequencer whose batches go to a LocalReplica (replica 0) and the serial oracle,
    whose queries that replica answers, and whose results come back as MSG_RESULTS."""

    def __init__(self, log_dir: str) -> None:
        self.now = 0.0
        self.seq = Sequencer(
            CommandLog(log_dir, fsync=False),
            replicas=2,
            partitions=PARTITIONS,
            clock=lambda: self.now,
            seed_source=lambda: 12345,
        )
        self.replica = LocalReplica(PARTITIONS, shuffle_seed=1)
        self.serial = SerialExecutor()
        self.replies: dict[bytes, list[tuple]] = defaultdict(list)
        self.control: dict[bytes, list[tuple]] = defaultdict(list)
        self.logged: Counter = Counter()  # (client_id, req_id) -> times in the log
        self.txn_of: dict[tuple[bytes, int], int] = {}  # (client_id, req_id) -> txn id
        self.batches = 0
        self._fed: set[int] = set()
        self._prev_digest = 0

    def send(self, identity: bytes, frame: bytes) -> None:
        self.seq.on_frame(identity, frame)

    def settle(self, rounds: int = 30) -> None:
        """Intake, batches, queries and results until nothing moves (bounded)."""
        for _ in range(rounds):
            self.now += 0.01
            self.seq.run_intake()
            moved = self._batch()
            moved |= self._queries()
            self.replica.pump()
            moved |= self._results()
            self._collect()
            if not (moved or self.seq.has_intake() or self.seq.has_pending()):
                return
        raise AssertionError(f"sequencer did not settle in {rounds} rounds")

    def _collect(self) -> None:
        for identity, items in self.seq.take_client_out().items():
            self.replies[identity].extend(wire.unpack(wire.encode_results_reply(items))[1])
        for identity, reply in self.seq.take_control_out():
            self.control[identity].append(reply)

    def _batch(self) -> bool:
        data = self.seq.tick(int(self.now * 1000))
        if data is None:
            return False
        assert len(data) <= limits.batch_bytes_max, len(data)
        batch = wire.decode_batch(data)
        self.batches += 1
        assert batch.epoch == self.batches and batch.prev_epoch == self.batches - 1
        assert batch.prev_digest == self._prev_digest
        self._prev_digest = wire.batch_digest(data)
        for i, txn in enumerate(batch.txns):
            if txn.client_id:
                key = (txn.client_id, txn.req_id)
                self.logged[key] += 1
                self.txn_of[key] = batch.first_txn_id + i
        self.replica.apply(batch)
        self.serial.apply(batch)
        assert self.replica.idle()
        assert self.replica.state_hash == self.serial.state_hash
        assert _packed(self.replica.results) == _packed(self.serial.results)
        return True

    def _queries(self) -> bool:
        out = self.seq.take_query_out()
        for (_r, p), queries in out.items():
            for q in queries:
                self.replica.parts[p].on_query(*q)
        return bool(out)

    def _results(self) -> bool:
        results = tuple(
            (t, st_, v, msgpack.packb(v))
            for t, (st_, v) in self.replica.results.items()
            if t not in self._fed
        )
        self._fed.update(t for t, _s, _v, _d in results)
        qres = tuple(self.replica.query_results)
        self.replica.query_results.clear()
        if not (results or qres):
            return False
        for _t, st_, _v, _d in results:
            assert st_ in STATUS_NAMES
        for _q, _tag, st_, v in qres:
            assert st_ in STATUS_NAMES
            msgpack.packb(v)
        status = self.replica.parts[0].status()
        msg = ewire.unpack(ewire.results_message(0, 0, results, qres, status))
        assert self.seq.on_results_message(msg), "a real partition report was refused"
        return True

    def replies_to(self, identity: bytes) -> list[tuple]:
        return self.replies.get(identity, [])

    def check_rejected_never_logged(self, identity: bytes, client_id: bytes | None) -> None:
        if not client_id:
            return
        for req_id, status, value in self.replies_to(identity):
            if status == ERROR and value[0] in NOT_EXECUTED and req_id is not None:
                assert self.logged[(client_id, req_id)] == 0, (req_id, value)
        for key, n in self.logged.items():
            assert n == 1, f"{key} logged {n} times"


@contextmanager
def harness() -> Iterator[Harness]:
    with tempfile.TemporaryDirectory(prefix="ordo-fuzz-") as d:
        h = Harness(d)
        try:
            yield h
        finally:
            h.seq.log.close()


@contextmanager
def no_tracebacks() -> Iterator[list[logging.LogRecord]]:
    """Collect records with a traceback logged by any ordo logger (there must be none:
    a client's input is not an internal error)."""
    records: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info:
                records.append(record)

    handler = Catch()
    root = logging.getLogger("ordo")
    root.addHandler(handler)
    try:
        yield records
    finally:
        root.removeHandler(handler)


# Sequencer properties ----------------------------------------------------------------------
def check_frame_outcome(h: Harness, identity: bytes, m: dict, client_id_unique: bool) -> None:
    """``client_id_unique``: no other frame used this client id, so what the log holds
    under it came from this frame."""
    replies = h.replies_to(identity)
    logged_here: list[tuple[bytes, int]] = []
    if client_id_unique:
        h.check_rejected_never_logged(identity, m["client_id"])
        logged_here = [k for k in h.logged if m["client_id"] and k[0] == m["client_id"]]
    if m["kind"] == "calls":
        by_id = Counter(r[0] for r in replies)
        for req_id in m["well_shaped"]:
            assert by_id[req_id] == 1, (req_id, replies)
        none_replies = [r for r in replies if r[0] is None]
        assert len(none_replies) == m["malformed_calls"], replies
        assert all(r[1] == ERROR for r in none_replies)
        assert sum(by_id.values()) == len(m["well_shaped"]) + m["malformed_calls"], replies
        assert all(req_id in m["well_shaped"] for _cid, req_id in logged_here)
    elif m["kind"] == "control":
        assert len(h.control[identity]) == 1 and not replies, (h.control[identity], replies)
        assert not logged_here
    else:
        assert len(replies) == 1 and replies[0][:2] == (None, ERROR), replies
        assert not h.control[identity] and not logged_here


def run_frames(frames: list[bytes], prefix: bytes) -> None:
    models = [frame_model(f) for f in frames]
    ids = [(m["client_id"], r) for m in models for r in m.get("well_shaped", [])]
    assume(len(set(ids)) == len(ids))  # a repeated (client, request) is a retry: see below
    with harness() as h, no_tracebacks() as tracebacks:
        for i, frame in enumerate(frames):
            h.send(prefix + b"%d" % i, frame)
        h.settle()
    assert not tracebacks, [r.getMessage() for r in tracebacks]
    uses = Counter(m["client_id"] for m in models)
    for i, m in enumerate(models):
        event(f"frame: {m['kind']}")
        check_frame_outcome(h, prefix + b"%d" % i, m, uses[m["client_id"]] == 1)
    event(f"calls logged: {min(len(h.logged), 3)}{'+' if len(h.logged) >= 3 else ''}")
    codes = {r[2][0] for rs in h.replies.values() for r in rs if r[1] == ERROR}
    for code in codes:
        event(f"error code: {code}")


@FUZZ
@given(st.data())
def test_every_call_is_answered_once_or_logged_and_rejected_calls_never_reach_the_log(
    data: st.DataObject,
) -> None:
    n = data.draw(st.integers(1, 3))
    run_frames([data.draw(client_frames(i), label=f"frame {i}") for i in range(n)], b"id")


@FUZZ
@given(st.lists(raw_frames, min_size=1, max_size=4))
def test_any_bytes_get_exactly_their_answers_and_never_raise(frames: list[bytes]) -> None:
    run_frames(frames, b"raw")


@FUZZ
@given(
    st.lists(
        st.one_of(valid_calls(), valid_calls(), st.tuples(procedure_names, wire_values)),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 3),
)
def test_valid_calls_among_bad_ones_are_answered_with_what_the_oracle_computed(
    calls: list[tuple[Any, Any]], clients: int
) -> None:
    frames = {}
    for c in range(clients):
        mine = tuple((i, n, a) for i, (n, a) in enumerate(calls) if i % clients == c)
        try:
            frames[b"v%d" % c] = msgpack.packb((wire.REQ_CALLS, b"v%d" % c, mine))
        except ValueError:  # nested past what msgpack packs: no client can send it
            assume(False)
    with harness() as h:
        for identity, frame in frames.items():
            h.send(identity, frame)
        h.settle()
    for identity, frame in frames.items():
        if frame_model(frame)["kind"] == "error":  # too large, or too deep to decode
            event("frame refused")
            assert [r[:2] for r in h.replies_to(identity)] == [(None, ERROR)]
            assert not [k for k in h.logged if k[0] == identity]
    for i, (name, _args) in enumerate(calls):
        key = (b"v%d" % (i % clients), i)
        if frame_model(frames[key[0]])["kind"] == "error":
            continue
        (reply,) = [r for r in h.replies_to(key[0]) if r[0] == i]
        txn_id = h.txn_of.get(key)
        if txn_id is not None:  # sequenced: the answer is the oracle's result for it
            event("sequenced")
            assert msgpack.packb(reply[1:]) == msgpack.packb(h.serial.results[txn_id])
        elif reply[1] != ERROR:  # answered without sequencing: a single-partition read
            event("read")
            assert lookup(name).read_only
        else:
            event(f"refused: {reply[2][0]}")
            assert reply[2][0] in NOT_EXECUTED


# Footprints built from client values -------------------------------------------------------
# A user procedure may put an "any" argument into a footprint key. The sequencer must
# refuse what no partition can take (an unhashable key, one that places nowhere), and
# run the rest on every partition as the oracle does. (A map argument in a key passed
# the sequencer and then raised in every partition's admission, again on replay; a
# float first key part under place_by_first_int made participant 0.5.)
FZ_TABLES = ("fuzz_hashed", "fuzz_by_int", "fuzz_ordered")
catalog.register_table(catalog.Table(FZ_TABLES[0], key_len=2, lock_len=1, columns=("v",)))
catalog.register_table(
    catalog.Table(
        FZ_TABLES[1],
        key_len=2,
        lock_len=1,
        placement=catalog.place_by_first_int,
        columns=("v",),
    )
)
catalog.register_table(
    catalog.Table(
        FZ_TABLES[2], key_len=2, lock_len=1, ordered=True, key_types=(int, int), columns=("v",)
    )
)
_FZ_TABLE = Arg("fuzz_table", "int", min_value=0, max_value=len(FZ_TABLES) - 1)


@procedure(
    "fuzz.touch",
    [_FZ_TABLE, Arg("fuzz_a", "any"), Arg("fuzz_b", "any"), Arg("fuzz_read_only", "bool")],
    lambda t, a, b, ro: Footprint(
        reads=((FZ_TABLES[t], (a, b)),), writes=() if ro else ((FZ_TABLES[t], (a, b)),)
    ),
)
def _fuzz_touch(ctx: Any, t: int, a: Any, b: Any, ro: bool) -> Any:
    row = ctx.get(FZ_TABLES[t], (a, b))
    if not ro:
        ctx.put(FZ_TABLES[t], (a, b), (1,))
    return row


@procedure(
    "fuzz.scan",
    [_FZ_TABLE, Arg("fuzz_prefix", "any")],
    lambda t, a: Footprint(reads=((FZ_TABLES[t], (a,)),)),
    read_only=True,
)
def _fuzz_scan(ctx: Any, t: int, a: Any) -> int:
    return len(ctx.scan(FZ_TABLES[t], (a,)))


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("fuzz.touch"),
                st.tuples(st.integers(0, 2), wire_values, wire_values, st.booleans()),
            ),
            st.tuples(st.just("fuzz.scan"), st.tuples(st.integers(0, 2), wire_values)),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_footprints_of_client_values_are_refused_or_run_everywhere_as_in_the_oracle(
    calls: list[tuple[str, tuple]],
) -> None:
    try:
        frame = msgpack.packb((wire.REQ_CALLS, b"fz", tuple((i, *c) for i, c in enumerate(calls))))
    except ValueError:  # nested past what msgpack packs: no client can send it
        assume(False)
    with harness() as h, no_tracebacks() as tracebacks:
        h.send(b"fz", frame)
        h.settle()  # the replica and the oracle agree after every batch (Harness._batch)
    assert not tracebacks, [r.getMessage() for r in tracebacks]
    for i, (name, _args) in enumerate(calls):
        (reply,) = [r for r in h.replies_to(b"fz") if r[0] == i]
        txn_id = h.txn_of.get((b"fz", i))
        if txn_id is not None:
            event("sequenced")
            assert msgpack.packb(reply[1:]) == msgpack.packb(h.serial.results[txn_id])
        elif reply[1] != ERROR:
            event("read")
            assert lookup(name).read_only
        else:
            event(f"refused: {reply[2][0]}")
            assert reply[2][0] in NOT_EXECUTED


reuse_values = st.one_of(
    wire_values, st.sampled_from((10, 500)).map(nest), st.sampled_from(("y", "x" * 70_000))
)


@FUZZ
@given(
    st.tuples(keys, reuse_values),
    st.tuples(keys, reuse_values),
    st.booleans(),
    st.integers(0, limits.req_id_max),
)
def test_a_reused_request_id_is_refused_and_a_true_retry_is_not_logged_again(
    first: tuple, second: tuple, answered_between: bool, req_id: int
) -> None:
    client = b"reuser"
    same = msgpack.packb(first) == msgpack.packb(second)
    with harness() as h:
        h.send(b"a", msgpack.packb((wire.REQ_CALLS, client, ((req_id, "kv.put", first),))))
        if answered_between:
            h.settle()
        h.send(b"b", msgpack.packb((wire.REQ_CALLS, client, ((req_id, "kv.put", second),))))
        h.settle()
    assert h.logged[(client, req_id)] <= 1
    a, b = h.replies_to(b"a"), h.replies_to(b"b")
    if same:
        assert len(b) == 1 and b[0][:2] == (req_id, OK)  # the original answer, once
        # in flight, the answer goes to the retry's connection only
        assert len(a) == (1 if answered_between else 0)
    else:
        assert len(a) == 1 and a[0][:2] == (req_id, OK), a
        assert len(b) == 1 and b[0][1] == ERROR and b[0][2][0] == ERR_REQUEST_ID_REUSED, b


@pytest.mark.parametrize("n", [limits.calls_per_frame_max, limits.calls_per_frame_max + 1])
def test_a_frame_at_and_past_the_calls_bound(n: int) -> None:
    calls = tuple((i, "bank.transfer", ("a", "b", "c")) for i in range(n))
    with harness() as h:
        h.send(b"bad", msgpack.packb((wire.REQ_CALLS, b"bad", calls)))
        h.settle()
    replies = h.replies_to(b"bad")
    if n <= limits.calls_per_frame_max:
        assert sorted(r[0] for r in replies) == list(range(n))
        assert {r[2][0] for r in replies} == {"bad_arguments"}
    else:
        assert len(replies) == 1 and replies[0][:2] == (None, ERROR)
    assert h.batches == 0


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_frames_at_the_size_bound(delta: int) -> None:
    def frame(pad: int) -> bytes:
        return msgpack.packb((wire.REQ_CALLS, b"big", ((1, "kv.put", ("k", "x" * pad)),)))

    pad = limits.request_bytes_max - len(frame(0))
    pad -= len(frame(pad)) - limits.request_bytes_max  # the str header grows with pad
    data = frame(pad + delta)
    assert len(data) == limits.request_bytes_max + delta
    with harness() as h:
        h.send(b"big", data)
        h.settle()
    (reply,) = h.replies_to(b"big")
    if delta <= 0:
        assert reply[:2] == (1, OK)
        assert h.serial.storage.get("kv", ("k",)) == ("x" * (pad + delta),)
    else:
        assert reply[:2] == (None, ERROR) and reply[2][0] == "too_large"
        assert h.batches == 0


def test_big_writes_are_cut_into_batches_within_the_byte_bound_and_none_is_lost() -> None:
    value = "v" * 950_000
    with harness() as h:
        for i in range(48):  # 45 MB of valid calls arriving within one epoch
            frame = msgpack.packb(
                (wire.REQ_CALLS, b"w%d" % (i % 3), ((i, "kv.put", (f"k{i}", value)),))
            )
            h.send(b"w%d" % (i % 3), frame)
        h.settle(rounds=60)
        answered = [r for i in range(3) for r in h.replies_to(b"w%d" % i)]
        assert sorted(r[0] for r in answered) == list(range(48))
        assert all(r[1] == OK for r in answered)
        assert h.batches >= 48 * 950_000 // limits.batch_bytes_max
        assert h.serial.storage.row_count() == 48


def test_one_clients_flood_of_bad_calls_does_not_hold_back_another_clients_call() -> None:
    bad = tuple((i, "bank.transfer", ("a", "b", "c")) for i in range(limits.calls_per_frame_max))
    with harness() as h:
        for _ in range(3):
            h.send(b"flooder", msgpack.packb((wire.REQ_CALLS, b"flooder", bad)))
        h.send(b"good", msgpack.packb((wire.REQ_CALLS, b"good", ((1, "kv.put", ("g", 1)),))))
        h.now = 100.0
        h.seq.run_intake(deadline=0.0)  # one round of the round robin, no more
        data = h.seq.tick(1)
        assert data is not None, "the good call waited behind the flood"
        txns = wire.decode_batch(data).txns
        assert [(t.client_id, t.req_id) for t in txns] == [(b"good", 1)]
        assert h.seq.has_intake()  # most of the flood still waits its turn


def _results_messages() -> st.SearchStrategy[Any]:
    good_status = st.tuples(*[st.integers(0, 10)] * 8, st.booleans(), *[st.integers(0, 10)] * 4)
    entries = st.lists(st.tuples(wire_ints, st.integers(-1, 4), wire_values).map(tuple), max_size=3)
    return st.one_of(
        wire_values,
        st.tuples(
            st.sampled_from((ewire.MSG_RESULTS, True, 1.0, 99)),
            st.one_of(st.integers(-1, 3), wire_values),
            st.one_of(st.integers(-1, 3), wire_values),
            st.one_of(entries.map(tuple), wire_values),
            st.one_of(entries.map(tuple), wire_values),
            st.one_of(good_status, wire_values, st.lists(wire_ints, max_size=14).map(tuple)),
        ),
    )


@FUZZ
@given(st.lists(_results_messages(), min_size=1, max_size=5))
def test_junk_on_the_results_path_is_refused_and_status_still_works(msgs: list[Any]) -> None:
    with harness() as h:
        h.send(b"c", msgpack.packb((wire.REQ_CALLS, b"c", ((1, "kv.put", ("k", 1)),))))
        h.seq.run_intake()
        assert h.seq.tick(1) is not None
        for msg in msgs:
            h.seq.on_results_message(msg)
            report = h.seq.status_report()
            for p in report["partitions"]:
                assert p["replica"] in range(2) and p["partition"] in range(PARTITIONS)
        # The real answer still gets through, and only once.
        h.settle()
    replies = h.replies_to(b"c")
    assert len(replies) <= 1  # a forged well-formed result may have answered it first
    if replies and replies[0][1] == OK:
        assert replies[0][0] == 1


# Partition properties ----------------------------------------------------------------------
overflow_runs = st.sampled_from(
    (
        [("kv.add", ("o", INT64_MAX))] * 3,
        [("kv.add", ("o", INT64_MIN))] * 2,
        [("kv.put", ("o", UINT64_MAX)), ("kv.add", ("o", 1))],
        [("kv.put", ("o", "text")), ("kv.add", ("o", 1))],
        [("kv.put", ("o", math.nan)), ("kv.add", ("o", 1))],
        [
            ("bank.open", (INT64_MAX - 2, 3, INT64_MAX)),
            ("bank.transfer", (INT64_MAX - 2, INT64_MAX - 1, INT64_MAX)),
            ("bank.transfer", (INT64_MAX, INT64_MAX - 1, INT64_MAX)),
        ],
        [("bank.open", (INT64_MAX, 2, 1)), ("bank.balance", (INT64_MAX,))],
    )
)


@FUZZ
@given(
    st.lists(
        st.one_of(st.lists(valid_calls(), min_size=1, max_size=8), overflow_runs),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 2**64 - 1),
)
def test_replica_equals_serial_oracle_on_adversarial_valid_calls(
    batches: list[list[tuple[str, tuple]]], seed: int
) -> None:
    replica = LocalReplica(PARTITIONS, shuffle_seed=seed % 7)
    serial = SerialExecutor()
    txn_id = 0
    for e, calls in enumerate(batches, start=1):
        batch = make_batch(e, txn_id, 1000 + e, seed, calls, PARTITIONS)
        txn_id += len(calls)
        replica.apply(batch)
        serial.apply(batch)
        assert replica.idle()
        assert replica.state_hash == serial.state_hash
        assert _packed(replica.results) == _packed(serial.results)
        for status, value in serial.results.values():
            event(f"status: {STATUS_NAMES[status]}")
            assert status in (OK, ABORTED, ERROR)
            msgpack.packb(value)  # results travel on the wire
            if status == ERROR:
                assert value[0] == ERR_PROCEDURE_FAILED
    for p in replica.parts:
        assert p.storage.recompute_hash()[0] == p.storage.state_hash


def _inbound_messages() -> st.SearchStrategy[Any]:
    """Inbox messages as a partition might receive them: mostly malformed, some not."""
    exact = st.lists(
        st.tuples(st.sampled_from(("account", "kv", "nope")), st.tuples(wire_ints), wire_values)
    )
    prefixes = st.lists(
        st.tuples(
            st.just("account"),
            st.tuples(wire_ints),
            st.lists(st.tuples(st.tuples(wire_ints), wire_values)),
        )
    )
    txn_ids = st.one_of(st.integers(-3, 3), st.integers(2**40, 2**41), wire_values)
    entry = st.tuples(txn_ids, st.one_of(exact, wire_values), st.one_of(prefixes, wire_values))
    query = st.tuples(
        st.integers(-(2**20), -1),  # never a query id the sequencer handed out
        st.one_of(st.integers(0, 1), wire_values),
        st.one_of(
            st.sampled_from(("kv.get", "bank.balance", "kv.put", "__result__", "no")), wire_values
        ),
        st.one_of(st.tuples(keys), st.tuples(accounts), wire_values),
        st.one_of(st.integers(-1, 10), st.just(INT64_MAX), wire_values),
    )
    return st.one_of(
        wire_values,
        st.tuples(
            st.just(ewire.MSG_READS),
            st.one_of(st.integers(-1, 3), wire_values),
            st.lists(entry, max_size=3),
        ),
        st.tuples(
            st.just(ewire.MSG_QUERY),
            st.integers(0, 1),
            st.lists(st.one_of(query, wire_values), max_size=3),
        ),
        st.tuples(
            st.sampled_from((ewire.MSG_RESEND, ewire.MSG_RESEND_GAP, ewire.MSG_STATUS_REQUEST, 99)),
            wire_values,
            wire_values,
        ),
    )


def _encode(msg: Any) -> bytes:
    return msgpack.packb(msg)


def _forged_peer_read(msg: Any, partition: int, next_txn_id: int) -> bool:
    """A well-formed read from a real peer for a txn not yet run here: indistinguishable
    from the real thing without authentication, so it may change outcomes."""
    if not isinstance(msg, ewire.Reads):
        return False
    if msg.from_partition == partition or not 0 <= msg.from_partition < PARTITIONS:
        return False
    return any(
        type(e) is tuple and e and type(e[0]) is int and next_txn_id <= e[0] < 2**40
        for e in msg.entries
    )


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1), st.one_of(_inbound_messages().map(_encode), st.binary(max_size=64))
        ),
        max_size=6,
    ),
    st.integers(0, 3),
)
def test_inbox_junk_never_raises_and_changes_no_outcome(
    junk: list[tuple[int, bytes]], at: int
) -> None:
    rng_calls = [("bank.transfer", (i % 6, (i * 5 + 1) % 6, 7 + i)) for i in range(24)]
    batches = [make_batch(1, 0, 1000, 3, [("bank.open", (0, 6, 100))], PARTITIONS)]
    for e in range(2, 6):
        chunk = rng_calls[(e - 2) * 6 : (e - 1) * 6]
        first = 1 + (e - 2) * 6
        batches.append(make_batch(e, first, 1000 + e, 3, chunk, PARTITIONS))
    replica = LocalReplica(PARTITIONS)
    serial = SerialExecutor()
    for i, batch in enumerate(batches):
        if i == at:
            for p, data in junk:
                part = replica.parts[p]
                msg, _problem = ewire.decode_inbound(data)  # never raises
                if msg is None:
                    continue
                if _forged_peer_read(msg, p, part.next_txn_id):
                    continue  # impersonating a peer needs authentication: out of scope
                if isinstance(msg, ewire.Reads):
                    part.on_reads(msg.from_partition, msg.entries)
                elif isinstance(msg, ewire.Query):
                    for q in msg.calls:
                        part.on_query(*q)
            replica.pump()
            for q in replica.query_results:
                msgpack.packb(q)
        replica.apply(batch)
        serial.apply(batch)
        assert replica.state_hash == serial.state_hash
        assert _packed(replica.results) == _packed(serial.results)
    assert replica.idle()
