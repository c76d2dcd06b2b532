"""Checks shared by the high-availability tests (loopback and network-namespace hosts).

``check_outcome``: every call the client ledger saw answered is in the committed log
exactly once, no (client, request) is in the log twice, terms never decrease along the
log, every sequencer's local log agrees with the leader's, replicas' hashes agree per
partition and equal a serial replay of the log, every answer the ledger holds is the
serial replay's, and no determinism violation was seen.
"""

from __future__ import annotations

import time
from pathlib import Path

from cluster.config import ClusterConfig
from cluster.ledger import Ledger
from executor.deterministic.oracle import SerialExecutor
from sequencer.log import iter_frames
from txn_library.wire import sequencer as wire


def check_outcome(cfg: ClusterConfig, ledger: Ledger, st: dict, transfers: int) -> None:
    """The ledger against the committed log and the replicas (see module docstring)."""
    assert not ledger.failed, ledger.failed[:5]
    assert len(ledger.acked) == transfers
    # Local logs are fdatasynced every sequencer_local_sync_s: read them once the
    # leader's holds the epoch its status reported.
    deadline = time.monotonic() + 10
    while True:
        logs = [  # a member wiped and restarted may not have made its log yet: empty
            [data for _e, data in iter_frames(d)] if d.is_dir() else []
            for d in (Path(cfg.sequencer_log_dir(m)) for m in range(cfg.sequencers))
        ]
        leader_log = logs[st["member"]]
        if len(leader_log) >= st["epoch"] - st["log_first_epoch"] + 1:
            break
        assert time.monotonic() < deadline, "the leader's log never reached its epoch"
        time.sleep(0.05)
    for m, other in enumerate(logs):
        n = min(len(other), len(leader_log))
        assert other[:n] == leader_log[:n], f"sequencer {m}'s log differs from the leader's"
    seen: dict[tuple[bytes, int], int] = {}
    txn_of: dict[tuple[bytes, int], int] = {}
    terms = []
    for data in leader_log:
        batch = wire.decode_batch(data)
        terms.append(batch.term)
        for i, txn in enumerate(batch.txns):
            if txn.client_id:
                key = (txn.client_id, txn.req_id)
                seen[key] = seen.get(key, 0) + 1
                txn_of[key] = batch.first_txn_id + i
    assert terms == sorted(terms), "terms never decrease along the log"
    twice = [k for k, n in seen.items() if n > 1]
    assert not twice, f"{len(twice)} calls sequenced twice"
    lost = [k for k in ledger.acked if k not in seen]
    assert not lost, f"{len(lost)} acknowledged calls are not in the log"
    serial = SerialExecutor()
    for data in leader_log:
        serial.apply(wire.decode_batch(data))
    by_part: dict[int, set[str]] = {}
    for p in st["partitions"]:
        by_part.setdefault(p["partition"], set()).add(p["state_hash"])
    assert all(len(h) == 1 for h in by_part.values()), by_part
    live = sum(int(next(iter(h)), 16) for h in by_part.values()) % (1 << 64)
    assert serial.state_hash == live
    wrong = [
        k for k, (_t, status) in ledger.acked.items() if serial.results[txn_of[k]][0] != status
    ]
    assert not wrong, f"{len(wrong)} answers differ from the serial replay's"
    assert st["determinism_violations"] == 0
