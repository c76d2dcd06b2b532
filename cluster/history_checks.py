"""Checks of a replicated cluster's history after a run (the nemesis, the HA tests):
every sequencer's log against the leader's, the client ledger against the log, terms,
the replicas' hashes against each other and a serial replay of the log.

Each check is a name with ``ok`` and a detail (``record``), so a long run reports every
one (cluster.nemesis) and a test asserts them all (tests/ha_checks.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cluster.config import ClusterConfig
from cluster.ledger import Ledger
from executor.deterministic.oracle import SerialExecutor
from sequencer.log import iter_frames
from txn_library.wire import sequencer as wire


def record(checks: dict[str, dict[str, Any]], name: str, ok: bool, detail: str) -> None:
    checks[name] = {"ok": bool(ok), "detail": detail}


def read_logs(cfg: ClusterConfig, st: dict, wait_s: float = 30.0) -> list[list[bytes]]:
    """Every sequencer's local log (a member wiped and restarted may have none yet),
    once the leader's holds the epoch its status reported (local logs are fdatasynced
    every sequencer_local_sync_s)."""
    deadline = time.monotonic() + wait_s
    while True:
        logs = [
            [data for _e, data in iter_frames(d)] if d.is_dir() else []
            for d in (Path(cfg.sequencer_log_dir(m)) for m in range(cfg.sequencers))
        ]
        if len(logs[st["member"]]) >= st["epoch"] - st["log_first_epoch"] + 1:
            return logs
        if time.monotonic() > deadline:
            return logs
        time.sleep(0.1)


def check_history(
    cfg: ClusterConfig, ledger: Ledger, st: dict
) -> tuple[dict[str, dict[str, Any]], SerialExecutor]:
    """Every sequencer's log against the leader's, the client ledger against the log
    (each acknowledged call there exactly once, answered as the serial replay answers
    it), terms, the replicas' hashes against each other and the serial replay (each
    check a name with ok and a detail; tests/ha_checks.py asserts them all too), and the
    serial replay it ran."""
    checks: dict[str, dict[str, Any]] = {}
    logs = read_logs(cfg, st)
    leader_log = logs[st["member"]]
    want = st["epoch"] - st["log_first_epoch"] + 1
    record(checks, "leader_log_complete", len(leader_log) >= want, f"{len(leader_log)}/{want}")
    differ = [
        m for m, other in enumerate(logs) if other[: len(leader_log)] != leader_log[: len(other)]
    ]
    record(checks, "sequencer_logs_agree", not differ, f"differ from the leader's: {differ}")
    seen: Counter[tuple[bytes, int]] = Counter()
    txn_of: dict[tuple[bytes, int], int] = {}
    terms = []
    serial = SerialExecutor()
    for data in leader_log:
        batch = wire.decode_batch(data)
        terms.append(batch.term)
        for i, txn in enumerate(batch.txns):
            if txn.client_id:
                key = (txn.client_id, txn.req_id)
                seen[key] += 1
                txn_of[key] = batch.first_txn_id + i
        serial.apply(batch)
    record(checks, "terms_never_decrease", terms == sorted(terms), f"last term {terms[-1:]}")
    twice = [k for k, n in seen.items() if n > 1]
    record(checks, "no_call_sequenced_twice", not twice, f"{len(twice)} twice")
    lost = [k for k in ledger.acked if k not in seen]
    record(
        checks,
        "every_acked_call_in_log",
        not lost,
        f"{len(ledger.acked)} acked, {len(lost)} missing from the log",
    )
    wrong = [
        k
        for k, (_t, status) in ledger.acked.items()
        if k in txn_of and serial.results[txn_of[k]][0] != status
    ]
    record(checks, "answers_equal_serial_replay", not wrong, f"{len(wrong)} differ")
    by_part: dict[int, set[str]] = {}
    for p in st["partitions"]:
        by_part.setdefault(p["partition"], set()).add(p["state_hash"])
    equal = all(len(h) == 1 for h in by_part.values())
    shown = {p: sorted(h) for p, h in sorted(by_part.items())}
    record(checks, "replica_hashes_equal", equal, json.dumps(shown))
    live = sum(int(next(iter(h)), 16) for h in by_part.values()) % (1 << 64)
    record(
        checks,
        "serial_replay_equals_replicas",
        equal and serial.state_hash == live,
        f"replay {serial.state_hash:016x}, replicas {live:016x}",
    )
    record(
        checks,
        "no_determinism_violation",
        st["determinism_violations"] == 0,
        f"{st['determinism_violations']} seen",
    )
    return checks, serial
