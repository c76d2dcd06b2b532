"""Benchmark: S-Store's Leaderboard Maintenance on Ordo (issue 40, docs/STREAMS.md).

Votes (phone, contestant) arrive in input batches; a dataflow validates them, records
them, keeps the top-3/bottom-3 board and trending-3 over the last 100 votes, and
removes the last contestant every 1,000 votes (txn_library/workloads/leaderboard.py). Three ways
to run it on the same engine (``--mode``, repeatable):

  dataflow  one client pushes batches to ``lb_votes_in`` with increasing ids on one
            ordered connection: closed loop (``--window`` in flight) or, with ``--rate
            R``, open loop (push i due at i / R s, latency counted from then); PE
            triggers run the steps. Latency: push to acknowledged, and push to sink
            (its batch seen in ``lb_board`` by a subscriber thread polling
            ``stream.read``, ``--sink-poll-ms`` while nothing is new). ``--variant
            lbe`` (EE triggers) or ``lbn`` (nested). ``--latency``: then the
            saturating rate, found by open-loop probes, and latency at
            ``--latency-at`` fractions of it (scripts/leaderboard_latency.py: why the
            closed loop's figure is not that rate).
  chained   H-Store's ordered way (variant lbc, no triggers): per batch, synchronous
            calls push, lbc.validate, lbc.record, lbc.board, lbc.trending.
  async     the same calls for many batches at once, unordered (REQ_CALLS_UNORDERED)
            from ``--async-connections`` client connections (default 8; one unordered
            connection keeps single-partition calls in the order sent): order is not
            guaranteed, and --check says so.

Experiments: ``--chains 1,2,...`` (batches/s against dataflow length, chain<n> with PE
triggers against chainc<n> chained by the client), ``--ee`` (lb against lbe, and lbn),
``--recovery-batches N`` (weak against strong recovery: log bytes, time to live, same
state hash), ``--tpcc-cost`` (New Order throughput beside a dataflow at ``--rate``,
and the CPU each process used), ``--all`` (everything the docs cite, ``--latency``
included, a few minutes).

Each way and experiment starts its own embedded cluster (``--replicas`` x
``--partitions``, default 1 x 1: the leaderboard lives on one partition, as S-Store ran
it on one core; durable log on; data in a temporary directory, removed unless
``--keep-data``), or drives the cluster of ``--data-dir`` (ways and ``--chains``, not
the experiments that start and stop clusters).

``--check``: after each run, every pushed batch must have been processed exactly once
and in order by every step (read from the command log, tied to the progress rows of a
fresh checkpoint), and the boards and tables must equal the plain-Python model fed the
same votes (scripts/leaderboard_check.py). Exit status 1 if a check failed; the async
way fails it by design (unordered calls), which ``--all`` expects and does not count.

    .venv/bin/python scripts/leaderboard.py --mode dataflow --seconds 10 --check
    .venv/bin/python scripts/leaderboard.py --mode dataflow --latency --check
    .venv/bin/python scripts/leaderboard.py --mode dataflow --rate 1000 --seconds 10
    .venv/bin/python scripts/leaderboard.py --mode chained --mode async --seconds 5 --check
    .venv/bin/python scripts/leaderboard.py --chains 1,2,5,10 --chain-seconds 3
    .venv/bin/python scripts/leaderboard.py --all --check --publish  # results/streaming/

Prints a table; writes ``--out`` (JSON, leaderboard.json) and ``--plot`` (PNG,
leaderboard.png; "" for none), by default to the scratch directory
(scripts/bench_outputs.py), with ``--publish`` to results/streaming/.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_outputs import BenchParser, wrote  # noqa: E402
from leaderboard_check import Verdict, check  # noqa: E402
from leaderboard_cluster import (  # noqa: E402
    Cpu,
    Flow,
    Target,
    attached,
    chain_flow,
    embedded,
    leaderboard_flow,
    prepare,
    source_for,
)
from leaderboard_latency import latency_experiment, parse_fractions  # noqa: E402
from leaderboard_load import SINK_POLL_S, Run, chained, pipelined, unordered  # noqa: E402
from leaderboard_recovery import recovery  # noqa: E402
from leaderboard_report import SSTORE, plot, print_tables, write_json  # noqa: E402
from leaderboard_tpcc import tpcc_cost  # noqa: E402

from cluster.config import ClusterConfig  # noqa: E402
from txn_library import native  # noqa: E402

WAYS = ("dataflow", "chained", "async")
TPCC_RATE = 300.0  # batches/s pushed beside TPC-C unless --rate says otherwise


def cluster_for(a: argparse.Namespace) -> AbstractContextManager[Target]:
    if a.data_dir:
        return attached(a.data_dir)
    return embedded(
        replicas=a.replicas,
        partitions=a.partitions,
        recovery=a.dataflow_recovery,
        keep=a.keep_data,
    )


def measure(
    t: Target, way: str, flow: Flow, a: argparse.Namespace, seconds: float
) -> tuple[Run, dict[str, Any]]:
    """One run of ``flow`` the ``way`` way; its summary with the CPU its processes used."""
    first = prepare(t, flow)
    source = source_for(flow, a.seed, a.votes_per_batch)
    cpu = Cpu(t.pids()).start()
    if way == "dataflow":
        run = pipelined(
            t.address,
            flow,
            source,
            first,
            warmup_s=a.warmup,
            seconds=seconds,
            in_flight=a.open_loop_window if a.rate else a.window,
            rate=a.rate,
            sink_poll_s=a.sink_poll_ms / 1000,
        )
    elif way == "chained":
        run = chained(t.address, flow, source, first, warmup_s=a.warmup, seconds=seconds)
    else:
        run = unordered(
            t.address,
            flow,
            source,
            first,
            warmup_s=a.warmup,
            seconds=seconds,
            in_flight=a.window,
            connections=min(a.async_connections, a.window),
        )
    row = run.summary()
    row["cpu"] = cpu.stop()
    lat = row["latency_ms"]
    print(
        f"{way:<8} {flow.dataflow:<8} {row['batches_per_s']:>9,.1f} batches/s  p50 "
        f"{lat['p50']} ms  p99 {lat['p99']} ms  ({row['batches']:,} batches)",
        flush=True,
    )
    return run, row


def checked(
    t: Target, runs: list[Run], rows: list[dict[str, Any]], a: argparse.Namespace
) -> list[Verdict]:
    """Check ``runs`` (one per flow) and put each verdict beside its row."""
    if not a.check:
        return []
    verdicts = check(t, runs)
    for v, row in zip(verdicts, rows, strict=True):
        row["check"] = v.to_json()
        say(v)
    return verdicts


def say(v: Verdict) -> None:
    if v.ok and v.expected_to_fail:
        print(
            f"check {v.way} {v.flow}: ok this time ({v.batches:,} batches), though unordered "
            "calls guarantee no order",
            flush=True,
        )
        return
    if v.ok:
        print(
            f"check {v.way} {v.flow}: ok, {v.batches:,} batches each processed once, in order, "
            "by every step; output equals the model",
            flush=True,
        )
        return
    head = (
        "FAILED, as expected: unordered calls guarantee no order"
        if v.expected_to_fail
        else "FAILED"
    )
    print(f"check {v.way} {v.flow}: {head}", flush=True)
    for p in v.problems:
        print(f"  - {p}", flush=True)


# Experiments ---------------------------------------------------------------------------
def run_ways(a: argparse.Namespace, ways: list[str]) -> tuple[list[dict[str, Any]], list[Verdict]]:
    rows, verdicts = [], []
    for way in ways:
        flow = leaderboard_flow(a.variant if way == "dataflow" else "lbc")
        with cluster_for(a) as t:
            run, row = measure(t, way, flow, a, a.seconds)
            verdicts += checked(t, [run], [row], a)
            if way == "dataflow" and a.latency:
                row["latency"] = run_latency(t, flow, a, row["batches_per_s"])
        rows.append(row)
    return rows, verdicts


def run_latency(t: Target, flow: Flow, a: argparse.Namespace, first_guess: float) -> dict[str, Any]:
    """The saturating rate by open-loop probes from ``first_guess`` (the closed loop's
    figure), then latency at fractions of it (scripts/leaderboard_latency.py)."""

    def run_at(rate: float, seconds: float) -> dict[str, Any]:
        first = prepare(t, flow)
        cpu = Cpu(t.pids()).start()
        run = pipelined(
            t.address,
            flow,
            source_for(flow, a.seed, a.votes_per_batch),
            first,
            warmup_s=a.warmup,
            seconds=seconds,
            in_flight=a.open_loop_window,
            rate=rate,
            sink_poll_s=a.sink_poll_ms / 1000,
        )
        row = run.summary()
        row["cpu"] = cpu.stop()
        return row

    return latency_experiment(
        run_at,
        max(first_guess, 1.0),
        probe_s=a.probe_seconds,
        seconds=a.seconds,
        fractions=a.latency_at,
        say=lambda line: print(f"{flow.dataflow:<8} {line}", flush=True),
    )


def run_ee(a: argparse.Namespace) -> tuple[list[dict[str, Any]], list[Verdict]]:
    runs, rows = [], []
    with cluster_for(a) as t:
        for variant in ("lb", "lbe", "lbn"):
            run, row = measure(t, "dataflow", leaderboard_flow(variant), a, a.seconds)
            runs.append(run)
            rows.append(row)
        verdicts = checked(t, runs, rows, a)
    return rows, verdicts


def run_chains(
    a: argparse.Namespace, lengths: list[int]
) -> tuple[list[dict[str, Any]], list[Verdict]]:
    runs, rows, out = [], [], []
    with cluster_for(a) as t:
        for n in lengths:
            pe_run, pe = measure(t, "dataflow", chain_flow(n, True), a, a.chain_seconds)
            cl_run, cl = measure(t, "chained", chain_flow(n, False), a, a.chain_seconds)
            runs += [pe_run, cl_run]
            rows += [pe, cl]
            out.append({"length": n, "pe": pe, "client": cl})
        verdicts = checked(t, runs, rows, a)
    return out, verdicts


# Main ---------------------------------------------------------------------------------------
def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mode", action="append", choices=WAYS, help="a way to run it (repeatable)")
    ap.add_argument("--variant", choices=("lb", "lbe", "lbn"), default="lb", help="dataflow way")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window of each run")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    ap.add_argument("--votes-per-batch", type=int, default=1)
    ap.add_argument("--window", type=int, default=256, help="calls in flight (dataflow, async)")
    ap.add_argument(
        "--async-connections", type=int, default=8, help="async: unordered client connections"
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="dataflow: open loop, batches/s (0: closed loop, --window in flight)",
    )
    ap.add_argument(
        "--latency",
        action="store_true",
        help="dataflow: the saturating rate by open-loop probes, latency at --latency-at",
    )
    ap.add_argument(
        "--latency-at",
        default="0.5,0.8",
        help="dataflow, --latency: fractions of the saturating rate to measure latency at",
    )
    ap.add_argument("--probe-seconds", type=float, default=4.0, help="--latency: each probe")
    ap.add_argument(
        "--open-loop-window",
        type=int,
        default=4096,
        help="open loop (--rate, --latency): pushes unanswered at most",
    )
    ap.add_argument(
        "--sink-poll-ms",
        type=float,
        default=SINK_POLL_S * 1000,
        help="dataflow: the subscriber's poll interval while the sink has nothing new",
    )
    ap.add_argument("--check", action="store_true", help="exactly once, in order, = the model")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--dataflow-recovery", choices=("strong", "weak"), default="strong")
    ap.add_argument("--data-dir", help="drive the cluster running here instead")
    ap.add_argument("--keep-data", action="store_true", help="keep embedded clusters' data")
    ap.add_argument("--chains", help="dataflow lengths, e.g. 1,2,3,4,5,6,7,8,9,10")
    ap.add_argument("--chain-seconds", type=float, default=3.0)
    ap.add_argument("--ee", action="store_true", help="lb against lbe (and lbn)")
    ap.add_argument("--recovery-batches", type=int, default=0)
    ap.add_argument("--tpcc-cost", action="store_true")
    ap.add_argument("--tpcc-seconds", type=float, default=10.0)
    ap.add_argument("--tpcc-warmup", type=float, default=2.0)
    ap.add_argument("--tpcc-terminals", type=int, default=100)
    ap.add_argument("--all", action="store_true", help="every experiment the docs cite")
    ap.output("--out", "results/streaming/leaderboard.json", 'JSON ("" for none)')
    ap.output("--plot", "results/streaming/leaderboard.png", 'PNG ("" for none)')
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser()
    a = ap.parse(argv)
    if a.all:
        a.mode = a.mode or list(WAYS)
        a.ee = True
        a.chains = a.chains or ",".join(str(n) for n in range(1, 11))
        a.recovery_batches = a.recovery_batches or 5000
        a.tpcc_cost = True
        a.latency = True
    if a.latency and not a.mode:
        a.mode = ["dataflow"]
    if not (a.mode or a.chains or a.ee or a.recovery_batches or a.tpcc_cost):
        a.mode = list(WAYS)
    if a.data_dir and (a.recovery_batches or a.tpcc_cost):
        ap.error("--recovery-batches and --tpcc-cost start clusters of their own: no --data-dir")
    if a.window < 1 or a.votes_per_batch < 1 or a.seconds <= 0 or a.sink_poll_ms <= 0:
        ap.error("--window and --votes-per-batch >= 1, --seconds and --sink-poll-ms > 0")
    if a.rate < 0 or a.probe_seconds <= 0 or a.open_loop_window < 1:
        ap.error("--rate >= 0, --probe-seconds > 0, --open-loop-window >= 1")
    try:
        a.latency_at = parse_fractions(a.latency_at)
    except ValueError as e:
        ap.error(f"--latency-at: {e}")
    if a.latency and "dataflow" not in (a.mode or []):
        ap.error("--latency measures the dataflow way: add --mode dataflow")
    if a.latency and a.rate:
        ap.error("--latency finds its own rates: no --rate")
    return a


def experiments(a: argparse.Namespace, result: dict[str, Any]) -> Iterator[list[Verdict]]:
    if a.mode:
        result["ways"], v = run_ways(a, list(dict.fromkeys(a.mode)))
        yield v
    if a.ee:
        result["ee"], v = run_ee(a)
        yield v
    if a.chains:
        result["chains"], v = run_chains(a, [int(x) for x in a.chains.split(",")])
        yield v
    if a.recovery_batches:
        result["recovery"], v = recovery(
            a.recovery_batches,
            seed=a.seed,
            per_batch=a.votes_per_batch,
            in_flight=a.window,
            check_it=a.check,
            keep=a.keep_data,
        )
        for x in v:
            say(x)
        yield v
    if a.tpcc_cost:
        result["tpcc_cost"], v = tpcc_cost(
            script=Path(__file__).resolve(),
            rate=a.rate or TPCC_RATE,
            seconds=a.tpcc_seconds,
            warmup=a.tpcc_warmup,
            terminals=a.tpcc_terminals,
            sink_poll_ms=a.sink_poll_ms,
            check_it=a.check,
            keep=a.keep_data,
        )
        for x in v:
            say(x)
        yield v


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "engine": native.describe(),
        "cluster": {
            "replicas": a.replicas,
            "partitions": a.partitions,
            "dataflow_recovery": a.dataflow_recovery,
            "data_dir": a.data_dir,
            "fsync": True,
            "epoch_ms": 10,
        },
        "options": {k: v for k, v in vars(a).items() if k not in ("out", "plot", "publish")},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg())},
        "sstore_batches_per_s": SSTORE,
    }
    if a.data_dir:
        cfg = ClusterConfig.load(a.data_dir)
        result["cluster"] = {
            "replicas": cfg.replicas,
            "partitions": cfg.partitions,
            "dataflow_recovery": cfg.dataflow_recovery,
            "data_dir": a.data_dir,
            "fsync": cfg.fsync,
            "epoch_ms": cfg.epoch_duration_ms,
        }
    verdicts: list[Verdict] = []
    for v in experiments(a, result):
        verdicts += v
    result["machine"]["loadavg_after"] = list(os.getloadavg())
    print_tables(result)
    if a.out:
        write_json(result, a.out)
    if a.plot:
        plot(result, a.plot)
    wrote(a.out, a.plot)
    failed = [v for v in verdicts if not v.ok and not (a.all and v.expected_to_fail)]
    if failed:
        print(f"\n--check FAILED for: {', '.join(f'{v.way} {v.flow}' for v in failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
