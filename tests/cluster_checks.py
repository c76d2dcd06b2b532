"""Checks shared by the tests that run a live cluster (not a test module itself)."""

from __future__ import annotations

from cluster.config import ClusterConfig
from executor.deterministic.oracle import SerialExecutor
from sequencer.log import iter_frames
from txn_library.wire import sequencer as wire


def replicas_agree_with_serial_replay(cfg: ClusterConfig, st: dict) -> SerialExecutor:
    """Replica hashes agree per partition, and their sum equals the serial oracle's after
    the whole command log. Returns the oracle (its results, for further checks)."""
    assert st["determinism_violations"] == 0
    by_part: dict[int, set[str]] = {}
    for p in st["partitions"]:
        by_part.setdefault(p["partition"], set()).add(p["state_hash"])
    assert all(len(h) == 1 for h in by_part.values()), by_part
    serial = SerialExecutor()
    for _e, data in iter_frames(cfg.log_dir):
        serial.apply(wire.decode_batch(data))
    live = sum(int(next(iter(h)), 16) for h in by_part.values()) % (1 << 64)
    assert serial.state_hash == live
    return serial
