"""``--tpcc-cost`` of scripts/leaderboard.py: what a running dataflow costs concurrent
TPC-C New Order, against the CPU it takes.

One cluster (1 replica x 2 partitions, W=2 by genesis, the leaderboard's ``lb``
dataflow on one of the partitions), three phases of a warm-up and a window each:
New Order alone (tpcc.driver's terminals, closed loop); ``lb`` alone, pushed at a
fixed rate by a second process of this script (``--mode dataflow --rate R
--data-dir``); New Order again while another such process pushes at the same rate.
The CPU seconds of every process inside each window (cluster.measure.CpuMeter: the
cluster's processes, "driver" = this one's New Order load, "dataflow_client" = the
pusher) give the dataflow's share: its CPU alone at that rate over the CPU used while
both run (and, for comparison, the CPU used beside New Order less New Order's at its
CPU per transaction alone, over the same). The dataflow costs New Order no more than
its share when the throughput New Order lost is at most the smaller of the two (plus
``MARGIN`` for noise): alone, the dataflow's epochs carry little else, so the first
estimate overstates what it takes beside a busy New Order.

Invariant: a pusher process is always ended (it ends by itself after its seconds;
killed if it outlives its time or this one fails first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from leaderboard_check import Verdict
from leaderboard_cluster import LEADERBOARD, Target, embedded, leaderboard_flow, prepare

from cluster.measure import CpuMeter
from tpcc import driver
from tpcc.inputs import TpccInputs
from txn_library.placement import partition_of
from txn_library.workloads.leaderboard import VARIANT

GENESIS_ARGS = {"warehouses": 2, "seed": 7, "load_ts_ms": 1_700_000_000_000}
MODULES = (*driver.PROCEDURE_MODULES, LEADERBOARD)
MARGIN = 0.02  # of New Order's throughput: noise allowed beyond the dataflow's CPU share
PUSHER_START_S = 60.0  # how long the pusher may take to push its first batch
PUSHER_SLACK_S = 3.0  # the pusher runs this much longer than the warm-up + window


def _new_order(
    target: Target, seconds: float, warmup: float, terminals: int, seed: int, extra: dict[str, int]
) -> dict[str, Any]:
    opts = driver.RunOptions(
        warehouses=GENESIS_ARGS["warehouses"],
        partitions=target.cfg.partitions,
        replicas=target.cfg.replicas,
        duration_s=seconds,
        warmup_s=warmup,
        terminals=terminals,
        seed=seed,
        load_seed=GENESIS_ARGS["seed"],
        check=False,
        out=None,
        progress=False,
    )
    inputs = TpccInputs(
        opts.warehouses,
        target.cfg.partitions,
        opts.seed,
        load_seed=opts.load_seed,
        mix=opts.mix,
        remote_line_pct=opts.remote_pct,
    )
    meter = CpuMeter({**target.pids(), **extra})
    window = driver.drive(target.address, inputs, opts, lambda _line: None, meter)
    s = driver.summarize(window, opts, target.cfg.partitions, target.cfg.replicas)
    cpu = dict(meter.used)
    return {
        "measured_s": s["measured_s"],
        "new_order_per_s": s["new_order_per_s"],
        "new_order_latency_ms": s["per_type"].get("new_order", {}).get("latency_ms"),
        "errors": s["errors"],
        "cpu_s": cpu,
        "cpu_cores": round(sum(cpu.values()) / s["measured_s"], 3),
    }


def _start_pusher(
    target: Target, script: Path, rate: float, seconds: float, out: Path, args: list[str]
) -> subprocess.Popen:
    """This script in another process (with ``args`` besides): ``lb`` pushed at ``rate``
    for ``seconds``; returns once its first batch is in (or ends it and raises)."""
    argv = [
        sys.executable,
        str(script),
        "--mode=dataflow",
        "--variant=lb",
        f"--data-dir={target.cfg.data_dir}",
        f"--rate={rate:g}",
        "--warmup=0",
        f"--seconds={seconds:g}",
        f"--out={out}",
        "--plot=",
        *args,
    ]
    with open(out.with_suffix(".log"), "wb") as said:  # its own table: shown if it fails
        pusher = subprocess.Popen(argv, stdout=said, stderr=subprocess.STDOUT)
    try:
        _wait_pushing(target, pusher)
    except BaseException:
        _end(pusher, 0.0)
        raise
    return pusher


def _end(pusher: subprocess.Popen, timeout_s: float) -> int:
    """Wait for the pusher to finish (killed past ``timeout_s``); its exit status."""
    try:
        return pusher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pusher.kill()
        return pusher.wait()


def _wait_pushing(target: Target, pusher: subprocess.Popen) -> None:
    deadline = time.monotonic() + PUSHER_START_S
    with target.client() as c:
        last = c.call("dataflow.status", "lb").value.get("last_pushed")
        while time.monotonic() < deadline:
            if pusher.poll() is not None:
                raise RuntimeError(f"the dataflow client exited with {pusher.returncode}")
            if c.call("dataflow.status", "lb").value.get("last_pushed") != last:
                return
            time.sleep(0.05)
    raise TimeoutError(f"the dataflow client pushed nothing within {PUSHER_START_S:.0f} s")


def _dataflow_alone(
    target: Target,
    script: Path,
    rate: float,
    seconds: float,
    warmup: float,
    out: Path,
    args: list[str],
) -> dict[str, Any]:
    """CPU of every process while lb is pushed at ``rate`` and nothing else runs."""
    pusher = _start_pusher(target, script, rate, warmup + seconds + PUSHER_SLACK_S, out, args)
    try:
        time.sleep(warmup)
        meter = CpuMeter({**target.pids(), "dataflow_client": pusher.pid})
        meter.edge("start")
        time.sleep(seconds)
        meter.edge("end")
    finally:
        code = _end(pusher, PUSHER_SLACK_S + 600)
    cpu = dict(meter.used)
    cpu.pop("driver", None)  # this process only slept
    pushed = json.loads(out.read_text())["ways"][0] if out.is_file() else {}
    if code != 0:
        print(out.with_suffix(".log").read_text(errors="replace")[-4000:], flush=True)
    return {
        "exit_status": code,
        "batches_per_s": pushed.get("batches_per_s"),
        "cpu_s": cpu,
        "cpu_cores": round(sum(cpu.values()) / seconds, 3),
    }


def tpcc_cost(
    *,
    script: Path,
    rate: float,
    seconds: float,
    warmup: float,
    terminals: int,
    sink_poll_ms: float,
    check_it: bool,
    keep: bool,
) -> tuple[dict[str, Any], list[Verdict]]:
    with (
        embedded(
            replicas=1,
            partitions=2,
            modules=MODULES,
            genesis=driver.GENESIS,
            genesis_args=dict(GENESIS_ARGS),
            keep=keep,
        ) as t,
        tempfile.TemporaryDirectory(prefix="ordo-lb-pusher-") as tmp,
    ):
        prepare(t, leaderboard_flow("lb"))
        print(f"tpcc-cost: New Order alone, {warmup:g} + {seconds:g} s", flush=True)
        alone = _new_order(t, seconds, warmup, terminals, 1, {})
        print(f"tpcc-cost: lb alone at {rate:g} batches/s", flush=True)
        args = [f"--sink-poll-ms={sink_poll_ms:g}"]
        df_alone = _dataflow_alone(t, script, rate, seconds, warmup, Path(tmp) / "alone.json", args)
        print(f"tpcc-cost: New Order with lb pushed at {rate:g} batches/s", flush=True)
        out = Path(tmp) / "beside.json"
        if check_it:
            args.append("--check")
        pusher = _start_pusher(t, script, rate, warmup + seconds + PUSHER_SLACK_S, out, args)
        try:
            extra = {"dataflow_client": pusher.pid}
            with_df = _new_order(t, seconds, warmup, terminals, 2, extra)
        finally:
            code = _end(pusher, PUSHER_SLACK_S + 600)
        pushed = json.loads(out.read_text())["ways"][0] if out.is_file() else {}
        if code != 0:
            print(out.with_suffix(".log").read_text(errors="replace")[-4000:], flush=True)
    result = _compare(alone, df_alone, with_df)
    result["dataflow"] = pushed
    result["rate_per_s"] = rate
    lb = VARIANT["lb"]
    result["cluster"] = (
        f"1 replica x 2 partitions, W={GENESIS_ARGS['warehouses']}, lb on partition "
        f"{partition_of(lb.contestants, (lb.home, 1), 2)}, {terminals} New Order terminals"
    )
    verdicts = []
    if code != 0 or not pushed:
        problems = (pushed.get("check") or {}).get("problems") or []
        verdicts.append(
            Verdict(
                "tpcc-cost",
                "lb",
                pushed.get("batches", 0),
                [f"the dataflow client exited with {code}", *problems],
                {},
            )
        )
    return result, verdicts


def _compare(
    alone: dict[str, Any], df_alone: dict[str, Any], with_df: dict[str, Any]
) -> dict[str, Any]:
    no_alone, no_with = alone["new_order_per_s"], with_df["new_order_per_s"]
    loss = 1.0 - no_with / no_alone if no_alone else 0.0
    cpu_with = with_df["cpu_cores"]
    # The dataflow's share: its CPU alone at the same rate, of the CPU used while both run.
    share = min(1.0, df_alone["cpu_cores"] / cpu_with) if cpu_with else 0.0
    # Beside New Order: the CPU used with it, less New Order's at its CPU per txn alone.
    cpu_per_no = alone["cpu_cores"] / no_alone if no_alone else 0.0
    beside = max(0.0, cpu_with - no_with * cpu_per_no) / cpu_with if cpu_with else 0.0
    within = loss <= min(share, beside) + MARGIN  # both estimates must allow the loss
    return {
        "new_order_alone": alone,
        "dataflow_alone": df_alone,
        "new_order_with_dataflow": with_df,
        "new_order_loss": round(loss, 4),
        "dataflow_cpu_share": round(share, 4),
        "dataflow_cpu_share_beside": round(beside, 4),
        "dataflow_cores_of_machine": round(df_alone["cpu_cores"] / (os.cpu_count() or 1), 4),
        "margin": MARGIN,
        "costs_no_more_than_its_share": within,
        "verdict": (
            f"New Order lost {loss:.1%} of its throughput; the dataflow's CPU (alone, same "
            f"rate) is {share:.1%} of the CPU used with both running ({beside:.1%} by New "
            f"Order's CPU per txn): {'no more' if within else 'MORE'} than the smaller share"
        ),
    }
