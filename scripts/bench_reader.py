#!/usr/bin/env python3
"""Benchmark: a reader (executor/reader/, issue 46) beside a 1 x 2 bank cluster.

One embedded cluster (1 replica x 2 partitions, durable log, one reader), ``--accounts``
accounts, bank transfers (most across partitions) from the load generator:

  follow    transfers at ``--transfer-rate``/s (open loop), then as fast as the
            cluster takes them (closed loop, 200 in flight), ``--duration`` s each: the
            cluster's transfers/s, and the reader's lag behind the sequencer's epoch
            (sampled every 50 ms: p50, p99, max). Then the cluster rests, the reader is
            restarted ``--from-genesis`` and replays the whole history: its txns/s
            against the closed loop's (the cluster's capacity on this machine).
  queries   with transfers at ``--transfer-rate``/s, queries from one client,
            ``--in-flight`` at a time, for ``--duration`` s each: one-key snapshots
            (bank.balance) and bank.total over every account, answered by the reader,
            then by the replica's partitions (``replica=0``): queries/s, and how many
            totals differed from the money opened (must be 0).
  tpcc      a TPC-C history (``ordo tpcc run``, New Order, W=2, 1 x 2, ``--tpcc-seconds``
            s; or ``--tpcc-data-dir``, a kept one) replayed in one process from the
            genesis, the reader's way (executor/reader/follower.py: serially, each write
            at its key's partition) and the partitions' code's (LocalReplica, as
            recovery and Spark replay run it), ``--tpcc-runs`` times each, alternating:
            the best CPU seconds; both must reach the same per-partition state hashes.
            Against the rate the cluster made it at.

Prints a table and writes it as JSON to ``--out`` (default: bench_reader.json in the
scratch directory, scripts/bench_outputs.py); ``--publish`` writes
results/readers/bench_reader.json instead, the file docs/BENCHMARKS.md cites.

    .venv/bin/python scripts/bench_reader.py --duration 10 --publish
    .venv/bin/python scripts/bench_reader.py --duration 5 --out /tmp/reader.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_outputs import BenchParser, wrote  # noqa: E402

import txn_library.workloads.builtin  # noqa: E402,F401  (registers the bank)
from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import (  # noqa: E402
    LocalCluster,
    cluster_client,
    free_base_port,
    reader_report,
    wait_quiescent,
)
from cluster.load_background import Background  # noqa: E402
from cluster.load_shapes import Call, ClosedLoop, Load, OpenLoop  # noqa: E402
from cluster.loadgen import LoadGenerator  # noqa: E402
from txn_library.client import Client  # noqa: E402
from txn_library.workloads.bank import make_transfers, open_accounts  # noqa: E402

START = 10_000


def transfers(cfg: ClusterConfig, accounts: int, rate: float | None) -> Background:
    """Transfers at ``rate``/s (open loop), or as fast as answered (None: closed loop)."""
    calls = make_transfers(20_000, accounts, cfg.partitions, 0.8, seed=1)
    sent = [0]

    def next_call(_terminal: int) -> Call:
        args = calls[sent[0] % len(calls)]
        sent[0] += 1
        return Call("bank.transfer", args, "transfer")

    shape: Load = (
        ClosedLoop(terminals=4, in_flight_per_terminal=50)
        if rate is None
        else OpenLoop(rate_per_s=rate, in_flight_max=2_000, terminals=4)
    )
    return Background(
        lambda source: LoadGenerator(
            cfg.client_addrs,
            source,
            shape,
            connections=2,
            timeout_s=30.0,
        ),
        next_call,
    )


def closed_loop(submit: Callable[[], Future], in_flight: int, duration_s: float) -> dict:
    """``submit()`` kept ``in_flight`` deep for ``duration_s``: answers/s, and the values."""
    values: list = []
    errors = 0
    t0 = time.perf_counter()
    end = t0 + duration_s
    futs = [submit() for _ in range(in_flight)]
    done = 0
    while futs:
        f = futs.pop(0)
        try:
            values.append(f.result(timeout=60).value)
        except Exception:  # noqa: BLE001 - counted: a benchmark reports, never decides
            errors += 1
        done += 1
        if time.perf_counter() < end:
            futs.append(submit())
    elapsed = time.perf_counter() - t0
    return {"answered": done, "errors": errors, "per_s": round(done / elapsed), "values": values}


def run_watching(lc: LocalCluster, load: Background, duration_s: float) -> dict:
    """Run ``load`` for ``duration_s``, sampling the reader's lag every 50 ms."""
    cfg = lc.config
    lags: list[int] = []
    with cluster_client(cfg) as c:
        load.start(duration_s=None)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duration_s:
            epoch = c.status()["epoch"]
            rep = reader_report(cfg, 0, timeout_s=2.0)
            if rep is not None:
                lags.append(max(0, epoch - rep["applied_epoch"]))
            time.sleep(0.05)
        window = load.stop(timeout_s=60)
        elapsed = time.perf_counter() - t0
    lags.sort()
    return {
        "transfers_per_s": round(window.ok / elapsed),
        "lag_epochs_p50": lags[len(lags) // 2] if lags else None,
        "lag_epochs_p99": lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else None,
        "lag_epochs_max": lags[-1] if lags else None,
        "lag_samples": len(lags),
    }


def follow(lc: LocalCluster, args: argparse.Namespace) -> dict:
    cfg = lc.config
    out = {
        "open_loop": run_watching(
            lc, transfers(cfg, args.accounts, args.transfer_rate), args.duration
        ),
        "closed_loop": run_watching(lc, transfers(cfg, args.accounts, None), args.duration),
    }
    with cluster_client(cfg) as c:
        st = wait_quiescent(c, 1, cfg.partitions)
    history_txns = st["txns_sequenced"]
    # The whole history again, from genesis, while the cluster rests.
    old_pid = reader_report(cfg, 0)
    lc.kill("reader-0")
    t1 = time.perf_counter()
    lc.start_reader(0, from_genesis=True)
    while True:
        rep = reader_report(cfg, 0, timeout_s=1.0)
        if (
            rep is not None
            and rep["pid"] != (old_pid or {}).get("pid")
            and rep["live"]
            and rep["applied_epoch"] >= st["epoch"]
        ):
            break
        time.sleep(0.01)
    replay_s = time.perf_counter() - t1  # process start and genesis included
    assert rep["started_epoch"] == 0 and rep["txns_applied"] >= history_txns, rep
    rate = history_txns / replay_s
    out["replay"] = {
        "epochs": st["epoch"],
        "txns": history_txns,
        "seconds": round(replay_s, 2),
        "txns_per_s": round(rate),
        "vs_cluster_closed_loop": round(rate / max(1, out["closed_loop"]["transfers_per_s"]), 2),
    }
    return out


def queries(lc: LocalCluster, args: argparse.Namespace) -> dict:
    cfg = lc.config
    total = args.accounts * START
    out: dict = {}
    load = transfers(cfg, args.accounts, args.transfer_rate)
    load.start(duration_s=None)
    try:
        with cluster_client(cfg, timeout_s=60) as c:
            for where, pin in (("reader", {"reader": 0}), ("replica", {"replica": 0})):
                one = closed_loop(
                    _submit(c, "bank.balance", (7,), pin), args.in_flight, args.duration
                )
                many = closed_loop(
                    _submit(c, "bank.total", (0, args.accounts), pin),
                    args.in_flight,
                    args.duration,
                )
                wrong = sum(1 for v in many["values"] if v != total)
                del one["values"], many["values"]
                out[where] = {"one_key": one, f"total_{args.accounts}": many, "wrong": wrong}
    finally:
        window = load.stop(timeout_s=60)
    out["transfers_ok"] = window.ok
    out["money"] = total
    return out


def _submit(c: Client, proc: str, a: tuple, pin: dict) -> Callable[[], Future]:
    return lambda: c.submit_query(proc, *a, **pin)


def tpcc(args: argparse.Namespace, tmp: Path) -> dict:
    from cluster.replay_cli import replay_spec
    from executor.core.genesis import genesis_storage
    from executor.reader.follower import Follower
    from executor.replay.batches import Replayer, iter_batches
    from executor.replay.reconstruct import GENESIS, load_boundary

    made: dict = {}
    if args.tpcc_data_dir:
        data = Path(args.tpcc_data_dir)
    else:
        data = tmp / "tpcc"
        run_json = tmp / "tpcc-run.json"
        subprocess.run(
            [sys.executable, "-m", "cluster.cli", "tpcc", "run", "--duration",
             str(args.tpcc_seconds), "--warmup", "0.5", "--data-dir", str(data), "--no-check",
             "--quiet", "--out", str(run_json)],
            cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        summary = json.loads(run_json.read_text())["summary"]
        made = {
            "txn_per_s": summary["txn_per_s"],
            "new_order_per_s": summary["new_order_per_s"],
            "cpu_us_per_sequenced_txn": summary["cpu_us_per_sequenced_txn"],
        }
    cfg = ClusterConfig.load(data)
    spec = replay_spec(cfg, cfg.log_dir)
    spec.prepare()
    n = cfg.partitions
    batches = [b for _, b, _ in iter_batches(cfg.log_dir, 1)]
    reader_cpus, replica_cpus = [], []
    for _ in range(args.tpcc_runs):  # alternating: this host's CPU seconds vary by 20-30%
        # The reader's way.
        follower = Follower(
            n, [genesis_storage(cfg.genesis, cfg.genesis_args, p, n) for p in range(n)]
        )
        t0 = time.process_time()
        for b in batches:
            follower.apply(b)
        reader_cpus.append(time.process_time() - t0)
        # The partitions' code in one process.
        replica = load_boundary(spec, GENESIS)
        replayer = Replayer(replica, n)
        t0 = time.process_time()
        stats = replayer.run(spec.log_dir, None)
        replica_cpus.append(time.process_time() - t0)
    reader_cpu, replica_cpu = min(reader_cpus), min(replica_cpus)
    change_cpus, change_bytes = apply_change_records(cfg, batches, args.tpcc_runs, follower)
    change_cpu = min(change_cpus)
    new_orders = sum(1 for b in batches for t in b.txns if t.proc == "tpcc.new_order")
    mine = [f"{h:016x}" for h in follower.state_hashes()]
    theirs = [f"{p.storage.state_hash:016x}" for p in replica.parts]
    assert mine == theirs, f"the reader's hashes {mine} are not the partitions' {theirs}"
    txns = follower.txns_applied
    out = {
        "epochs": len(batches),
        "txns": txns,
        "runs": args.tpcc_runs,
        "reader_cpu_s": [round(c, 2) for c in reader_cpus],
        "reader_txns_per_s": round(txns / reader_cpu),
        "reader_cpu_us_per_txn": round(1e6 * reader_cpu / txns, 1),
        "partitions_code_cpu_s": [round(c, 2) for c in replica_cpus],
        "partitions_code_cpu_us_per_txn": round(1e6 * replica_cpu / stats.txns, 1),
        "change_record_cpu_s": [round(c, 2) for c in change_cpus],
        "change_record_cpu_us_per_txn": round(1e6 * change_cpu / txns, 1),
        "change_record_bytes_per_txn": round(change_bytes / txns),
        "new_orders": new_orders,
        "cpu_us_per_new_order": {
            "reader_reexecutes": round(1e6 * reader_cpu / max(1, new_orders), 1),
            "reader_applies_change_records": round(1e6 * change_cpu / max(1, new_orders), 1),
            "partitions_code": round(1e6 * replica_cpu / max(1, new_orders), 1),
        },
        "state_hashes_equal": True,
        "made_by_the_cluster": made,
    }
    if made:
        out["reader_vs_cluster"] = round(txns / reader_cpu / made["txn_per_s"], 2)
        out["change_records_vs_cluster"] = round(txns / change_cpu / made["txn_per_s"], 2)
    return out


def apply_change_records(
    cfg: ClusterConfig, batches: list, runs: int, reference: Any
) -> tuple[list[float], int]:
    """The other way to follow (FoundationDB's), measured before it is built: apply the
    writes each partition records per epoch (its change record: every key written,
    with its encoded row), no procedure run. The records are taken from a reader's run
    (untimed), packed as one frame per partition per epoch, as partitions would send
    them; then, timed: each frame decoded and its rows installed into fresh genesis
    storages. Returns the CPU seconds of each run and the frames' bytes; the state
    hashes must equal ``reference``'s (the reader's)."""
    import msgpack

    from executor.core.genesis import genesis_storage
    from executor.reader.follower import Follower

    n = cfg.partitions
    capture = Follower(n, [genesis_storage(cfg.genesis, cfg.genesis_args, p, n) for p in range(n)])
    for st in capture.storages:
        st.track_changes()
    frames: list[list[bytes]] = []
    for b in batches:
        capture.apply(b)
        frames.append([msgpack.packb(st.take_changes()) for st in capture.storages])
    size = sum(len(f) for per in frames for f in per)
    cpus = []
    for _ in range(runs):
        storages = [genesis_storage(cfg.genesis, cfg.genesis_args, p, n) for p in range(n)]
        unpack = msgpack.unpackb
        t0 = time.process_time()
        for per in frames:
            for st, frame in zip(storages, per, strict=True):
                writes = [
                    (t, key, None if data is None else unpack(data, use_list=False)[2], data)
                    for t, rows in unpack(frame, use_list=False, strict_map_key=False).items()
                    for key, data in rows.items()
                ]
                if writes:
                    st.apply(writes)
        cpus.append(time.process_time() - t0)
        got = [s.state_hash for s in storages]
        want = list(reference.state_hashes())
        assert got == want, f"change records reach {got}, the reader {want}"
    return cpus, size


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="follow,queries,tpcc")
    ap.add_argument("--tpcc-seconds", type=float, default=3.0)
    ap.add_argument("--tpcc-data-dir", default=None, help="a kept TPC-C cluster directory")
    ap.add_argument("--tpcc-runs", type=int, default=3, help="replays each way, alternating")
    ap.add_argument("--accounts", type=int, default=1_000)
    ap.add_argument("--transfer-rate", type=float, default=1_000.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.output("--out", "results/readers/bench_reader.json", "JSON")
    return ap


def main() -> int:
    args = parser().parse()
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="ordo-bench-reader-") as data:
        return run(args, parts, data)


def run(args: argparse.Namespace, parts: list[str], data: str) -> int:
    cfg = ClusterConfig(
        replicas=1,
        partitions=2,
        readers=1,
        # The replica keeps versions here (with readers it would keep none: ClusterConfig.
        # replica_versions), so its snapshots can be set beside the reader's.
        query_versions=True,
        base_port=free_base_port(),
        data_dir=str(Path(data) / "data"),
    )
    result: dict = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "build": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        + "+work-tree",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "compiled": os.environ.get("ORDO_PURE") != "1",
        "shape": "1 replica x 2 partitions + 1 reader",
        "accounts": args.accounts,
    }
    if "follow" in parts or "queries" in parts:
        with LocalCluster(cfg) as lc:
            with cluster_client(cfg) as c:
                open_accounts(c, args.accounts, START)
            if "follow" in parts:
                result["follow"] = follow(lc, args)
            if "queries" in parts:
                result["queries"] = queries(lc, args)
    if "tpcc" in parts:
        result["tpcc"] = tpcc(args, Path(data))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    wrote(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
