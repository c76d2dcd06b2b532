#!/usr/bin/env python3
"""TPC-C New Order throughput of two trees, side by side in one session.

This machine is noisy: a number measured an hour ago says little about today's. So
this runs the same command on a base revision (checked out in a temporary git
worktree) and on the work tree, alternating, ``--runs`` times each, and prints both
and their ratio. Both trees use this project's venv; each run's JSON (``ordo tpcc run
--out``), compare.json and compare.png go to --out-dir (default: the scratch directory,
scripts/bench_outputs.py; ``--publish``: results/compare/).

    .venv/bin/python scripts/bench_compare.py --base 4708671 --runs 2

The command is ``python -m cluster.cli tpcc run --warehouses 2 --partitions 2
--replicas 1 --duration D --quiet --out FILE`` in each tree (``--args`` replaces the
part after ``tpcc run``).

The base tree's hot modules are compiled too when it has scripts/build_native.py, so
both trees run as users run them. ``--base pure`` compares the work tree with itself
run from source (ORDO_PURE=1): what compiling pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_outputs import BenchParser, wrote

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARGS = "--warehouses 2 --partitions 2 --replicas 1 --duration 20"


def run_once(tree: Path, args: list[str], out: Path, pure: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), ORDO_PURE="1" if pure else "0")
    cmd = [sys.executable, "-m", "cluster.cli", "tpcc", "run", *args, "--quiet", "--out", str(out)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def new_orders_per_s(run: dict) -> float:
    """New Order transactions per second of the measured window."""
    return float(run["summary"]["new_order_per_s"])


def new_order_latency_ms(run: dict) -> dict[str, float]:
    """New Order's p50 / p95 / p99 latency (ms) in the measured window."""
    return dict(run["summary"]["per_type"]["new_order"]["latency_ms"])


def cpu_us_per_txn(run: dict) -> float:
    """CPU of every process (sequencer, partitions, driver) per sequenced txn."""
    return float(sum(run["summary"]["cpu_us_per_sequenced_txn"].values()))


def plot(rates: dict[str, list[float]], rev: str, path: Path) -> None:
    """Each run's New Order/s, base and work tree side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    runs = range(1, len(rates["base"]) + 1)
    ax.bar([r - 0.2 for r in runs], rates["base"], width=0.4, label=f"base {rev}")
    ax.bar([r + 0.2 for r in runs], rates["work"], width=0.4, label="work tree")
    ax.set_xlabel("run (alternating)")
    ax.set_ylabel("New Order/s")
    ax.set_xticks(list(runs))
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision to compare against, or 'pure'")
    ap.add_argument("--runs", type=int, default=2, help="runs per tree, alternating")
    ap.add_argument("--args", default=DEFAULT_ARGS, help="arguments after 'tpcc run'")
    ap.add_argument(
        "--work-args",
        default="",
        help="extra arguments for the work tree's runs only (e.g. '--readers 1': New Order "
        "with a reader against the base without)",
    )
    ap.output("--out-dir", "results/compare", "each run's JSON, compare.json and .png")
    return ap


def main() -> None:
    a = parser().parse()
    out_dir = Path(a.out_dir).resolve()  # the runs' cwd is their tree
    out_dir.mkdir(parents=True, exist_ok=True)
    args = a.args.split()
    pure = a.base == "pure"
    rev = "pure" if pure else subprocess.run(
        ["git", "rev-parse", "--short", a.base],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ordo-base-") as tmp:
        base = ROOT if pure else Path(tmp) / "tree"
        if not pure:
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(base), rev],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            if (base / "scripts" / "build_native.py").exists():
                subprocess.run([sys.executable, "scripts/build_native.py"], cwd=base, check=True)
        try:
            rates: dict[str, list[float]] = {"base": [], "work": []}
            cpu: dict[str, list[float]] = {"base": [], "work": []}
            latency: dict[str, list[dict[str, float]]] = {"base": [], "work": []}
            lags: list[dict] = []  # the work tree's readers, with --work-args --readers N
            for i in range(a.runs):
                for name, tree in (("base", base), ("work", ROOT)):
                    run_pure = pure and name == "base"
                    mine = args + (a.work_args.split() if name == "work" else [])
                    run = run_once(tree, mine, out_dir / f"{name}-{i + 1}.json", run_pure)
                    rates[name].append(new_orders_per_s(run))
                    cpu[name].append(cpu_us_per_txn(run))
                    latency[name].append(new_order_latency_ms(run))
                    lat = latency[name][-1]
                    lag = run["summary"].get("reader_lag_epochs")
                    if lag:
                        lags.append(lag)
                    print(
                        f"run {i + 1} {name:4s} ({rev if name == 'base' else 'work tree'}): "
                        f"{rates[name][-1]:,.0f} New Order/s, "
                        f"{cpu[name][-1]:.0f} us CPU per txn (all processes), "
                        f"p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms; "
                        f"{run['cluster'].get('engine', 'pure Python')}",
                        flush=True,
                    )
        finally:
            if not pure:
                subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    mean = {k: round(statistics.fmean(v), 1) for k, v in rates.items()}
    cpu = {k: [round(x, 1) for x in v] for k, v in cpu.items()}
    ratio = mean["work"] / mean["base"]
    result = {
        "base": rev,
        "args": a.args,
        "work_args": a.work_args,
        "reader_lag_epochs": lags,
        "new_order_per_s": rates,
        "cpu_us_per_txn": cpu,
        "new_order_latency_ms": latency,
        "mean": mean,
        "ratio": round(ratio, 4),
    }
    (out_dir / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rates, rev, out_dir / "compare.png")
    p99 = {k: statistics.median(x["p99"] for x in v) for k, v in latency.items()}
    print(
        f"mean: base {mean['base']:,.0f}, work tree {mean['work']:,.0f} New Order/s; "
        f"work/base = {ratio:.3f}; median p99 base {p99['base']:.1f} ms, "
        f"work tree {p99['work']:.1f} ms"
        + (f"; readers' lag p99 {max(x.get('p99', 0) for x in lags)} epochs" if lags else "")
    )
    wrote(out_dir / "compare.json", out_dir / "compare.png")


if __name__ == "__main__":
    main()
