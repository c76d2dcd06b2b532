"""The cluster a leaderboard benchmark runs on (scripts/leaderboard.py), the flows pushed
through it and the CPU its processes use.

A ``Target`` is an embedded cluster (``embedded``: a LocalCluster in a temporary
directory, removed afterwards unless kept) or a running one (``attached``: its data
directory). A ``Flow`` names what a run pushes and where its output comes out: one
variant of S-Store's Leaderboard Maintenance (txn_library/workloads/leaderboard.py) or one chain
of txn_library/workloads/chains.py. A source gives each batch's tuples as a pure function of
the batch id and a seed, so the check (scripts/leaderboard_check.py) regenerates what
the client pushed and two runs push the same input.

Invariants: an embedded cluster is stopped, and its directory removed unless kept,
however the block leaves; this process imports the cluster's procedure modules, so it
derives from a weak-recovery log exactly what the cluster derived.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cluster.config import ClusterConfig
from cluster.launcher import LocalCluster, cluster_client, free_base_port
from cluster.measure import process_cpu_s
from txn_library.client import Client
from txn_library.procedure import load_modules
from txn_library.streams import dataflow_named

MODULES = (
    "txn_library.workloads.builtin",
    "txn_library.workloads.leaderboard",
    "txn_library.workloads.chains",
)
LEADERBOARD = "txn_library.workloads.leaderboard"
CHAINS = "txn_library.workloads.chains"
PHONES = 5_000  # distinct phone numbers votes come from (each may vote 10 times)
START_WAIT_S = 300.0  # a TPC-C genesis loads its warehouses before the cluster answers


@dataclass
class Target:
    """A cluster to benchmark: ``lc`` is None when attached to a running one."""

    cfg: ClusterConfig
    lc: LocalCluster | None = None

    @property
    def address(self) -> str:
        return self.cfg.client_addr

    def client(self, **kw: Any) -> Client:
        return cluster_client(self.cfg, **kw)

    def pids(self) -> dict[str, int]:
        return {} if self.lc is None else {n: p.pid for n, p in self.lc.procs.items()}

    def stop(self) -> None:
        if self.lc is not None:
            self.lc.stop()

    def restart(self) -> LocalCluster:
        """Start the embedded cluster again on the same directory (its log kept)."""
        if self.lc is None:
            raise RuntimeError("an attached cluster is not this script's to restart")
        self.lc.stop()
        self.lc = LocalCluster(self.cfg)
        return self.lc.start(wait_s=START_WAIT_S)


@contextmanager
def embedded(
    *,
    replicas: int,
    partitions: int,
    recovery: str = "strong",
    modules: tuple[str, ...] = MODULES,
    genesis: str | None = None,
    genesis_args: dict | None = None,
    keep: bool = False,
) -> Iterator[Target]:
    """A fresh local cluster with the durable log on and no periodic checkpoints."""
    tmp = tempfile.mkdtemp(prefix="ordo-leaderboard-")
    cfg = ClusterConfig(
        replicas=replicas,
        partitions=partitions,
        base_port=free_base_port(),
        data_dir=str(Path(tmp) / "data"),
        procedure_modules=modules,
        dataflow_recovery=recovery,
        genesis=genesis,
        genesis_args=genesis_args or {},
    )
    load_modules(cfg.procedure_modules)
    target = Target(cfg, LocalCluster(cfg))
    try:
        assert target.lc is not None
        target.lc.start(wait_s=START_WAIT_S)
        yield target
    finally:
        target.stop()
        if keep:
            print(f"data kept in {cfg.data_dir}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def attached(data_dir: str) -> Iterator[Target]:
    """The cluster running in ``data_dir`` (its cluster.json); never stopped here."""
    cfg = ClusterConfig.load(data_dir)
    load_modules(cfg.procedure_modules)
    yield Target(cfg, None)


# What is pushed ------------------------------------------------------------------------
@dataclass(frozen=True)
class Flow:
    """One dataflow as a run sees it: the border stream pushed to, the sink whose batch
    marks a batch done, and its steps (procedures) in the dataflow's order."""

    dataflow: str
    kind: str  # "leaderboard" or "chain"
    border: str
    sink: str
    steps: tuple[str, ...]
    triggers: bool
    module: str


def leaderboard_flow(variant: str) -> Flow:
    from txn_library.workloads.leaderboard import VARIANT

    df = dataflow_named(variant)
    if df is None:
        raise ValueError(f"no leaderboard variant {variant!r}")
    return Flow(
        variant,
        "leaderboard",
        df.border.name,
        VARIANT[variant].names["board"],
        tuple(s.name for s in df.order),
        df.triggers,
        LEADERBOARD,
    )


def chain_flow(n: int, triggers: bool) -> Flow:
    import txn_library.workloads.chains  # noqa: F401  (declares the chains)

    name = f"{'chain' if triggers else 'chainc'}{n}"
    df = dataflow_named(name)
    if df is None:
        raise ValueError(f"no dataflow {name} (txn_library.workloads.chains has lengths 1..10)")
    last = df.order[-1].output
    assert last is not None
    return Flow(
        name, "chain", df.border.name, last, tuple(s.name for s in df.order), df.triggers, CHAINS
    )


class Source(Protocol):
    """Each batch's tuples, a pure function of the batch id."""

    def tuples(self, batch_id: int) -> list[tuple]: ...


@dataclass(frozen=True)
class Votes:
    """``per_batch`` votes (phone, contestant) per batch, seeded per batch id; one
    contestant id in 26 names nobody (S-Store's generator sends invalid votes too)."""

    seed: int
    per_batch: int

    def tuples(self, batch_id: int) -> list[tuple]:
        from txn_library.workloads.leaderboard import CONTESTANTS

        rng = random.Random(self.seed * 1_000_000_007 + batch_id)
        return [
            (rng.randrange(PHONES), rng.randrange(1, CONTESTANTS + 2))
            for _ in range(self.per_batch)
        ]


@dataclass(frozen=True)
class Numbers:
    """A chain's input: ``per_batch`` copies of the batch id."""

    per_batch: int

    def tuples(self, batch_id: int) -> list[tuple]:
        return [(batch_id,)] * self.per_batch


def source_for(flow: Flow, seed: int, per_batch: int) -> Source:
    return Votes(seed, per_batch) if flow.kind == "leaderboard" else Numbers(per_batch)


def prepare(target: Target, flow: Flow) -> int:
    """Put the contestants in the show (a no-op when they are) and return the first
    batch id this run may push (after every batch the border stream has seen)."""
    if flow.module not in target.cfg.procedure_modules:
        raise SystemExit(
            f"the cluster in {target.cfg.data_dir} does not load {flow.module} "
            f"(its procedure_modules: {list(target.cfg.procedure_modules)})"
        )
    with target.client() as c:
        if flow.kind == "leaderboard":
            from txn_library.workloads.leaderboard import CONTESTANTS

            r = c.call("leaderboard.setup", flow.dataflow, CONTESTANTS)
            if not r.ok:
                raise SystemExit(f"leaderboard.setup {flow.dataflow}: {r.value}")
        st = c.call("dataflow.status", flow.dataflow)
    last = st.value.get("last_pushed") if st.ok else None
    return 1 if last is None else int(last) + 1


# CPU -------------------------------------------------------------------------------------
@dataclass
class Cpu:
    """CPU seconds each process used between ``start`` and ``stop`` (this one is
    "client": its load loops and subscriber)."""

    pids: dict[str, int]
    began: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def _now(self) -> dict[str, float]:
        now = {"client": time.process_time()}
        for name, pid in self.pids.items():
            v = process_cpu_s(pid)
            if v is not None:
                now[name] = v
        return now

    def start(self) -> Cpu:
        self.began = self._now()
        self.wall_s = time.perf_counter()
        return self

    def stop(self) -> dict[str, Any]:
        end = self._now()
        wall = time.perf_counter() - self.wall_s
        self.used = {n: round(v - self.began[n], 2) for n, v in end.items() if n in self.began}
        return {"wall_s": round(wall, 2), "cpu_s": self.used}
