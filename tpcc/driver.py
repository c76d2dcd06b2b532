"""The TPC-C driver behind ``ordo tpcc run`` and ``ordo tpcc check``.

It starts an embedded local cluster whose partitions load their own warehouses at
startup (genesis ``tpcc.loader:genesis``; nothing goes through the log), or attaches
to a running one, then drives TPC-C terminals against it and reports throughput
(txn/s, tpmC), rollbacks, dependent-transaction restarts, the multi-partition share
and latency percentiles per transaction type; finally it checks consistency
conditions 1-9, 11 and 12 on every warehouse of every replica and compares the replicas' state
hashes.

Load model: ``terminals`` terminals, each bound to a home warehouse. Closed loop
(default): a terminal submits its next transaction as soon as the previous one
answers; there are no keying or think times (clause 5.2.5 is not modelled), so the
numbers are engine capacity, not a compliant tpmC. Open loop: transactions are
submitted at a fixed rate whatever the answers (bounded in flight).

The load is cluster.loadgen's generator (one thread, one DEALER, no per-call futures):
a ``ClosedLoop`` of the terminals, or an ``OpenLoop`` at the rate with fixed spacing and
at most ``limits.loadgen_in_flight_max`` calls outstanding. The read-only transactions
(Order-Status, Stock-Level) go through the sequencer (``queries`` "sequenced": today's
path, run unlogged at one replica), or straight to the partitions as snapshot queries
(``queries`` "snapshot": cluster/load_queries.py, docs/QUERIES.md). This module keeps what is
TPC-C's: the terminals and their inputs (tpcc.inputs), the embedded cluster, the
summary's layout and the checks. Measurement counts answers that arrive inside the
window [warmup, warmup + duration); the sequencer's status (restarts, epochs) is read
at both ends of the window. Latency percentiles are cluster.measure.percentiles
(nearest rank).

Invariant: the driver never decides anything the database should: every outcome it
reports is a result returned by the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cluster.config import ClusterConfig
from cluster.load_queries import QueryTargets
from cluster.load_shapes import ClosedLoop, OpenLoop
from cluster.loadgen import LoadGenerator
from cluster.measure import CpuMeter, KindStats, Window
from cluster.ownership import claim_cluster_dir
from tpcc.inputs import (
    KINDS,
    NEW_ORDER,
    ORDER_STATUS,
    STOCK_LEVEL,
    Call,
    TpccInputs,
    terminals_for,
)
from txn_library import limits, native

GENESIS = "tpcc.loader:genesis"
PROCEDURE_MODULES = ("txn_library.workloads.builtin", "tpcc.transactions")
DRAIN_S = 30.0  # after the window, wait this long for calls still in flight
LOAD_S_PER_WAREHOUSE = 2.0  # rough, for the load progress bar's patience
READ_ONLY_KINDS = (ORDER_STATUS, STOCK_LEVEL)
READ_ONLY_AS = ("sequenced", "snapshot")  # RunOptions.queries


@dataclass
class RunOptions:
    warehouses: int = 2
    partitions: int = 2
    replicas: int = 1
    fsync: bool = True
    epoch_ms: int = 10
    mix: str = "new-order"
    duration_s: float = 30.0
    warmup_s: float = 5.0
    remote_pct: float = 1.0
    terminals: int = 200
    open_loop: bool = False
    rate: float = 0.0
    seed: int = 1
    load_seed: int = 1
    payment_rc: bool = False
    check: bool = True
    attach: str | None = None
    data_dir: str | None = None
    fresh: bool = False  # an existing data_dir is deleted first (else refused)
    keep_data: bool = False
    out: str | None = "results/tpcc/run.json"
    progress: bool = True
    versions: bool = True  # ClusterConfig.query_versions (embedded cluster)
    readers: int = 0  # readers beside the replicas (embedded; the replicas keep no versions)
    queries: str = "sequenced"  # the read-only transactions: READ_ONLY_AS


# --- Cluster -----------------------------------------------------------------------------


def embedded_config(opts: RunOptions, data_dir: str, base_port: int) -> ClusterConfig:
    return ClusterConfig(
        replicas=opts.replicas,
        partitions=opts.partitions,
        base_port=base_port,
        data_dir=data_dir,
        epoch_duration_ms=opts.epoch_ms,
        fsync=opts.fsync,
        query_versions=opts.versions and opts.readers == 0,
        readers=opts.readers,
        procedure_modules=PROCEDURE_MODULES,
        genesis=GENESIS,
        genesis_args={
            "warehouses": opts.warehouses,
            "seed": opts.load_seed,
            "load_ts_ms": int(time.time() * 1000),
        },
    )


def _bar_off(progress: bool) -> bool | None:
    """tqdm's ``disable``: off when not asked for, and (None) off when stderr is not a
    terminal, so a log gets no carriage-return redraws."""
    return None if progress else True


def start_cluster(cfg: ClusterConfig, progress: bool, log: Callable[[str], None]) -> Any:
    """Start sequencer + partitions (and readers); show a progress bar while
    partitions load."""
    from tqdm import tqdm

    from cluster.launcher import LocalCluster
    from txn_library.client import Client

    lc = LocalCluster(cfg)
    cfg.save()
    lc.start_sequencer()
    for r in range(cfg.replicas):
        for p in range(cfg.partitions):
            lc.start_partition(r, p)
    for i in range(cfg.readers):
        lc.start_reader(i)  # it loads the genesis too, and follows from epoch 1
    want = cfg.replicas * cfg.partitions
    per_part = cfg.genesis_args["warehouses"] / cfg.partitions
    patience = 60.0 + 4 * LOAD_S_PER_WAREHOUSE * per_part * want
    deadline = time.monotonic() + patience
    log(
        f"loading {cfg.genesis_args['warehouses']} warehouses into {cfg.replicas} replica(s) "
        f"x {cfg.partitions} partitions (each partition generates its own rows)"
    )
    try:
        with (
            Client(cfg.client_addr, timeout_s=5) as c,
            tqdm(
                total=want, desc="partitions loaded", unit="part", disable=_bar_off(progress)
            ) as bar,
        ):
            while True:
                lc.check_alive()
                try:
                    n = len(c.status(timeout_s=2)["partitions"])
                except Exception:
                    n = 0
                bar.update(n - bar.n)
                if n >= want and _readers_live(cfg):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"partitions (or readers) not loaded after {patience:.0f}s")
                time.sleep(0.2)
    except BaseException:
        lc.stop()
        raise
    return lc


# --- Load --------------------------------------------------------------------------------


def drive(
    address: str,
    inputs: TpccInputs,
    opts: RunOptions,
    log: Callable[[str], None],
    meter: CpuMeter,
    query_addresses: list[list[str]] | None = None,
) -> Window:
    """The terminals against the cluster at ``address``: warm-up, window, drain. With
    ``opts.queries`` "snapshot" the read-only transactions go to ``query_addresses``
    ([replica][partition]) as snapshot queries."""
    terminals = terminals_for(opts.terminals, opts.warehouses)
    queries = None
    if opts.queries == "snapshot":
        if not query_addresses:
            raise ValueError("snapshot queries need the partitions' query addresses")
        queries = QueryTargets(query_addresses, kinds=READ_ONLY_KINDS)

    def next_call(t: int) -> Call:
        return inputs.next(terminals[t])

    load: ClosedLoop | OpenLoop = ClosedLoop(terminals=opts.terminals)
    if opts.open_loop:
        load = OpenLoop(opts.rate, limits.loadgen_in_flight_max, terminals=opts.terminals)
    with LoadGenerator(address, next_call, load, seed=opts.seed, queries=queries) as gen:
        return gen.run(
            warmup_s=opts.warmup_s,
            duration_s=opts.duration_s,
            drain_s=DRAIN_S,
            status_at_edges=True,
            on_edge=meter.edge,
            on_tick=_Progress(log).tick,
        )


class _Progress:
    """One line a second: warming up, or the last second's throughput."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.last = (0, 0)  # (txns, new orders) answered in the window at the last line

    def tick(self, elapsed_s: float, measuring: bool, w: Window, in_flight: int) -> None:
        if not measuring:
            self.log(f"[{elapsed_s:6.1f}s] warming up: in flight {in_flight}")
            return
        total = sum(k.ok + k.aborted for k in w.kinds.values())
        new_orders = w.kinds[NEW_ORDER].ok if NEW_ORDER in w.kinds else 0
        self.log(
            f"[{elapsed_s:6.1f}s] measuring: {total - self.last[0]:6d} txn/s  "
            f"{new_orders - self.last[1]:6d} new-order/s  in flight {in_flight:5d}  "
            f"errors {w.errors}"
        )
        self.last = (total, new_orders)


def _readers_live(cfg: ClusterConfig) -> bool:
    """Whether every reader has loaded its start and caught up (none: true)."""
    from cluster.launcher import reader_report

    for r in range(cfg.readers):
        rep = reader_report(cfg, r, timeout_s=0.5)
        if rep is None or not rep.get("live"):
            return False
    return True


class _LagSampler:
    """Every reader's lag behind the sequencer's epoch, sampled every LAG_EVERY_S while
    the terminals run (the reader's own status: cluster.launcher.reader_report)."""

    def __init__(self, cfg: ClusterConfig) -> None:
        import threading

        self.cfg = cfg
        self.samples: list[int] = []
        self.live = 0  # samples of a reader that had caught up since its start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from cluster.launcher import reader_report

        while not self._stop.wait(LAG_EVERY_S):
            for r in range(self.cfg.readers):
                rep = reader_report(self.cfg, r, timeout_s=1.0)
                if rep is not None:  # catching up after its start too: lag is lag
                    self.samples.append(int(rep["lag_epochs"]))
                    self.live += bool(rep.get("live"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.samples)
        if not xs:
            return {"samples": 0}
        return {
            "samples": len(xs),
            "live_samples": self.live,
            "p50": xs[len(xs) // 2],
            "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))],
            "max": xs[-1],
        }


LAG_EVERY_S = 0.05


# --- Results -----------------------------------------------------------------------------


def _sequenced(w: Window) -> int:
    """Answered calls that went through the log (the read-only kinds do not)."""
    return sum(k.ok + k.aborted for name, k in w.kinds.items() if name in _SEQUENCED)


def summarize(w: Window, opts: RunOptions, partitions: int, replicas: int) -> dict[str, Any]:
    seconds = w.measured_s
    completed = w.ok + w.aborted
    sequenced = _sequenced(w)
    multi = sum(k.multi_partition for k in w.kinds.values())
    no = w.kinds.get(NEW_ORDER, KindStats())
    restarts = None
    if w.status_start is not None and w.status_end is not None:
        restarts = w.status_end["restarts"] - w.status_start["restarts"]
    per_kind = {}
    for name in KINDS:
        k = w.kinds.get(name)
        if k is None or k.answered == 0:
            continue
        per_kind[name] = {
            "ok": k.ok,
            "aborted": k.aborted,
            "errors": k.errors,
            "per_s": round((k.ok + k.aborted) / seconds, 1),
            "multi_partition": k.multi_partition,
            "latency_ms": k.percentiles_ms(),
        }
    epochs = None
    if w.status_start and w.status_end:
        epochs = w.status_end["epoch"] - w.status_start["epoch"]
    return {
        "measured_s": round(seconds, 2),
        "txn_per_s": round(completed / seconds, 1),
        "new_order_per_s": round(no.ok / seconds, 1),
        "tpmC": round(no.ok / seconds * 60.0),
        "new_order_rollbacks": no.aborted,
        "dependent_restarts": restarts,
        "multi_partition_share": round(multi / sequenced, 4) if sequenced else 0.0,
        "errors": dict(w.error_codes),
        "unanswered_after_drain": w.unanswered,
        "open_loop_skipped": w.skipped,
        "epochs": epochs,
        "txns_per_epoch": round(sequenced / epochs, 1) if epochs else None,
        "per_type": per_kind,
        "determinism_violations": (w.status_end or {}).get("determinism_violations"),
    }


_SEQUENCED = ("new_order", "payment", "delivery")


# --- Checks ------------------------------------------------------------------------------


def check_cluster(
    cfg: ClusterConfig, warehouses: int, log: Callable[[str], None], timeout_s: float = 120.0
) -> dict[str, Any]:
    """Consistency conditions 1-9, 11, 12 on every warehouse at every replica, and equal state
    hashes per partition across replicas once the cluster is quiescent."""
    from cluster.launcher import wait_quiescent
    from txn_library.client import Client

    with Client(cfg.client_addr, timeout_s=timeout_s) as c:
        st = wait_quiescent(c, cfg.replicas, cfg.partitions, timeout_s=timeout_s)
        violations: dict[str, list[str]] = {}
        for r in range(cfg.replicas):
            for w_id in range(1, warehouses + 1):
                res = c.call("tpcc.check_warehouse", w_id, replica=r, timeout_s=timeout_s)
                found = list(res.value) if res.ok else [f"check failed: {res.value}"]
                if found:
                    violations[f"replica {r} warehouse {w_id}"] = found
        st = wait_quiescent(c, cfg.replicas, cfg.partitions, timeout_s=timeout_s)
    hashes: dict[int, dict[int, str]] = {}
    for p in st["partitions"]:
        hashes.setdefault(p["partition"], {})[p["replica"]] = p["state_hash"]
    equal = all(len(set(h.values())) == 1 for h in hashes.values())
    ok = not violations and equal and st["determinism_violations"] == 0
    verdict = {
        "consistent": not violations,
        "violations": violations,
        "state_hashes_equal": equal,
        "state_hashes": {str(p): h for p, h in sorted(hashes.items())},
        "determinism_violations": st["determinism_violations"],
        "epoch": st["epoch"],
        "ok": ok,
    }
    log(
        f"check: consistency conditions 1-9, 11, 12 on {warehouses} warehouse(s) x {cfg.replicas} "
        f"replica(s): {'hold' if not violations else 'VIOLATED'}; state hashes per partition "
        f"{'equal' if equal else 'DIFFER'} across replicas; determinism violations "
        f"{st['determinism_violations']} -> {'OK' if ok else 'FAILED'}"
    )
    for where, found in violations.items():
        for v in found[:10]:
            log(f"  {where}: {v}")
    return verdict


def warehouses_of(cfg: ClusterConfig) -> int:
    if cfg.genesis != GENESIS:
        raise ValueError(
            f"the cluster in {cfg.data_dir} was not started with genesis {GENESIS} "
            f"(it has {cfg.genesis!r}); start one with `ordo tpcc run` or a tpcc config"
        )
    return int(cfg.genesis_args["warehouses"])


# --- Run ---------------------------------------------------------------------------------


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(opts: RunOptions, log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """A whole ``ordo tpcc run``: cluster, load loop, summary, checks, JSON file."""
    from cluster.launcher import free_base_port
    from txn_library.procedure import load_modules

    load_modules(PROCEDURE_MODULES)
    if opts.open_loop and opts.rate <= 0:
        raise ValueError("--open-loop needs --rate > 0")
    if opts.queries not in READ_ONLY_AS:
        raise ValueError(f"read-only transactions go as one of {READ_ONLY_AS}")
    lc = None
    tmp_dir = None
    owner = None
    if opts.attach:
        cfg = ClusterConfig.load(opts.attach)
        opts.warehouses = warehouses_of(cfg)
        opts.partitions, opts.replicas = cfg.partitions, cfg.replicas
        opts.load_seed = int(cfg.genesis_args.get("seed", opts.load_seed))
        opts.fsync, opts.epoch_ms = cfg.fsync, cfg.epoch_duration_ms
        opts.versions = cfg.replica_versions
    else:
        data_dir = opts.data_dir
        if data_dir is None:
            data_dir = tmp_dir = tempfile.mkdtemp(prefix="ordo-tpcc-")
        elif Path(data_dir).exists() and not opts.fresh:  # never deleted unasked
            raise FileExistsError(
                f"{data_dir} exists; pass --fresh to start a new TPC-C database there "
                f"(it is deleted first), or --attach {data_dir} to drive the cluster "
                f"running there"
            )
        if tmp_dir is None:  # another launcher's cluster there is never touched
            owner = claim_cluster_dir(data_dir, fresh=opts.fresh)
        cfg = embedded_config(opts, data_dir, free_base_port())
        opts.versions = cfg.replica_versions  # none when readers serve
    if opts.queries == "snapshot" and not opts.versions:
        raise ValueError(
            "snapshot queries read row versions: the cluster keeps none (--no-versions)"
        )
    load_before = os.getloadavg()
    try:
        if not opts.attach:
            log(f"engine: {native.describe()}")
            lc = start_cluster(cfg, opts.progress, log)
        inputs = TpccInputs(
            opts.warehouses,
            cfg.partitions,
            opts.seed,
            load_seed=opts.load_seed,
            mix=opts.mix,
            remote_line_pct=opts.remote_pct,
            payment_by_name_proc=(
                "tpcc.payment_by_name_rc" if opts.payment_rc else "tpcc.payment_by_name"
            ),
        )
        mode = f"open loop at {opts.rate:g} txn/s" if opts.open_loop else "closed loop"
        log(
            f"driving {opts.terminals} terminals, {mode}, no keying/think times, mix "
            f"{opts.mix}, {opts.warmup_s:g}s warm-up + {opts.duration_s:g}s measured; "
            f"read-only transactions {opts.queries}; row versions "
            f"{'kept' if opts.versions else 'not kept'}"
        )
        pids = {} if lc is None else {name: p.pid for name, p in lc.procs.items()}
        meter = CpuMeter(pids)
        lags = _LagSampler(cfg) if cfg.readers else None
        try:
            window = drive(cfg.client_addr, inputs, opts, log, meter, cfg.query_addrs())
        finally:
            if lags is not None:
                lags.stop()
        load_after = os.getloadavg()
        summary = summarize(window, opts, cfg.partitions, cfg.replicas)
        if lags is not None:
            summary["reader_lag_epochs"] = lags.summary()
        summary["cpu_s_in_window"] = meter.used
        sequenced = _sequenced(window)
        if sequenced:
            summary["cpu_us_per_sequenced_txn"] = {
                name: round(1e6 * used / sequenced, 1) for name, used in meter.used.items()
            }
        result: dict[str, Any] = {
            "options": asdict(opts),
            "cluster": {
                "warehouses": opts.warehouses,
                "partitions": cfg.partitions,
                "replicas": cfg.replicas,
                "fsync": cfg.fsync,
                "epoch_ms": cfg.epoch_duration_ms,
                "query_versions": cfg.replica_versions,
                # The processes' choice (the same tree and environment as this one's).
                "engine": "attached" if opts.attach else native.describe(),
            },
            "summary": summary,
            "machine": {
                "cpus": os.cpu_count(),
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in load_after],
            },
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        print_summary(summary, log)
        if opts.check:
            result["check"] = check_cluster(cfg, opts.warehouses, log)
        if lc is not None:
            lc.check_alive()
    finally:
        if lc is not None:
            lc.stop()
        if owner is not None:
            owner.release()
        if tmp_dir and not opts.keep_data:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.out).write_text(json.dumps(result, indent=2))
        log(f"results written to {opts.out}")
    return result


def print_summary(s: dict[str, Any], log: Callable[[str], None]) -> None:
    log(
        f"committed {s['txn_per_s']:.0f} txn/s over {s['measured_s']}s; "
        f"New-Order {s['new_order_per_s']:.0f}/s = tpmC {s['tpmC']} "
        f"(rollbacks {s['new_order_rollbacks']})"
    )
    log(
        f"dependent restarts {s['dependent_restarts']}, multi-partition share "
        f"{100 * s['multi_partition_share']:.1f}%, errors {sum(s['errors'].values())}, "
        f"epochs {s['epochs']} ({s['txns_per_epoch']} txns/epoch)"
    )
    for name, k in s["per_type"].items():
        lat = k["latency_ms"]
        log(
            f"  {name:13s} {k['per_s']:8.1f}/s  ok {k['ok']:7d}  aborted {k['aborted']:5d}  "
            f"errors {k['errors']:3d}  p50 {lat['p50']} ms  p95 {lat['p95']} ms  "
            f"p99 {lat['p99']} ms"
        )
    for what, n in s["errors"].items():
        log(f"  error {what}: {n}")
    lag = s.get("reader_lag_epochs")
    if lag:
        log(
            f"  readers' lag behind the sequencer: p50 {lag.get('p50')} / p99 "
            f"{lag.get('p99')} / max {lag.get('max')} epochs ({lag['samples']} samples)"
        )
    if s.get("cpu_s_in_window"):
        used = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(s["cpu_s_in_window"].items()))
        log(f"  CPU used in the window: {used} (of {s['measured_s']}s x {os.cpu_count()} cores)")
