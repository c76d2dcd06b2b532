"""Smoke test of scripts/paper_experiments.py: the clogging (b) and dependent (c)
experiments end to end at a tiny size, both modes, real processes, into tmp_path.

Checks the outputs exist and hold what the plots and the report are made of, and the
one property of b that matters: the stalled transaction kept its locks for its whole
stall in both modes (its latency is at least the stall) while the load went on.
Every process the script starts is killed by PID if the script fails or hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "paper_experiments.py"
STALL_MS = 400


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        ps = subprocess.run(["ps", "-o", "pid=", "--ppid", str(p)], capture_output=True, text=True)
        kids = [int(x) for x in ps.stdout.split()]
        out.extend(kids)
        todo.extend(kids)
    return out


def test_clogging_and_dependent_experiments_smoke(tmp_path: Path) -> None:
    out_dir = tmp_path / "paper"
    args = [
        sys.executable,
        str(SCRIPT),
        "b",
        "c",
        "--out-dir",
        str(out_dir),
        "--records",
        "20000",
        "--conflict-probs",
        "0.01",
        "--clog-rate",
        "300",
        "--clog-total-s",
        "1.6",
        "--stall-at-s",
        "0.4",
        "--stall-ms",
        str(STALL_MS),
        "--tags",
        "100",
        "--dependent-shares",
        "1.0",
        "--index-rates",
        "0",
        "300",
        "--warmup-s",
        "0.2",
        "--duration-s",
        "0.8",
        "--in-flight",
        "32",
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            for pid in _descendants(proc.pid) + [proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    for name in ("b", "c"):
        for ext in ("json", "csv", "png"):
            assert (out_dir / f"{name}.{ext}").stat().st_size > 0
    assert not (tmp_path / "docs").exists()  # a run elsewhere leaves the report alone

    b = json.loads((out_dir / "b.json").read_text())["rows"]
    assert {r["mode"] for r in b} == {"deterministic", "traditional"}
    for r in b:
        assert r["failed"] == 0 and r["answered"] > 0, r
        assert isinstance(r["stall_txn_latency_s"], float), r["stall_txn_latency_s"]
        assert r["stall_txn_latency_s"] >= STALL_MS / 1000  # the locks were held throughout
        assert r["working_set_per_partition"] == 5000
        assert r["series"] and all(0 <= s["blocked_share"] <= 1 for s in r["series"])

    c = json.loads((out_dir / "c.json").read_text())["rows"]
    assert len(c) == 4  # 2 modes x 1 share x 2 rates
    for r in c:
        assert r["failed"] == 0 and r["ok"] > 0, r
        if r["index_updates_per_s"] == 0:
            assert r["index_moves_sent"] == 0 and r["index_moves_committed_per_s"] == 0
            if r["mode"] == "deterministic":
                assert r["restarts"] == 0  # nothing moves: every prediction holds
        else:
            assert r["index_moves_committed_per_s"] > 0
