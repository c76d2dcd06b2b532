"""A dataflow as a workload of the cluster simulator: exactly once and in order, under
every fault the simulator injects (scripts/simulate.py --workload stream).

Client k (of up to ``STREAMS``) pushes batches of small ints to its own stream
``sim_in_<k>`` with increasing, gapped batch ids; now and then it pushes an earlier
batch again with the same tuples (a retry across sessions: answered from the first
push) or with other tuples (refused). Clients beyond ``STREAMS`` send OLTP calls on
the same home (kv adds), interleaving with the chains. The dataflow ``sim_<k>`` has
two steps: ``count`` folds each batch into a running chain (count, sum, a hash of the
batch ids in the order processed) and emits the batch's sum to ``sim_mid_<k>``;
``total`` folds those sums again (the order within a batch: count before total) and
emits the running total to the sink ``sim_out_<k>``, which keeps ``retained(k)``
batches.

Checker, from the logged history and the oracle's final state: for every stream the
batches whose push committed (first push of an id, in log order) are exactly the
batches each step processed, once each, in that order: the chain's count, sum and hash
equal what those pushes give, and ``total`` equals ``count``'s sum; the sink keeps the
last of those batches (``retained(k)`` to its trim bound), each with the running total
after it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
import xxhash

import txn_library.workloads.builtin  # noqa: F401  (kv: the OLTP side)
from txn_library.errors import OK
from txn_library.streams import Dataflow, StreamContext, stream, stream_procedure
from txn_library.streams.spec import STREAM_BATCHES
from txn_library.workloads.contract import Call, FinalState

STREAMS = 6
HOME = 7
CHAIN = "sim_chain"  # kv key prefix of each stream's chain row


def _chain_hash(h: int, batch_id: int) -> int:
    return xxhash.xxh3_64_intdigest(msgpack.packb((h, batch_id)))


def retained(k: int) -> int:
    """How many batches stream k's sink keeps: a few, so that retention trims it often,
    in a step that is multi-partition where its kv row is not at HOME (only HOME trims;
    every engine must agree). (A border keeps the default: a step takes its batch from
    the border after every push of the epoch, so a border must keep what one epoch
    pushes.)"""
    return 3 + k


def _declare(k: int) -> None:
    s_in = stream(f"sim_in_{k}", [("x", "int")], home=HOME)
    s_mid = stream(f"sim_mid_{k}", [("sum", "int")], home=HOME)
    s_out = stream(f"sim_out_{k}", [("total", "int")], home=HOME, retain_batches=retained(k))
    key_count, key_total = (f"{CHAIN}_count_{k}",), (f"{CHAIN}_total_{k}",)

    @stream_procedure(
        f"sim.count_{k}", input=s_in.name, output=s_mid.name, writes=[("kv", key_count)]
    )
    def count(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> list[tuple]:
        row = ctx.get("kv", key_count)
        n, total, h = row[0] if row else (0, 0, 0)
        s = sum(x for (x,) in tuples)
        ctx.put("kv", key_count, ((n + 1, total + s, _chain_hash(h, batch_id)),))
        return [(s,)]

    @stream_procedure(
        f"sim.total_{k}", input=s_mid.name, output=s_out.name, writes=[("kv", key_total)]
    )
    def total(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> list[tuple]:
        row = ctx.get("kv", key_total)
        t = (row[0] if row else 0) + sum(s for (s,) in tuples)
        ctx.put("kv", key_total, (t,))
        return [(t,)]

    Dataflow(f"sim_{k}", [count >> total])


for _k in range(STREAMS):
    _declare(_k)


@dataclass
class StreamWorkload:
    rng: random.Random
    partitions: int
    name: str = "stream"
    procedure_modules: tuple[str, ...] = ("txn_library.workloads.stream_sim",)
    history_tables: frozenset[str] = frozenset()
    defaults: ClassVar[dict[str, Any]] = {}

    def genesis(self) -> tuple[str | None, dict[str, Any]]:
        return None, {}

    def setup_calls(self) -> list[Call]:
        return []

    def client_calls(self, client: int, clients: int) -> Iterator[Call]:
        rng = random.Random(self.rng.getrandbits(64))
        if client >= STREAMS:
            while True:
                yield ("kv.add", (f"sim_oltp_{rng.randrange(4)}", rng.randint(-9, 9)))
        name = f"sim_in_{client}"
        pushed: list[tuple[int, list[list[int]]]] = []
        b = 0
        while True:
            r = rng.random()
            if pushed and r < 0.06:  # a retry of an earlier push: the first answer
                yield ("stream.push", (name, *rng.choice(pushed)))
            elif pushed and r < 0.09:  # an earlier id, other tuples: refused
                old, tuples = rng.choice(pushed)
                yield ("stream.push", (name, old, [*tuples, [1]]))
            else:
                b += rng.randint(1, 3)
                tuples = [[rng.randint(-100, 100)] for _ in range(rng.randint(0, 4))]
                pushed.append((b, tuples))
                yield ("stream.push", (name, b, tuples))

    def point_read(self, proc: str, args: tuple) -> tuple[str, tuple] | None:
        return None

    def check(self, final: FinalState) -> list[str]:
        expected: dict[str, list[tuple[int, list]]] = {}
        first: dict[tuple[str, int], Any] = {}
        out = []
        for t in final.txns:
            if t.proc != "stream.push" or t.result[0] != OK:
                continue
            name, b, tuples = t.args
            if (name, b) in first:
                if t.result != first[(name, b)]:
                    out.append(
                        f"{name} batch {b}: a repeated push got {t.result}, not {first[(name, b)]}"
                    )
                continue
            first[(name, b)] = t.result
            expected.setdefault(name, []).append((b, tuples))
        kv = final.oracle.whole_tables().get("kv", {})
        for k in range(STREAMS):
            name = f"sim_in_{k}"
            batches = expected.get(name, [])
            ids = [b for b, _ in batches]
            if ids != sorted(set(ids)):
                out.append(f"{name}: committed pushes out of order or twice: {ids[:20]}")
            n, total, h = 0, 0, 0
            for b, tuples in batches:
                n, total, h = n + 1, total + sum(x for (x,) in tuples), _chain_hash(h, b)
            row = kv.get((f"{CHAIN}_count_{k}",))
            got = row[0] if row else (0, 0, 0)
            if tuple(got) != (n, total, h):
                out.append(
                    f"{name}: steps processed (count, sum, chain) {tuple(got)}, the committed "
                    f"pushes give {(n, total, h)}: a batch lost, repeated or out of order"
                )
            trow = kv.get((f"{CHAIN}_total_{k}",))
            if (trow[0] if trow else 0) != total:
                out.append(f"{name}: the second step saw {trow}, the first {total}")
            out += _check_sink(k, batches, final.oracle.whole_tables())
        return out


def _check_sink(k: int, batches: list[tuple[int, list]], tables: dict[str, dict]) -> list[str]:
    """The sink of stream k keeps the last committed batches, between ``retained(k)``
    and the trim bound (all of them while fewer), each with the running total."""
    sink, keep = f"sim_out_{k}", retained(k)
    kept = sorted(key[2] for key in tables.get(STREAM_BATCHES, {}) if key[:2] == (HOME, sink))
    ids = [b for b, _ in batches]
    most = keep + max(1, keep // 16)
    if kept != ids[len(ids) - len(kept) :] or not min(keep, len(ids)) <= len(kept) <= most:
        return [f"{sink}: keeps batches {kept[:10]}, the last {keep}..{most} of {ids[-12:]}"]
    totals, t = {}, 0
    for b, tuples in batches:
        t += sum(x for (x,) in tuples)
        totals[b] = t
    rows = tables.get(sink, {})
    got = {b: rows.get((HOME, b, 0)) for b in kept}
    wrong = [b for b in kept if got[b] != (totals[b],)]
    if wrong:
        b = wrong[0]
        return [f"{sink}: batch {b} holds {got[b]}, the running total then was {totals[b]}"]
    return []
