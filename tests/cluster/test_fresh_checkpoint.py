"""Integration: commands built on a fresh checkpoint (``ordo dump``, and so ``ordo tpcc
check --whole``; ``ordo checkpoint``) get one whatever else is checkpointing.

TPC-C state (W=2: a partition's base holds ~330k rows and takes seconds to write)
under New-Order load, 1 replica x 2 partitions, keeping one checkpoint:
- without periodic checkpoints, ``ordo tpcc check --whole`` (a dump, then TPC-C's
  conditions 1-12 on the whole database at its epoch, mid-load) and another reader at
  once, while both partitions write their first (base) checkpoint: both get one, and
  the state they read is consistent;
- restarted with a checkpoint every epoch (every boundary but the ones a busy writer
  skips), several readers at once, each holding its checkpoint while pruning runs
  after every file: each reads whole files of one epoch at or after the one it asked
  for;
- a partition killed with kill -9 and restarted: a dump while it recovers gets one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from cluster.config import ClusterConfig
from cluster.fresh_checkpoint import hold_fresh_checkpoint
from cluster.launcher import LocalCluster, free_base_port
from executor.core import checkpoint as ckpt
from executor.replay.export import MARKER
from tpcc.driver import PROCEDURE_MODULES
from txn_library.client import Client

ORDO = [sys.executable, "-m", "cluster.cli"]


def _load(cfg: ClusterConfig) -> subprocess.Popen[bytes]:
    """New-Order terminals against the cluster until killed. Four keep rows changing
    while checkpoints are written and pruned (the partitions wrote no fewer checkpoint
    files than under sixteen); a base takes seconds for the state's size, not the
    load's, and more terminals only take cores from the dumps' exports."""
    args = ["tpcc", "run", "--attach", cfg.data_dir, "--duration", "600", "--warmup", "0"]
    args += ["--terminals", "4", "--no-check", "--quiet", "--out", "/dev/null"]
    return subprocess.Popen([*ORDO, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _dump(cfg: ClusterConfig, out: Path) -> subprocess.Popen[str]:
    args = ["dump", "--data-dir", cfg.data_dir, "--out", str(out), "--timeout", "120"]
    return subprocess.Popen(
        [*ORDO, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _check_whole(cfg: ClusterConfig) -> subprocess.Popen[str]:
    args = ["tpcc", "check", "--whole", "--json", "--data-dir", cfg.data_dir, "--timeout", "120"]
    return subprocess.Popen(
        [*ORDO, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )


def _finished(p: subprocess.Popen[str]) -> str:
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out
    return out


def _reader(cfg: ClusterConfig, got: dict[int, Any], key: int) -> None:
    """Holds a fresh checkpoint and loads every partition's chain whole (CRCs, links,
    state hash) while the partitions go on writing and pruning."""
    try:
        with Client(cfg.client_addr) as c:
            asked = int(c.status()["epoch"]) + 1
            with hold_fresh_checkpoint(c, cfg, 0, 120) as (epoch, files):
                infos = [ckpt.load(f)[0] for f in files]
                got[key] = (asked, epoch, {i.epoch for i in infos}, [i.partition for i in infos])
    except Exception as e:  # reported by the test, with its type
        got[key] = e


def _readers(cfg: ClusterConfig, n: int) -> dict[int, Any]:
    got: dict[int, Any] = {}
    threads = [threading.Thread(target=_reader, args=(cfg, got, i)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return got


def _each_read_one_fresh_epoch(got: dict[int, Any], n: int) -> None:
    assert len(got) == n, got
    for asked, epoch, epochs, partitions in got.values():
        assert epoch >= asked and epochs == {epoch} and partitions == [0, 1], got


def test_dumps_get_a_fresh_checkpoint_whatever_else_is_checkpointing(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        replicas=1,
        partitions=2,
        base_port=free_base_port(),
        data_dir=str(tmp_path / "data"),
        genesis="tpcc.loader:genesis",
        genesis_args={"warehouses": 2, "seed": 7, "load_ts_ms": 1_700_000_000_000},
        procedure_modules=PROCEDURE_MODULES,
        checkpoint_keep=1,
    )
    lc = LocalCluster(cfg).start()
    load = _load(cfg)
    try:
        # First checkpoints (bases, seconds each): a whole-database check (a dump) and
        # a reader at once.
        check = _check_whole(cfg)
        got = _readers(cfg, 1)
        out = _finished(check)
        _each_read_one_fresh_epoch(got, 1)
        verdict = json.loads(out[out.index("{") :])
        assert verdict["ok"] and verdict["warehouses"] == [1, 2], verdict["violations"]
        assert verdict["rows"]["order_line"] > 0
    finally:
        load.kill()
        lc.stop()

    # A checkpoint every epoch, one kept: pruning after every file.
    cfg = replace(cfg, checkpoint_every_epochs=1)
    lc = LocalCluster(cfg).start()
    load = _load(cfg)
    try:
        _each_read_one_fresh_epoch(_readers(cfg, 3), 3)
        lc.kill("r0p1")
        lc.start_partition(0, 1)
        dump = _dump(cfg, tmp_path / "while-recovering")
        _finished(dump)
        marker = json.loads((tmp_path / "while-recovering" / MARKER).read_text())
        assert marker["complete"]
        with Client(cfg.client_addr) as c:
            assert not any(p["down"] for p in c.status()["partitions"])
    finally:
        load.kill()
        lc.stop()
    holds = cfg.checkpoint_dir(0) / ckpt.HOLDS_DIR
    assert not list(holds.iterdir()), "every hold released"
