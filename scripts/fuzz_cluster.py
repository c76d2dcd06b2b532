"""Hostile and unlucky input against a live local cluster, while a good client works.

What it measures. A well-behaved client runs closed-loop ``bank.transfer`` calls
(``--concurrency`` in flight) first on an idle cluster, then while ``--flooders``
processes (each with its own ZeroMQ context and sockets) send at least ``--messages``
hostile messages: garbage bytes, msgpack of the wrong shape, request kinds True / 1.0
/ "1" / 99, REQ_CALLS with 2 or 4 fields, calls with wrong field counts, unknown
procedures, wrong argument types, ints at the int64/uint64 bounds, nesting 100 / 1000
/ 10000 deep, frames just under and over ``limits.request_bytes_max`` and of several
MB, frames of 10,000 bad calls, duplicate and reused request ids, a burst of ~0.9 MB
``kv.put`` calls and hundreds of ``kv.get`` of them (retry-cache pressure), junk prune
requests, multi-frame messages, and junk to the internal sockets (results PULL,
partition PULLs, log service ROUTER). The good client is the load generator
(cluster/loadgen.py); every hostile message travels through its raw-frame channel
(cluster/load_raw.py). Only 127.0.0.1 addresses from the cluster config are ever
used. Then it checks, prints and writes ``fuzz_cluster.json`` (plus ``fuzz_cluster.png``,
the good client's latency over time with the flood shaded) to the scratch directory
(scripts/bench_outputs.py), or with ``--publish`` to results/fuzz/:

- every process is alive; no cluster log shows a new traceback or CRITICAL line (junk
  deserves a rate-limited warning, not an operator's alarm);
- per partition, both replicas' state hashes agree once quiescent;
- the bank total is unchanged (sequenced ``bank.total`` and, per replica, the sum of
  replica-pinned ``bank.balance`` reads), and every acknowledged transfer is there:
  each account's balance equals the client-side ledger of acknowledged transfers
  (accounts touched by an outcome-unknown call are reported, not compared);
- the command log holds no call that had to be rejected, no (client, request) pair
  twice, and no batch above ``limits.batch_bytes_max``;
- a reused (client_id, req_id) with other arguments gets ``request_id_reused`` and
  request kinds True / 1.0 are refused (probes after the flood);
- the sequencer's RSS peaks under ``--rss-max-mb`` and is at most
  ``--rss-after-max-mb`` once the flood is over (what it keeps, not what it used);
- the good client's p99 during the flood is within ``--p99-ratio-max`` x idle (its
  first ``--warmup`` second is not measured), and every one of its calls is answered.

It also records CPU use (machine and per process) in both phases, p99.9 and maximum
latencies with the slowest calls, and when the heaviest hostile messages were sent
(marked on the plot), to tell a stall caused by the cluster from a busy machine.

Exit status 1 if any check fails (every figure is still printed and written).
Message kinds named with ``--skip`` are left out (e.g. to measure the rest while one
known defect stops the sequencer). A default run takes about a minute:

    .venv/bin/python scripts/fuzz_cluster.py
    .venv/bin/python scripts/fuzz_cluster.py --duration 60 --messages 20000 --seed 7
    .venv/bin/python scripts/fuzz_cluster.py --attach ordo-data      # a running cluster
    .venv/bin/python scripts/fuzz_cluster.py --skip logsvc_junk,results_junk

Integers past uint64 (2**64, 2**70, -2**63-1) cannot be encoded in msgpack at all, so
on the wire they are stood in for by floats and by truncated int headers.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402
import zmq  # noqa: E402
from bench_outputs import BenchParser, wrote  # noqa: E402

from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import LocalCluster, free_base_port, is_quiescent  # noqa: E402
from cluster.load_background import Background  # noqa: E402
from cluster.load_raw import PUSH, RawChannel  # noqa: E402
from cluster.load_shapes import Call, CallLike, ClosedLoop  # noqa: E402
from cluster.loadgen import TIMEOUT_CODE, LoadGenerator  # noqa: E402
from cluster.measure import percentiles  # noqa: E402
from sequencer.log import iter_frames  # noqa: E402
from txn_library import limits  # noqa: E402
from txn_library.client import Client  # noqa: E402
from txn_library.client.protocol import Result, to_outcome  # noqa: E402
from txn_library.errors import ABORTED, ERROR, OK, CallFailed, OrdoError  # noqa: E402
from txn_library.wire import partition as ewire  # noqa: E402
from txn_library.wire import sequencer as wire  # noqa: E402

# Client ids: calls from "fzx-" clients must all be rejected (never logged); calls from
# "fzv-" clients may be valid and logged. Every kv key a flooder writes starts "fz/".
REJECT_PREFIX = b"fzx-"
VALID_PREFIX = b"fzv-"
LOCALHOST = "tcp://127.0.0.1:"

# Message kinds. Fixed ones send this many in total whatever --messages says; the
# weighted ones share the rest of --messages.
FIXED_TOTALS: dict[str, int] = {
    "oversized_1mib": 48,  # just under, at, just over request_bytes_max
    "oversized_multi_mb": 4,  # 2, 4, 8 MB and one past frame_bytes_hard_max
    "bad_call_frames": 40,  # 10,000 (or 10,001) bad calls in one frame
    "big_put": 60,  # ~0.9 MB kv.put, in one burst per flooder at 25% of the flood
    "big_get": 300,  # kv.get of those values: answers cached for retries
    "overflow_write": 8,  # valid calls whose writes leave int64/uint64, at 85%
    "limit_accounts": 4,  # bank.open of 10,000 accounts (the per-call maximum)
}
WEIGHTS: dict[str, int] = {
    "garbage": 14,
    "wrong_shape": 14,
    "bad_kind": 8,
    "calls_arity": 5,
    "call_fields": 8,
    "unknown_proc": 6,
    "wrong_args": 10,
    "int_bounds": 8,
    "deep_nesting": 4,
    "dup_req_ids": 2,
    "reused_req_id": 3,
    "prune_junk": 2,
    "multi_frame": 3,
    "results_junk": 5,
    "partition_junk": 5,
    "logsvc_junk": 3,
}
TARGET_OF: dict[str, str] = {"results_junk": "results", "partition_junk": "partition"}
TARGET_OF["logsvc_junk"] = "logsvc"
MOMENTS: dict[str, tuple[float, float]] = {  # kind -> (from, to) fraction of the flood
    "big_put": (0.25, 0.25),
    "big_get": (0.30, 0.95),
    "overflow_write": (0.85, 0.85),
}
ALL_KINDS = [*FIXED_TOTALS, *WEIGHTS]
# Kinds whose send times are marked on the plot (to line stalls up with causes).
NOTABLE = ("oversized_multi_mb", "bad_call_frames", "big_put", "overflow_write", "limit_accounts")

INT_EDGES = limits.edge_values()  # msgpack int edges, every bound -1/0/+1
# Stand-ins for ints msgpack cannot carry (2**64, 2**70, -2**63-1).
PAST_UINT64 = (2.0**63, 2.0**64, 2.0**70, -(2.0**63) - 2048.0, 1e300)
FLOAT_EDGES = (0.0, -0.0, math.nan, math.inf, -math.inf, 1e308, 5e-324, 0.5, *PAST_UINT64)
# Truncated int headers, and ext -1 (timestamps) with a bad and a good length.
RAW_ODDITIES = (
    b"\xcf\xff\xff",
    b"\xd3\x80",
    b"\xcd",
    b"\xce\x00\x00\x00",
    b"\xc7\x05\xff\x00\x00\x00\x00\x00",
    b"\xd6\xff\x00\x00\x00\x01",
)


# Raw msgpack building ---------------------------------------------------------
def P(obj: Any) -> bytes:
    """msgpack bytes of obj."""
    return msgpack.packb(obj)


def arr(*items: bytes) -> bytes:
    """A msgpack array of already-encoded items (so an item may be hand-made bytes)."""
    n = len(items)
    if n < 16:
        head = bytes([0x90 | n])
    elif n < 1 << 16:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    return head + b"".join(items)


def nested(depth: int) -> bytes:
    """[[[...[0]...]]] nested ``depth`` deep (msgpack.packb refuses such depths)."""
    return b"\x91" * depth + b"\x00"


def calls_frame(client_id: Any, calls: list[Any], kind: Any = wire.REQ_CALLS) -> bytes:
    return P([kind, client_id, calls])


def sized_frame(client_id: bytes, req_id: int, proc: str, size: int) -> bytes:
    """A one-call frame of exactly ``size`` bytes (the call's one argument pads it)."""
    pad = max(0, size - 64)
    for _ in range(3):
        frame = calls_frame(client_id, [[req_id, proc, ["x" * pad]]])
        if len(frame) == size:
            return frame
        pad += size - len(frame)
    return frame


# Hostile message generators (one per kind) ---------------------------------------
@dataclass
class Gen:
    """What a generator may use: randomness, the flooder's identity, the good range."""

    rng: random.Random
    flooder: int
    first_account: int
    accounts: int
    partitions: list[str]
    n: int = 0  # messages generated so far (fresh req ids, unique keys)
    big_puts: int = 0
    reuse: dict[int, int] = field(default_factory=dict)

    def cid(self, kind: str, valid: bool) -> bytes:
        prefix = VALID_PREFIX if valid else REJECT_PREFIX
        return prefix + f"{kind}-{self.flooder}".encode()

    def req(self) -> int:
        self.n += 1
        return self.n

    def account(self) -> int:
        """An account id outside the good client's range (hostile calls never touch it)."""
        while True:
            v = self.rng.choice(
                (*INT_EDGES, 2**62 + self.rng.randrange(1 << 20), -self.rng.randrange(1, 1 << 40))
            )
            if not self.first_account <= v < self.first_account + self.accounts:
                return v

    def junk(self, depth: int = 0) -> Any:
        """A random msgpack-encodable value: edge numbers, strings, bytes, ext, nesting."""
        rng = self.rng
        r = rng.random()
        if depth >= 4 or r < 0.6:
            pick = rng.randrange(10)
            if pick < 3:
                return rng.choice(INT_EDGES)
            if pick == 3:
                return rng.choice(FLOAT_EDGES)
            if pick == 4:
                return "".join(
                    chr(rng.choice((65, 0, 0x7F, 0xE9, 0x4E2D, 0x1F600)))
                    for _ in range(rng.randrange(12))
                )
            if pick == 5:
                return rng.randbytes(rng.choice((0, 1, 16, 300)))
            if pick == 6:
                return rng.choice((None, True, False))
            if pick == 7:
                return msgpack.ExtType(
                    rng.randrange(128), rng.randbytes(rng.choice((0, 1, 4, 8, 12)))
                )
            if pick == 8:
                return rng.choice(("kv.put", "bank.transfer", "__result__", "", "kv.get\x00"))
            return rng.choice(
                (
                    wire.REQ_CALLS,
                    wire.REQ_CALLS_UNORDERED,
                    wire.REQ_STATUS,
                    wire.REQ_PRUNE,
                    ewire.MSG_READS,
                )
            )
        if r < 0.85:
            return [self.junk(depth + 1) for _ in range(rng.randrange(6))]
        if rng.random() < 0.5:
            return {
                str(self.junk(depth + 1))[:20]: self.junk(depth + 1)
                for _ in range(rng.randrange(4))
            }
        return {rng.choice((1, 2.5, None, b"k")): self.junk(depth + 1)}  # non-str keys

    def bad_arg(self, want: type) -> Any:
        """A value that is not of type ``want`` (bool counts as not int)."""
        while True:
            v = self.rng.choice(
                ("1", b"1", True, None, 1.5, math.nan, [1], {"a": 1}, *PAST_UINT64, self.junk())
            )
            if type(v) is not want:
                return v


def g_garbage(g: Gen) -> list[bytes]:
    rng = g.rng
    data = rng.randbytes(rng.choice((0, 1, 2, 7, 64, 512, 4096)))
    if rng.random() < 0.3:
        data = rng.choice(RAW_ODDITIES) + data
    return [data]


def g_wrong_shape(g: Gen) -> list[bytes]:
    rng = g.rng
    shapes: list[Any] = [
        g.junk(),
        [],
        [wire.REQ_CALLS],
        {"kind": wire.REQ_CALLS},
        [wire.REQ_CALLS, g.cid("wrong_shape", False), "not calls"],
        [wire.REQ_CALLS, g.cid("wrong_shape", False), {"a": 1}],
        [wire.REQ_CALLS, g.junk(), [[g.req(), "kv.put", ["fz/shape", 1]]]],
        [wire.REQ_CALLS, b"x" * 65, [[g.req(), "kv.put", ["fz/shape", 1]]]],
        [wire.REQ_CALLS, "str-client", [[g.req(), "kv.put", ["fz/shape", 1]]]],
        [wire.REQ_STATUS, g.junk(), g.junk()],
        [[wire.REQ_CALLS], g.junk()],
    ]
    return [P(rng.choice(shapes))]


def g_bad_kind(g: Gen) -> list[bytes]:
    kind = g.rng.choice((True, 1.0, "1", b"\x01", 99, -1, 0, 2**64 - 1, None, [1], False))
    call = [g.req(), "kv.put", [f"fz/kind/{g.flooder}", g.n]]
    return [calls_frame(g.cid("bad_kind", False), [call], kind=kind)]


def g_calls_arity(g: Gen) -> list[bytes]:
    cid = g.cid("calls_arity", False)
    call = [g.req(), "kv.put", ["fz/arity", 1]]
    msg = g.rng.choice(
        (
            [wire.REQ_CALLS, cid],
            [wire.REQ_CALLS, cid, [call], g.junk()],
            [wire.REQ_CALLS, cid, [call], None],
            [wire.REQ_CALLS, cid, [call], 1, 2],
            [wire.REQ_CALLS_UNORDERED, cid],
            [wire.REQ_CALLS_UNORDERED, cid, [call], 1],
        )
    )
    return [P(msg)]


def g_call_fields(g: Gen) -> list[bytes]:
    r = g.req()
    args = [f"fz/fields/{g.flooder}", 1]
    bad_replica = g.rng.choice((2, 5, -1, "0", 1.0, True, b"\x00", [0], 2**64 - 1))
    call = g.rng.choice(
        (
            [],
            [r],
            [r, "kv.put"],
            [r, "kv.put", args, bad_replica],
            [r, "kv.put", args, 0, "extra"],
            [r, "kv.put", args, 0, 1, 2],
            g.junk(),
            "kv.put",
            [True, "kv.put", args],
            [1.0, "kv.put", args],
            [None, "kv.put", args],
            [2.0**64, "kv.put", args],
        )
    )
    return [calls_frame(g.cid("call_fields", False), [call])]


def g_unknown_proc(g: Gen) -> list[bytes]:
    name = g.rng.choice(
        (
            "no.such",
            "",
            "kv.put\x00",
            "KV.PUT",
            "__result__",
            "x" * 10_000,
            17,
            b"kv.put",
            None,
            ["kv.put"],
            True,
            "tpcc.no_such",
        )
    )
    return [calls_frame(g.cid("unknown_proc", False), [[g.req(), name, [1, 2, 3]]])]


def g_wrong_args(g: Gen) -> list[bytes]:
    rng = g.rng
    i, t = (lambda: g.bad_arg(int)), (lambda: g.bad_arg(str))  # noqa: E731
    choices: list[tuple[str, Any]] = [
        ("bank.transfer", [i(), 1, 1]),
        ("bank.transfer", [1, i(), 1]),
        ("bank.transfer", [1, 2, i()]),
        ("bank.transfer", [1, 2]),
        ("bank.transfer", [1, 2, 3, 4]),
        ("bank.transfer", [1, 2, 0]),
        ("bank.transfer", [1, 2, -5]),
        ("bank.open", [i(), 1, 1]),
        ("bank.open", [-1, 1, 1]),
        ("bank.balance", [i()]),
        ("kv.put", [t(), 1]),
        ("kv.put", ["x" * 1025, 1]),
        ("kv.put", ["fz/args"]),
        ("kv.get", [t()]),
        ("kv.add", ["fz/args", i()]),
        ("kv.add", ["fz/args", 2.0**70]),
        ("kv.put", list(range(limits.args_per_call_max + 1))),
        ("kv.put", 5),
        ("kv.put", "ab"),
        ("kv.put", {"key": "k"}),
        ("kv.put", None),
        ("tpcc.new_order", [i(), i()]),
    ]
    name, args = rng.choice(choices)
    return [calls_frame(g.cid("wrong_args", False), [[g.req(), name, args]])]


def g_int_bounds(g: Gen) -> list[bytes]:
    rng = g.rng
    edge = lambda: rng.choice(INT_EDGES)  # noqa: E731
    count = rng.choice((0, -1, 1, 2, limits.calls_per_frame_max + 1, 2**63 - 1, 2**64 - 1))
    first = rng.choice((2**63 - 1, 2**63 - 2, 2**62 + g.n, -1, -(2**63), 2**63, 2**64 - 1))
    choices: list[tuple[str, list[Any]]] = [
        ("bank.transfer", [g.account(), g.account(), edge()]),
        ("bank.transfer", [g.account(), g.account(), rng.choice(PAST_UINT64)]),
        ("bank.balance", [g.account()]),
        ("bank.open", [first, count, edge()]),
        ("kv.add", [f"fz/int/{g.flooder}/{g.n}", edge()]),
        ("kv.put", [f"fz/int/{g.flooder}/{g.n}", edge()]),
        ("kv.get", ["k" * rng.choice((1023, 1024, 1025))]),
    ]
    name, args = rng.choice(choices)
    if name == "bank.open" and isinstance(args[0], int) and isinstance(args[1], int):
        lo, hi = args[0], args[0] + args[1]
        if lo < g.first_account + g.accounts and hi > g.first_account:
            args[0] = 2**62 + g.n  # never open inside the good range
    return [calls_frame(g.cid("int_bounds", True), [[g.req(), name, args]])]


def g_deep_nesting(g: Gen) -> list[bytes]:
    rng = g.rng
    d = nested(rng.choice((100, 1000, 1024, 1025, 10_000)))
    cx, cv = P(g.cid("deep_nesting", False)), P(g.cid("deep_nesting_value", True))
    r, kv = P(g.req()), P("kv.put")
    placements = [
        d,
        arr(d, cx, P([])),
        arr(P(wire.REQ_CALLS), d, P([])),
        arr(P(wire.REQ_CALLS), cx, d),
        arr(P(wire.REQ_CALLS), cx, arr(d)),
        arr(P(wire.REQ_CALLS), cx, arr(arr(d, kv, P(["fz/deep", 1])))),
        arr(P(wire.REQ_CALLS), cx, arr(arr(r, d, P([])))),
        arr(P(wire.REQ_CALLS), cx, arr(arr(r, kv, d))),
        arr(P(wire.REQ_CALLS), cx, arr(arr(r, P("bank.transfer"), arr(d, P(1), P(1))))),
        arr(P(wire.REQ_CALLS), cv, arr(arr(r, kv, arr(P(f"fz/deep/{g.flooder}"), d)))),
        arr(P(wire.REQ_PRUNE), d),
    ]
    return [rng.choice(placements)]


def g_oversized_1mib(g: Gen) -> list[bytes]:
    m = limits.request_bytes_max
    size = g.rng.choice((m - 1000, m - 1, m, m + 1, m + 1000))
    return [sized_frame(g.cid("oversized_1mib", False), g.req(), "fz.no.such", size)]


def g_oversized_multi_mb(g: Gen) -> list[bytes]:
    sizes = (2 << 20, 4 << 20, 8 << 20, limits.frame_bytes_hard_max + (1 << 20))
    size = sizes[g.n % len(sizes)] if g.flooder == 0 else sizes[g.flooder % len(sizes)]
    g.n += 1
    return [sized_frame(g.cid("oversized_multi_mb", False), g.req(), "kv.put", size)]


def g_bad_call_frames(g: Gen) -> list[bytes]:
    rng = g.rng
    n = rng.choice((limits.calls_per_frame_max, limits.calls_per_frame_max + 1))
    base = g.n * 100_000
    g.n += 1
    shapes = (
        lambda i: [base + i, "bank.transfer", ["a", "b", "c"]],
        lambda i: [base + i, "no.such", []],
        lambda i: [base + i],
        lambda i: [base + i, "kv.put", [i]],
        lambda i: [base + i, "bank.open", [-1, 0, -1]],
    )
    make = rng.choice(shapes)
    return [calls_frame(g.cid("bad_call_frames", False), [make(i) for i in range(n)])]


def g_big_put(g: Gen) -> list[bytes]:
    key = f"fz/big/{g.flooder}/{g.big_puts}"
    g.big_puts += 1
    value = g.rng.randbytes(900_000)
    return [calls_frame(g.cid("big", True), [[g.req(), "kv.put", [key, value]]])]


def g_big_get(g: Gen) -> list[bytes]:
    key = f"fz/big/{g.flooder}/{g.rng.randrange(max(1, g.big_puts))}"
    return [calls_frame(g.cid("big", True), [[g.req(), "kv.get", [key]]])]


def g_overflow_write(g: Gen) -> list[bytes]:
    top = 2**63 - 1
    if g.n % 2 == 0:
        key = f"fz/ovf/{g.flooder}"
        calls = [[g.req(), "kv.add", [key, top]] for _ in range(3)]
        calls += [[g.req(), "kv.add", [key + "-", -(2**63)]] for _ in range(2)]
    else:
        a = 2**62 + (1 << 40) + 8 * g.flooder
        calls = [
            [g.req(), "bank.open", [a, 3, top]],
            [g.req(), "bank.transfer", [a, a + 1, top]],
            [g.req(), "bank.transfer", [a + 2, a + 1, top]],
        ]
    return [calls_frame(g.cid("overflow_write", True), calls)]


def g_limit_accounts(g: Gen) -> list[bytes]:
    first = 10**15 + g.flooder * 10**6 + g.n * 10**4
    g.n += 1
    call = [g.req(), "bank.open", [first, 10_000, 1]]
    return [calls_frame(g.cid("limit_accounts", True), [call])]


def g_dup_req_ids(g: Gen) -> list[bytes]:
    r = g.req()
    k = g.rng.choice((2, 3, 50))
    calls = [[r, "kv.put", [f"fz/dup/{g.flooder}/{r}", i]] for i in range(k)]
    return [calls_frame(g.cid("dup_req_ids", True), calls)]


def g_reused_req_id(g: Gen) -> list[bytes]:
    r = g.rng.randrange(1, 21)  # a small pool: most sends reuse an id with new arguments
    g.reuse[r] = g.reuse.get(r, 0) + 1
    call = [r, "kv.put", [f"fz/reuse/{g.flooder}/{r}", g.reuse[r]]]
    return [calls_frame(g.cid("reused_req_id", True), [call])]


def g_prune_junk(g: Gen) -> list[bytes]:
    arg = g.rng.choice((5, -1, 1.5, b"/tmp", ["a"], {"a": 1}, True, "\x00", "a\x00b", g.junk()))
    if arg is None or (isinstance(arg, str) and "\x00" not in arg):
        arg = 5  # never a real path, never None (a real prune)
    msg = g.rng.choice(([wire.REQ_PRUNE, arg], [wire.REQ_PRUNE], [wire.REQ_PRUNE, arg, arg]))
    return [P(msg)]


def g_multi_frame(g: Gen) -> list[bytes]:
    good = calls_frame(g.cid("multi_frame", False), [[g.req(), "kv.put", ["fz/multi", 1]]])
    return g.rng.choice(
        ([good, b"junk"], [b"", b""], [good, good], [b"x", good, b"y"], [P([wire.REQ_STATUS]), b""])
    )


def g_results_junk(g: Gen) -> list[bytes]:
    """Messages a validating sequencer must drop: bad types, ranges or shapes, never a
    well-typed message impersonating a real partition (no authentication exists)."""
    rng = g.rng
    st_bad = rng.choice(((1, 2, 3), ("x",) * 13, (g.junk(),) * 13, 5, None, (-1,) * 13))
    ok_status = (0, 0, 0, 0, 0, 0, 0, 0, False, 0, 0, 0, 0)
    msgs: list[Any] = [
        g.junk(),
        [ewire.MSG_RESULTS],
        [ewire.MSG_RESULTS, 0, 0, [], []],
        [ewire.MSG_RESULTS, "x", 0, [], [], ok_status],
        [ewire.MSG_RESULTS, 0, "y", [], [], ok_status],
        [ewire.MSG_RESULTS, 99, 0, [], [], ok_status],
        [ewire.MSG_RESULTS, 0, -1, [], [], ok_status],
        [ewire.MSG_RESULTS, True, 0, [], [], ok_status],
        [ewire.MSG_RESULTS, 0, 0, [], [], st_bad],
        [ewire.MSG_RESULTS, 0, 0, [[1, 2]], [], st_bad],
        [ewire.MSG_RESULTS, 0, 0, "junk", [], st_bad],
        [ewire.MSG_RESULTS, 0, 0, [["x", 0, 1]], [[-5, 0]], st_bad],
        [ewire.MSG_RESULTS, 0, 0, [[-7, 0, None]], [[-9, 0, 0, None]], st_bad],
    ]
    if rng.random() < 0.2:
        return [rng.randbytes(rng.choice((0, 3, 100)))]
    if rng.random() < 0.1:
        return [P(rng.choice(msgs)), b"second frame"]
    return [P(rng.choice(msgs))]


def g_partition_junk(g: Gen) -> list[bytes]:
    """Junk a partition must drop: bad kinds, types and shapes; never a well-formed read
    from a real peer or a query whose answer could reach a real client."""
    rng = g.rng
    bad_from = rng.choice(("x", -1, 99, None, [0], 2**64 - 1, 1.5, True))
    txn = rng.choice((0, 1, 2**31, 2**62, -1, "x", None, 1.5))
    msgs: list[Any] = [
        g.junk(),
        [ewire.MSG_READS],
        [ewire.MSG_READS, bad_from, [[txn, [], []]]],
        [ewire.MSG_READS, rng.choice((0, 1)), [[txn, "x", 5]]],
        [ewire.MSG_READS, rng.choice((0, 1)), [["x", [], []]]],
        [ewire.MSG_READS, rng.choice((0, 1)), "entries"],
        [ewire.MSG_READS, rng.choice((0, 1)), [[1, 2]]],
        [ewire.MSG_QUERY, 0, [[-1 - g.n, 0, "kv.get", ["k"], "x"]]],
        [ewire.MSG_QUERY, 0, [[-1 - g.n, 0, "kv.get", g.junk(), 0]]],
        [ewire.MSG_QUERY, 0, [[-1 - g.n, 0, g.junk(), ["k"], 0]]],
        [ewire.MSG_QUERY, 0, [[-1 - g.n, 0, "__result__", g.junk(), 0]]],
        [ewire.MSG_QUERY, 0, [[-1 - g.n, 0, "kv.get", ["k"], 2.0**70]]],
        [ewire.MSG_QUERY, 0, "queries"],
        [ewire.MSG_QUERY, 0, [g.junk()]],
        [ewire.MSG_STATUS_REQUEST],
        [ewire.MSG_RESEND, bad_from, g.junk()],
        [ewire.MSG_RESEND_GAP, bad_from, g.junk()],
        [77, 1, 2],
    ]
    if rng.random() < 0.2:
        return [rng.randbytes(rng.choice((0, 3, 100)))]
    if rng.random() < 0.1:
        return [P(rng.choice(msgs)), b"second frame"]
    return [P(rng.choice(msgs))]


def g_logsvc_junk(g: Gen) -> list[bytes]:
    rng = g.rng
    msgs: list[Any] = [
        g.junk(),
        [wire.LOG_FETCH],
        [wire.LOG_FETCH, "x", 1],
        [wire.LOG_FETCH, 1, None],
        [wire.LOG_FETCH, 1.5, 2.5],
        [wire.LOG_FETCH, 5, 1],
        [wire.LOG_FETCH, -5, 3],
        [wire.LOG_FETCH, 0, 2**64 - 1],
        [wire.LOG_FETCH, 2**63 - 1, 2**63 - 1],
        [wire.LOG_FETCH, 1, 2, 3],
        [wire.LOG_BATCHES, [], 0],
        [99, 1, 2],
    ]
    if rng.random() < 0.2:
        return [rng.randbytes(rng.choice((0, 3, 100)))]
    if rng.random() < 0.15:
        return [P(rng.choice(msgs)), b"second frame"]
    return [P(rng.choice(msgs))]


GENERATORS: dict[str, Callable[[Gen], list[bytes]]] = {
    "garbage": g_garbage,
    "wrong_shape": g_wrong_shape,
    "bad_kind": g_bad_kind,
    "calls_arity": g_calls_arity,
    "call_fields": g_call_fields,
    "unknown_proc": g_unknown_proc,
    "wrong_args": g_wrong_args,
    "int_bounds": g_int_bounds,
    "deep_nesting": g_deep_nesting,
    "oversized_1mib": g_oversized_1mib,
    "oversized_multi_mb": g_oversized_multi_mb,
    "bad_call_frames": g_bad_call_frames,
    "big_put": g_big_put,
    "big_get": g_big_get,
    "overflow_write": g_overflow_write,
    "limit_accounts": g_limit_accounts,
    "dup_req_ids": g_dup_req_ids,
    "reused_req_id": g_reused_req_id,
    "prune_junk": g_prune_junk,
    "multi_frame": g_multi_frame,
    "results_junk": g_results_junk,
    "partition_junk": g_partition_junk,
    "logsvc_junk": g_logsvc_junk,
}


# Flood plan -------------------------------------------------------------------
def plan(messages: int, flooders: int, skip: set[str], seed: int) -> list[list[tuple[float, str]]]:
    """Per flooder: (time as a fraction of the flood, kind), sorted by time."""
    rng = random.Random(seed)
    fixed = {k: v for k, v in FIXED_TOTALS.items() if k not in skip}
    weights = {k: w for k, w in WEIGHTS.items() if k not in skip}
    rest = max(0, messages - sum(fixed.values()))
    totals = dict(fixed)
    wsum = sum(weights.values()) or 1
    for k, w in weights.items():
        totals[k] = math.ceil(rest * w / wsum)
    out: list[list[tuple[float, str]]] = [[] for _ in range(flooders)]
    for kind, total in totals.items():
        for f in range(flooders):
            share = total // flooders + (1 if f < total % flooders else 0)
            lo, hi = MOMENTS.get(kind, (0.0, 1.0))
            out[f].extend((rng.uniform(lo, hi), kind) for _ in range(share))
    for sched in out:
        sched.sort()
    return out


@dataclass
class FloodReport:
    sent: Counter = field(default_factory=Counter)
    sent_bytes: Counter = field(default_factory=Counter)
    not_sent: Counter = field(default_factory=Counter)  # send buffer full or time up
    replies: dict[str, Counter] = field(default_factory=dict)
    cpu_s: float = 0.0  # CPU the flooder processes used
    moments: list[tuple[float, str]] = field(default_factory=list)  # (s into flood, kind)

    def merge(self, other: dict) -> None:
        self.sent.update(other["sent"])
        self.sent_bytes.update(other["sent_bytes"])
        self.not_sent.update(other["not_sent"])
        self.cpu_s += other.get("cpu_s", 0.0)
        self.moments.extend(tuple(m) for m in other.get("moments", ()))  # type: ignore[misc]
        for kind, c in other["replies"].items():
            self.replies.setdefault(kind, Counter()).update(c)


def _reply_labels(frame: bytes) -> Iterator[str]:
    try:
        kind, body = wire.unpack(frame)[:2]
    except Exception:  # our own tally of someone else's reply: anything unexpected counts
        yield "undecodable"
        return
    if kind != wire.REP_RESULTS:
        names = {
            wire.REP_STATUS: "status",
            wire.REP_OK: "control_ok",
            wire.REP_ERROR: "control_error",
        }
        yield names.get(kind, f"kind_{kind}")
        return
    for item in body:
        req_id, status, value = item
        if status == ERROR:
            code = value[0] if isinstance(value, tuple) and value else "?"
            yield f"{'frame_' if req_id is None else ''}error:{code}"
        else:
            yield {OK: "ok", ABORTED: "aborted"}.get(status, f"status_{status}")


def _check_local(addr: str) -> str:
    if not addr.startswith(LOCALHOST):
        raise SystemExit(f"refusing to send anywhere but 127.0.0.1: {addr}")
    return addr


def flooder_main(spec: dict, go: Any, out_q: Any) -> None:
    """One flooder process: its own raw channel (context and sockets, cluster.load_raw)
    playing its share of the schedule, paced and bounded."""
    rng = random.Random(spec["seed"])
    g = Gen(rng, spec["index"], spec["first_account"], spec["accounts"], spec["partitions"])
    schedule: list[tuple[float, str]] = [tuple(x) for x in spec["schedule"]]  # type: ignore[misc]
    replies: dict[str, Counter] = {}
    chan = RawChannel()

    def socket_key(kind: str) -> str:
        target = TARGET_OF.get(kind, "client")
        if target == "partition":
            return f"partition:{rng.randrange(len(spec['partitions']))}"
        return kind if target in ("client", "logsvc") else target

    def open_socket(key: str) -> None:
        if key.startswith("partition:"):
            chan.open(key, _check_local(spec["partitions"][int(key.split(":")[1])]), PUSH)
        elif key == "results":
            chan.open(key, _check_local(spec["results"]), PUSH)
        else:
            target = TARGET_OF.get(key, "client")
            chan.open(key, _check_local(spec["logsvc"] if target == "logsvc" else spec["client"]))

    def message(kind: str) -> tuple[str, list[bytes]]:
        frames = GENERATORS[kind](g)
        return socket_key(kind), frames

    def tally(key: str, frame: bytes) -> None:
        counts = replies.setdefault(key, Counter())
        for label in _reply_labels(frame):
            counts[label] += 1

    kinds = {k for _t, k in schedule}
    for kind in kinds:  # connect everything before the flood starts
        if TARGET_OF.get(kind) == "partition":
            for i in range(len(spec["partitions"])):
                open_socket(f"partition:{i}")
        else:
            open_socket(socket_key(kind))
    out_q.put(("ready", spec["index"]))
    go.wait()
    played = chan.play(schedule, spec["duration_s"], message, tally, marked=NOTABLE)
    out_q.put(
        (
            "done",
            {
                "sent": dict(played.sent),
                "sent_bytes": dict(played.sent_bytes),
                "not_sent": dict(played.not_sent),
                "replies": {k: dict(c) for k, c in replies.items() if c},
                "cpu_s": time.process_time(),
                "moments": played.marked,
            },
        )
    )
    chan.close()


# The well-behaved client ---------------------------------------------------------
@dataclass
class Sample:
    t_s: float  # when the call was sent, seconds since the run started
    latency_ms: float
    outcome: str  # ok, aborted, an error code, or timeout


class GoodClient:
    """Closed-loop transfers between random good accounts (cluster.loadgen: one terminal
    per call in flight, one client identity), with a ledger of the acknowledged ones and
    the accounts touched by calls of unknown outcome. ``t0``: time.perf_counter of the
    run's start."""

    def __init__(
        self, addr: str, first: int, n: int, concurrency: int, seed: int, t0: float
    ) -> None:
        self.first, self.n, self.t0 = first, n, t0
        self.delta: Counter = Counter()  # account -> net change from acknowledged transfers
        self.uncertain: set[int] = set()  # touched by a call whose outcome is unknown
        self.samples: list[Sample] = []  # appended on the load's thread, read after stop
        self.ok_transfers = 0
        rngs = [random.Random(seed * 1000 + i) for i in range(concurrency)]

        def transfer(terminal: int) -> Call:
            rng = rngs[terminal]
            src, dst = (first + a for a in rng.sample(range(n), 2))
            return Call("bank.transfer", (src, dst, rng.randint(1, 50)), "transfer")

        self._load = Background(
            lambda source: LoadGenerator(
                addr, source, ClosedLoop(terminals=concurrency), timeout_s=15.0, retry_s=2.0
            ),
            transfer,
        )

    def start(self) -> None:
        self._load.start(on_answer=self._answered)

    def stop(self) -> None:
        self._load.stop(timeout_s=30)

    def _answered(
        self, _t: int, call: CallLike, status: int, value: Any, sent: float, answered: float
    ) -> None:
        src, dst, amount = call.args
        outcome = to_outcome(status, value, answered - sent)
        applied, unknown = False, False
        if isinstance(outcome, Result):
            applied = outcome.ok
            label = "ok" if outcome.ok else "aborted"
        elif isinstance(outcome, CallFailed):  # not executed, unless "unavailable" or timeout
            label = outcome.code
            unknown = outcome.code in ("unavailable", TIMEOUT_CODE)
        else:  # Overloaded: not executed
            label = type(outcome).__name__
        self.samples.append(Sample(sent - self.t0, (answered - sent) * 1000.0, label))
        if applied:
            self.ok_transfers += 1
            self.delta[src] -= amount
            self.delta[dst] += amount
        elif unknown:
            self.uncertain.update((src, dst))


# Observing the cluster ---------------------------------------------------------------
def proc_status_kb(pid: int, field_name: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds a process has used (from /proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, in clock ticks."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


@dataclass
class CpuSnapshot:
    at: float
    machine: tuple[int, int]
    procs: dict[str, float | None]
    own: float

    @classmethod
    def take(cls, pids: dict[str, int]) -> CpuSnapshot:
        t = os.times()
        return cls(
            time.monotonic(),
            machine_jiffies(),
            {name: cpu_s(pid) for name, pid in pids.items()},
            t.user + t.system,
        )


def cpu_use(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, Any]:
    """CPU shares between two snapshots: the machine's busy share, and each process's
    share of one core (so 1.0 = one core busy the whole time)."""
    wall = max(b.at - a.at, 1e-9)
    busy, total = (b.machine[0] - a.machine[0]), (b.machine[1] - a.machine[1])
    out: dict[str, Any] = {
        "seconds": round(wall, 1),
        "machine_busy_share": round(busy / max(total, 1), 3),
        "this_script_cores": round((b.own - a.own) / wall, 3),
    }
    for name, before in a.procs.items():
        after = b.procs.get(name)
        if before is not None and after is not None:
            out[f"{name}_cores"] = round((after - before) / wall, 3)
    return out


def find_sequencer_pid(data_dir: str) -> int | None:
    """The pid of ``python -m cluster.cli sequencer --data-dir data_dir`` (attach mode)."""
    want = Path(data_dir).resolve()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            cwd = (d / "cwd").resolve()
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "cluster.cli" in args and "sequencer" in args and "--data-dir" in args:
            i = args.index("--data-dir") + 1
            if i < len(args) and (cwd / args[i]).resolve() == want:
                return int(d.name)
    return None


def status_once(addr: str, timeout_s: float = 3.0) -> dict | None:
    """A fresh client per request: a status lost to a bug must not shift the next one."""
    try:
        with Client(addr, timeout_s=timeout_s) as c:
            return c.status(timeout_s=timeout_s)
    except OrdoError:
        return None


def wait_settled(cfg: ClusterConfig, timeout_s: float) -> tuple[dict | None, str]:
    """Like cluster.launcher.wait_quiescent, but keeps going (and says why) when the
    status is unavailable or lists partitions that do not exist."""
    deadline = time.monotonic() + timeout_s
    why = "no status"
    prev: list[str] | None = None
    while time.monotonic() < deadline:
        st = status_once(cfg.client_addr)
        if st is None:
            why = "status request unanswered"
            time.sleep(0.5)
            continue
        parts = real_partitions(cfg, st)
        settled = is_quiescent(st, parts, cfg.replicas, cfg.partitions)
        hashes = [p["state_hash"] for p in parts]
        if settled and hashes == prev:
            return st, "quiescent"
        prev = hashes if settled else None
        why = (
            f"not quiescent: epoch {st['epoch']}, pending {st['pending']}, partitions "
            + ", ".join(
                f"r{p['replica']}p{p['partition']}@{p['last_epoch']}"
                f"{' down' if p['down'] else ''}{' active' if p['active'] else ''}"
                for p in parts
            )
        )
        time.sleep(0.3)
    return None, why


def real_partitions(cfg: ClusterConfig, st: dict) -> list[dict]:
    return [
        p
        for p in st.get("partitions", [])
        if p["replica"] in range(cfg.replicas) and p["partition"] in range(cfg.partitions)
    ]


def log_sizes(logs_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(logs_dir.glob("*.log"))}


def new_log_findings(logs_dir: Path, since: dict[str, int]) -> dict[str, dict[str, int]]:
    """Tracebacks and loud lines each cluster log gained since ``since``."""
    out: dict[str, dict[str, int]] = {}
    for p in sorted(logs_dir.glob("*.log")):
        with open(p, "rb") as f:
            f.seek(since.get(p.name, 0))
            text = f.read().decode(errors="replace")
        counts = {
            "tracebacks": text.count("Traceback (most recent call last)"),
            "critical": text.count(" CRITICAL "),
            "error_lines": text.count(" ERROR "),
            "warning_lines": text.count(" WARNING "),
        }
        if any(counts.values()):
            out[p.name] = counts
    return out


def scan_log(cfg: ClusterConfig) -> dict:
    """What the command log holds: rejected-kind calls, duplicates, batch sizes."""
    rejected: Counter = Counter()
    seen: set[tuple[bytes, Any]] = set()
    twice: list[str] = []
    batch_max = 0
    over = 0
    epochs = 0
    error = None
    try:
        for _epoch, data in iter_frames(cfg.log_dir):
            epochs += 1
            batch_max = max(batch_max, len(data))
            over += len(data) > limits.batch_bytes_max
            for txn in wire.decode_batch(data).txns:
                cid, req = txn.client_id, txn.req_id
                if not cid:
                    continue
                if cid.startswith(REJECT_PREFIX):
                    rejected[f"{cid.decode(errors='replace')}:{txn.proc}"] += 1
                if (cid, req) in seen and len(twice) < 10:
                    twice.append(f"{cid.decode(errors='replace')}#{req}")
                seen.add((cid, req))
    except Exception as e:  # report a log we cannot read instead of stopping the report
        error = f"{type(e).__name__}: {e}"
    return {
        "epochs": epochs,
        "batch_bytes_max_seen": batch_max,
        "batches_over_limit": over,
        "rejected_kind_logged": dict(rejected),
        "logged_twice": twice,
        "error": error,
    }


def probes(cfg: ClusterConfig) -> dict[str, Any]:
    """Exact answers to two named defects, after the flood."""
    chan = RawChannel()
    chan.open("probe", _check_local(cfg.client_addr))
    tag = os.urandom(4).hex()

    def ask(frame: bytes) -> Any:
        reply = chan.ask("probe", frame, 10.0)
        if reply is None:
            return "no reply"
        kind, body = wire.unpack(reply)[:2]
        return list(body) if kind == wire.REP_RESULTS else (kind, body)

    out: dict[str, Any] = {}
    try:
        cid = b"fzv-probe-" + tag.encode()
        key = f"fz/probe/{tag}"
        out["first_call"] = ask(calls_frame(cid, [[1, "kv.put", [key, "first"]]]))
        out["reused_req_id"] = ask(calls_frame(cid, [[1, "kv.put", [key, "second"]]]))
        for name, kind in (("kind_true", True), ("kind_float", 1.0)):
            cid2 = REJECT_PREFIX + f"probe-{name}-{tag}".encode()
            out[name] = ask(calls_frame(cid2, [[1, "kv.put", [f"{key}/{name}", 1]]], kind=kind))
        with Client(cfg.client_addr, timeout_s=10) as c:
            out["value_after"] = c.call("kv.get", key).value
            for name in ("kind_true", "kind_float"):
                out[f"{name}_executed"] = c.call("kv.get", f"{key}/{name}").value is not None
    except (OrdoError, zmq.ZMQError, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        chan.close()
    return out


def _codes(reply: Any) -> list[str]:
    if not isinstance(reply, list):
        return [str(reply)]
    return [
        (r[2][0] if r[1] == ERROR and isinstance(r[2], tuple) else {OK: "ok"}.get(r[1], str(r[1])))
        for r in reply
    ]


def read_balances(cfg: ClusterConfig, first: int, n: int) -> dict[str, Any]:
    """Sequenced bank.total, and every account's balance pinned to each replica."""
    out: dict[str, Any] = {"total": None, "per_replica": {}}
    try:
        with Client(cfg.client_addr, timeout_s=15) as c:
            out["total"] = c.call("bank.total", first, n).value
            for r in range(cfg.replicas):
                futs: list[Future] = [
                    c.submit("bank.balance", first + a, replica=r) for a in range(n)
                ]
                out["per_replica"][r] = [f.result(timeout=20).value for f in futs]
    except (OrdoError, FutureTimeout) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


# The run -------------------------------------------------------------------------
@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def run(a: argparse.Namespace) -> int:
    skip = {k for k in a.skip.split(",") if k}
    unknown = skip - set(ALL_KINDS)
    if unknown:
        raise SystemExit(f"--skip: unknown kinds {sorted(unknown)}; known: {ALL_KINDS}")
    tmp: str | None = None
    lc: LocalCluster | None = None
    if a.attach:
        cfg = ClusterConfig.load(a.attach)
    else:
        data_dir = a.data_dir or (tmp := tempfile.mkdtemp(prefix="ordo-fuzz-"))
        cfg = ClusterConfig(replicas=2, partitions=2, base_port=free_base_port(), data_dir=data_dir)
    addrs = [cfg.client_addr, cfg.results_addr, cfg.log_service_addr]
    addrs += [cfg.partition_addr(r, p) for r in range(cfg.replicas) for p in range(cfg.partitions)]
    for addr in addrs:
        _check_local(addr)
    try:
        if not a.attach:
            lc = LocalCluster(cfg)
            print(f"starting a 2x2 cluster in {cfg.data_dir} (base port {cfg.base_port})")
            lc.start()
        return fuzz(a, cfg, lc, skip)
    finally:
        if lc is not None:
            lc.stop()
        if tmp is not None and not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def open_good_accounts(cfg: ClusterConfig, first: int, n: int, balance: int) -> int:
    """Open n fresh accounts (first one found free from ``first``); returns the first."""
    with Client(cfg.client_addr, timeout_s=30) as c:
        for _ in range(20):
            r = c.call("bank.open", first, n, balance)
            if r.ok:
                return first
            first += 1_000_000_007  # taken (attach mode): try elsewhere
    raise SystemExit("could not open the good client's accounts")


class Flooders:
    """The flooder processes: spawned before the idle phase, released together."""

    def __init__(self, cfg: ClusterConfig, a: argparse.Namespace, skip: set[str], first: int):
        spawn = mp.get_context("spawn")  # no fork after ZeroMQ contexts exist
        self.go = spawn.Event()
        self.out_q = spawn.Queue()
        self.duration_s = a.duration
        partition_addrs = [
            cfg.partition_addr(r, p) for r in range(cfg.replicas) for p in range(cfg.partitions)
        ]
        self.procs = []
        for i, sched in enumerate(plan(a.messages, a.flooders, skip, a.seed)):
            spec = {
                "index": i,
                "seed": a.seed * 7919 + i,
                "schedule": sched,
                "duration_s": a.duration,
                "client": cfg.client_addr,
                "results": cfg.results_addr,
                "logsvc": cfg.log_service_addr,
                "partitions": partition_addrs,
                "first_account": first,
                "accounts": a.accounts,
            }
            proc = spawn.Process(target=flooder_main, args=(spec, self.go, self.out_q))
            proc.daemon = True
            proc.start()
            self.procs.append(proc)
        for _ in self.procs:
            self.out_q.get(timeout=60)  # ("ready", index): sockets connected

    def run(self) -> FloodReport:
        """Release the flooders and wait (bounded) for their reports."""
        self.go.set()
        report = FloodReport()
        deadline = time.monotonic() + self.duration_s * 1.1 + 30.0
        done = 0
        while done < len(self.procs) and time.monotonic() < deadline:
            try:
                msg = self.out_q.get(timeout=1.0)
            except queue.Empty:
                continue
            if msg[0] == "done":
                report.merge(msg[1])
                done += 1
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        return report


@dataclass
class Run:
    """What the checks look at."""

    a: argparse.Namespace
    cfg: ClusterConfig
    lc: LocalCluster | None
    first: int
    seq_pid: int | None
    good: GoodClient
    flood: FloodReport
    flood_start_s: float
    flood_end_s: float
    rss_before_kb: int | None
    logs_before: dict[str, int]
    figures: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    status: dict | None = None

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

    @property
    def sequencer_alive(self) -> bool:
        return bool(self.figures.get("processes_alive", {}).get("sequencer"))


def cluster_pids(cfg: ClusterConfig, lc: LocalCluster | None, seq_pid: int | None) -> dict:
    """Name -> pid of the sequencer and every partition process."""
    if lc is not None:
        return {name: p.pid for name, p in lc.procs.items()}
    pids = {} if seq_pid is None else {"sequencer": seq_pid}
    st = status_once(cfg.client_addr)
    for p in real_partitions(cfg, st) if st else []:
        if isinstance(p.get("pid"), int):
            pids[f"r{p['replica']}p{p['partition']}"] = p["pid"]
    return pids


def fuzz(a: argparse.Namespace, cfg: ClusterConfig, lc: LocalCluster | None, skip: set[str]) -> int:
    first = 0 if lc is not None else 10**12 + random.Random(a.seed).randrange(10**9)
    first = open_good_accounts(cfg, first, a.accounts, a.balance)
    seq_pid = lc.procs["sequencer"].pid if lc is not None else find_sequencer_pid(cfg.data_dir)
    logs_before = log_sizes(Path(cfg.data_dir) / "logs")
    flooders = Flooders(cfg, a, skip, first)
    pids = cluster_pids(cfg, lc, seq_pid)
    t0 = time.perf_counter()
    good = GoodClient(cfg.client_addr, first, a.accounts, a.concurrency, a.seed, t0)
    good.start()
    print(f"idle phase: {a.idle:.0f} s of transfers, {a.concurrency} in flight")
    cpu_idle_start = CpuSnapshot.take(pids)
    time.sleep(a.idle)
    rss_before = proc_status_kb(seq_pid, "VmRSS") if seq_pid else None
    flood_start = time.perf_counter() - t0
    cpu_flood_start = CpuSnapshot.take(pids)
    print(f"flood phase: {a.flooders} flooders, {a.messages} messages over {a.duration:.0f} s")
    flood = flooders.run()
    flood_end = time.perf_counter() - t0
    cpu_flood_end = CpuSnapshot.take(pids)
    good.stop()
    print("flood over; checking")
    r = Run(
        a, cfg, lc, first, seq_pid, good, flood, flood_start, flood_end, rss_before, logs_before
    )
    r.figures["cpu"] = {
        "idle": cpu_use(cpu_idle_start, cpu_flood_start),
        "flood": cpu_use(cpu_flood_start, cpu_flood_end),
        "flooders_cpu_s": round(flood.cpu_s, 1),
    }
    for step in (
        check_processes,
        check_replicas,
        check_bank,
        check_command_log,
        check_probes,
        check_rss,
        check_cluster_logs,
        check_latency,
        check_flood,
    ):
        step(r)
    result = report(r, skip)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2, default=str))
    moments = [(flood_start + t, kind) for t, kind in flood.moments]
    plot(good.samples, flood_start, flood_end, moments, a.plot, r.figures["good_client"])
    print_summary(result)
    print()
    wrote(a.out, a.plot)
    return 0 if result["passed"] else 1


def check_processes(r: Run) -> None:
    cfg, lc = r.cfg, r.lc
    if lc is not None:
        alive = {name: p.poll() is None for name, p in lc.procs.items()}
        exit_codes = {n: p.returncode for n, p in lc.procs.items() if p.returncode is not None}
    else:
        alive = {"sequencer": r.seq_pid is not None and Path(f"/proc/{r.seq_pid}").exists()}
        exit_codes = {}
    why = "a process died"
    if all(alive.values()):
        r.status, why = wait_settled(cfg, 60.0)
    if lc is None and r.status is not None:
        for p in real_partitions(cfg, r.status):
            alive[f"r{p['replica']}p{p['partition']}"] = not p["down"]
    r.figures["processes_alive"] = alive
    r.figures["exit_codes"] = exit_codes
    r.figures["settled"] = why
    r.check(
        "processes_alive",
        all(alive.values()),
        f"exit codes {exit_codes}" if exit_codes else "all alive",
    )


def check_replicas(r: Run) -> None:
    if r.status is None:
        r.check("replica_hashes_agree", False, f"never quiescent: {r.figures['settled']}")
        return
    hashes: dict[int, dict[int, str]] = {}
    for p in real_partitions(r.cfg, r.status):
        hashes.setdefault(p["partition"], {})[p["replica"]] = p["state_hash"]
    agree = len(hashes) == r.cfg.partitions and all(
        len(h) == r.cfg.replicas and len(set(h.values())) == 1 for h in hashes.values()
    )
    r.figures["state_hashes"] = hashes
    r.check("replica_hashes_agree", agree, json.dumps(hashes))
    violations = r.status["determinism_violations"]
    r.check("determinism_violations_zero", violations == 0, str(violations))


def check_bank(r: Run) -> None:
    a, good = r.a, r.good
    expected = a.accounts * a.balance
    bal = read_balances(r.cfg, r.first, a.accounts) if r.sequencer_alive else {}
    if not r.sequencer_alive:
        bal["error"] = "sequencer down"
    per_replica: dict[int, list] = bal.get("per_replica", {})
    sums = {rep: sum(v or 0 for v in vals) for rep, vals in per_replica.items()}
    missing = {rep: sum(v is None for v in vals) for rep, vals in per_replica.items()}
    total_ok = (
        bal.get("total") == expected
        and len(sums) == r.cfg.replicas
        and all(s == expected for s in sums.values())
        and not any(missing.values())
    )
    err = f"; {bal['error']}" if "error" in bal else ""
    r.check(
        "bank_total_unchanged",
        total_ok,
        f"expected {expected}, sequenced bank.total {bal.get('total')}, per replica sum "
        f"{sums}, accounts missing {missing}{err}",
    )
    mismatched: list[str] = []
    compared = 0
    for rep, vals in per_replica.items():
        for i, v in enumerate(vals):
            acct = r.first + i
            if acct in good.uncertain:
                continue
            compared += 1
            want = a.balance + good.delta[acct]
            if v != want:
                mismatched.append(f"replica {rep} account {acct}: {v} != ledger {want}")
    r.figures["ledger"] = {
        "acknowledged_transfers": good.ok_transfers,
        "balances_compared": compared,
        "accounts_outcome_unknown": len(good.uncertain),
        "mismatches": len(mismatched),
    }
    r.check(
        "acknowledged_transfers_kept",
        compared > 0 and not mismatched and not err,
        f"{good.ok_transfers} acknowledged transfers; {compared} balances compared with the "
        f"ledger, {len(good.uncertain)} accounts skipped (a call of unknown outcome); "
        + ("; ".join(mismatched[:5]) if mismatched else "all equal")
        + err,
    )


def check_command_log(r: Run) -> None:
    scan = scan_log(r.cfg)
    r.figures["command_log"] = scan
    bad = scan["rejected_kind_logged"]
    r.check(
        "rejected_calls_never_logged",
        not bad and not scan["error"],
        (json.dumps(bad) if bad else "none") + (f"; {scan['error']}" if scan["error"] else ""),
    )
    twice = scan["logged_twice"]
    r.check("no_call_logged_twice", not twice, ", ".join(twice) or "none")
    r.check(
        "batches_within_bytes_max",
        scan["batches_over_limit"] == 0,
        f"largest batch {scan['batch_bytes_max_seen']} bytes; "
        f"{scan['batches_over_limit']} over {limits.batch_bytes_max}",
    )


def check_probes(r: Run) -> None:
    probe = probes(r.cfg) if r.sequencer_alive else {"error": "sequencer down"}
    r.figures["probes"] = {k: repr(v)[:300] for k, v in probe.items()}
    reuse = _codes(probe.get("reused_req_id"))
    r.check(
        "reused_request_id_rejected",
        reuse == ["request_id_reused"],
        f"first call {_codes(probe.get('first_call'))}, same ids other args {reuse}, "
        f"value after {probe.get('value_after')!r}",
    )
    details = []
    ok = "error" not in probe
    for name, kind in (("kind_true", "True"), ("kind_float", "1.0")):
        codes = _codes(probe.get(name))
        executed = probe.get(f"{name}_executed")
        ok = ok and executed is False and bool(codes) and "ok" not in codes
        details.append(f"kind {kind} -> {codes}, executed {executed}")
    r.check("bool_and_float_kinds_refused", ok, "; ".join(details))


def check_rss(r: Run) -> None:
    pid = r.seq_pid

    def mb(kb: int | None) -> float | None:
        return None if kb is None else round(kb / 1024, 1)

    after = proc_status_kb(pid, "VmRSS") if pid else None
    peak = proc_status_kb(pid, "VmHWM") if pid else None
    rss: dict[str, float | None] = {
        "before_mb": mb(r.rss_before_kb),
        "after_mb": mb(after),
        "peak_mb": mb(peak),
        "growth_mb": None
        if after is None or r.rss_before_kb is None
        else mb(after - r.rss_before_kb),
    }
    r.figures["sequencer_rss"] = rss
    ok = peak is not None and peak / 1024 < r.a.rss_max_mb
    r.check("sequencer_rss_bounded", ok, f"{rss} (limit {r.a.rss_max_mb} MB on the peak)")
    ok = after is not None and after / 1024 <= r.a.rss_after_max_mb
    r.check(
        "sequencer_rss_comes_back",
        ok,
        f"{rss['after_mb']} MB after the flood (limit {r.a.rss_after_max_mb} MB)",
    )


def check_cluster_logs(r: Run) -> None:
    logs_dir = Path(r.cfg.data_dir) / "logs"
    findings = new_log_findings(logs_dir, r.logs_before) if logs_dir.exists() else {}
    r.figures["log_findings"] = findings
    tracebacks = {k: v["tracebacks"] for k, v in findings.items() if v["tracebacks"]}
    r.check(
        "no_new_tracebacks_in_logs",
        not tracebacks,
        json.dumps(tracebacks) if tracebacks else "none",
    )
    # Junk is worth a rate-limited warning, never an operator's alarm.
    critical = {k: v["critical"] for k, v in findings.items() if v["critical"]}
    examples = critical_examples(logs_dir, r.logs_before) if critical else []
    r.figures["critical_log_lines"] = examples
    r.check(
        "no_new_critical_log_lines",
        not critical,
        (json.dumps(critical) + "; " + " | ".join(examples[:3])) if critical else "none",
    )


def critical_examples(logs_dir: Path, since: dict[str, int]) -> list[str]:
    out = []
    for p in sorted(logs_dir.glob("*.log")):
        with open(p, "rb") as f:
            f.seek(since.get(p.name, 0))
            lines = f.read().decode(errors="replace").splitlines()
        out += [f"{p.name}: {line[:240]}" for line in lines if " CRITICAL " in line][:5]
    return out


def check_latency(r: Run) -> None:
    samples = r.good.samples
    idle = [s.latency_ms for s in samples if r.a.warmup <= s.t_s < r.flood_start_s]
    during = [s.latency_ms for s in samples if r.flood_start_s <= s.t_s < r.flood_end_s]
    outcomes = Counter(s.outcome for s in samples)
    idle_p50, idle_p99, idle_p999 = percentiles(idle, (0.5, 0.99, 0.999))
    flood_p50, flood_p99, flood_p999 = percentiles(during, (0.5, 0.99, 0.999))
    lat: dict[str, Any] = {
        "idle_calls": len(idle),
        "flood_calls": len(during),
        "idle_p50_ms": idle_p50,
        "idle_p99_ms": idle_p99,
        "flood_p50_ms": flood_p50,
        "flood_p99_ms": flood_p99,
        "idle_p999_ms": idle_p999,
        "flood_p999_ms": flood_p999,
        "idle_max_ms": max(idle, default=None),
        "flood_max_ms": max(during, default=None),
        "slowest": [
            {"t_s": round(s.t_s, 2), "ms": round(s.latency_ms, 1), "outcome": s.outcome}
            for s in sorted(samples, key=lambda s: -s.latency_ms)[:8]
        ],
        "idle_calls_per_s": round(len(idle) / max(r.flood_start_s - r.a.warmup, 1e-9), 1),
        "flood_calls_per_s": round(len(during) / max(r.flood_end_s - r.flood_start_s, 1e-9), 1),
        "outcomes": dict(outcomes),
    }
    ratio = None
    if lat["idle_p99_ms"] and lat["flood_p99_ms"] is not None:
        ratio = round(lat["flood_p99_ms"] / lat["idle_p99_ms"], 2)
    lat["p99_ratio"] = ratio
    r.figures["good_client"] = lat
    r.check(
        "good_client_p99_within_ratio",
        ratio is not None and ratio <= r.a.p99_ratio_max,
        f"flood p99 {lat['flood_p99_ms']} ms / idle p99 {lat['idle_p99_ms']} ms = {ratio} "
        f"(limit {r.a.p99_ratio_max})",
    )
    failed = {k: v for k, v in outcomes.items() if k not in ("ok", "aborted")}
    r.check("good_client_calls_all_answered", not failed, json.dumps(failed) if failed else "none")


def check_flood(r: Run) -> None:
    sent, not_sent = sum(r.flood.sent.values()), sum(r.flood.not_sent.values())
    r.check(
        "flood_delivered",
        sent >= min(r.a.messages, 10_000),
        f"{sent} hostile messages sent; {not_sent} not sent (send buffer full or time up)",
    )


def report(r: Run, skip: set[str]) -> dict:
    a, cfg, flood = r.a, r.cfg, r.flood
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": {
            "attach": a.attach,
            "replicas": cfg.replicas,
            "partitions": cfg.partitions,
            "flooders": a.flooders,
            "messages_target": a.messages,
            "idle_s": a.idle,
            "warmup_s": a.warmup,
            "flood_s": a.duration,
            "seed": a.seed,
            "concurrency": a.concurrency,
            "accounts": a.accounts,
            "balance": a.balance,
            "skip": sorted(skip),
        },
        "passed": all(c.ok for c in r.checks),
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in r.checks],
        "hostile": {
            "sent_total": sum(flood.sent.values()),
            "sent": dict(sorted(flood.sent.items())),
            "sent_bytes": dict(sorted(flood.sent_bytes.items())),
            "not_sent": dict(sorted(flood.not_sent.items())),
            "replies": {k: dict(v) for k, v in sorted(flood.replies.items())},
        },
        **r.figures,
        "status_after": None
        if r.status is None
        else {k: v for k, v in r.status.items() if k != "partitions"},
    }


def plot(
    samples: list[Sample],
    start: float,
    end: float,
    moments: list[tuple[float, str]],
    path: str,
    lat: dict,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    ok = [s for s in samples if s.outcome in ("ok", "aborted")]
    bad = [s for s in samples if s.outcome not in ("ok", "aborted")]
    ax.scatter([s.t_s for s in ok], [s.latency_ms for s in ok], s=3, label="answered")
    if bad:
        ax.scatter(
            [s.t_s for s in bad],
            [s.latency_ms for s in bad],
            s=12,
            c="red",
            marker="x",
            label="error / timeout",
        )
    ax.axvspan(start, end, color="orange", alpha=0.15, label="hostile flood")
    ax.set_yscale("log")
    floor = min((s.latency_ms for s in samples), default=1.0) * 0.5
    markers = dict(zip(NOTABLE, "v^so*", strict=True))
    for kind in NOTABLE:
        ts = [t for t, k in moments if k == kind]
        if ts:
            ax.scatter(ts, [floor] * len(ts), marker=markers[kind], s=18, label=f"sent: {kind}")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("bank.transfer latency (ms)")
    ax.set_title(
        f"good client under hostile input: p99 idle {lat['idle_p99_ms'] or 0:.1f} ms, "
        f"flood {lat['flood_p99_ms'] or 0:.1f} ms"
    )
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(r: dict) -> None:
    h = r["hostile"]
    print(f"\nhostile messages sent: {h['sent_total']}")
    print(f"  {'kind':<20} {'sent':>7} {'MB':>8} {'not sent':>9}  replies")
    for kind in ALL_KINDS:
        if kind not in h["sent"] and kind not in h["not_sent"]:
            continue
        replies = h["replies"].get(kind, {})
        top = ", ".join(f"{k}={v}" for k, v in sorted(replies.items(), key=lambda kv: -kv[1])[:3])
        mbytes = h["sent_bytes"].get(kind, 0) / 2**20
        print(
            f"  {kind:<20} {h['sent'].get(kind, 0):>7} {mbytes:>8.1f} "
            f"{h['not_sent'].get(kind, 0):>9}  {top}"
        )
    g = r["good_client"]
    print(f"\ngood client: {g['idle_calls']} calls idle, {g['flood_calls']} during the flood")
    print(f"  outcomes {g['outcomes']}")
    print(f"  p50 ms: idle {g['idle_p50_ms']}, flood {g['flood_p50_ms']}")
    print(f"  p99 ms: idle {g['idle_p99_ms']}, flood {g['flood_p99_ms']}; ratio {g['p99_ratio']}")
    print(f"  p99.9 ms: idle {g['idle_p999_ms']}, flood {g['flood_p999_ms']}")
    print(f"  max ms: idle {g['idle_max_ms']}, flood {g['flood_max_ms']}")
    print(f"sequencer RSS: {r['sequencer_rss']}")
    cpu = r.get("cpu", {})
    for phase in ("idle", "flood"):
        print(f"CPU {phase}: {cpu.get(phase)}")
    print("\nchecks:")
    for c in r["checks"]:
        print(f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail'][:300]}")
    print(f"\n{'ALL CHECKS PASSED' if r['passed'] else 'SOME CHECKS FAILED'}")


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=45.0, help="flood phase, seconds")
    ap.add_argument("--idle", type=float, default=6.0, help="idle phase before it, seconds")
    ap.add_argument("--warmup", type=float, default=1.0, help="idle seconds not measured")
    ap.add_argument("--flooders", type=int, default=4, help="hostile processes")
    ap.add_argument("--messages", type=int, default=12_000, help="hostile messages in total")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8, help="good client's calls in flight")
    ap.add_argument("--accounts", type=int, default=200)
    ap.add_argument("--balance", type=int, default=10_000)
    ap.add_argument("--skip", default="", help="comma-separated message kinds to leave out")
    ap.add_argument("--attach", metavar="DATA_DIR", help="fuzz the running cluster of DATA_DIR")
    ap.add_argument("--data-dir", help="where to start our cluster (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the temp data dir (logs)")
    ap.add_argument("--rss-max-mb", type=float, default=600.0, help="sequencer's peak RSS")
    ap.add_argument(
        "--rss-after-max-mb", type=float, default=100.0, help="sequencer's RSS after the flood"
    )
    ap.add_argument("--p99-ratio-max", type=float, default=2.0)
    ap.output("--out", "results/fuzz/fuzz_cluster.json", "JSON")
    ap.output("--plot", "results/fuzz/fuzz_cluster.png", "PNG")
    return ap


def main() -> None:
    a = parser().parse()
    if a.flooders < 1 or a.messages < 0 or a.duration <= 0:
        raise SystemExit("--flooders >= 1, --messages >= 0, --duration > 0")
    sys.exit(run(a))


if __name__ == "__main__":
    main()
