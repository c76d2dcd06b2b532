"""Benchmark: a dataflow step whose state lives on another partition than its streams,
writing a sink that keeps R batches (issue 44; txn_library/workloads/retention_bench.py).

For each R of ``--retention`` (default 50 and 200,000): a fresh ``--replicas`` x
``--partitions`` embedded cluster (default 2 x 2; durable log on, no periodic
checkpoints) loading txn_library.workloads.retention_bench. The load generator
(cluster/loadgen.py, one connection, so pushes keep their order) pushes batches of
``--per-batch`` tuples to ``rb<R>_in`` with increasing ids: ``--window`` terminals in a
closed loop, or ``--rate`` batches/s in an open loop; ``--warmup`` then ``--seconds``.
Meanwhile a thread reads ``dataflow.status`` every ``--status-ms``: a batch's step is
done when the step's last processed batch reaches it.

Prints, per R: acknowledged pushes/s and their p50/p99 latency, steps done per second
and their p50 latency (from the push's send; the status read itself waits behind the
transactions sequenced before it, so this is an upper bound), over the window and per
``--slice-s`` slice of it. A step whose cost grows with what the sink holds shows as figures falling
from slice to slice at a large R and not at a small one.

Writes JSON to ``--out`` (default: stream_retention.json in the scratch directory,
scripts/bench_outputs.py); ``--publish`` writes results/streaming/stream_retention.json.

    .venv/bin/python scripts/bench_stream_retention.py --retention 50,200000 --seconds 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_outputs import BenchParser, wrote  # noqa: E402
from leaderboard_cluster import Cpu, Target, embedded  # noqa: E402

from cluster.load_shapes import Call, CallLike, ClosedLoop, Load, OpenLoop  # noqa: E402
from cluster.loadgen import LoadGenerator  # noqa: E402
from cluster.measure import latency_percentiles_ms  # noqa: E402
from txn_library import native  # noqa: E402
from txn_library.errors import OK, OrdoError  # noqa: E402
from txn_library.streams import PUSH  # noqa: E402
from txn_library.workloads.retention_bench import RETENTIONS, names  # noqa: E402

MODULES = ("txn_library.workloads.builtin", "txn_library.workloads.retention_bench")
DRAIN_S = 30.0


@dataclass
class Pushes:
    """Batches pushed to one flow and when each was sent, acknowledged and processed
    by the step (time.perf_counter seconds)."""

    retention: int
    per_batch: int
    next_batch: int = 1
    sent: dict[int, float] = field(default_factory=dict)
    acked: dict[int, float] = field(default_factory=dict)
    stepped: dict[int, float] = field(default_factory=dict)
    not_ok: int = 0

    def source(self, _terminal: int) -> CallLike:
        b = self.next_batch
        self.next_batch += 1
        _, border, _ = names(self.retention)
        return Call(PUSH, (border, b, [(b,)] * self.per_batch), "push")

    def on_answer(
        self, _t: int, call: CallLike, status: Any, _value: Any, sent: float, answered: float
    ) -> None:
        b = call.args[1]
        self.sent[b] = sent
        if status == OK:
            self.acked[b] = answered
        else:
            self.not_ok += 1


@contextmanager
def progress_of(t: Target, pushes: Pushes, every_s: float) -> Iterator[None]:
    """While the block runs, note when the step's last processed batch passes each id."""
    stop = threading.Event()
    flow, _, _ = names(pushes.retention)

    def follow() -> None:
        done = 0
        with t.client(timeout_s=30.0) as c:
            while not stop.is_set():
                try:
                    r = c.call("dataflow.status", flow)
                except OrdoError:
                    continue
                now = time.perf_counter()
                last = r.value.get("last_processed") if r.ok else None
                if last is not None and last > done:
                    for b in range(done + 1, last + 1):
                        pushes.stepped[b] = now
                    done = last
                stop.wait(every_s)

    th = threading.Thread(target=follow, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(timeout=30.0)


def figures(p: Pushes, w0: float, w1: float) -> dict[str, Any]:
    """Pushes acknowledged and steps done inside [w0, w1), per second, and the latency
    of those sent inside it."""
    span = max(w1 - w0, 1e-9)
    sent = [b for b, s in p.sent.items() if w0 <= s < w1]
    return {
        "pushes_per_s": round(sum(1 for a in p.acked.values() if w0 <= a < w1) / span, 1),
        "push_latency_ms": latency_percentiles_ms(
            [p.acked[b] - p.sent[b] for b in sent if b in p.acked], (0.5, 0.99)
        ),
        "steps_per_s": round(sum(1 for d in p.stepped.values() if w0 <= d < w1) / span, 1),
        "step_latency_ms": latency_percentiles_ms(
            [p.stepped[b] - p.sent[b] for b in sent if b in p.stepped], (0.5, 0.99)
        ),
    }


def load_of(a: argparse.Namespace) -> Load:
    if a.rate:
        return OpenLoop(rate_per_s=a.rate, in_flight_max=a.window)
    return ClosedLoop(terminals=a.window)


def one(retention: int, a: argparse.Namespace) -> dict[str, Any]:
    p = Pushes(retention, a.per_batch)
    with embedded(replicas=a.replicas, partitions=a.partitions, modules=MODULES) as t:
        cpu = Cpu(t.pids()).start()
        with (
            progress_of(t, p, a.status_ms / 1000.0),
            LoadGenerator(t.address, p.source, load_of(a)) as gen,
        ):
            w = gen.run(
                warmup_s=a.warmup, duration_s=a.seconds, drain_s=DRAIN_S, on_answer=p.on_answer
            )
            time.sleep(1.0)  # the last steps' progress
        used = cpu.stop()
    w0, w1 = w.started_at, w.ended_at
    row: dict[str, Any] = {"retention": retention, "batches": len(p.sent), "not_ok": p.not_ok}
    row.update(figures(p, w0, w1))
    row["slices"] = []
    s = w0
    while s + a.slice_s <= w1 + 0.05:  # whole slices (the window ends a turn late)
        row["slices"].append({"from_s": round(s - w0, 1), **figures(p, s, s + a.slice_s)})
        s += a.slice_s
    row["cpu"] = used
    say(f"R={retention:,}", row)
    for sl in row["slices"]:
        say(f"  {sl['from_s']:>4.0f} s", sl)
    return row


def say(what: str, f: dict[str, Any]) -> None:
    print(
        f"{what:<12} pushes {f['pushes_per_s']:>7,.1f}/s p50 {f['push_latency_ms']['p50']} ms "
        f"p99 {f['push_latency_ms']['p99']} ms | steps {f['steps_per_s']:>7,.1f}/s "
        f"p50 {f['step_latency_ms']['p50']} ms p99 {f['step_latency_ms']['p99']} ms",
        flush=True,
    )


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--retention", default="50,200000", help=f"sinks' R, of {RETENTIONS}")
    ap.add_argument("--seconds", type=float, default=40.0, help="measured window of each run")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--slice-s", type=float, default=10.0, help="slices of the window")
    ap.add_argument("--window", type=int, default=32, help="pushes in flight at most")
    ap.add_argument("--rate", type=float, default=0.0, help="batches/s (0: closed loop)")
    ap.add_argument("--per-batch", type=int, default=1, help="tuples per batch")
    ap.add_argument("--status-ms", type=float, default=20.0, help="dataflow.status period")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.output("--out", "results/streaming/stream_retention.json", "JSON")
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser()
    a = ap.parse(argv)
    a.retentions = [int(x) for x in a.retention.split(",")]
    unknown = sorted(set(a.retentions) - set(RETENTIONS))
    if unknown:
        ap.error(
            f"no flow keeps {unknown}: txn_library/workloads/retention_bench.py has {RETENTIONS}"
        )
    if a.partitions < 2:
        ap.error("--partitions >= 2: the step's state must live on another partition")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    out = a.out
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "engine": native.describe(),
        "cluster": {"replicas": a.replicas, "partitions": a.partitions, "epoch_ms": 10},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg())},
        "runs": [one(r, a) for r in a.retentions],
    }
    result["machine"]["loadavg_after"] = list(os.getloadavg())
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    wrote(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
