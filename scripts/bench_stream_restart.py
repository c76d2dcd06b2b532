"""Benchmark: how long a partition takes to be live again after kill -9 and a restart,
under streaming load (issue 44).

A fresh ``--replicas`` x ``--partitions`` embedded cluster (default 2 x 2, durable log
on) loading txn_library.workloads.retention_bench, checkpointing every ``--checkpoint-every-s``
seconds (0: never, the default of ``ordo up``). The load generator pushes batches to
``rb<R>_in`` (``--retention``, default 50) at ``--rate`` batches/s (default 700, an open
loop); each push derives a step that is a multi-partition transaction (streams on
partition 0, state on partition 1). After ``--kill-at-s`` seconds ``--kill`` (default
r0p1: the state's partition, a few rows) is killed with SIGKILL, restarted
``--down-s`` later; the load goes on until ``--after-s`` after it is live again.

Measured from the restart: when the new process first reports (``reporting_s``), and
when it is live again (``live_s``: its status says it is no longer catching up, at or
past the epoch the sequencer had reached at the restart), with what the partition
logged meanwhile (its checkpoint load, the epochs and transactions it replayed, its
own figure for the catch-up counted from its start) and the pushes acknowledged per
second around it. ``--repeat`` restarts the same partition that many times, each
``--after-s`` after the previous one was live.

Writes JSON to ``--out`` (default: stream_restart.json in the scratch directory,
scripts/bench_outputs.py); ``--publish`` writes results/recovery/stream_restart.json.

    .venv/bin/python scripts/bench_stream_restart.py --rate 700 --checkpoint-every-s 0
    .venv/bin/python scripts/bench_stream_restart.py --rate 700 --checkpoint-every-s 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_outputs import BenchParser, wrote  # noqa: E402
from bench_stream_retention import MODULES, Pushes, figures  # noqa: E402

from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import (  # noqa: E402
    LocalCluster,
    cluster_client,
    free_base_port,
    partition_status,
)
from cluster.load_background import Background  # noqa: E402
from cluster.load_shapes import OpenLoop  # noqa: E402
from cluster.loadgen import LoadGenerator  # noqa: E402
from txn_library import native  # noqa: E402
from txn_library.errors import OrdoError  # noqa: E402
from txn_library.procedure import load_modules  # noqa: E402
from txn_library.workloads.retention_bench import RETENTIONS  # noqa: E402

LIVE_WAIT_S = 120.0
POLL_S = 0.01
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
LOADED = re.compile(r"loaded checkpoint \S+ \(epoch (\d+).* in ([0-9.]+)s")
LIVE = re.compile(r"live: caught up from epoch (\d+) to (\d+) in ([0-9.]+)s \((\d+) txns")


@dataclass
class Restart:
    """One kill and restart, times in time.perf_counter seconds (``*_wall``: time.time)."""

    name: str
    killed_at: float = 0.0
    restarted_at: float = 0.0
    restarted_wall: float = 0.0
    epoch_at_restart: int = 0
    old_pid: int = 0
    reporting_at: float | None = None
    live_at: float | None = None
    live_status: dict[str, Any] = field(default_factory=dict)


class Restarter:
    """Kills and restarts one partition, and waits until it is live again (its status
    from the sequencer: another pid, no longer catching up, at or past the epoch the
    sequencer had reached at the restart), noting when it first reports on the way."""

    def __init__(self, lc: LocalCluster, cfg: ClusterConfig, name: str) -> None:
        self.lc, self.cfg, self.name = lc, cfg, name
        m = re.fullmatch(r"r(\d+)p(\d+)", name)
        if m is None:
            raise SystemExit(f"--kill {name!r}: a partition is named r<replica>p<partition>")
        self.replica, self.partition = int(m[1]), int(m[2])

    def once(self, down_s: float) -> Restart:
        r = Restart(self.name)
        with cluster_client(self.cfg, timeout_s=10.0) as c:
            p = partition_status(c, self.replica, self.partition)
            r.old_pid = p["pid"] if p else 0
            self.lc.kill(self.name)
            r.killed_at = time.perf_counter()
            time.sleep(down_s)
            r.epoch_at_restart = int(c.status()["epoch"])
            r.restarted_wall = time.time()
            r.restarted_at = time.perf_counter()
            self.lc.start_partition(self.replica, self.partition)
            self._wait_live(c, r)
        return r

    def _wait_live(self, c: Any, r: Restart) -> None:
        deadline = time.perf_counter() + LIVE_WAIT_S
        while time.perf_counter() < deadline:
            try:
                p = partition_status(c, self.replica, self.partition)
            except OrdoError:
                p = None
            now = time.perf_counter()
            if p is not None and p["pid"] != r.old_pid:
                if r.reporting_at is None:
                    r.reporting_at = now
                if not p["catching_up"] and p["last_epoch"] >= r.epoch_at_restart:
                    r.live_at = now
                    r.live_status = dict(p)
                    return
            time.sleep(POLL_S)


def logged(path: Path, since_wall: float) -> dict[str, Any]:
    """What the restarted partition logged after ``since_wall``: its checkpoint load,
    the catch-up it reports, and when each came (seconds after ``since_wall``)."""
    out: dict[str, Any] = {}
    for line in path.read_text(errors="replace").splitlines():
        m = LOG_TIME.match(line)
        if m is None:
            continue
        at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - since_wall
        if at < -0.5:
            continue
        if " up" in line and "up_s" not in out and "partition r" in line:
            out["up_s"] = round(at, 2)
        if (c := LOADED.search(line)) is not None and "checkpoint_epoch" not in out:
            out["checkpoint_epoch"], out["checkpoint_load_s"] = int(c[1]), float(c[2])
            out["checkpoint_loaded_s"] = round(at, 2)
        if (v := LIVE.search(line)) is not None and "live_logged_s" not in out:
            out["replayed_epochs"] = int(v[2]) - int(v[1])
            out["catch_up_s"] = float(v[3])  # the partition's figure, from its start
            out["txns_applied"] = int(v[4])  # since genesis: the checkpoint's count too
            out["live_logged_s"] = round(at, 2)
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="ordo-stream-restart-")
    cfg = ClusterConfig(
        replicas=a.replicas,
        partitions=a.partitions,
        base_port=free_base_port(),
        data_dir=str(Path(tmp) / "data"),
        procedure_modules=MODULES,
        checkpoint_every_s=a.checkpoint_every_s,
    )
    load_modules(cfg.procedure_modules)
    pushes = Pushes(a.retention, 1)
    done: list[Restart] = []
    try:
        with LocalCluster(cfg) as lc:
            rs = Restarter(lc, cfg, a.kill)
            load = OpenLoop(rate_per_s=a.rate, in_flight_max=a.window)
            bg = Background(lambda src: LoadGenerator(cfg.client_addr, src, load), pushes.source)
            bg.start(duration_s=None, drain_s=30.0, on_answer=pushes.on_answer)
            started = time.perf_counter()
            try:
                time.sleep(a.kill_at_s)
                for _ in range(a.repeat):
                    done.append(rs.once(a.down_s))
                    time.sleep(a.after_s)
            finally:
                ended = time.perf_counter()
                bg.stop(timeout_s=60.0)
            log_path = lc.log_files[a.kill]
            restarts = [one(r, log_path, pushes) for r in done]
    finally:
        if a.keep_data:
            print(f"data kept in {cfg.data_dir}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"load": figures(pushes, started, ended), "restarts": restarts}


def one(r: Restart, log_path: Path, pushes: Pushes) -> dict[str, Any]:
    def since(t: float | None) -> float | None:
        return None if t is None else round(t - r.restarted_at, 2)

    row: dict[str, Any] = {
        "partition": r.name,
        "epoch_at_restart": r.epoch_at_restart,
        "reporting_s": since(r.reporting_at),
        "live_s": since(r.live_at),
        "live_at_epoch": r.live_status.get("last_epoch"),
        "logged": logged(log_path, r.restarted_wall),
    }
    t0 = r.killed_at
    row["pushes_around"] = {
        "before_kill": figures(pushes, t0 - 5.0, t0)["pushes_per_s"],
        "down_and_recovering": figures(pushes, t0, r.live_at or t0 + 5.0)["pushes_per_s"],
    }
    live = "not live" if r.live_at is None else f"live again {row['live_s']} s"
    lg = row["logged"]
    print(
        f"{r.name}: restarted at epoch {r.epoch_at_restart}; reporting {row['reporting_s']} s, "
        f"{live} after the restart; logged: up {lg.get('up_s')} s, checkpoint "
        f"{lg.get('checkpoint_epoch')} loaded in {lg.get('checkpoint_load_s')} s, "
        f"{lg.get('replayed_epochs')} epochs replayed ({lg.get('txns_applied')} txns in all), "
        f"live {lg.get('live_logged_s')} s (its own figure {lg.get('catch_up_s')} s)",
        flush=True,
    )
    return row


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=700.0, help="pushes/s (open loop)")
    ap.add_argument("--window", type=int, default=512, help="pushes in flight at most")
    ap.add_argument("--retention", type=int, default=50, help=f"the sink's R, of {RETENTIONS}")
    ap.add_argument("--checkpoint-every-s", type=float, default=0.0, help="0: never")
    ap.add_argument("--kill", default="r0p1", help="the partition killed and restarted")
    ap.add_argument("--kill-at-s", type=float, default=20.0, help="load before the kill")
    ap.add_argument("--down-s", type=float, default=1.0)
    ap.add_argument("--after-s", type=float, default=10.0, help="load after live again")
    ap.add_argument("--repeat", type=int, default=1, help="kills of the same partition")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--keep-data", action="store_true")
    ap.output("--out", "results/recovery/stream_restart.json", "JSON")
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser()
    a = ap.parse(argv)
    if a.retention not in RETENTIONS:
        ap.error(
            f"no flow keeps {a.retention}: "
            f"txn_library/workloads/retention_bench.py has {RETENTIONS}"
        )
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    out = a.out
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "engine": native.describe(),
        "cluster": {
            "replicas": a.replicas,
            "partitions": a.partitions,
            "epoch_ms": 10,
            "checkpoint_every_s": a.checkpoint_every_s,
        },
        "options": vars(a),
        "machine": {"cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg())},
    }
    result.update(run(a))
    result["machine"]["loadavg_after"] = list(os.getloadavg())
    ld = result["load"]
    print(
        f"load: {ld['pushes_per_s']:,.1f} pushes/s acknowledged, p50 "
        f"{ld['push_latency_ms']['p50']} ms p99 {ld['push_latency_ms']['p99']} ms",
        flush=True,
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    wrote(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
