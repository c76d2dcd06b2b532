"""Benchmark: partition recovery time against log length since the last checkpoint.

Bank (default): for each N (default 10k, 100k, 1M transfers, half multi-partition) on a
fresh 1 replica x 2 partition cluster with the durable log on: open accounts,
checkpoint, run N transfers, wait until idle, kill -9 partition 0, restart it, and time
until it is live again (loaded the checkpoint, replayed every later epoch from the log
service, with its peer resending the reads it needs). Also replays the same log
in-process (LocalReplica, no sockets) for the pure replay rate. Writes
bench_recovery.json and bench_recovery.png.

TPC-C (--workload tpcc): for each duration D (seconds of New-Order, W=2 on 1 replica
x 2 partitions, a checkpoint every --checkpoint-every epochs as live clusters take
them), drive the cluster for D s, wait until idle, kill -9 partition 0, restart it and
time until it is live again. The load of its newest checkpoint is reported twice:
as the restarted partition logged it (``partition_load_s``: a fresh process, its other
partition running, the load plus settling the heap), and measured in this process on
the same files afterwards (``checkpoint_load_s``: ``checkpoint.load_newest``, what the
restarted partition runs first, with the chain it loaded; the number earlier sessions
recorded). Writes bench_recovery_tpcc.json.

Both write to the scratch directory (scripts/bench_outputs.py), or with ``--publish`` to
results/recovery/ (``--out`` names another file). Uses only what the engine had before
incremental checkpoints too, so the same script measures an older tree (copy it into
that tree's scripts/).

    .venv/bin/python scripts/bench_recovery.py --sizes 10000,100000,1000000 --publish
    .venv/bin/python scripts/bench_recovery.py --workload tpcc --durations 10,30
    .venv/bin/python scripts/bench_recovery.py --load DIR/replica-0/checkpoints/FILE.ckpt

``--load FILE`` only times loading one checkpoint (with the chain it needs) in this
fresh process, as a restarted partition loads it first, and prints the time, its CPU
(user and system: a fresh process also pays for its pages) and the rows loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_outputs import BenchParser, output_path, wrote  # noqa: E402

from cluster.bank_load import run_transfers  # noqa: E402
from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import (  # noqa: E402
    LocalCluster,
    free_base_port,
    partition_status,
    wait_live_again,
    wait_quiescent,
)
from executor.core import checkpoint  # noqa: E402
from executor.deterministic.replica import LocalReplica  # noqa: E402
from sequencer.log import iter_frames  # noqa: E402
from txn_library.client import Client  # noqa: E402
from txn_library.wire import sequencer as wire  # noqa: E402
from txn_library.workloads.bank import make_transfers, open_accounts  # noqa: E402

ACCOUNTS = 10_000


def one(n: int, tmp: str) -> dict:
    cfg = ClusterConfig(replicas=1, partitions=2, base_port=free_base_port(), data_dir=tmp)
    with LocalCluster(cfg) as lc, Client(cfg.client_addr) as c:
        open_accounts(c, ACCOUNTS, 1_000_000)
        ck = c.control(wire.CheckpointRequest())
        while not all(p["newest_checkpoint_epoch"] >= ck for p in c.status()["partitions"]):
            time.sleep(0.1)
        t0 = time.perf_counter()
        done = 0
        while done < n:  # in chunks so the workload generator stays small
            chunk = min(200_000, n - done)
            run = run_transfers(
                cfg.client_addr, make_transfers(chunk, ACCOUNTS, 2, 0.5, done), 4, 1000
            )
            assert run.errors == 0, run.error_codes
            done += chunk
        live_s = time.perf_counter() - t0
        st = wait_quiescent(c, 1, 2, timeout_s=300)
        target = st["epoch"]
        before = {p["partition"]: p["state_hash"] for p in st["partitions"]}
        old_pid = partition_status(c, 0, 0)["pid"]  # type: ignore[index]
        lc.kill("r0p0")
        t1 = time.perf_counter()
        lc.start_partition(0, 0)
        wait_live_again(c, 0, 0, old_pid, target, timeout_s=600)
        recovery_s = time.perf_counter() - t1
        after = {p["partition"]: p["state_hash"] for p in wait_quiescent(c, 1, 2)["partitions"]}
        assert after == before, (before, after)
    # Pure in-process replay of the same log from the same checkpoint.
    storages, infos = [], []
    for part in (0, 1):
        info, s = checkpoint.load(cfg.checkpoint_dir(0) / checkpoint.checkpoint_name(ck, part))
        storages.append(s)
        infos.append(info)
    r = LocalReplica(2, storages)
    for p, info in zip(r.parts, infos, strict=True):
        p.restore(info.epoch, info.next_txn_id, info.txns_applied)
    t2 = time.perf_counter()
    for _e, data in iter_frames(cfg.log_dir, first_epoch=ck + 1):
        r.apply(wire.decode_batch(data))
    replay_s = time.perf_counter() - t2
    return {
        "txns_since_checkpoint": n,
        "epochs_since_checkpoint": target - ck,
        "live_txn_per_s": round(n / live_s),
        "recovery_s": round(recovery_s, 2),
        "recovery_txn_per_s": round(n / recovery_s),
        "inprocess_replay_s": round(replay_s, 2),
        "inprocess_replay_txn_per_s": round(n / replay_s),
    }


def one_tpcc(duration_s: float, checkpoint_every: int, tmp: str) -> dict:
    from tpcc import driver

    cfg = ClusterConfig(
        replicas=1,
        partitions=2,
        base_port=free_base_port(),
        data_dir=tmp,
        procedure_modules=driver.PROCEDURE_MODULES,
        genesis=driver.GENESIS,
        genesis_args={"warehouses": 2, "seed": 1, "load_ts_ms": 1_700_000_000_000},
        checkpoint_every_epochs=checkpoint_every,
        checkpoint_keep=3,
    )
    lc = driver.start_cluster(cfg, progress=False, log=print)
    try:
        opts = driver.RunOptions(
            mix="new-order",
            duration_s=duration_s,
            warmup_s=0.0,
            terminals=100,
            check=False,
            attach=tmp,
            out=None,
            progress=False,
        )
        result = driver.run(opts)
        with Client(cfg.client_addr) as c:
            st = wait_quiescent(c, 1, 2, timeout_s=300)
            target = st["epoch"]
            before = {p["partition"]: p["state_hash"] for p in st["partitions"]}
            p0 = partition_status(c, 0, 0)
            assert p0 is not None
            newest = p0["newest_checkpoint_epoch"]
            lc.kill("r0p0")
            t1 = time.perf_counter()
            lc.start_partition(0, 0)
            wait_live_again(c, 0, 0, p0["pid"], target, timeout_s=600)
            recovery_s = time.perf_counter() - t1
            after = {p["partition"]: p["state_hash"] for p in wait_quiescent(c, 1, 2)["partitions"]}
        assert after == before, (before, after)
        lc.check_alive()
    finally:
        lc.stop()
    t2 = time.perf_counter()
    found = checkpoint.load_newest(cfg.checkpoint_dir(0), 0, 2)
    load_s = time.perf_counter() - t2
    assert found is not None
    info, storage = found
    return {
        "duration_s": duration_s,
        "live_txn_per_s": result["summary"]["txn_per_s"],
        "epochs": target,
        "checkpoint_epoch": info.epoch,
        "newest_durable_before_kill": newest,
        "epochs_since_checkpoint": target - info.epoch,
        "checkpoint_rows": storage.row_count(),
        "checkpoint_files": getattr(info, "depth", 0) + 1,  # its chain: a base + deltas
        "checkpoint_load_s": round(load_s, 3),
        "partition_load_s": logged_load_s(lc.logs_dir / "replica-0-partition-0.log"),
        "recovery_s": round(recovery_s, 2),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def logged_load_s(log_file: Path) -> float | None:
    """The load time the last start of a partition logged (``loaded checkpoint ...``)."""
    found = re.findall(r"loaded checkpoint .* in ([0-9.]+)s", log_file.read_text(errors="replace"))
    return float(found[-1]) if found else None


def time_load(path: Path) -> None:
    """Load one checkpoint (and the files of its chain) in this process and print what
    it took: the load a restarted partition runs first, without a cluster around it."""
    import resource

    import tpcc.schema  # noqa: F401  (registers the TPC-C tables, should the file hold them)
    from txn_library import native

    checkpoint.read_info(path)  # the header alone, so that the file is in the page cache
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    _info, storage = checkpoint.load(path)
    load_s = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"{native.describe()}: load {load_s:.3f} s (user {r1.ru_utime - r0.ru_utime:.3f} s, "
        f"system {r1.ru_stime - r0.ru_stime:.3f} s), {storage.row_count():,} rows"
    )


def main_tpcc(a: argparse.Namespace) -> None:
    rows = []
    for d in [float(x) for x in a.durations.split(",")]:
        with tempfile.TemporaryDirectory(prefix="ordo-rec-tpcc-") as tmp:
            row = one_tpcc(d, a.checkpoint_every, tmp)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(a.out)
    if out == output_path("results/recovery/bench_recovery.json", a.publish):  # the default
        out = output_path("results/recovery/bench_recovery_tpcc.json", a.publish)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, indent=2))
    wrote(out)


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workload", choices=["bank", "tpcc"], default="bank")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="bank: transfers")
    ap.add_argument("--durations", default="10,30", help="tpcc: seconds of New-Order")
    ap.add_argument("--checkpoint-every", type=int, default=200, help="tpcc: epochs")
    ap.output(
        "--out",
        "results/recovery/bench_recovery.json",
        "JSON, the PNG beside it (tpcc: bench_recovery_tpcc.json unless given)",
    )
    ap.add_argument("--load", metavar="CHECKPOINT_FILE", help="only time loading this checkpoint")
    return ap


def main() -> None:
    a = parser().parse()
    if a.load:
        time_load(Path(a.load))
        return
    if a.workload == "tpcc":
        main_tpcc(a)
        return
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        with tempfile.TemporaryDirectory(prefix="ordo-rec-") as tmp:
            row = one(n, tmp)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["txns_since_checkpoint"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        xs, [r["recovery_s"] for r in rows], "o-", label="kill -9 -> live (process, log service)"
    )
    ax.plot(xs, [r["inprocess_replay_s"] for r in rows], "s--", label="in-process replay")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("transactions since checkpoint")
    ax.set_ylabel("seconds")
    ax.set_title("Ordo partition recovery (1 replica x 2 partitions)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    wrote(out, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
