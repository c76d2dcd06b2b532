"""The seed paper's three experiments on Ordo, deterministic vs traditional (2PL+2PC).

"The Case for Determinism in Database Systems" (Thomson & Abadi, VLDB 2010):

  a  TPC-C New Order throughput, average latency and contention vs the share of
     multi-partition New Orders (0..100%), 2 and 10 warehouses on 2 partitions
     (the paper's Figures 3 and 7).
  b  Clogging: 10-record updates over 1,000,000 records at pairwise conflict
     probability 0.01%, 0.1%, 1%; at t=1 s one transaction takes its locks and stalls
     for 1 s; throughput and the share of blocked transactions over time (Figure 1).
  c  Dependent transactions: index lookup then update, 0/50/100% of them dependent,
     while a background client re-points index entries at a given rate; throughput
     and average restarts vs that rate (Figures 5-6).

One command runs everything and writes {a,b,c}.json, .csv and .png to the scratch
directory (scripts/bench_outputs.py), or with ``--publish`` to results/paper/ and the
report docs/PAPER_REPORT.md from them:

    .venv/bin/python scripts/paper_experiments.py --publish  # a, b and c
    .venv/bin/python scripts/paper_experiments.py --quick a  # one experiment, shorter points

Every cluster is real processes on 127.0.0.1, fsync on, one replica (the baseline is
not replicated), 2 partitions. Per cluster the points run back to back; each point
has a warm-up whose answers are not counted and a measurement window. The load
generator (cluster/loadgen.py, shared with ``ordo tpcc run`` and the bank benchmarks,
nearest-rank percentiles) is closed loop (a fixed number of calls in flight) except in
b, where it is open loop at a fixed rate so that a stall shows up as a backlog, not as
idle clients.

Invariant: the script never decides an outcome: every count is a result returned by
the cluster or read from its status.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txn_library import placement

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_outputs import ROOT, BenchParser, wrote  # noqa: E402

from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import LocalCluster, ProcessGroup, free_base_port  # noqa: E402
from cluster.load_shapes import Call, ClosedLoop, OpenLoop, Router, home_router  # noqa: E402
from cluster.loadgen import LoadGenerator  # noqa: E402
from cluster.measure import Window  # noqa: E402
from cluster.traditional_server import TraditionalCluster  # noqa: E402
from executor.traditional.options import TraditionalOptions  # noqa: E402
from txn_library import limits  # noqa: E402
from txn_library.client import Client  # noqa: E402
from txn_library.client.routing import RoutingClient  # noqa: E402
from txn_library.workloads import bench_procedures as bp  # noqa: E402

MODES = ("deterministic", "traditional")
PARTITIONS = 2
BENCH_MODULES = (
    "txn_library.workloads.builtin",
    "tpcc.transactions",
    "txn_library.workloads.bench_procedures",
)
BUCKET_S = 0.1
START_WAIT_S = 600.0
DRAIN_S = 60.0


# --- Clusters ----------------------------------------------------------------------------


def start_cluster(
    mode: str, tmp: str, genesis: str, genesis_args: dict, epoch_ms: int
) -> tuple[ProcessGroup, Any]:
    """Start a cluster of ``mode``; returns (process group, client with submit/status)."""
    cfg = ClusterConfig(
        replicas=1,
        partitions=PARTITIONS,
        base_port=free_base_port(),
        data_dir=tmp,
        epoch_duration_ms=epoch_ms,
        procedure_modules=BENCH_MODULES,
        genesis=genesis,
        genesis_args=genesis_args,
    )
    group: ProcessGroup
    if mode == "deterministic":
        group = LocalCluster(cfg)
    else:
        group = TraditionalCluster(cfg, TraditionalOptions())
    try:
        group.start(wait_s=START_WAIT_S)
        client = _open_client(mode, cfg, group)
    except BaseException:
        group.stop()
        raise
    return group, client


def _open_client(mode: str, cfg: ClusterConfig, group: ProcessGroup) -> Any:
    if mode == "deterministic":
        return Client(cfg.client_addr, timeout_s=120)
    assert isinstance(group, TraditionalCluster)
    return RoutingClient(group.client_addrs, timeout_s=120)


def restarts_of(client: Any) -> int:
    """Deterministic: the sequencer's dependent restarts. Traditional: wait-die deaths
    (the status field 'restarts' of that mode sums the partitions' deaths)."""
    return int(client.status(timeout_s=10)["restarts"])


def contention_counters(client: Any) -> dict[str, int]:
    """Cumulative contention counters of the cluster (both modes report them in status):
    lock requests that had to queue, (det) admissions with any such request, restarts
    (det: dependent restarts; traditional: wait-die deaths)."""
    st = client.status(timeout_s=10)
    parts = st["partitions"]
    return {
        "lock_waits": sum(int(p.get("lock_waits", 0)) for p in parts),
        "txn_waits": sum(int(p.get("txn_waits", 0)) for p in parts),
        "restarts": int(st["restarts"]),
    }


# --- Load generator ----------------------------------------------------------------------


def load_targets(group: ProcessGroup) -> tuple[list[str], Router | None]:
    """Where the load goes: the sequencer, or (traditional) each call's home partition."""
    if isinstance(group, TraditionalCluster):
        return group.client_addrs, home_router(PARTITIONS)
    return [group.config.client_addr], None


def run_point(
    group: ProcessGroup,
    next_call: Callable[[], Call],
    warmup_s: float,
    duration_s: float,
    *,
    in_flight: int = 256,
    rate: float | None = None,
    events: Sequence[tuple[float, Callable[[], None]]] = (),
    blocked_after_s: float = 0.2,
) -> Window:
    """Drive calls for warmup_s + duration_s through cluster.loadgen, with a timeline of
    BUCKET_S buckets. Closed loop (``in_flight`` outstanding) or open loop at ``rate``
    calls/s (at most ``in_flight`` outstanding; calls due beyond it are skipped and
    reported on stderr). ``events`` run at their offsets from the start (e.g. the
    stalling transaction)."""
    targets, route = load_targets(group)
    load: ClosedLoop | OpenLoop = ClosedLoop(terminals=in_flight)
    if rate is not None:
        load = OpenLoop(rate, in_flight_max=in_flight)
    with LoadGenerator(targets, lambda _t: next_call(), load, route=route, timeout_s=120) as gen:
        w = gen.run(
            warmup_s=warmup_s,
            duration_s=duration_s,
            drain_s=DRAIN_S,
            events=events,
            timeline_bucket_s=BUCKET_S,
            late_after_s=blocked_after_s,
        )
    if w.skipped:
        print(
            f"warning: {w.skipped} calls not sent (at most {in_flight} in flight)", file=sys.stderr
        )
    return w


def point_summary(w: Window) -> dict[str, Any]:
    """A point's measured numbers (answers inside the window), as rows report them."""
    lat = w.latencies_s()
    pct = w.percentiles_ms((0.5, 0.99))
    measured_s = round(w.measured_s, 2)
    return {
        "measured_s": measured_s,
        "answered": w.answered,
        "ok": w.ok,
        "aborted": w.aborted,
        "failed": w.errors,
        "errors": list(w.error_codes)[:3],
        "txn_per_s": round(w.answered / w.measured_s, 1),
        "latency_avg_ms": round(1000 * sum(lat) / len(lat), 2) if lat else None,
        "latency_p50_ms": pct["p50"],
        "latency_p99_ms": pct["p99"],
        "kinds": {name: k.ok + k.aborted for name, k in w.kinds.items() if k.ok + k.aborted},
    }


# --- a: TPC-C New Order vs multi-partition share -----------------------------------------


def new_order_calls(warehouses: int, multi_share: float, seed: int) -> Callable[[], Call]:
    """New Orders (clause 2.4.1 inputs, no remote lines) of which ``multi_share`` get one
    line supplied by a warehouse on the other partition (so they are multi-partition)."""
    from tpcc.inputs import Terminal, TpccInputs
    from tpcc.schema import WAREHOUSE

    inputs = TpccInputs(warehouses, PARTITIONS, seed, load_seed=1, remote_line_pct=0)
    rng = random.Random(seed)
    part = {
        w: placement.partition_of(WAREHOUSE, (w,), PARTITIONS) for w in range(1, warehouses + 1)
    }

    def nxt() -> Call:
        w_id = rng.randint(1, warehouses)
        call = inputs.new_order(Terminal(w_id, 1))
        w, d, c, i_ids, supply, qty = call.args
        kind = "single"
        if rng.random() < multi_share:
            others = [x for x in part if part[x] != part[w_id]]
            supply = list(supply)
            supply[rng.randrange(len(supply))] = rng.choice(others)
            kind = "multi"
        return Call("tpcc.new_order", (w, d, c, list(i_ids), list(supply), list(qty)), kind)

    return nxt


def experiment_a(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    shares = [0.0, 0.1, 0.2, 0.5, 0.8, 1.0]
    for warehouses in a.warehouses:
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix=f"ordo-paper-a-{mode}-") as tmp:
                t_load = time.monotonic()
                gargs = {"warehouses": warehouses, "seed": 1, "load_ts_ms": 1_700_000_000_000}
                group, client = start_cluster(mode, tmp, "tpcc.loader:genesis", gargs, a.epoch_ms)
                load_s = time.monotonic() - t_load
                try:
                    for share in shares:
                        before = contention_counters(client)
                        w = run_point(
                            group,
                            new_order_calls(warehouses, share, seed=int(share * 100) + 7),
                            a.warmup_s,
                            a.duration_s,
                            in_flight=a.in_flight,
                        )
                        time.sleep(0.5)  # partitions report status every 0.2 s
                        after = contention_counters(client)
                        group.check_alive()
                        row = {
                            "experiment": "a",
                            "mode": mode,
                            "warehouses": warehouses,
                            "multi_partition_share": share,
                            "load_s": round(load_s, 1),
                            **point_summary(w),
                        }
                        # Counted over warm-up + window + drain (status is cumulative),
                        # so divided by every call answered in that span.
                        d = {k: after[k] - before[k] for k in after}
                        calls = w.answered_all or 1
                        row["lock_waits_per_txn"] = round(d["lock_waits"] / calls, 4)
                        if mode == "traditional":
                            row["wait_die_deaths"] = d["restarts"]
                            row["deaths_per_txn"] = round(d["restarts"] / calls, 4)
                            row["waited_share"] = None
                        else:
                            # share of (txn, partition) admissions not granted every lock
                            # at once; a multi-partition txn is admitted at both partitions
                            row["waited_share"] = round(d["txn_waits"] / calls, 4)
                            row["deaths_per_txn"] = 0.0
                        row["load_avg_1m"] = round(os.getloadavg()[0], 2)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                finally:
                    client.close()
                    group.stop()
    return rows


# --- b: clogging ------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkingSet:
    """Where a txn's 10 records come from, for a target pairwise conflict probability.

    A txn picks its partition uniformly (so it is single-partition), then 10 distinct
    records uniformly from the first ``size`` records of that partition (its working
    set; the other records exist but are not touched). Two txns conflict only on the
    same partition (prob. 1/2) and then with probability 1 - C(size-10, 10)/C(size, 10)
    (~100/size). With 1,000,000 records: size 500,000 (the whole partition) gives
    0.01%, 50,000 gives 0.1%, 5,000 gives 1%.
    """

    target: float
    size: int

    def conflict_probability(self) -> float:
        k = self.size
        return 0.5 * (1.0 - math.comb(k - 10, 10) / math.comb(k, 10))


def working_set_for(target: float, records: int) -> WorkingSet:
    per_part = records // PARTITIONS
    size = max(20, min(per_part, round(0.5 * 100 / target)))
    return WorkingSet(target, size)


def clog_calls(ws: WorkingSet, seed: int) -> Callable[[], Call]:
    rng = random.Random(seed)

    def nxt() -> Call:
        p = rng.randrange(PARTITIONS)
        js = rng.sample(range(ws.size), 10)
        return Call("bench.update", ([p + PARTITIONS * j for j in js], 1), "update")

    return nxt


def experiment_b(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    records = a.records
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix=f"ordo-paper-b-{mode}-") as tmp:
            t_load = time.monotonic()
            gargs = {"records": records, "tags": 0}
            genesis = "txn_library.workloads.bench_procedures:genesis"
            group, client = start_cluster(mode, tmp, genesis, gargs, a.epoch_ms)
            load_s = time.monotonic() - t_load
            try:
                for target in a.conflict_probs:
                    ws = working_set_for(target, records)
                    nxt = clog_calls(ws, seed=int(target * 1e6))
                    stall_call = nxt()  # a regular txn of the workload, on some partition
                    stall_rids = stall_call.args[0]
                    stall_future: list[Future] = []

                    def fire(
                        rids: list = stall_rids, out: list = stall_future, c: Any = client
                    ) -> None:
                        out.append(c.submit("bench.stall", rids, 1, a.stall_ms))

                    w = run_point(
                        group,
                        nxt,
                        0.0,
                        a.clog_total_s,
                        in_flight=a.clog_in_flight,
                        rate=a.clog_rate,
                        events=[(a.stall_at_s, fire)],
                    )
                    group.check_alive()
                    stall_latency = None
                    if stall_future:
                        try:
                            stall_latency = round(stall_future[0].result(timeout=30).latency_s, 3)
                        except Exception as e:
                            stall_latency = repr(e)
                    tl = w.timeline
                    assert tl is not None
                    series = []
                    for b in range(int(a.clog_total_s / BUCKET_S)):
                        n, old = tl.samples[b][1:] if b < len(tl.samples) else (None, None)
                        submitted, late = tl.submitted[b], tl.late[b]
                        series.append(
                            {
                                "t_s": round((b + 1) * BUCKET_S, 3),  # end of the bucket
                                "txn_per_s": tl.answers[b] / BUCKET_S,  # answers in it
                                "in_flight": n,  # sampled at about the bucket's end
                                "blocked": old,  # of those, waiting > 200 ms
                                "submitted": submitted,
                                "late": late,
                                # of the calls submitted in the bucket, share answered
                                # after more than 200 ms (or never)
                                "blocked_share": round(late / submitted, 4) if submitted else 0.0,
                            }
                        )
                    row = {
                        "experiment": "b",
                        "mode": mode,
                        "conflict_probability_target": target,
                        "conflict_probability_model": round(ws.conflict_probability(), 6),
                        "working_set_per_partition": ws.size,
                        "records": records,
                        "rate_offered_per_s": a.clog_rate,
                        "stall_ms": a.stall_ms,
                        "stall_at_s": a.stall_at_s,
                        "stall_txn_latency_s": stall_latency,
                        "stall_txn_partition": stall_rids[0] % PARTITIONS,
                        "load_s": round(load_s, 1),
                        "load_avg_1m": round(os.getloadavg()[0], 2),
                        **point_summary(w),
                        "series": series,
                    }
                    print(json.dumps({k: v for k, v in row.items() if k != "series"}), flush=True)
                    rows.append(row)
            finally:
                client.close()
                group.stop()
    return rows


# --- c: dependent transactions -----------------------------------------------------------


def dependent_calls(
    mode: str, tags: int, slots: int, share: float, seed: int
) -> Callable[[], Call]:
    rng = random.Random(seed)

    def nxt() -> Call:
        tag = rng.randrange(tags)
        if rng.random() < share:
            if mode == "deterministic":
                return Call("bench.tag_update", (tag, 1), "dependent")
            return Call("bench.tag_update_locking", (tag, 1, tags, slots), "dependent")
        rid = rng.choice(bp.slot_rids(tag, tags, slots))
        return Call("bench.update", ([rid], 1), "known")

    return nxt


def index_mover(
    group: ProcessGroup, tags: int, slots: int, rate: float, stop: threading.Event
) -> Window | None:
    """Re-point random tags to random slots at ``rate`` per second (open loop, its own
    load generator) until ``stop``; then wait up to 30 s for the answers. The window
    counts every move (sent, committed); None when the rate is 0 (nothing sent)."""
    if rate <= 0:
        return None
    rng = random.Random(99)

    def nxt(_terminal: int) -> Call | None:
        if stop.is_set():
            return None
        tag = rng.randrange(tags)
        return Call("bench.tag_move", (tag, rng.choice(bp.slot_rids(tag, tags, slots))), "move")

    targets, route = load_targets(group)
    load = OpenLoop(rate, in_flight_max=limits.loadgen_in_flight_max)
    with LoadGenerator(targets, nxt, load, route=route, timeout_s=30.0) as gen:
        return gen.run(drain_s=0.0)


def experiment_c(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    tags, slots = a.tags, a.slots
    for mode in MODES:
        with tempfile.TemporaryDirectory(prefix=f"ordo-paper-c-{mode}-") as tmp:
            gargs = {"records": tags * slots, "tags": tags}
            genesis = "txn_library.workloads.bench_procedures:genesis"
            group, client = start_cluster(mode, tmp, genesis, gargs, a.epoch_ms)
            try:
                for share in a.dependent_shares:
                    for rate in a.index_rates:
                        stop = threading.Event()
                        moved: list[Window | None] = []
                        mover = threading.Thread(
                            target=lambda out=moved, g=group, r=rate, s=stop: out.append(
                                index_mover(g, tags, slots, r, s)
                            )
                        )
                        before = restarts_of(client)
                        mover_t0 = time.monotonic()
                        mover.start()
                        try:
                            w = run_point(
                                group,
                                dependent_calls(mode, tags, slots, share, seed=int(rate) + 3),
                                a.warmup_s,
                                a.duration_s,
                                in_flight=a.in_flight,
                            )
                        finally:
                            stop.set()
                            mover_s = time.monotonic() - mover_t0
                            mover.join()
                        if not moved:
                            raise RuntimeError("the index mover failed (its error is above)")
                        moves = moved[0]
                        moves_sent = 0 if moves is None else moves.sent
                        moves_ok = 0 if moves is None else moves.ok
                        time.sleep(0.3)
                        after = restarts_of(client)
                        group.check_alive()
                        # restarts are counted over warm-up + window + drain, so per
                        # dependent txn answered in that same span
                        dependent = w.kinds_all.get("dependent", 0)
                        row = {
                            "experiment": "c",
                            "mode": mode,
                            "dependent_share": share,
                            "index_updates_per_s": rate,  # offered
                            "index_moves_sent": moves_sent,
                            "index_moves_committed_per_s": round(moves_ok / mover_s, 1),
                            "tags": tags,
                            "slots": slots,
                            **point_summary(w),
                            "restarts": after - before,
                            "restart_kind": "dependent restarts"
                            if mode == "deterministic"
                            else "wait-die deaths",
                            "restarts_per_dependent_txn": round((after - before) / dependent, 4)
                            if dependent
                            else None,
                            "load_avg_1m": round(os.getloadavg()[0], 2),
                        }
                        print(json.dumps(row), flush=True)
                        rows.append(row)
            finally:
                client.close()
                group.stop()
    return rows


# --- Output -----------------------------------------------------------------------------


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    flat = [{k: v for k, v in r.items() if not isinstance(v, (list, dict))} for r in rows]
    if not flat:
        return
    with path.open("w", newline="") as f:
        names = list(dict.fromkeys(k for r in flat for k in r))
        wr = csv.DictWriter(f, fieldnames=names, restval="")
        wr.writeheader()
        wr.writerows(flat)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save_figure(plt: Any, fig: Any, axes: Any, path: Path) -> None:
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_a(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    whs = sorted({r["warehouses"] for r in rows})
    for wh in whs:
        for mode, style in zip(MODES, ("-o", "--s"), strict=True):
            pts = [r for r in rows if r["warehouses"] == wh and r["mode"] == mode]
            xs = [100 * r["multi_partition_share"] for r in pts]
            label = f"{mode}, {wh} warehouses"
            axes[0].plot(xs, [r["txn_per_s"] for r in pts], style, label=label)
            axes[1].plot(xs, [r["latency_avg_ms"] for r in pts], style, label=label)
            axes[2].plot(xs, [r.get("lock_waits_per_txn") for r in pts], style, label=label)
            if mode == "traditional":
                deaths = [r.get("deaths_per_txn") for r in pts]
                axes[2].plot(xs, deaths, ":x", label=f"wait-die deaths, {wh} warehouses")
    axes[0].set_title("New Order throughput (Fig. 3)")
    axes[0].set_ylabel("txn/s")
    axes[1].set_title("average latency (Fig. 7)")
    axes[1].set_ylabel("ms")
    axes[2].set_title("contention: lock requests that queued, per txn (Fig. 7)")
    axes[2].set_ylabel("per transaction")
    for ax in axes:
        ax.set_xlabel("% multi-partition New Orders")
    _save_figure(plt, fig, axes, path)


def plot_b(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _pyplot()
    targets = sorted({r["conflict_probability_target"] for r in rows})
    fig, axes = plt.subplots(2, len(targets), figsize=(5 * len(targets), 7), squeeze=False)
    for j, tgt in enumerate(targets):
        for mode, style in zip(MODES, ("-", "--"), strict=True):
            for r in rows:
                if r["mode"] != mode or r["conflict_probability_target"] != tgt:
                    continue
                ts = [s["t_s"] for s in r["series"]]
                axes[0][j].plot(ts, [s["txn_per_s"] for s in r["series"]], style, label=mode)
                t_sub = [t - BUCKET_S for t in ts]  # blocked share is by submission bucket
                shares = [s["blocked_share"] for s in r["series"]]
                axes[1][j].plot(t_sub, shares, style, label=mode)
                at = r["stall_at_s"]
                for ax in (axes[0][j], axes[1][j]):
                    ax.axvspan(at, at + r["stall_ms"] / 1000, color="grey", alpha=0.12)
        axes[0][j].set_title(f"conflict probability {100 * tgt:g}%")
        axes[0][j].set_ylabel("txn/s (100 ms buckets)")
        axes[1][j].set_ylabel("blocked share: txns submitted\nthen, answered after > 200 ms")
        axes[1][j].set_ylim(-0.02, 1.02)
        axes[1][j].set_xlabel("time (s); grey: the stalled txn holds its locks")
    _save_figure(plt, fig, axes.flat, path)


def plot_c(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    shares = sorted({r["dependent_share"] for r in rows})
    for mode, style in zip(MODES, ("-o", "--s"), strict=True):
        for share in shares:
            pts = [r for r in rows if r["mode"] == mode and r["dependent_share"] == share]
            xs = [r["index_updates_per_s"] for r in pts]
            label = f"{mode}, {100 * share:g}% dependent"
            axes[0].plot(xs, [r["txn_per_s"] for r in pts], style, label=label)
            if share > 0:
                ys = [r["restarts_per_dependent_txn"] or 0 for r in pts]
                axes[1].plot(xs, ys, style, label=label)
    axes[0].set_title("throughput vs index volatility (Fig. 5)")
    axes[0].set_ylabel("txn/s")
    axes[1].set_title("restarts per dependent txn (Fig. 6)\n(traditional: wait-die deaths)")
    for ax in axes:
        ax.set_xlabel("index-entry updates per second")
    _save_figure(plt, fig, axes, path)


def save(out_dir: Path, name: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    write_csv(out_dir / f"{name}.csv", rows)
    {"a": plot_a, "b": plot_b, "c": plot_c}[name[0]](rows, out_dir / f"{name}.png")


# --- Report ------------------------------------------------------------------------------

REPORT = ROOT / "docs" / "PAPER_REPORT.md"  # its image links assume results/paper/


def _fmt(x: Any, digits: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and digits:
        return f"{x:,.{digits}f}"
    if isinstance(x, (int, float)):
        return f"{x:,.0f}"
    return str(x)


def _ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for wh in sorted({r["warehouses"] for r in rows}):
        parts = []
        for share in (0.0, 0.5, 1.0):
            pick = {
                r["mode"]: r["txn_per_s"]
                for r in rows
                if r["warehouses"] == wh and r["multi_partition_share"] == share
            }
            if len(pick) == 2 and pick["traditional"]:
                ratio = pick["deterministic"] / pick["traditional"]
                parts.append(f"{ratio:.2f}x at {100 * share:.0f}%")
        if parts:
            out.append(f"- {wh} warehouses: " + ", ".join(parts))
    return out


def _clog_summary(r: dict[str, Any]) -> dict[str, Any]:
    at, stall_s = r["stall_at_s"], r["stall_ms"] / 1000
    during = [s for s in r["series"] if at < s["t_s"] <= at + stall_s + 1e-9]
    submitted = sum(s.get("submitted", 0) for s in during)
    late = sum(s.get("late", 0) for s in during)
    return {
        "mean_tput": sum(s["txn_per_s"] for s in during) / len(during) if during else None,
        "min_tput": min((s["txn_per_s"] for s in during), default=None),
        "blocked_share": round(late / submitted, 3) if submitted else None,
        "max_in_flight_blocked": max((s["blocked"] or 0 for s in during), default=None),
    }


def write_report(out_dir: Path, report: Path) -> None:
    """docs/PAPER_REPORT.md from the saved JSON of each experiment (numbers only; the
    analysis is docs/PAPER_EXPERIMENTS.md)."""
    saved = {}
    for name in ("a", "b", "c"):
        path = out_dir / f"{name}.json"
        if path.exists():
            saved[name] = json.loads(path.read_text())
    if not saved:
        return
    lines = [
        "# Paper experiments: measured report",
        "",
        "Generated by `scripts/paper_experiments.py` from `results/paper/*.json`; do not",
        "edit by hand. Method and comparison with the paper: docs/PAPER_EXPERIMENTS.md.",
        "",
    ]
    for name, d in saved.items():
        lines.append(
            f"- {name}: run {d['when']} on {d['cpus']} CPUs, {d['wall_s']} s, 1-minute load "
            f"average {d['load_avg_1m_start']} at start, {d['load_avg_1m_end']} at end"
        )
    if "a" in saved:
        rows = saved["a"]["rows"]
        lines += ["", "## a. New Order vs multi-partition share (Figures 3, 7)", ""]
        lines += ["![a](../results/paper/a.png)", "", "Deterministic / traditional throughput:", ""]
        lines += _ratio_lines(rows)
        lines += [
            "",
            "| warehouses | multi % | mode | txn/s | avg ms | p99 ms | lock waits/txn "
            "| waited share | deaths/txn |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sorted(rows, key=lambda r: (r["warehouses"], r["multi_partition_share"])):
            lines.append(
                f"| {r['warehouses']} | {100 * r['multi_partition_share']:.0f} | {r['mode']} "
                f"| {_fmt(r['txn_per_s'])} | {_fmt(r['latency_avg_ms'], 1)} "
                f"| {_fmt(r['latency_p99_ms'], 1)} | {_fmt(r.get('lock_waits_per_txn'), 3)} "
                f"| {_fmt(r.get('waited_share'), 3)} | {_fmt(r.get('deaths_per_txn'), 3)} |"
            )
    if "b" in saved:
        rows = saved["b"]["rows"]
        lines += ["", "## b. Clogging: one transaction holds its locks for 1 s (Figure 1)", ""]
        lines += [
            "![b](../results/paper/b.png)",
            "",
            "During the stall (the 1 s after it started): mean and lowest throughput over",
            "its 100 ms buckets (one bucket dips with noise at any p);",
            "blocked share = share of the calls submitted during the stall that were answered",
            "after more than 200 ms (or never); most calls waiting > 200 ms at one sample.",
            "",
            "| mode | conflict p | working set/partition | stall txn latency s "
            "| mean txn/s | min txn/s | blocked share | max blocked at once | avg ms | p99 ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            c = _clog_summary(r)
            lines.append(
                f"| {r['mode']} | {100 * r['conflict_probability_target']:g}% "
                f"| {_fmt(r.get('working_set_per_partition'))} | {r['stall_txn_latency_s']} "
                f"| {_fmt(c['mean_tput'])} | {_fmt(c['min_tput'])} "
                f"| {_fmt(c['blocked_share'], 3)} "
                f"| {_fmt(c['max_in_flight_blocked'])} "
                f"| {_fmt(r['latency_avg_ms'], 1)} | {_fmt(r['latency_p99_ms'], 1)} |"
            )
    if "c" in saved:
        rows = saved["c"]["rows"]
        lines += ["", "## c. Dependent transactions vs index volatility (Figures 5, 6)", ""]
        lines += [
            "![c](../results/paper/c.png)",
            "",
            "| mode | dependent % | index updates/s offered | committed | txn/s | avg ms "
            "| restarts | restarts per dependent txn |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['mode']} | {100 * r['dependent_share']:.0f} "
                f"| {_fmt(r['index_updates_per_s'])} "
                f"| {_fmt(r.get('index_moves_committed_per_s'))} | {_fmt(r['txn_per_s'])} "
                f"| {_fmt(r['latency_avg_ms'], 1)} | {r['restarts']} "
                f"| {_fmt(r['restarts_per_dependent_txn'], 4)} |"
            )
        lines += ["", "Traditional restarts are wait-die deaths (it has no dependent restarts)."]
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines) + "\n")
    print(f"report: {report}", flush=True)


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("experiments", nargs="*", help="any of a b c (default: all three)")
    ap.add_argument("--quick", action="store_true", help="shorter points, smaller sizes")
    ap.add_argument("--epoch-ms", type=int, default=10)
    ap.add_argument("--warmup-s", type=float, default=1.5)
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--in-flight", type=int, default=256, help="closed loop, total")
    ap.add_argument("--warehouses", type=int, nargs="+", default=[2, 10])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--clog-rate", type=float, default=1500.0, help="b: offered txn/s")
    ap.add_argument("--clog-in-flight", type=int, default=4000)
    ap.add_argument("--clog-total-s", type=float, default=4.0)
    ap.add_argument("--stall-at-s", type=float, default=1.0)
    ap.add_argument("--stall-ms", type=int, default=1000)
    ap.add_argument("--tags", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--dependent-shares", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--index-rates", type=float, nargs="+", default=[0, 200, 1000, 3000])
    ap.add_argument(
        "--conflict-probs", type=float, nargs="+", default=[0.0001, 0.001, 0.01], help="b"
    )
    ap.add_argument(
        "--replot", action="store_true", help="only re-render CSV/PNG from the saved JSON"
    )
    ap.output("--out-dir", "results/paper", "JSON, CSV and PNG go here")
    ap.add_argument(
        "--no-report", action="store_true", help="with --publish: leave docs/PAPER_REPORT.md"
    )
    return ap


def main() -> None:
    ap = parser()
    a = ap.parse()
    a.out_dir = Path(a.out_dir)
    a.experiments = a.experiments or ["a", "b", "c"]
    unknown = sorted(set(a.experiments) - {"a", "b", "c"})
    if unknown:
        ap.error(f"unknown experiment(s) {unknown}: choose from a b c")
    report = a.publish and not (a.quick or a.no_report)
    if a.replot:
        for name in a.experiments:
            stem = name + ("_quick" if a.quick else "")
            saved = json.loads((a.out_dir / f"{stem}.json").read_text())
            rows = saved.pop("rows")
            save(a.out_dir, stem, rows, saved)
        if report:
            write_report(a.out_dir, REPORT)
        wrote(a.out_dir)
        return
    if a.quick:
        a.warmup_s, a.duration_s = 0.5, 2.0
        a.records = min(a.records, 100_000)
        a.index_rates = [0, 1000]
        a.dependent_shares = [0.0, 1.0]
        a.warehouses = [2]
    t0 = time.monotonic()
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
    }
    runners = {"a": experiment_a, "b": experiment_b, "c": experiment_c}
    for name in a.experiments:
        t1 = time.monotonic()
        rows = runners[name](a)
        meta_x = {**meta, "wall_s": round(time.monotonic() - t1, 1)}
        meta_x["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
        save(a.out_dir, name + ("_quick" if a.quick else ""), rows, meta_x)
        print(f"experiment {name}: {time.monotonic() - t1:.0f} s", flush=True)
    print(f"all done in {time.monotonic() - t0:.0f} s", flush=True)
    if report:  # scratch and quick runs are smoke tests: they keep the report
        write_report(a.out_dir, REPORT)
    wrote(a.out_dir)


if __name__ == "__main__":
    main()
