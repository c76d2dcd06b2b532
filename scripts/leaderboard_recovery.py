"""``--recovery-batches N`` of scripts/leaderboard.py: log bytes and recovery time of N
leaderboard batches, weak recovery against strong (docs/STREAMS.md).

For each of strong and weak: a fresh 1 replica x 1 partition cluster with that
``dataflow_recovery`` and no checkpoints; N batches pushed through the ``lb`` dataflow
(the same votes both times); quiescent, its state hash noted; stopped; the command
log's bytes measured; started again, timed until the partition is live (status: not
catching up, at the last epoch, idle), with the partition's own figure from its log
("live: caught up from epoch ... in X s", counted from when its storage is open) and
an in-process replay of the same log (``LocalReplica``: decode and apply, no process
start, no sockets) beside it. The state hash after recovery must equal the one before,
and weak must equal strong (derivation is deterministic).

Invariant: the check (``--check``) runs after the recovery is timed, so its checkpoint
cannot shorten the replay it measures.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from leaderboard_check import Verdict, check
from leaderboard_cluster import Target, embedded, leaderboard_flow, prepare, source_for
from leaderboard_load import pipelined

from cluster.launcher import partition_status, wait_quiescent
from executor.deterministic.replica import LocalReplica
from executor.replay.batches import iter_batches

LIVE_WAIT_S = 600.0
LIVE_LINE = re.compile(r"live: caught up from epoch (\d+) to (\d+) in ([0-9.]+)s")


def log_bytes(log_dir: Path) -> int:
    return sum(f.stat().st_size for f in log_dir.iterdir() if f.is_file())


def _wait_live(target: Target, epoch: int) -> float:
    """Seconds from now until partition 0 is live at ``epoch`` or later."""
    t0 = time.perf_counter()
    deadline = t0 + LIVE_WAIT_S
    with target.client(timeout_s=10.0) as c:
        while time.perf_counter() < deadline:
            p = partition_status(c, 0, 0)
            if p is not None and not p["catching_up"] and p["last_epoch"] >= epoch:
                if p["active"] == 0:
                    return time.perf_counter() - t0
            time.sleep(0.01)
    raise TimeoutError(f"partition 0 not live at epoch {epoch} within {LIVE_WAIT_S:.0f} s")


def _logged_live_s(target: Target) -> float | None:
    path = Path(target.cfg.data_dir) / "logs" / "replica-0-partition-0.log"
    found = LIVE_LINE.findall(path.read_text(errors="replace")) if path.is_file() else []
    return float(found[-1][2]) if found else None


def _replay_in_process(target: Target, last_epoch: int) -> tuple[float, str]:
    replica = LocalReplica(1)
    t0 = time.perf_counter()
    for _epoch, batch, _size in iter_batches(target.cfg.log_dir, 1, last_epoch):
        replica.apply(batch)
    return time.perf_counter() - t0, f"{replica.parts[0].storage.state_hash:016x}"


def one(
    mode: str,
    batches: int,
    *,
    seed: int,
    per_batch: int,
    in_flight: int,
    check_it: bool,
    keep: bool,
) -> tuple[dict[str, Any], Verdict | None]:
    flow = leaderboard_flow("lb")
    source = source_for(flow, seed, per_batch)
    with embedded(replicas=1, partitions=1, recovery=mode, keep=keep) as t:
        first = prepare(t, flow)
        run = pipelined(
            t.address,
            flow,
            source,
            first,
            warmup_s=0.0,
            seconds=0.0,
            in_flight=in_flight,
            batches=batches,
        )
        with t.client() as c:
            st = wait_quiescent(c, 1, 1, timeout_s=300)
        epoch, before = st["epoch"], st["partitions"][0]["state_hash"]
        t.stop()
        size = log_bytes(t.cfg.log_dir)
        t0 = time.perf_counter()
        t.restart()
        started_s = time.perf_counter() - t0
        live_s = started_s + _wait_live(t, epoch)
        with t.client() as c:
            after = wait_quiescent(c, 1, 1, timeout_s=300)["partitions"][0]["state_hash"]
        replay_s, replay_hash = _replay_in_process(t, epoch)
        logged_s = _logged_live_s(t)
        verdict = check(t, [run])[0] if check_it else None
    row = {
        "dataflow_recovery": mode,
        "batches": batches,
        "pushed_per_s": run.summary()["batches_per_s"],
        "epochs": epoch,
        "log_bytes": size,
        "restart_to_live_s": round(live_s, 3),
        "partition_logged_live_s": logged_s,
        "inprocess_replay_s": round(replay_s, 3),
        "state_hash_before": before,
        "state_hash_after": after,
        "state_hash_inprocess": replay_hash,
    }
    return row, verdict


def recovery(
    batches: int, *, seed: int, per_batch: int, in_flight: int, check_it: bool, keep: bool
) -> tuple[dict[str, Any], list[Verdict]]:
    rows, verdicts = [], []
    for mode in ("strong", "weak"):
        row, v = one(
            mode,
            batches,
            seed=seed,
            per_batch=per_batch,
            in_flight=in_flight,
            check_it=check_it,
            keep=keep,
        )
        print(
            f"recovery {mode}: {row['log_bytes']:,} log bytes, live after "
            f"{row['restart_to_live_s']} s (partition says {row['partition_logged_live_s']} s, "
            f"in-process replay {row['inprocess_replay_s']} s), hash {row['state_hash_after']}",
            flush=True,
        )
        rows.append(row)
        if v is not None:
            v.way = f"recovery-{mode}"
            verdicts.append(v)
    hashes = {
        r[k]
        for r in rows
        for k in ("state_hash_before", "state_hash_after", "state_hash_inprocess")
    }
    strong, weak = rows
    result = {
        "cluster": "1 replica x 1 partition, durable log, no checkpoints",
        "rows": rows,
        "same_state_hash": len(hashes) == 1,
        "log_bytes_weak_over_strong": round(weak["log_bytes"] / strong["log_bytes"], 3),
        "recovery_weak_over_strong": round(
            weak["restart_to_live_s"] / max(strong["restart_to_live_s"], 1e-9), 3
        ),
    }
    if len(hashes) != 1:
        verdicts.append(
            Verdict(
                "recovery",
                "lb",
                batches,
                [f"state hashes differ across modes or across the restart: {sorted(hashes)}"],
                {},
            )
        )
    return result, verdicts
