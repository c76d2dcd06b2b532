#!/usr/bin/env python3
"""Flame graphs of every Ordo process under TPC-C New Order: where the CPU goes.

Runs ``ordo tpcc run`` on an embedded cluster (default: W=2, 1 replica x 2 partitions,
durable log, 200 terminals) and, once its warm-up is over, attaches py-spy (sampling,
from outside the process: the processes run unmodified) to the sequencer, each
partition and the driver for the measured window. Writes one SVG flame graph per
process and the run's JSON summary (New Order/s, CPU per sequenced txn per process)
to --out-dir (default: the scratch directory, scripts/bench_outputs.py; ``--publish``:
results/profile/), and prints both.

    .venv/bin/python scripts/profile_tpcc.py --duration 20

Needs ptrace rights over the cluster's processes (root, or a kernel.yama.ptrace_scope
that allows it). Sampling at --rate Hz costs the profiled processes a little CPU:
compare throughput with and without profiling before reading much into small shares.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_outputs import BenchParser, wrote

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
FIND_PROCESSES_S = 120.0  # genesis of W warehouses takes a while before processes exist


def role_pids(data_dir: Path) -> dict[str, int]:
    """{role: pid} of the embedded cluster's processes (found by their command lines)."""
    out = subprocess.run(
        ["pgrep", "-af", f"cluster.cli .*--data-dir {data_dir}"],
        capture_output=True,
        text=True,
    ).stdout
    roles: dict[str, int] = {}
    for line in out.splitlines():
        pid, _, cmd = line.partition(" ")
        args = cmd.split()
        if "sequencer" in args:
            roles["sequencer"] = int(pid)
        elif "replica" in args:
            r = args[args.index("--replica") + 1]
            p = args[args.index("--partition") + 1]
            roles[f"r{r}p{p}"] = int(pid)
    return roles


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--warehouses", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--duration", type=float, default=20.0, help="measured (and sampled) s")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.output("--out-dir", "results/profile", "flame graphs and the run's JSON")
    ap.add_argument(
        "--format",
        choices=("flamegraph", "raw"),
        default="flamegraph",
        help="flamegraph: one SVG per process; raw: collapsed stacks (.txt), for scripts",
    )
    return ap


def main() -> None:
    a = parser().parse()
    out_dir = Path(a.out_dir).resolve()  # `ordo tpcc run` runs in ROOT
    out_dir.mkdir(parents=True, exist_ok=True)
    summary_path = out_dir / "tpcc_run.json"
    suffix = "svg" if a.format == "flamegraph" else "txt"
    with tempfile.TemporaryDirectory(prefix="ordo-profile-") as tmp:
        data_dir = Path(tmp) / "data"
        run = subprocess.Popen(
            [
                str(VENV_BIN / "ordo"),
                "tpcc",
                "run",
                "--warehouses",
                str(a.warehouses),
                "--partitions",
                str(a.partitions),
                "--replicas",
                str(a.replicas),
                "--duration",
                str(a.duration),
                "--warmup",
                str(a.warmup),
                "--data-dir",
                str(data_dir),
                "--quiet",
                "--out",
                str(summary_path),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        wanted = 1 + a.replicas * a.partitions
        deadline = time.monotonic() + FIND_PROCESSES_S
        pids = role_pids(data_dir)
        while len(pids) < wanted:
            if time.monotonic() > deadline or run.poll() is not None:
                run.kill()
                raise SystemExit(f"found only {sorted(pids)} of {wanted} cluster processes")
            time.sleep(0.2)
            pids = role_pids(data_dir)
        pids["driver"] = run.pid
        # The driver loads nothing: the window starts warmup_s after the cluster answers.
        # Wait for the warm-up (plus the cluster's start) by watching the driver's output.
        time.sleep(a.warmup + 2.0)
        spies = {
            role: subprocess.Popen(
                [
                    str(VENV_BIN / "py-spy"),
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(max(1, int(a.duration) - 2)),
                    "--rate",
                    str(a.rate),
                    "--nonblocking",
                    "--format",
                    a.format,
                    "--output",
                    str(out_dir / f"{role}.{suffix}"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for role, pid in sorted(pids.items())
        }
        failed = []
        for role, spy in spies.items():
            _, err = spy.communicate()
            if spy.returncode != 0:
                failed.append(f"{role}: {err.strip().splitlines()[-1] if err.strip() else '?'}")
        if run.wait() != 0:
            raise SystemExit(f"ordo tpcc run exited {run.returncode}")
    s = json.loads(summary_path.read_text())["summary"]
    print(f"New Order/s {s['new_order_per_s']:,.0f}; CPU per sequenced txn (us):")
    for role, us in sorted(s["cpu_us_per_sequenced_txn"].items()):
        print(f"  {role:10s} {us:7.1f}   profile: {out_dir / (role + '.' + suffix)}")
    print(f"summary: {summary_path}")
    wrote(out_dir)
    if failed:
        raise SystemExit("py-spy failed for " + "; ".join(failed))


if __name__ == "__main__":
    main()
