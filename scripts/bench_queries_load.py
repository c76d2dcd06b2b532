"""The loads of scripts/bench_queries.py: bank transfers and queries, each generator in a
process of its own, started together, through cluster/loadgen.py.

Why processes: a generator is one Python thread; two in one process share the GIL, so a
transfer load woken every millisecond would wait behind the query generator (and both
latencies would measure the interpreter, not the engine). Each ``Worker`` is a spawned
process (no fork after ZeroMQ contexts exist) that runs one ``LoadSpec`` at a time: it
builds the generator (sockets connected), says ready, runs on the word go, and sends
back a ``LoadResult``. ``run_together`` starts several specs on as many workers and
releases them at once, so their windows line up.

Sources (``LoadSpec.source``), over accounts 0..accounts-1 of ``txn_library.workloads.builtin``'s
bank, seeded:
  transfers   bank.transfer(src, dst, 1..50), src and dst uniform (about half cross
              partitions); kind "transfer"
  balance     bank.balance(a), a uniform: one key, one partition; kind "query"
  sum_one     qbench.sum(k accounts of one partition, a run of them in key order at a
              random start; the partition uniform): k keys, one partition
  total_all   bank.total(first, k) with [first, first + k) touching every partition
  scan        bank.total(0, accounts): every account; kind "scan"
``isolation`` "snapshot" or "read_committed" sends the queries (kinds "query" and
"scan") to the partitions' query sockets (cluster/load_queries.py): a 1-partition query
to its partition, a multi-partition one to each partition in turn (any participant can
coordinate); "strict" sends them through the sequencer as calls.

Checker: with ``invariant`` set, every OK answer of a query or scan kind (warm-up and
drain too) must equal it (the total of every account while transfers conserve money);
the worker counts what it checked and the violations, and keeps the first few.

Invariants: a worker runs one spec at a time and always answers (a LoadResult, or the
error's text); every wait on a worker is bounded.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from cluster.load_queries import QueryTargets
from cluster.load_shapes import Call, CallLike, ClosedLoop, OpenLoop
from cluster.loadgen import LoadGenerator
from cluster.measure import Window, latency_percentiles_ms
from txn_library import limits, placement
from txn_library.errors import OK

QUERY_KINDS = ("query", "scan")
READY_TIMEOUT_S = 120.0  # a worker builds its generator (and imports) within this
VIOLATIONS_KEPT = 10
AMOUNT_MAX = 50  # cents per transfer (accounts start with far more: few aborts)


@dataclass(frozen=True)
class LoadSpec:
    """One load: what it sends (``source``, ``params``), how (closed loop of
    ``in_flight`` calls, or open loop at ``rate_per_s`` with at most ``in_flight``
    outstanding), at which isolation, for how long."""

    source: str
    params: dict[str, Any]
    client_addr: str
    query_addrs: list[list[str]]
    isolation: str = "snapshot"
    rate_per_s: float | None = None
    in_flight: int = 256
    connections: int = 4
    warmup_s: float = 2.0
    duration_s: float = 10.0
    invariant: int | None = None
    timeline_bucket_s: float | None = None
    late_after_s: float = 0.2
    seed: int = 1


@dataclass
class LoadResult:
    window: Window
    checked: int = 0  # answers compared with the invariant
    violations: int = 0
    examples: list[Any] = field(default_factory=list)  # (kind, proc, args, value)
    epoch_min: int = -1  # completed epochs the OK query answers reflected
    epoch_max: int = -1
    malformed_replies: int = 0


# --- Sources -----------------------------------------------------------------------------


def accounts_by_partition(accounts: int, partitions: int) -> list[list[int]]:
    """Each partition's accounts, in key order (txn_library.placement)."""
    out: list[list[int]] = [[] for _ in range(partitions)]
    for a in range(accounts):
        out[placement.partition_of("account", (a,), partitions)].append(a)
    return out


def spanning_firsts(accounts: int, keys: int, partitions: int) -> list[int]:
    """The firsts of ranges [first, first + keys) inside 0..accounts-1 that touch every
    partition."""
    part = [placement.partition_of("account", (a,), partitions) for a in range(accounts)]
    out = []
    seen: dict[int, int] = {}  # partition -> accounts of it in the current range
    for a in range(min(keys, accounts)):
        seen[part[a]] = seen.get(part[a], 0) + 1
    for first in range(0, accounts - keys + 1):
        if len(seen) == partitions:
            out.append(first)
        if first + keys < accounts:  # slide: drop first, add first + keys
            p = part[first]
            seen[p] -= 1
            if not seen[p]:
                del seen[p]
            q = part[first + keys]
            seen[q] = seen.get(q, 0) + 1
    return out


def make_source(spec: LoadSpec) -> tuple[Callable[[int], CallLike | None], Callable | None]:
    """(source, query route) of ``spec``."""
    p = spec.params
    accounts, partitions = int(p["accounts"]), int(p["partitions"])
    rng = random.Random(spec.seed)
    kind = spec.source
    turn = [0]

    def spread(_proc: str, _args: Sequence[Any]) -> int:  # coordinators in turn
        turn[0] += 1
        return turn[0] % partitions

    if kind == "transfers":

        def transfer(_t: int) -> Call:
            s, d = rng.randrange(accounts), rng.randrange(accounts)
            return Call("bank.transfer", (s, d, rng.randint(1, AMOUNT_MAX)), "transfer")

        return transfer, None
    if kind == "balance":

        def balance(_t: int) -> Call:
            return Call("bank.balance", (rng.randrange(accounts),), "query")

        def home(_proc: str, args: Sequence[Any]) -> int:
            return placement.partition_of("account", (args[0],), partitions)

        return balance, home
    if kind == "sum_one":
        keys = int(p["keys"])
        owned = accounts_by_partition(accounts, partitions)
        if min(len(o) for o in owned) < keys:
            raise ValueError(f"a partition holds fewer than {keys} accounts")

        def sum_one(_t: int) -> Call:
            mine = owned[rng.randrange(partitions)]
            first = rng.randrange(len(mine) - keys + 1)
            return Call("qbench.sum", (mine[first : first + keys],), "query")

        def owner(_proc: str, args: Sequence[Any]) -> int:
            return placement.partition_of("account", (args[0][0],), partitions)

        return sum_one, owner
    if kind == "total_all":
        keys = int(p["keys"])
        firsts = spanning_firsts(accounts, keys, partitions)
        if not firsts:
            raise ValueError(f"no range of {keys} accounts touches every partition")

        def total(_t: int) -> Call:
            return Call("bank.total", (rng.choice(firsts), keys), "query", True)

        return total, spread
    if kind == "scan":

        def scan(_t: int) -> Call:
            return Call("bank.total", (0, accounts), "scan", partitions > 1)

        return scan, spread
    raise ValueError(f"unknown source {kind!r}")


# --- The worker process -----------------------------------------------------------------


def run_spec(spec: LoadSpec, ready: Callable[[], None]) -> LoadResult:
    """Build the generator, call ``ready``, run it; the result with the checker's."""
    source, route = make_source(spec)
    queries = None
    if spec.isolation != "strict" and route is not None:
        queries = QueryTargets(
            spec.query_addrs, isolation=spec.isolation, kinds=QUERY_KINDS, route=route
        )
    load: ClosedLoop | OpenLoop = ClosedLoop(spec.in_flight)
    if spec.rate_per_s is not None:
        load = OpenLoop(spec.rate_per_s, spec.in_flight, terminals=spec.connections)
    out = LoadResult(Window())
    expected = spec.invariant

    def check(_t: int, call: Any, status: Any, value: Any, _sent: float, _at: float) -> None:
        if expected is None or status != OK or call.kind not in QUERY_KINDS:
            return
        out.checked += 1
        if value != expected:
            out.violations += 1
            if len(out.examples) < VIOLATIONS_KEPT:
                out.examples.append((call.kind, call.proc, list(call.args)[:2], value))

    with LoadGenerator(
        spec.client_addr,
        source,
        load,
        connections=min(spec.connections, spec.in_flight),
        timeout_s=60.0,
        seed=spec.seed,
        queries=queries,
    ) as gen:
        ready()
        out.window = gen.run(
            warmup_s=spec.warmup_s,
            duration_s=spec.duration_s,
            drain_s=10.0,
            timeline_bucket_s=spec.timeline_bucket_s,
            late_after_s=spec.late_after_s,
            on_answer=check if expected is not None else None,
        )
        out.malformed_replies = gen.malformed_replies
        if gen.queries is not None:
            out.epoch_min, out.epoch_max = gen.queries.epoch_min, gen.queries.epoch_max
    return out


def worker_main(conn: Connection) -> None:
    """A worker: specs until None; for each, "ready", wait for "go", then the result."""
    while True:
        spec = conn.recv()
        if spec is None:
            return

        def ready() -> None:
            conn.send("ready")
            conn.recv()  # "go"

        try:
            result = run_spec(spec, ready)
            conn.send(result)
        except Exception:  # noqa: BLE001 - the parent raises it with the worker's trace
            conn.send(traceback.format_exc())


class Worker:
    """A spawned worker process and its pipe."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child,), daemon=True)
        self.proc.start()

    def _recv(self, timeout_s: float) -> Any:
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"load worker {self.proc.pid} silent for {timeout_s:.0f} s")
        msg = self.conn.recv()
        if isinstance(msg, str) and msg != "ready":
            raise RuntimeError(f"load worker {self.proc.pid} failed:\n{msg}")
        return msg

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


def run_together(
    workers: Sequence[Worker], specs: Sequence[LoadSpec], at_go: Callable[[], None] | None = None
) -> list[LoadResult]:
    """Run ``specs[i]`` on ``workers[i]``, released together; ``at_go`` runs right after
    the release (on this thread). Every wait is bounded."""
    if len(specs) > len(workers):
        raise ValueError(f"{len(specs)} loads, {len(workers)} workers")
    for w, spec in zip(workers, specs, strict=False):
        w.conn.send(spec)
    for w in workers[: len(specs)]:
        w._recv(READY_TIMEOUT_S)
    for w in workers[: len(specs)]:
        w.conn.send("go")
    if at_go is not None:
        at_go()
    results = []
    for w, spec in zip(workers, specs, strict=False):
        longest = spec.warmup_s + spec.duration_s + 10.0 + 60.0 + READY_TIMEOUT_S
        res = w._recv(longest)
        assert isinstance(res, LoadResult)
        results.append(res)
    return results


# --- Summaries ---------------------------------------------------------------------------


def summary(results: Sequence[LoadResult], kinds: Sequence[str]) -> dict[str, Any]:
    """Answers of ``kinds`` inside the windows of ``results`` (loads run together):
    per second (over the mean window), latency percentiles over every sample, errors."""
    ok = aborted = errors = 0
    lat: list[float] = []
    seconds = 0.0
    codes: dict[str, int] = {}
    skipped = 0
    for r in results:
        w = r.window
        seconds += w.measured_s
        skipped += w.skipped
        for name in kinds:
            k = w.kinds.get(name)
            if k is None:
                continue
            ok, aborted, errors = ok + k.ok, aborted + k.aborted, errors + k.errors
            lat += k.latencies_s
        for code, n in w.error_codes.items():
            codes[code] = codes.get(code, 0) + n
    seconds = seconds / len(results) if results else 0.0
    pct = latency_percentiles_ms(lat, (0.5, 0.99), 2)
    return {
        "per_s": round((ok + aborted) / seconds, 1) if seconds else 0.0,
        "ok": ok,
        "aborted": aborted,
        "errors": errors,
        "error_codes": codes,
        "p50_ms": pct["p50"],
        "p99_ms": pct["p99"],
        "max_ms": round(1000 * max(lat), 2) if lat else None,
        "measured_s": round(seconds, 2),
        "open_loop_skipped": skipped,
    }


def checks(results: Sequence[LoadResult]) -> dict[str, Any]:
    """The checker's counts over ``results``."""
    return {
        "checked": sum(r.checked for r in results),
        "violations": sum(r.violations for r in results),
        "examples": [e for r in results for e in r.examples][:VIOLATIONS_KEPT],
        "epochs": [
            min((r.epoch_min for r in results if r.epoch_min >= 0), default=-1),
            max((r.epoch_max for r in results), default=-1),
        ],
    }


def in_flight_cap(n: int) -> int:
    return max(1, min(n, limits.loadgen_in_flight_max))
