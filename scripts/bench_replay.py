"""Benchmark: replay throughput of `ordo replay verify` vs live execution, same log.

Runs a live cluster (bank transfers, or TPC-C New-Order through `tpcc.driver` with
--workload tpcc) with checkpoints every N epochs and every checkpoint kept, records
the live rate and the replicas' final hashes, stops the cluster, then replays the
same log. With --baseline N it first runs the same live workload N times with and
without checkpoints, alternating (A B A B: a change in the machine's load hits both),
for the cost of checkpoints on the live rate, and on the partitions' CPU per txn
(from /proc, steadier than the rate on a shared host); --baseline-only stops there.
Then:

  - in this process, no Spark: every interval one after another (verify_local), and
    one replay of the whole log from genesis (reconstruct at the last epoch);
  - `ordo replay verify` with --master local[1] and local[2] (subprocesses, so each
    pays its own SparkSession start: reported apart from the job time);
  - `ordo replay state` at the last epoch (its hash must equal the live replicas') and
    `ordo replay history` on local[2].

Writes bench_replay_<workload>.json to the scratch directory (scripts/bench_outputs.py),
or with ``--publish`` to results/replay/ (``--out`` names another file), and prints a
Markdown section. The machine is shared: `uptime` load averages are recorded before and
after every phase.

    .venv/bin/python scripts/bench_replay.py --txns 100000
    .venv/bin/python scripts/bench_replay.py --txns 100000 --repeat 2 --publish
    .venv/bin/python scripts/bench_replay.py --workload tpcc --duration 40
    .venv/bin/python scripts/bench_replay.py --workload tpcc --duration 30 \
        --checkpoint-every 200 --baseline 2

It uses only what the engine had before incremental checkpoints too, so the same
script measures an older tree (copy it into that tree's scripts/).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_outputs import BenchParser, wrote  # noqa: E402

from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import LocalCluster, free_base_port, wait_quiescent  # noqa: E402
from cluster.replay_cli import replay_spec  # noqa: E402
from executor.core import checkpoint  # noqa: E402
from executor.replay.boundaries import scan_checkpoints  # noqa: E402
from executor.replay.reconstruct import reconstruct  # noqa: E402
from executor.replay.spark_jobs import split_runs  # noqa: E402
from executor.replay.spec import ReplaySpec  # noqa: E402
from executor.replay.verdicts import (  # noqa: E402
    BAD_CHECKPOINT,
    BATCH_INVALID,
    DIVERGED,
    LOG_CORRUPT,
)
from executor.replay.verify import plan_history, verify_local, verify_run  # noqa: E402
from sequencer.log import rewrite_payloads  # noqa: E402
from txn_library import native  # noqa: E402
from txn_library.client import Client  # noqa: E402
from txn_library.wire import sequencer as wire  # noqa: E402


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_s(procs: dict[str, Any]) -> dict[str, float]:
    """CPU seconds (user + system) each cluster process has used so far (/proc)."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, proc in procs.items():
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / hz
    return out


def live_bank(
    a: argparse.Namespace, data: Path, checkpoint_every: int | None = None
) -> tuple[ClusterConfig, dict, dict]:
    from cluster.bank_load import run_transfers
    from txn_library.workloads.bank import make_transfers, open_accounts

    cfg = ClusterConfig(
        replicas=a.replicas,
        partitions=a.partitions,
        base_port=free_base_port(),
        data_dir=str(data),
        procedure_modules=("txn_library.workloads.builtin",),
        checkpoint_every_epochs=a.checkpoint_every
        if checkpoint_every is None
        else checkpoint_every,
        checkpoint_keep=1_000_000,
    )
    with LocalCluster(cfg):
        with Client(cfg.client_addr) as c:
            open_accounts(c, a.accounts, 1_000_000)
        transfers = make_transfers(a.txns, a.accounts, a.partitions, a.multi, seed=1)
        run = run_transfers(cfg.client_addr, transfers, a.clients, a.in_flight)
        if run.errors:
            raise RuntimeError(f"{run.errors} transfers failed: {dict(run.error_codes)}")
        with Client(cfg.client_addr) as c:
            status = wait_quiescent(c, a.replicas, a.partitions, timeout_s=300)
    live = {
        "workload": "bank.transfer",
        "txns": run.sent,
        "elapsed_s": round(run.measured_s, 3),
        "txn_per_s": round(run.sent / run.measured_s, 1),
        "multi_partition_share": a.multi,
        "latency_p50_ms": run.percentiles_ms((0.5,), digits=1)["p50"],
    }
    return cfg, status, live


def live_tpcc(
    a: argparse.Namespace, data: Path, checkpoint_every: int | None = None
) -> tuple[ClusterConfig, dict, dict]:
    from tpcc import driver

    cfg = ClusterConfig(
        replicas=a.replicas,
        partitions=a.partitions,
        base_port=free_base_port(),
        data_dir=str(data),
        procedure_modules=driver.PROCEDURE_MODULES,
        genesis=driver.GENESIS,
        genesis_args={"warehouses": a.warehouses, "seed": 1, "load_ts_ms": 1_700_000_000_000},
        checkpoint_every_epochs=a.checkpoint_every
        if checkpoint_every is None
        else checkpoint_every,
        checkpoint_keep=1_000_000,
    )
    lc = driver.start_cluster(cfg, progress=False, log=print)
    try:
        opts = driver.RunOptions(
            mix="new-order",
            duration_s=a.duration,
            warmup_s=0.0,
            remote_pct=a.remote_pct,
            terminals=a.terminals,
            check=True,
            attach=str(data),
            out=None,
            progress=False,
        )
        before = cpu_s(lc.procs)
        result = driver.run(opts)
        used = cpu_s(lc.procs)
        with Client(cfg.client_addr) as c:
            status = wait_quiescent(c, a.replicas, a.partitions, timeout_s=300)
        lc.check_alive()
    finally:
        lc.stop()
    s = result["summary"]
    live = {
        "workload": f"tpcc.new_order (remote lines {a.remote_pct:.1f}%)",
        "txns": status["txns_sequenced"],
        "txn_per_s": s["txn_per_s"],
        "measured_s": s["measured_s"],
        "multi_partition_share": s["multi_partition_share"],
        "tpcc_check_ok": result.get("check", {}).get("ok"),
        # CPU per txn in the measured window (steadier than throughput on a noisy host)
        "cpu_us_per_txn": {
            role: round(
                1e6
                * sum(t - before[n] for n, t in used.items() if n in before and n.startswith(pre))
                / max(1.0, s["txn_per_s"] * s["measured_s"]),
                1,
            )
            for role, pre in (("partitions", "r"), ("sequencer", "sequencer"))
        },
    }
    return cfg, status, live


def baseline(a: argparse.Namespace) -> dict[str, Any]:
    """The live rate with checkpoints every --checkpoint-every epochs and without, in
    alternating runs (A B A B ...), each on a fresh cluster."""
    run = live_tpcc if a.workload == "tpcc" else live_bank
    out: dict[str, Any] = {"with_checkpoints": [], "without": []}
    for _ in range(a.baseline):
        for every, key in ((a.checkpoint_every, "with_checkpoints"), (0, "without")):
            with tempfile.TemporaryDirectory(prefix="ordo-bench-live-") as tmp:
                before = load()
                _, status, live = run(a, Path(tmp) / "data", every)
                out[key].append(
                    {
                        "txn_per_s": live["txn_per_s"],
                        "cpu_us_per_txn": live.get("cpu_us_per_txn"),
                        "epochs": status["epoch"],
                        "load_before": before,
                        "load_after": load(),
                    }
                )
                print(f"live, checkpoint every {every}: {out[key][-1]}", flush=True)
    mean = {k: sum(r["txn_per_s"] for r in v) / len(v) for k, v in out.items() if v}
    out["mean_txn_per_s"] = {k: round(v, 1) for k, v in mean.items()}
    out["ratio"] = round(mean["with_checkpoints"] / mean["without"], 3)
    cpu = {
        k: [r["cpu_us_per_txn"]["partitions"] for r in v if r.get("cpu_us_per_txn")]
        for k, v in out.items()
        if k in ("with_checkpoints", "without")
    }
    if all(cpu.values()):  # what checkpoints add to the partitions' CPU per txn
        mean_cpu = {k: sum(v) / len(v) for k, v in cpu.items()}
        out["partition_cpu_us_per_txn"] = {k: round(v, 1) for k, v in mean_cpu.items()}
        out["partition_cpu_overhead"] = round(
            mean_cpu["with_checkpoints"] / mean_cpu["without"] - 1, 3
        )
    return out


def in_process(spec: ReplaySpec, ckpt: Path, last_epoch: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = verify_local(spec, ckpt)
    verify_s = time.perf_counter() - t0
    txns = sum(r["txns"] for r in rows)
    # The same runs local[2] gets, in two plain processes at once (no Spark): what two
    # cores give this job without Spark's own costs (the bound for local[2]/local[1]).
    # Forked before the whole-log replay below: the children of a parent holding that
    # state walk it in every collection and copy the pages they touch (the same two runs
    # took 19.7 s forked after it, 14.9 s from a parent without it; 2026-11-26).
    tasks = plan_history(spec, ckpt)
    runs = split_runs(tasks, 2)
    t2 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(len(runs)) as pool:
        # as Spark tasks do: the state is retired, not freed, before the rows go back
        two = [row for rows_ in pool.map(partial(verify_run, keep=True), runs) for row in rows_]
    two_s = time.perf_counter() - t2
    t1 = time.perf_counter()
    rc = reconstruct(spec, [], last_epoch)  # genesis + the whole log, one replica
    whole_s = time.perf_counter() - t1
    return {
        "verify_sequential_s": round(verify_s, 3),
        "verify_sequential_txn_per_s": round(txns / verify_s, 1),
        "verify_replay_s_sum": round(sum(r["replay_s"] for r in rows), 3),
        "verify_load_s_sum": round(sum(r["load_s"] for r in rows), 3),
        "verdicts": sorted({r["verdict"] for r in rows}),
        "intervals": len(rows),
        "whole_log_replay_s": round(whole_s, 3),
        "whole_log_txn_per_s": round(rc.stats.txns / rc.replay_s, 1),
        "whole_log_hash": f"{rc.state_hash:016x}",
        "verify_two_processes_s": round(two_s, 3),
        "verify_two_processes_speedup": round(verify_s / two_s, 2),
        "verify_two_processes_runs": [len(r) for r in runs],
        "verify_two_processes_replay_s_sum": round(sum(r["replay_s"] for r in two), 3),
        "verify_two_processes_load_s_sum": round(sum(r["load_s"] for r in two), 3),
        "verify_two_processes_verdicts": sorted({r["verdict"] for r in two}),
    }


def ordo(args: list[str]) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "replay", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=3600,
    )
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"ordo replay {args[0]} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout), wall


def _doctor(batch: wire.Batch) -> tuple[wire.Batch, str]:
    """Change one argument of one call so that it still validates (same footprint)."""
    txns = list(batch.txns)
    for i, t in enumerate(txns):
        name, args = t.proc, t.args
        if name == "tpcc.new_order":
            from tpcc.transactions.new_order import UNUSED_I_ID

            if UNUSED_I_ID in args[3]:
                continue  # a rollback (clause 2.4.1.4): changing it changes nothing
            quantities = list(args[5])
            quantities[0] = quantities[0] % 10 + 1
            new_args = (*args[:5], tuple(quantities))
        elif name == "bank.transfer" and args[0] != args[1]:
            new_args = (args[0], args[1], args[2] + 1)
        else:
            continue
        txns[i] = t._replace(args=new_args)
        what = f"txn {batch.first_txn_id + i} {name}{args!r} -> {new_args!r}"
        return batch._replace(txns=tuple(txns)), what
    raise ValueError("no call to doctor in this batch")


def damage_check(cfg: ClusterConfig, work: Path) -> dict[str, Any]:
    """Copy the history, damage it three ways, and check `replay verify` locates each."""
    import shutil

    from sequencer.log import iter_frames
    from txn_library.wire import sequencer as wire

    src_ckpt = cfg.checkpoint_dir(0)
    epochs = [b.epoch for b in scan_checkpoints(src_ckpt, cfg.partitions)]
    if len(epochs) < 6:
        raise ValueError("the damage check wants at least 6 checkpoints")
    d = work / "damaged"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(cfg.log_dir, d / "log")
    shutil.copy(Path(cfg.data_dir) / "cluster.json", d / "cluster.json")
    ckpt = d / "replica-0" / "checkpoints"
    ckpt.mkdir(parents=True)
    for f in src_ckpt.glob("*.ckpt"):
        (ckpt / f.name).symlink_to(f.resolve())  # 80 MB each for TPC-C: link, copy the one we break
    for r in range(1, cfg.replicas):
        (d / f"replica-{r}").mkdir()
        (d / f"replica-{r}" / "checkpoints").symlink_to(cfg.checkpoint_dir(r).resolve())
    # 1. A doctored argument, re-encoded with a valid CRC, in interval (epochs[1], epochs[2]].
    doctored_epoch = (epochs[1] + epochs[2]) // 2
    batch = wire.decode_batch(
        dict(iter_frames(d / "log", doctored_epoch, doctored_epoch))[doctored_epoch]
    )
    changed, what = _doctor(batch)  # a live log is chained: all 8 fields
    rewrite_payloads(d / "log", {doctored_epoch: wire.pack(changed)})
    # 2. A checkpoint whose rows are damaged (its header still reads).
    bad = ckpt / checkpoint.checkpoint_name(epochs[3], 1)
    raw = bytearray(bad.read_bytes())
    bad.unlink()
    raw[len(raw) // 2] ^= 0x04
    bad.write_bytes(bytes(raw))
    # 3. A flipped byte in the middle of the log (breaks the frame's CRC), last interval.
    flipped_epoch = epochs[-1] - max(1, (epochs[-1] - epochs[-2]) // 2)
    segment = max(
        (s for s in (d / "log").glob("segment-*.log") if int(s.stem[8:]) <= flipped_epoch),
        key=lambda s: int(s.stem[8:]),
    )
    data, offset = segment.read_bytes(), 0
    for _ in range(flipped_epoch - int(segment.stem[8:])):
        offset += 8 + int.from_bytes(data[offset : offset + 4], "little")
    raw = bytearray(data)
    raw[offset + 8 + 5] ^= 0x20
    segment.write_bytes(bytes(raw))
    summary, wall = ordo(
        ["verify", str(d / "log"), str(ckpt), "--master", "local[2]", "--out", str(d / "verify")]
    )
    rows = {r["end_epoch"]: r for r in summary["rows"]}
    keep = (
        "start_epoch end_epoch verdict bad_epoch located_by suspect_first_epoch "
        "suspect_last_epoch suspect_txns diff_rows replicas_agree replayed_from_epoch detail"
    ).split()
    doctored, corrupt, flipped = rows[epochs[2]], rows[epochs[3]], rows[epochs[-1]]
    return {
        "doctored": {"epoch": doctored_epoch, "what": what, **{k: doctored[k] for k in keep}},
        # exactly, by its successor's digest of it (chained logs), else within the range
        "doctored_located": (
            doctored["verdict"] == BATCH_INVALID and doctored["bad_epoch"] == doctored_epoch
        )
        or (
            doctored["verdict"] == DIVERGED
            and doctored["suspect_first_epoch"] <= doctored_epoch <= doctored["suspect_last_epoch"]
        ),
        "corrupt_checkpoint": {"epoch": epochs[3], **{k: corrupt[k] for k in keep}},
        "corrupt_checkpoint_located": corrupt["verdict"] == BAD_CHECKPOINT
        and corrupt["bad_epoch"] == epochs[3],
        "next_interval_after_fallback": {k: rows[epochs[4]][k] for k in keep},
        "flipped_byte": {"epoch": flipped_epoch, **{k: flipped[k] for k in keep}},
        "flipped_byte_located": flipped["verdict"] == LOG_CORRUPT
        and flipped["bad_epoch"] == flipped_epoch,
        "verdicts": [r["verdict"] for r in summary["rows"]],
        "wall_s": round(wall, 3),
    }


def save(result: dict[str, Any], out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2, default=str) + "\n")


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", choices=["bank", "tpcc"], default="bank")
    ap.add_argument("--txns", type=int, default=100_000, help="bank: transfers")
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--multi", type=float, default=0.1, help="bank: multi-partition share")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=200, help="bank: per client")
    ap.add_argument("--warehouses", type=int, default=2, help="tpcc")
    ap.add_argument("--duration", type=float, default=30.0, help="tpcc: seconds driven")
    ap.add_argument("--remote-pct", type=float, default=1.0, help="tpcc: remote order lines")
    ap.add_argument("--terminals", type=int, default=100, help="tpcc")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=int, default=20, help="epochs")
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--data-dir", default=None, help="keep the run here (default: temporary)")
    ap.output(
        "--out",
        "results/replay/bench_replay_{workload}.json",
        "JSON (--reuse and --damage-only also read and update it)",
    )
    ap.add_argument("--no-damage", action="store_true", help="skip the damage check")
    ap.add_argument(
        "--damage-only",
        metavar="DATA_DIR",
        default=None,
        help="only run the damage check on a finished run kept with --data-dir",
    )
    ap.add_argument(
        "--reuse",
        metavar="DATA_DIR",
        default=None,
        help="skip the live run: re-measure Spark replay of a run kept with --data-dir "
        "(live and in-process numbers are kept from --out)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="verify runs per master")
    ap.add_argument(
        "--baseline-only",
        action="store_true",
        help="run only the --baseline comparison (live with and without checkpoints)",
    )
    ap.add_argument(
        "--baseline",
        type=int,
        default=0,
        metavar="N",
        help="first run the live workload N times with and N times without checkpoints",
    )
    return ap


def main() -> None:
    a = parser().parse()
    if a.damage_only:
        cfg = ClusterConfig.load(a.damage_only)
        damage = damage_check(cfg, Path(a.damage_only))
        print(json.dumps(damage, indent=2))
        if Path(a.out).exists():
            result = json.loads(Path(a.out).read_text())
            result["damage"] = damage
            save(result, a.out)
            wrote(a.out)
        return
    tmp = None
    if a.reuse:
        data = Path(a.reuse)
        cfg = ClusterConfig.load(data)
        result = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {}
        result.setdefault("load", {})
        live_hashes = result.get("live", {}).get("partition_hashes", {})
        ckpt = cfg.checkpoint_dir(0)
    else:
        if a.data_dir is None:
            tmp = tempfile.TemporaryDirectory(prefix="ordo-bench-replay-")
            data = Path(tmp.name) / "data"
        else:
            data = Path(a.data_dir)
        result = {"args": vars(a), "cpus": os.cpu_count(), "load": {}}
        result["engine"] = native.describe_now()
        if a.baseline:
            result["baseline"] = baseline(a)
            if a.baseline_only:
                save(result, a.out)
                print(json.dumps(result["baseline"], indent=2, default=str))
                wrote(a.out)
                return
        result["load"]["before_live"] = load()
        cfg, status, live = (live_tpcc if a.workload == "tpcc" else live_bank)(a, data)
        result["load"]["after_live"] = load()
        result["live"] = {
            **live,
            "epochs": status["epoch"],
            "txns_sequenced": status["txns_sequenced"],
        }
        live_hashes = {
            f"r{p['replica']}p{p['partition']}": p["state_hash"] for p in status["partitions"]
        }
        result["live"]["partition_hashes"] = live_hashes
        spec = replay_spec(cfg, cfg.log_dir)
        ckpt = cfg.checkpoint_dir(0)
        result["checkpoints"] = len([b for b in scan_checkpoints(ckpt, cfg.partitions) if b.epoch])
        print(f"live: {result['live']}", flush=True)
        result["in_process"] = in_process(spec, ckpt, status["epoch"])
        result["load"]["after_in_process"] = load()
        print(f"in process: {result['in_process']}", flush=True)

    # Masters alternate (A B A B ...) so that a change in the machine's load hits both.
    masters = a.masters.split(",")
    result["spark_verify"] = {m: [] for m in masters}
    for _ in range(a.repeat):
        for master in masters:
            out = data / "replay" / f"verify-{master.replace('[', '').replace(']', '')}"
            before = load()
            summary, wall = ordo(
                ["verify", str(cfg.log_dir), str(ckpt), "--master", master, "--out", str(out)]
            )
            summary.pop("rows", None)
            summary["wall_s_incl_session"] = round(wall, 3)
            summary["load_before"], summary["load_after"] = before, load()
            result["spark_verify"][master].append(summary)
            print(f"verify {master}: {summary}", flush=True)

    state, wall = ordo(["state", str(cfg.log_dir), str(ckpt), "--master", "local[2]"])
    state["wall_s_incl_session"] = round(wall, 3)
    state["matches_live"] = all(
        state["partition_hashes"][int(k.split("p")[-1])] == h for k, h in live_hashes.items()
    )
    result["spark_state"] = state
    history, wall = ordo(["history", str(cfg.log_dir), "--master", "local[2]"])
    history["wall_s_incl_session"] = round(wall, 3)
    result["spark_history"] = history
    if not a.no_damage:
        result["damage"] = damage_check(cfg, data)
        print(f"damage: {result['damage']}", flush=True)
    result["load"]["after_all"] = load()
    result["engine_at_end"] = native.describe_now()
    if result.get("engine") not in (None, result["engine_at_end"]):
        changed = f"{result['engine']} at the start, {result['engine_at_end']} at the end"
        print(f"WARNING: the engine changed during the run ({changed}): discard it", flush=True)
    result["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save(result, a.out)
    print(markdown(result))
    if tmp is not None:
        tmp.cleanup()
    wrote(a.out)


def markdown(r: dict[str, Any]) -> str:
    if "live" not in r:  # --reuse: only the Spark jobs ran
        lines = ["### Replay of a reused history", "", "| what | txn/s | time |", "|---|---:|---:|"]
    else:
        live, ip = r["live"], r["in_process"]
        live_s = live.get("elapsed_s", live.get("measured_s"))
        lines = [
            f"### Replay ({live['workload']}, {live['txns_sequenced']:,} txns, "
            f"{live['epochs']:,} epochs, {r['checkpoints']} checkpoints; "
            f"{r['cpus']} cores, load {r['load']['before_live']})",
            "",
            "| what | txn/s | time |",
            "|---|---:|---:|",
            f"| live execution ({r['args']['replicas']} replicas x {r['args']['partitions']} "
            f"partitions, fsync) | {live['txn_per_s']:,.0f} | {live_s} s |",
            f"| replay whole log from genesis, one process | {ip['whole_log_txn_per_s']:,.0f} "
            f"| {ip['whole_log_replay_s']} s |",
            f"| verify all intervals, one process, no Spark | "
            f"{ip['verify_sequential_txn_per_s']:,.0f} | {ip['verify_sequential_s']} s |",
        ]
    if "baseline" in r:
        b = r["baseline"]
        lines.append(
            f"| live, {len(b['with_checkpoints'])} runs with checkpoints every "
            f"{r['args']['checkpoint_every']} epochs / {len(b['without'])} without, alternating "
            f"| {b['mean_txn_per_s']['with_checkpoints']:,.0f} / "
            f"{b['mean_txn_per_s']['without']:,.0f} | ratio {b['ratio']} |"
        )
    for master, runs in r["spark_verify"].items():
        for s in runs:
            lines.append(
                f"| `ordo replay verify --master {master}` (job; load {s['load_before'][0]}) "
                f"| {s['txns_per_s_job']:,.0f} | {s['job_s']} s (wall with session start: "
                f"{s['wall_s_incl_session']} s) |"
            )
    st = r["spark_state"]
    lines += [
        "",
        f"`replay state` at epoch {st['epoch']}: hash {st['state_hash']}, "
        f"{'matches' if st['matches_live'] else 'DOES NOT MATCH'} the live replicas; "
        f"load {st['load_s']} s + replay {st['replay_s']} s + write {st['write_s']} s.",
        f"`replay history`: {r['spark_history']['txns']:,} rows in "
        f"{r['spark_history']['job_s']} s.",
        f"Load averages: {r['load']}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
