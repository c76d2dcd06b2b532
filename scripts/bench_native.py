"""What compiling the hot modules pays: one TPC-C log replayed compiled and pure.

A replay in one process runs the partitions' whole hot path (procedure bodies,
context, storage, lock manager) with no sockets and no other process, so it measures
the engine code that mypyc compiles (txn_library/native.py). On this shared host CPU
seconds vary by 20-30% from run to run, so with valgrind installed the replay is also
run under callgrind, counting the instructions of the replay alone (the genesis load
is not counted): the same number every time for the same log and build.

    .venv/bin/python scripts/bench_native.py                    # a 1.5 s New Order log
    .venv/bin/python scripts/bench_native.py --data-dir D       # D: a kept TPC-C cluster

Writes bench_native.json to the scratch directory (scripts/bench_outputs.py), or with
``--publish`` to results/native/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_outputs import BenchParser, wrote  # noqa: E402


def worker(data_dir: str, counted: bool) -> None:
    """Replay the whole log of ``data_dir`` from genesis; print one JSON line."""
    from cluster.config import ClusterConfig
    from cluster.replay_cli import replay_spec
    from executor.replay.reconstruct import GENESIS, Replayer, load_boundary
    from executor.replay.spec import log_last_epoch
    from txn_library import native

    cfg = ClusterConfig.load(data_dir)
    spec = replay_spec(cfg, cfg.log_dir)
    spec.prepare()
    replica = load_boundary(spec, GENESIS)
    replayer = Replayer(replica, spec.partitions)
    control = ["callgrind_control", "-i"]
    if counted:
        subprocess.run([*control, "on", str(os.getpid())], check=True, capture_output=True)
    t0 = time.process_time()
    stats = replayer.run(spec.log_dir, log_last_epoch(spec.log_dir))
    cpu_s = time.process_time() - t0
    if counted:
        subprocess.run([*control, "off", str(os.getpid())], check=True, capture_output=True)
    out = {
        "engine": native.describe(),
        "cpu_s": round(cpu_s, 3),
        "txns": stats.txns,
        "state_hash": f"{replica.state_hash:016x}",
    }
    print(json.dumps(out), flush=True)


def run(data_dir: Path, pure: bool, counted: bool) -> dict:
    env = dict(os.environ, ORDO_PURE="1" if pure else "0")
    cmd = [sys.executable, str(Path(__file__)), "--worker", str(data_dir)]
    with tempfile.TemporaryDirectory(prefix="ordo-cg-") as tmp:
        if counted:
            out_file = Path(tmp) / "callgrind.out"
            cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={out_file}", *cmd, "--counted"]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if counted:
            found = re.search(r"Collected : (\d+)", proc.stderr)
            assert found, proc.stderr[-2000:]
            result["instructions"] = int(found.group(1))
    return result


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data-dir", help="a kept TPC-C cluster directory (default: make one)")
    ap.add_argument("--seconds", type=float, default=1.5, help="of New Order, when making one")
    ap.add_argument("--runs", type=int, default=3, help="timed replays per engine, alternating")
    ap.output("--out", "results/native/bench_native.json", "JSON")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--counted", action="store_true", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    a = parser().parse()
    if a.worker:
        worker(a.worker, a.counted)
        return
    with tempfile.TemporaryDirectory(prefix="ordo-native-") as tmp:
        data = Path(a.data_dir) if a.data_dir else Path(tmp) / "data"
        if not a.data_dir:
            subprocess.run(
                [sys.executable, "-m", "cluster.cli", "tpcc", "run", "--duration", str(a.seconds),
                 "--warmup", "0.5", "--data-dir", str(data), "--no-check", "--quiet",
                 "--out", str(Path(tmp) / "run.json")],
                cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        timed: dict[str, list[dict]] = {"pure": [], "compiled": []}
        for i in range(a.runs):
            for name in ("pure", "compiled"):
                r = run(data, name == "pure", counted=False)
                timed[name].append(r)
                print(f"run {i + 1} {name:8s}: {r['cpu_s']:.2f} s CPU, {r['txns']} txns")
        counts = {}
        if shutil.which("valgrind") and shutil.which("callgrind_control"):
            for name in ("pure", "compiled"):
                counts[name] = run(data, name == "pure", counted=True)
                print(f"callgrind {name:8s}: {counts[name]['instructions']:,} instructions")
    hashes = {r["state_hash"] for rs in [*timed.values(), counts.values()] for r in rs}
    assert len(hashes) == 1, f"the engines disagree: {hashes}"
    best = {k: min(r["cpu_s"] for r in v) for k, v in timed.items()}
    result: dict = {"timed": timed, "best_cpu_s": best, "callgrind": counts}
    if counts:
        ratio = counts["compiled"]["instructions"] / counts["pure"]["instructions"]
        result["instructions_compiled_over_pure"] = round(ratio, 4)
        print(f"compiled / pure: {ratio:.3f} of the instructions")
    print(f"best CPU: pure {best['pure']:.2f} s, compiled {best['compiled']:.2f} s")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    wrote(a.out)


if __name__ == "__main__":
    main()
