#!/usr/bin/env python3
"""Where the CPU goes in a saturated Leaderboard run: each process sampled, its costs
per input batch.

Starts an embedded cluster (scripts/leaderboard_cluster.py: 1 x 1, durable log, as
scripts/leaderboard.py runs it), pushes the ``--variant`` dataflow closed loop
(``--window`` pushes in flight, a subscriber following the sink: the dataflow way of
scripts/leaderboard.py) and, once ``--warmup`` is over, samples the sequencer, the
partition and this process (the client: pusher, subscriber and their I/O threads) with
py-spy for ``--seconds`` (``--native``: with C frames, so the mypyc-compiled
modules' functions show by name instead of inside the Python frame that called them;
py-spy pauses a process to read them, so the run slows more).
Writes per role the collapsed stacks (``<role>.txt``) and, with ``--flamegraph``, an
SVG, plus ``summary.json`` (batches/s, CPU per batch per role, the top functions per
role by inclusive and by own samples, in microseconds of that role's CPU per batch)
into ``--out-dir`` (default: the scratch directory, scripts/bench_outputs.py;
``--publish``: results/profile/leaderboard/); prints the table.

    .venv/bin/python scripts/profile_leaderboard.py --seconds 15

A function's microseconds per batch are its share of the role's samples times the
role's CPU seconds in the window over the batches done in it: py-spy samples threads
that are running (not idle), so shares are of CPU. Sampling costs the processes a
little CPU (``--rate``): read shares, not the run's throughput.

Invariants: the cluster is stopped and every py-spy ended however the run ends; the
window that is sampled is the window whose batches and CPU are counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_outputs import BenchParser, wrote  # noqa: E402
from leaderboard_cluster import (  # noqa: E402
    Cpu,
    embedded,
    leaderboard_flow,
    prepare,
    source_for,
)
from leaderboard_load import pipelined  # noqa: E402

from txn_library import native  # noqa: E402

VENV_BIN = Path(sys.executable).parent
SPY_GRACE_S = 30.0  # how long a py-spy may take to write its output after its duration
TOP = 15  # functions listed per role and kind
_LINE = re.compile(r" \((.*):\d+\)$")  # py-spy's "fn (file.py:123)": the line dropped


def frame_name(frame: str) -> str:
    """``fn (path/file.py:12)`` as ``fn (file.py)``: a function, whatever line sampled."""
    m = _LINE.search(frame)
    if m is None:
        return frame
    return f"{frame[: m.start()]} ({Path(m.group(1)).name})"


def collapsed_costs(text: str) -> tuple[int, Counter[str], Counter[str]]:
    """Samples in py-spy's collapsed stacks (``a;b;c N`` per line): the total, and per
    function the samples it is on the stack of (inclusive, once a stack) and the
    samples it is the innermost frame of (own)."""
    total = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [frame_name(f) for f in stack.split(";")]
        if frames and frames[0].startswith("process ") or frames[0].startswith("thread "):
            frames = frames[1:]  # py-spy's --threads / pid prefixes, if any
        if not frames:
            continue
        total += count
        for f in set(frames):
            inclusive[f] += count
        own[frames[-1]] += count
    return total, inclusive, own


def per_batch_us(samples: int, total: int, cpu_s: float, batches: int) -> float:
    """A function's microseconds of its role's CPU per batch: its share of the samples
    times the role's CPU seconds, over the batches."""
    if total <= 0 or batches <= 0:
        return 0.0
    return round(1e6 * cpu_s * samples / total / batches, 1)


def role_summary(text: str, cpu_s: float, batches: int, top: int = TOP) -> dict[str, Any]:
    total, inclusive, own = collapsed_costs(text)

    def table(c: Counter[str]) -> list[dict[str, Any]]:
        return [
            {
                "function": f,
                "share": round(n / total, 3),
                "us_per_batch": per_batch_us(n, total, cpu_s, batches),
            }
            for f, n in c.most_common(top)
        ]

    return {
        "samples": total,
        "cpu_s": cpu_s,
        "us_per_batch": per_batch_us(total, total, cpu_s, batches),
        "inclusive": table(inclusive),
        "own": table(own),
    }


def spy(
    pid: int, seconds: float, rate: int, out: Path, flamegraph: bool, native_frames: bool = False
) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(VENV_BIN / "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, int(seconds))),
            "--rate",
            str(rate),
            # py-spy reads native stacks only from a paused process
            *([] if native_frames else ["--nonblocking"]),
            "--format",
            "flamegraph" if flamegraph else "raw",
            "--output",
            str(out),
            *(["--native"] if native_frames else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", choices=("lb", "lbe", "lbn"), default="lb")
    ap.add_argument("--seconds", type=float, default=15.0, help="sampled (and measured) s")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--window", type=int, default=256, help="pushes in flight")
    ap.add_argument("--votes-per-batch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=TOP, help="functions listed per role")
    ap.add_argument("--flamegraph", action="store_true", help="also an SVG per role")
    ap.add_argument(
        "--native",
        action="store_true",
        help="native frames too (py-spy --native): the compiled modules' functions",
    )
    ap.output("--out-dir", "results/profile/leaderboard", "stacks and summary.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse(argv)
    out_dir = Path(a.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    flow = leaderboard_flow(a.variant)
    with embedded(replicas=1, partitions=1) as t:
        first = prepare(t, flow)
        source = source_for(flow, a.seed, a.votes_per_batch)
        pids = {**t.pids(), "client": os.getpid()}
        roles = {"sequencer": pids["sequencer"], "partition": pids["r0p0"], "client": os.getpid()}
        box: dict[str, Any] = {}

        def load() -> None:
            box["run"] = pipelined(
                t.address,
                flow,
                source,
                first,
                warmup_s=a.warmup,
                seconds=a.seconds,
                in_flight=a.window,
            )

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(a.warmup)
        cpu = Cpu(t.pids()).start()
        spies = {
            role: spy(pid, a.seconds, a.rate, out_dir / f"{role}.txt", False, a.native)
            for role, pid in roles.items()
        }
        time.sleep(a.seconds)
        used = cpu.stop()["cpu_s"]
        graphs = {}
        if a.flamegraph:  # a second, shorter sample as SVG: the table is from the first
            graphs = {
                role: spy(pid, 3, a.rate, out_dir / f"{role}.svg", True)
                for role, pid in roles.items()
            }
        failed = []
        for role, p in [*spies.items(), *graphs.items()]:
            try:
                _, err = p.communicate(timeout=SPY_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            if p.returncode != 0:
                failed.append(f"{role}: {err.strip().splitlines()[-1] if err.strip() else '?'}")
        loader.join()
    run = box["run"]
    row = run.summary()
    batches = sum(1 for x in run.done.values() if run.window[0] <= x < run.window[1])
    cpu_by_role = {
        "sequencer": used.get("sequencer", 0.0),
        "partition": used.get("r0p0", 0.0),
        "client": used.get("client", 0.0),
    }
    summary: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "engine": native.describe(),
        "variant": a.variant,
        "batches_per_s": row["batches_per_s"],
        "batches": batches,
        "latency_ms": row["latency_ms"],
        "ack_latency_ms": row.get("ack_latency_ms"),
        "cpu_s": cpu_by_role,
        "loadavg": list(os.getloadavg()),
        "roles": {},
    }
    for role in roles:
        path = out_dir / f"{role}.txt"
        text = path.read_text() if path.exists() else ""
        summary["roles"][role] = role_summary(text, cpu_by_role[role], batches, a.top)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary)
    wrote(out_dir)
    if failed:
        print("py-spy failed for " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


def print_summary(s: dict[str, Any]) -> None:
    print(
        f"{s['variant']}: {s['batches_per_s']:,.0f} batches/s, p50/p99 push-to-sink "
        f"{s['latency_ms']['p50']}/{s['latency_ms']['p99']} ms ({s['engine']})"
    )
    for role, r in s["roles"].items():
        print(f"\n{role}: {r['cpu_s']} CPU-s, {r['us_per_batch']} us per batch")
        for kind in ("inclusive", "own"):
            print(f"  {kind}:")
            for e in r[kind]:
                print(f"    {e['us_per_batch']:>8.1f} us {e['share']:>6.1%}  {e['function']}")


if __name__ == "__main__":
    sys.exit(main())
