"""Benchmark: queryable state (issue 41, docs/QUERIES.md) against TSpoon's figures.

Four parts, each on embedded clusters this script starts (durable command log):

  keys      Queries/s and p50/p99 against keys touched (1, 10, 100, 1,000, all
            accounts) and partitions touched (one, all), with ``--transfer-rate``
            bank.transfer/s running (open loop), on 2 replicas x 2 partitions. One key:
            bank.balance; k keys on one partition: qbench.sum (txn_library/
            query_bench.py) of k accounts of one partition; k keys on every partition:
            bank.total(first, k). Snapshot queries, and the same one-key and 1,000-key
            queries strict (through the sequencer) for comparison. Per point, the
            throughput is a closed loop's (many queries in flight: saturation), and
            p50/p99 are an open loop's at ``--latency-share`` of that throughput (the
            latency a load below saturation sees; the closed loop's are queueing).
            Next to TSpoon: 53,900 queries/s touching one operator instance, 890/s
            selecting 1,000 keys, latency under 1 ms (one partition) to 10 ms (all).
  versions  What keeping row versions costs writes: TPC-C New Order throughput
            (``ordo tpcc run``, new-order mix) with ClusterConfig.query_versions on and
            off (``--no-versions``), alternating, ``--tpcc-runs`` runs each.
  clog      The seed paper's clogging experiment with a long scan: transfers at
            ``--transfer-rate`` while bank.total over every account runs at
            ``--scan-rate``/s as a sequenced call (logged, under locks) or as a
            snapshot query (no log, no locks), and with no scan: the transfers'
            throughput, p50/p99 and throughput over time.
  tpcc      TPC-C's standard mix with Order-Status and Stock-Level through the
            sequencer (today) or as snapshot queries (``ordo tpcc run
            --read-only-as``), alternating: throughput and those transactions'
            latencies.

Correctness: every snapshot or sequenced bank.total over every account (keys "all",
and the clogging scans) must equal the accounts' opening total while transfers run;
violations are counted, printed, and make the script exit 1 (as a failed TPC-C check
does).

Writes the JSON (``--out``) and a PNG (``--plot``), by default to the scratch directory
(scripts/bench_outputs.py), with ``--publish`` to results/queries/; prints tables.

    .venv/bin/python scripts/bench_queries.py --publish           # everything
    .venv/bin/python scripts/bench_queries.py --parts keys,clog --duration 5

Loads are cluster/loadgen.py generators, each in a process of its own
(scripts/bench_queries_load.py). Invariant: the script never decides an outcome: every
count is an answer the cluster returned (or a timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_outputs import BenchParser, wrote  # noqa: E402
from bench_queries_load import (  # noqa: E402
    LoadSpec,
    Worker,
    accounts_by_partition,
    checks,
    in_flight_cap,
    run_together,
    summary,
)

from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import LocalCluster, cluster_client, free_base_port  # noqa: E402
from cluster.measure import process_cpu_s  # noqa: E402
from txn_library import native  # noqa: E402
from txn_library.errors import CallFailed, CallTimeout  # noqa: E402
from txn_library.workloads.bank import open_accounts  # noqa: E402

PARTS = ("keys", "versions", "clog", "tpcc")
BANK_MODULES = ("txn_library.workloads.builtin", "txn_library.workloads.query_bench")
TSPOON = {
    "one_key_per_s": 53_900,
    "keys_1000_per_s": 890,
    "latency_one_partition_ms": 1.0,  # "under 1 ms"
    "latency_all_partitions_ms": 10.0,
}
TARGETS = {
    "one_key_snapshot_per_s": 54_000,
    "one_key_snapshot_p99_ms": 5.0,
    "keys_1000_all_snapshot_per_s": 890,
    "new_order_versions_cost_max": 0.10,
}
TODAY = {"keys_1000_all_sequenced_per_s": 232, "one_key_unsequenced_per_s": 30_700}
BUCKET_S = 0.1  # clogging timeline
SMOOTH_BUCKETS = 5  # the plot's moving mean


# --- The bank cluster --------------------------------------------------------------------


@contextmanager
def bank_cluster(a: argparse.Namespace) -> Iterator[tuple[ClusterConfig, LocalCluster]]:
    """A durable R x P cluster with ``a.accounts`` accounts of ``a.balance`` cents,
    answering snapshot queries."""
    tmp = tempfile.mkdtemp(prefix="ordo-bench-queries-")
    cfg = ClusterConfig(
        replicas=a.replicas,
        partitions=a.partitions,
        base_port=free_base_port(),
        data_dir=str(Path(tmp) / "data"),
        epoch_duration_ms=a.epoch_ms,
        fsync=True,
        procedure_modules=BANK_MODULES,
    )
    lc = LocalCluster(cfg)
    try:
        lc.start(wait_s=120)
        with cluster_client(cfg, timeout_s=120) as c:
            open_accounts(c, a.accounts, a.balance)
            deadline = time.monotonic() + 60
            while True:  # every replica serves snapshots once its partitions are live
                try:
                    for r in range(cfg.replicas):
                        c.query("bank.total", 0, a.accounts, replica=r, timeout_s=5)
                    break
                except (CallFailed, CallTimeout):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        yield cfg, lc
    finally:
        lc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


class Cpu:
    """CPU seconds of processes over a window that starts ``warmup_s`` after ``run``
    is called and lasts ``duration_s`` (blocks that long)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.used: dict[str, float] = {}

    def run(self, warmup_s: float, duration_s: float) -> None:
        time.sleep(warmup_s)
        start = {n: process_cpu_s(p) for n, p in self.pids.items()}
        time.sleep(duration_s)
        for n, p in self.pids.items():
            now, before = process_cpu_s(p), start.get(n)
            if now is not None and before is not None:
                self.used[n] = round(now - before, 2)

    def cluster_s(self) -> float:
        return sum(v for n, v in self.used.items() if not n.startswith("load"))


def _measure(cpu: Cpu, warmup_s: float, duration_s: float) -> Callable[[], None]:
    return lambda: cpu.run(warmup_s, duration_s)


def transfers_spec(a: argparse.Namespace, cfg: ClusterConfig, **kw: Any) -> LoadSpec:
    return LoadSpec(
        "transfers",
        {"accounts": a.accounts, "partitions": cfg.partitions},
        cfg.client_addr,
        cfg.query_addrs(),
        isolation="strict",
        rate_per_s=a.transfer_rate,
        in_flight=in_flight_cap(max(1000, int(a.transfer_rate * 5))),
        connections=2,
        seed=7,
        **kw,
    )


# --- 1: queries against keys and partitions touched --------------------------------------


def key_points(a: argparse.Namespace) -> list[tuple[int, str, str, str]]:
    """(keys, "one"|"all", source, isolation) of every point, in order."""
    out: list[tuple[int, str, str, str]] = []
    strict = {_keys(k, a) for k in a.strict_keys.split(",") if k}
    smallest = _smallest_partition(a)
    for k in (_keys(k, a) for k in a.keys.split(",")):
        if k == 1:
            out.append((1, "one", "balance", "snapshot"))
            if 1 in strict:
                out.append((1, "one", "balance", "strict"))
            continue
        # "all accounts" on one partition: every account of the smallest one
        one = smallest if k == a.accounts else min(k, smallest)
        out.append((one, "one", "sum_one", "snapshot"))
        out.append((k, "all", "total_all", "snapshot"))
        if k in strict:
            out.append((k, "all", "total_all", "strict"))
    return out


def _keys(text: str, a: argparse.Namespace) -> int:
    return a.accounts if text.strip() == "all" else int(text)


def _smallest_partition(a: argparse.Namespace) -> int:
    return min(len(o) for o in accounts_by_partition(a.accounts, a.partitions))


def keys_experiment(
    a: argparse.Namespace, cfg: ClusterConfig, lc: LocalCluster, workers: list[Worker]
) -> list[dict[str, Any]]:
    rows = []
    for keys, where, source, isolation in key_points(a):
        row = keys_point(a, cfg, lc, workers, keys, where, source, isolation)
        rows.append(row)
        print(
            f"keys {keys:6d} {where:3s} {isolation:8s}: {row['per_s']:9.1f} queries/s "
            f"(closed loop, {row['in_flight']} in flight: p99 {row['saturated_p99_ms']} ms); "
            f"at {row['latency_rate_per_s']:.0f}/s p50 {row['p50_ms']} ms p99 "
            f"{row['p99_ms']} ms; transfers {row['transfers']['per_s']:.0f}/s p99 "
            f"{row['transfers']['p99_ms']} ms; errors {row['errors']}",
            flush=True,
        )
    return rows


def keys_point(
    a: argparse.Namespace,
    cfg: ClusterConfig,
    lc: LocalCluster,
    workers: list[Worker],
    keys: int,
    where: str,
    source: str,
    isolation: str,
) -> dict[str, Any]:
    procs = a.query_procs
    params = {"accounts": a.accounts, "partitions": cfg.partitions, "keys": keys}
    invariant = a.accounts * a.balance if source == "total_all" and keys == a.accounts else None
    in_flight = max(8, min(a.query_in_flight, a.query_keys_in_flight // keys)) // procs
    in_flight = max(1, in_flight)

    def queries(seed: int, **kw: Any) -> list[LoadSpec]:
        return [
            LoadSpec(
                source,
                params,
                cfg.client_addr,
                cfg.query_addrs(),
                isolation=isolation,
                connections=a.connections,
                invariant=invariant,
                seed=seed * 101 + i,
                **kw,
            )
            for i in range(procs)
        ]

    # Saturation: a closed loop
    window = {"warmup_s": a.warmup, "duration_s": a.duration}
    cpu = Cpu(_pids(lc, workers))
    specs = [transfers_spec(a, cfg, **window), *queries(1, in_flight=in_flight, **window)]
    res = run_together(workers, specs, _measure(cpu, a.warmup, a.duration))
    sat = summary(res[1:], ["query"])
    tr = summary(res[:1], ["transfer"])
    # Latency: an open loop below saturation
    rate = max(1.0, sat["per_s"] * a.latency_share)
    lat_window = {"warmup_s": min(a.warmup, 2.0), "duration_s": a.latency_duration}
    open_in_flight = in_flight_cap(max(64, int(rate / procs)))
    specs = [
        transfers_spec(a, cfg, **lat_window),
        *queries(2, rate_per_s=rate / procs, in_flight=open_in_flight, **lat_window),
    ]
    res2 = run_together(workers, specs)
    lat = summary(res2[1:], ["query"])
    used = cpu.cluster_s()
    queries_in_window = sat["ok"] + sat["aborted"]
    return {
        "keys": keys,
        "partitions": where,
        "partitions_touched": 1 if where == "one" else cfg.partitions,
        "proc": {"balance": "bank.balance", "sum_one": "qbench.sum"}.get(source, "bank.total"),
        "isolation": isolation,
        "in_flight": in_flight * procs,
        "per_s": sat["per_s"],
        "saturated_p50_ms": sat["p50_ms"],
        "saturated_p99_ms": sat["p99_ms"],
        "latency_rate_per_s": round(rate, 1),
        "p50_ms": lat["p50_ms"],
        "p99_ms": lat["p99_ms"],
        "latency_run_per_s": lat["per_s"],
        "errors": sat["errors"] + lat["errors"],
        "error_codes": {**sat["error_codes"], **lat["error_codes"]},
        "open_loop_skipped": lat["open_loop_skipped"],
        "transfers": {k: tr[k] for k in ("per_s", "p50_ms", "p99_ms", "errors")},
        "transfers_at_latency_rate": {
            k: summary(res2[:1], ["transfer"])[k] for k in ("per_s", "p50_ms", "p99_ms")
        },
        "cpu_s": cpu.used,
        "cluster_cpu_us_per_query_transfers_included": (
            round(1e6 * used / queries_in_window, 1) if queries_in_window else None
        ),
        "check": checks([*res[1:], *res2[1:]]),
    }


def _pids(lc: LocalCluster, workers: Sequence[Worker]) -> dict[str, int]:
    pids = {name: p.pid for name, p in lc.procs.items()}
    for i, w in enumerate(workers):
        pid = w.proc.pid
        if pid is not None:
            pids[f"load{i}"] = pid
    return pids


def targets_met(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def row(keys: int, where: str, isolation: str) -> dict[str, Any] | None:
        for r in rows:
            if (r["keys"], r["partitions"], r["isolation"]) == (keys, where, isolation):
                return r
        return None

    out: dict[str, Any] = {}
    one = row(1, "one", "snapshot")
    if one is not None:
        out["one_key_snapshot_per_s"] = {
            "measured": one["per_s"],
            "target": TARGETS["one_key_snapshot_per_s"],
            "met": one["per_s"] >= TARGETS["one_key_snapshot_per_s"],
        }
        out["one_key_snapshot_p99_ms"] = {
            "measured": one["p99_ms"],
            "at_per_s": one["latency_rate_per_s"],
            "target": TARGETS["one_key_snapshot_p99_ms"],
            "met": one["p99_ms"] is not None
            and one["p99_ms"] <= TARGETS["one_key_snapshot_p99_ms"],
        }
    k1000 = row(1000, "all", "snapshot")
    if k1000 is not None:
        out["keys_1000_all_snapshot_per_s"] = {
            "measured": k1000["per_s"],
            "target": TARGETS["keys_1000_all_snapshot_per_s"],
            "met": k1000["per_s"] >= TARGETS["keys_1000_all_snapshot_per_s"],
        }
    return out


# --- 3: clogging with a long scan ---------------------------------------------------------


def clog_experiment(
    a: argparse.Namespace, cfg: ClusterConfig, lc: LocalCluster, workers: list[Worker]
) -> list[dict[str, Any]]:
    rows = []
    window = {"warmup_s": a.warmup, "duration_s": a.clog_duration}
    for case in ("none", "sequenced", "snapshot"):
        specs = [transfers_spec(a, cfg, timeline_bucket_s=BUCKET_S, **window)]
        if case != "none":
            specs.append(
                LoadSpec(
                    "scan",
                    {"accounts": a.accounts, "partitions": cfg.partitions},
                    cfg.client_addr,
                    cfg.query_addrs(),
                    isolation="strict" if case == "sequenced" else "snapshot",
                    rate_per_s=a.scan_rate,
                    in_flight=in_flight_cap(max(100, int(a.scan_rate * 60))),
                    connections=1,
                    invariant=a.accounts * a.balance,
                    seed=11,
                    **window,
                )
            )
        cpu = Cpu(_pids(lc, workers))
        res = run_together(workers, specs, _measure(cpu, a.warmup, a.clog_duration))
        tr = summary(res[:1], ["transfer"])
        scans = summary(res[1:], ["scan"]) if case != "none" else None
        tl = res[0].window.timeline
        series: list[float] = []
        late = submitted = 0
        if tl is not None:
            first = int(a.warmup / BUCKET_S)
            last = int((a.warmup + a.clog_duration) / BUCKET_S)
            series = [round(n / BUCKET_S, 1) for n in tl.answers[first:last]]
            late = sum(tl.late[first:last])
            submitted = sum(tl.submitted[first:last])
        row = {
            "scan": case,
            "scan_proc": f"bank.total(0, {a.accounts})",
            "scan_rate_per_s": a.scan_rate if case != "none" else 0,
            "transfers": tr,
            "transfers_late_share": round(late / submitted, 4) if submitted else None,
            "scans": scans,
            "check": checks(res[1:]) if case != "none" else None,
            "cpu_s": cpu.used,
            "transfers_per_s_series": series,
            "bucket_s": BUCKET_S,
        }
        rows.append(row)
        s = ""
        if scans is not None:
            s = f"; scans {scans['per_s']:.1f}/s p50 {scans['p50_ms']} p99 {scans['p99_ms']} ms"
        print(
            f"clog, scan {case:9s}: transfers {tr['per_s']:.0f}/s p50 {tr['p50_ms']} ms p99 "
            f"{tr['p99_ms']} ms max {tr['max_ms']} ms{s}",
            flush=True,
        )
    return rows


# --- 2 and 4: TPC-C ----------------------------------------------------------------------


def tpcc_command(opts: Any) -> str:
    cmd = (
        f"python -m cluster.cli tpcc run --warehouses {opts.warehouses} --partitions "
        f"{opts.partitions} --replicas {opts.replicas} --duration {opts.duration_s:g} "
        f"--warmup {opts.warmup_s:g} --terminals {opts.terminals} --mix {opts.mix}"
    )
    if not opts.versions:
        cmd += " --no-versions"
    if opts.queries != "sequenced":
        cmd += f" --read-only-as {opts.queries}"
    return cmd


def tpcc_once(a: argparse.Namespace, **kw: Any) -> dict[str, Any]:
    """One ``ordo tpcc run`` (embedded cluster) with ``kw`` on top of the bench's
    options; the summary, the check's verdict and the equivalent command."""
    from tpcc.driver import RunOptions
    from tpcc.driver import run as tpcc_run

    opts = RunOptions(
        warehouses=a.tpcc_warehouses,
        partitions=2,
        replicas=a.tpcc_replicas,
        duration_s=a.tpcc_duration,
        warmup_s=a.tpcc_warmup,
        terminals=a.tpcc_terminals,
        out=None,
        progress=False,
        **kw,
    )

    def log(line: str) -> None:
        if not line.startswith("["):  # the per-second progress lines
            print(f"    {line}", file=sys.stderr, flush=True)

    result = tpcc_run(opts, log)
    return {
        "command": tpcc_command(opts),
        "summary": result["summary"],
        "check_ok": result.get("check", {}).get("ok"),
    }


def versions_experiment(a: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for i in range(a.tpcc_runs):
        for versions in (True, False) if i % 2 == 0 else (False, True):
            r = tpcc_once(a, versions=versions, mix="new-order")
            s = r["summary"]
            runs.append(
                {
                    "run": i,
                    "versions": versions,
                    "new_order_per_s": s["new_order_per_s"],
                    "new_order_p50_ms": s["per_type"]["new_order"]["latency_ms"]["p50"],
                    "new_order_p99_ms": s["per_type"]["new_order"]["latency_ms"]["p99"],
                    "errors": sum(s["errors"].values()),
                    "check_ok": r["check_ok"],
                    "command": r["command"],
                }
            )
            print(
                f"versions {'on ' if versions else 'off'} run {i}: New Order "
                f"{s['new_order_per_s']:.0f}/s",
                flush=True,
            )
    on = [r["new_order_per_s"] for r in runs if r["versions"]]
    off = [r["new_order_per_s"] for r in runs if not r["versions"]]
    cost = 1.0 - statistics.mean(on) / statistics.mean(off) if on and off else None
    return {
        "runs": runs,
        "new_order_per_s_mean": {"versions": _mean(on), "no_versions": _mean(off)},
        "cost": None if cost is None else round(cost, 4),
        "target_cost_max": TARGETS["new_order_versions_cost_max"],
        "met": cost is not None and cost <= TARGETS["new_order_versions_cost_max"],
    }


def tpcc_read_only_experiment(a: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for i in range(a.tpcc_runs):
        for mode in ("sequenced", "snapshot") if i % 2 == 0 else ("snapshot", "sequenced"):
            r = tpcc_once(a, mix="standard", queries=mode)
            s = r["summary"]
            row: dict[str, Any] = {
                "run": i,
                "read_only_as": mode,
                "txn_per_s": s["txn_per_s"],
                "new_order_per_s": s["new_order_per_s"],
                "errors": sum(s["errors"].values()),
                "check_ok": r["check_ok"],
                "command": r["command"],
            }
            for kind in ("order_status", "stock_level", "new_order", "payment", "delivery"):
                k = s["per_type"].get(kind)
                if k is not None:
                    row[kind] = {"per_s": k["per_s"], **k["latency_ms"], "errors": k["errors"]}
            runs.append(row)
            print(
                f"tpcc standard, read-only {mode:9s} run {i}: {s['txn_per_s']:.0f} txn/s, "
                f"Order-Status p99 {row.get('order_status', {}).get('p99')} ms, Stock-Level "
                f"p99 {row.get('stock_level', {}).get('p99')} ms",
                flush=True,
            )
    means: dict[str, Any] = {}
    for mode in ("sequenced", "snapshot"):
        mine = [r for r in runs if r["read_only_as"] == mode]
        means[mode] = {
            "txn_per_s": _mean([r["txn_per_s"] for r in mine]),
            "new_order_per_s": _mean([r["new_order_per_s"] for r in mine]),
            **{
                f"{kind}_{q}_ms": _mean([r[kind][q] for r in mine if r.get(kind)])
                for kind in ("order_status", "stock_level")
                for q in ("p50", "p99")
            },
        }
    return {"runs": runs, "means": means}


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.mean(vals), 2) if vals else None


# --- Tables, JSON, plot -------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_tables(out: dict[str, Any]) -> None:
    if "keys" in out:
        k = out["keys"]
        print(
            f"\nQueries against keys and partitions touched, {k['transfer_rate']:g} transfers/s "
            f"running (queries/s: closed loop; p50/p99: open loop at the rate in brackets)"
        )
        print(
            table(
                [
                    "keys", "partitions", "proc", "isolation", "queries/s", "p50 ms", "p99 ms",
                    "(at /s)", "transfers p99 ms", "errors",
                ],
                [
                    [
                        r["keys"], r["partitions_touched"], r["proc"], r["isolation"],
                        r["per_s"], r["p50_ms"], r["p99_ms"], r["latency_rate_per_s"],
                        r["transfers"]["p99_ms"], r["errors"],
                    ]
                    for r in k["rows"]
                ],
            )
        )  # fmt: skip
        print(
            f"TSpoon: {TSPOON['one_key_per_s']:,} queries/s one key, "
            f"{TSPOON['keys_1000_per_s']:,}/s selecting 1,000 keys; latency < 1 ms (one "
            f"partition) to 10 ms (all). Today: 1,000-key bank.total sequenced "
            f"{TODAY['keys_1000_all_sequenced_per_s']}/s."
        )
        for name, t in k["targets"].items():
            print(f"  target {name}: {t['measured']} vs {t['target']}: {_met(t['met'])}")
    if "versions" in out:
        v = out["versions"]
        print("\nTPC-C New Order with and without row versions (alternating runs)")
        print(
            table(
                ["run", "versions", "New Order/s", "p50 ms", "p99 ms", "check"],
                [
                    [
                        r["run"],
                        "on" if r["versions"] else "off",
                        r["new_order_per_s"],
                        r["new_order_p50_ms"],
                        r["new_order_p99_ms"],
                        r["check_ok"],
                    ]
                    for r in v["runs"]
                ],
            )
        )
        m = v["new_order_per_s_mean"]
        cost = "-" if v["cost"] is None else f"{100 * v['cost']:.1f}%"
        print(
            f"  mean on {m['versions']}/s, off {m['no_versions']}/s: versions cost {cost} "
            f"(target <= {100 * v['target_cost_max']:.0f}%: {_met(v['met'])})"
        )
    if "clog" in out:
        print("\nClogging: transfers while a scan of every account runs")
        print(
            table(
                [
                    "scan", "transfers/s", "p50 ms", "p99 ms", "max ms", "late share",
                    "scans/s", "scan p50 ms", "scan p99 ms",
                ],
                [
                    [
                        r["scan"], r["transfers"]["per_s"], r["transfers"]["p50_ms"],
                        r["transfers"]["p99_ms"], r["transfers"]["max_ms"],
                        r["transfers_late_share"],
                        None if r["scans"] is None else r["scans"]["per_s"],
                        None if r["scans"] is None else r["scans"]["p50_ms"],
                        None if r["scans"] is None else r["scans"]["p99_ms"],
                    ]
                    for r in out["clog"]["rows"]
                ],
            )
        )  # fmt: skip
    if "tpcc_read_only" in out:
        t = out["tpcc_read_only"]
        print("\nTPC-C standard mix: Order-Status and Stock-Level through the sequencer or as")
        print("snapshot queries (alternating runs)")
        print(
            table(
                [
                    "run", "read-only as", "txn/s", "New Order/s", "OS p50", "OS p99",
                    "SL p50", "SL p99", "errors", "check",
                ],
                [
                    [
                        r["run"], r["read_only_as"], r["txn_per_s"], r["new_order_per_s"],
                        r.get("order_status", {}).get("p50"),
                        r.get("order_status", {}).get("p99"),
                        r.get("stock_level", {}).get("p50"),
                        r.get("stock_level", {}).get("p99"),
                        r["errors"], r["check_ok"],
                    ]
                    for r in t["runs"]
                ],
            )
        )  # fmt: skip
    c = out["correctness"]
    print(
        f"\nCorrectness: {c['checked']} bank.total answers over every account checked "
        f"against the invariant {c['invariant']}: {c['violations']} violations"
    )
    for e in c["examples"]:
        print(f"  VIOLATION {e}")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    ax = axes[0][0]
    rows = out.get("keys", {}).get("rows", [])
    for where, iso, style in (
        ("one", "snapshot", "o-"),
        ("all", "snapshot", "s-"),
        ("one", "strict", "o:"),
        ("all", "strict", "s:"),
    ):
        pts = [
            (r["keys"], r["per_s"])
            for r in rows
            if r["partitions"] == where and r["isolation"] == iso
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=f"{iso}, {where} partition(s)")
    if rows:
        tspoon = [TSPOON["one_key_per_s"], TSPOON["keys_1000_per_s"]]
        ax.plot([1, 1000], tspoon, "k*", ms=12, label="TSpoon")
        ax.set(xscale="log", yscale="log", xlabel="keys touched", ylabel="queries/s")
        ax.set_title("Throughput (closed loop)")
        ax.legend(fontsize=8)
    ax = axes[0][1]
    for where, style in (("one", "o-"), ("all", "s-")):
        lat = [
            (r["keys"], r["p50_ms"], r["p99_ms"])
            for r in rows
            if r["partitions"] == where and r["isolation"] == "snapshot" and r["p99_ms"] is not None
        ]
        if lat:
            xs, p50, p99 = zip(*lat, strict=True)
            ax.plot(xs, p50, style, label=f"p50, {where}")
            ax.plot(xs, p99, style, alpha=0.5, label=f"p99, {where}")
    if rows:
        ms = (TSPOON["latency_one_partition_ms"], TSPOON["latency_all_partitions_ms"])
        ax.axhline(ms[0], color="k", ls="--", lw=0.8, label="TSpoon 1 / 10 ms")
        ax.axhline(ms[1], color="k", ls="--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="keys touched", ylabel="ms")
        ax.set_title("Snapshot query latency (open loop below saturation)")
        ax.legend(fontsize=8)
    ax = axes[0][2]
    for where, style in (("one", "o-"), ("all", "s-")):
        pts = [
            (r["keys"], r["transfers"]["p99_ms"])
            for r in rows
            if r["partitions"] == where and r["isolation"] == "snapshot"
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=f"queries on {where}")
    if rows:
        ax.set(xscale="log", xlabel="keys a query touches", ylabel="transfer p99 ms")
        ax.set_title("Transfers' p99 while queries saturate")
        ax.legend(fontsize=8)
    ax = axes[1][0]
    for r in out.get("clog", {}).get("rows", []):
        ys = r["transfers_per_s_series"]
        smooth = [  # a moving mean over SMOOTH_BUCKETS buckets
            statistics.mean(ys[max(0, i - SMOOTH_BUCKETS + 1) : i + 1]) for i in range(len(ys))
        ]
        ax.plot([BUCKET_S * (i + 1) for i in range(len(ys))], smooth, label=f"scan: {r['scan']}")
    ax.set(xlabel="s (window)", ylabel=f"transfers/s (mean of {SMOOTH_BUCKETS * BUCKET_S:g} s)")
    ax.set_title("Clogging: transfers while scans run")
    if out.get("clog"):
        ax.legend(fontsize=8)
    ax = axes[1][1]
    v = out.get("versions")
    if v:
        for r in v["runs"]:
            ax.plot(0 if r["versions"] else 1, r["new_order_per_s"], "ko", alpha=0.5)
        m = v["new_order_per_s_mean"]
        ax.bar([0, 1], [m["versions"] or 0, m["no_versions"] or 0], color=["C0", "C1"], alpha=0.6)
        ax.set_xticks([0, 1], ["versions kept", "no versions"])
        cost = "-" if v["cost"] is None else f"{100 * v['cost']:.1f}%"
        ax.set_title(f"TPC-C New Order/s (cost {cost})")
    ax = axes[1][2]
    t = out.get("tpcc_read_only")
    if t:
        labels = ["OS p50", "OS p99", "SL p50", "SL p99"]
        keys = [
            "order_status_p50_ms",
            "order_status_p99_ms",
            "stock_level_p50_ms",
            "stock_level_p99_ms",
        ]
        for i, mode in enumerate(("sequenced", "snapshot")):
            ys = [t["means"][mode][k] or 0 for k in keys]
            ax.bar([j + 0.4 * i for j in range(4)], ys, width=0.4, label=mode)
        ax.set_xticks([j + 0.2 for j in range(4)], labels)
        ax.set(ylabel="ms")
        ax.set_title("TPC-C read-only transactions (standard mix)")
        ax.legend(fontsize=8)
    for ax in axes.flat:
        if not ax.has_data():
            ax.axis("off")
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"Queryable state, {out['meta']['when']}, {out['meta']['engine']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- Main ----------------------------------------------------------------------------------


def run_bank_parts(a: argparse.Namespace, parts: set[str], out: dict[str, Any]) -> None:
    workers = [Worker() for _ in range(1 + a.query_procs)]
    try:
        with bank_cluster(a) as (cfg, lc):
            if "keys" in parts:
                rows = keys_experiment(a, cfg, lc, workers)
                out["keys"] = {
                    "replicas": cfg.replicas,
                    "partitions": cfg.partitions,
                    "accounts": a.accounts,
                    "transfer_rate": a.transfer_rate,
                    "rows": rows,
                    "targets": targets_met(rows),
                    "tspoon": TSPOON,
                    "today": TODAY,
                }
                lc.check_alive()
            if "clog" in parts:
                out["clog"] = {
                    "replicas": cfg.replicas,
                    "partitions": cfg.partitions,
                    "accounts": a.accounts,
                    "transfer_rate": a.transfer_rate,
                    "rows": clog_experiment(a, cfg, lc, workers),
                }
                lc.check_alive()
    finally:
        for w in workers:
            w.close()


def correctness(out: dict[str, Any], invariant: int) -> dict[str, Any]:
    found = [r["check"] for r in out.get("keys", {}).get("rows", [])]
    found += [r["check"] for r in out.get("clog", {}).get("rows", []) if r["check"]]
    return {
        "invariant": invariant,
        "checked": sum(c["checked"] for c in found),
        "violations": sum(c["violations"] for c in found),
        "examples": [e for c in found for e in c["examples"]][:10],
    }


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--epoch-ms", type=int, default=10)
    ap.add_argument("--accounts", type=int, default=10_000, help="at most 10,000 (bank.total)")
    ap.add_argument("--balance", type=int, default=1_000, help="cents per account")
    ap.add_argument("--transfer-rate", type=float, default=1_000.0, help="transfers/s, open loop")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--duration", type=float, default=10.0, help="keys: each point's window")
    ap.add_argument("--latency-duration", type=float, default=5.0, help="keys: open-loop window")
    ap.add_argument("--latency-share", type=float, default=0.5, help="of the closed loop's rate")
    ap.add_argument("--keys", default="1,10,100,1000,all")
    ap.add_argument("--strict-keys", default="1,1000", help="points also measured strict")
    ap.add_argument("--query-in-flight", type=int, default=1_000, help="closed loop, at most")
    ap.add_argument(
        "--query-keys-in-flight",
        type=int,
        default=10_000,
        help="closed loop: at most this many keys in flight (a k-key point keeps this / k, "
        "at least 8)",
    )
    ap.add_argument("--query-procs", type=int, default=1, help="query generator processes")
    ap.add_argument("--connections", type=int, default=4, help="per query process")
    ap.add_argument("--scan-rate", type=float, default=5.0, help="clog: scans/s")
    ap.add_argument("--clog-duration", type=float, default=10.0)
    ap.add_argument("--tpcc-runs", type=int, default=2, help="runs of each setting")
    ap.add_argument("--tpcc-duration", type=float, default=20.0)
    ap.add_argument("--tpcc-warmup", type=float, default=5.0)
    ap.add_argument("--tpcc-warehouses", type=int, default=2)
    ap.add_argument("--tpcc-replicas", type=int, default=1)
    ap.add_argument("--tpcc-terminals", type=int, default=200)
    ap.output("--out", "results/queries/bench_queries.json", "JSON")
    ap.output("--plot", "results/queries/bench_queries.png", 'PNG ("" for none)')
    return ap


def main() -> None:
    ap = parser()
    a = ap.parse()
    parts = {p.strip() for p in a.parts.split(",") if p.strip()}
    if not parts <= set(PARTS):
        ap.error(f"--parts: some of {','.join(PARTS)}")
    if not 2 <= a.accounts <= 10_000 or a.query_procs < 1:
        ap.error("--accounts in 2..10,000 (bank.total's bound) and --query-procs >= 1")

    load_before = os.getloadavg()
    out: dict[str, Any] = {
        "meta": {
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["scripts/bench_queries.py", *sys.argv[1:]]),
            "engine": native.describe(),
            "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "options": vars(a),
        }
    }
    if parts & {"keys", "clog"}:
        run_bank_parts(a, parts, out)
    if "versions" in parts:
        out["versions"] = versions_experiment(a)
    if "tpcc" in parts:
        out["tpcc_read_only"] = tpcc_read_only_experiment(a)
    out["meta"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["correctness"] = correctness(out, a.accounts * a.balance)
    print_tables(out)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    if a.plot:  # "" for none
        plot(out, Path(a.plot))
    print()
    wrote(a.out, a.plot)
    tpcc_runs = out.get("versions", {}).get("runs", []) + out.get("tpcc_read_only", {}).get(
        "runs", []
    )
    failed_checks = [r["command"] for r in tpcc_runs if r["check_ok"] is False]
    for cmd in failed_checks:
        print(f"TPC-C check FAILED: {cmd}")
    if out["correctness"]["violations"] or failed_checks:
        sys.exit(1)


if __name__ == "__main__":
    main()
