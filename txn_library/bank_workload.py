"""Bank transfer workload with its checker, shared by tests, the demo and benchmarks.

Generates random transfers among ``accounts`` accounts, a chosen share of them
multi-partition (source and destination on different partitions), submits them
asynchronously from several clients with a bounded number in flight each, and
records every outcome and latency. The checker: every call answered, money
conserved.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import txn_library.builtin  # noqa: F401  (registers the bank)
from txn_library import placement
from txn_library.client import Client, Result


@dataclass
class BankRun:
    submitted: int = 0
    ok: int = 0
    aborted: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def answered(self) -> int:
        return self.ok + self.aborted + self.failed

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        xs = sorted(self.latencies_s)
        return 1000.0 * xs[min(len(xs) - 1, int(q * len(xs)))]


def make_transfers(
    n: int, accounts: int, partitions: int, multi_share: float, seed: int
) -> list[tuple[int, int, int]]:
    """n (src, dst, amount) with ``multi_share`` of them crossing partitions."""
    rng = random.Random(seed)
    by_part: dict[int, list[int]] = {}
    for a in range(accounts):
        by_part.setdefault(placement.partition_of("account", (a,), partitions), []).append(a)
    parts = sorted(by_part)
    out = []
    for _ in range(n):
        src = rng.randrange(accounts)
        ps = placement.partition_of("account", (src,), partitions)
        if partitions > 1 and rng.random() < multi_share:
            pd = rng.choice([p for p in parts if p != ps])
        else:
            pd = ps
        dst = rng.choice(by_part[pd])
        out.append((src, dst, rng.randint(1, 2_000)))
    return out


def open_accounts(client: Client, accounts: int, balance: int) -> None:
    step = 5_000
    for first in range(0, accounts, step):
        r = client.call("bank.open", first, min(step, accounts - first), balance)
        if not r.ok:
            raise RuntimeError(f"bank.open failed: {r.value}")


def run_transfers(
    address: str,
    transfers: list[tuple[int, int, int]],
    clients: int,
    in_flight_per_client: int = 500,
    timeout_s: float = 60.0,
    make_client: Callable[[], Any] | None = None,
) -> BankRun:
    """Submit ``transfers`` split over ``clients`` concurrent clients; wait for all.

    ``make_client`` builds each client (a context manager with ``submit``); default: a
    Client of the sequencer at ``address``.
    """
    if make_client is None:
        make_client = lambda: Client(address, timeout_s=timeout_s)  # noqa: E731
    run = BankRun()
    lock = threading.Lock()
    shards = [transfers[i::clients] for i in range(clients)]

    def worker(shard: list[tuple[int, int, int]]) -> None:
        sem = threading.BoundedSemaphore(in_flight_per_client)
        futures: list[Future] = []

        def done(f: Future) -> None:
            sem.release()
            with lock:
                try:
                    r: Result = f.result()
                    run.latencies_s.append(r.latency_s)
                    if r.ok:
                        run.ok += 1
                    else:
                        run.aborted += 1
                except Exception as e:
                    run.failed += 1
                    if len(run.errors) < 20:
                        run.errors.append(repr(e))

        with make_client() as c:
            for src, dst, amount in shard:
                sem.acquire()
                f = c.submit("bank.transfer", src, dst, amount)
                f.add_done_callback(done)
                futures.append(f)
            for f in futures:
                try:
                    f.result(timeout=timeout_s + 5)
                except Exception:
                    pass

    threads = [threading.Thread(target=worker, args=(s,)) for s in shards]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.elapsed_s = time.perf_counter() - t0
    run.submitted = len(transfers)
    return run
