"""The `ordo` command line against a real `ordo up`: call, status, checkpoint, dump,
log prune, and Ctrl-C stopping every child process."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster.launcher import free_base_port


def _ordo(*args: str, data_dir: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args, "--data-dir", data_dir],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def test_ordo_up_call_status_dump_and_ctrl_c(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "up",
            "--replicas",
            "2",
            "--partitions",
            "2",
            "--base-port",
            str(free_base_port()),
            "--data-dir",
            data,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    children: list[int] = []
    try:
        assert up.stdout is not None
        line = up.stdout.readline()
        deadline = time.monotonic() + 60
        while "ordo up: sequencer at" not in line and time.monotonic() < deadline:
            assert up.poll() is None, line
            line = up.stdout.readline()
        children = _children(up.pid)
        assert len(children) == 5  # sequencer + 2 x 2 partitions

        r = _ordo("call", "bank.open", "first=0", "count=10", "balance=100", data_dir=data)
        assert r.returncode == 0 and json.loads(r.stdout) == {"status": "ok", "value": 10}
        r = _ordo("call", "bank.transfer", "src=1", "dst=2", "amount=30", data_dir=data)
        assert json.loads(r.stdout) == {"status": "ok", "value": 70}
        r = _ordo("call", "bank.transfer", "src=1", "dst=2", "amount=1000", data_dir=data)
        assert r.returncode == 1 and json.loads(r.stdout)["reason"] == "insufficient funds"
        r = _ordo("call", "bank.balance", "2", data_dir=data)
        assert json.loads(r.stdout)["value"] == 130
        r = _ordo("call", "bank.transfer", "src=x", "dst=2", "amount=1", data_dir=data)
        assert r.returncode != 0 and "src" in r.stderr
        r = _ordo("call", "no.such.proc", data_dir=data)
        assert r.returncode != 0 and "no procedure" in r.stderr

        r = _ordo("status", data_dir=data)
        assert r.returncode == 0
        rows = [ln.split() for ln in r.stdout.splitlines()[2:]]
        assert len(rows) == 4
        hashes = {(row[1], row[6]) for row in rows}  # (partition, state hash)
        assert len(hashes) == 2  # both replicas agree per partition
        assert all(row[-1] == "live" for row in rows)

        r = _ordo("checkpoint", data_dir=data)
        assert r.returncode == 0, r.stderr
        out = tmp_path / "dump"
        r = _ordo("dump", "--replica", "1", "--out", str(out), "--format", "csv", data_dir=data)
        assert r.returncode == 0, r.stderr
        balances = {}
        for f in (out / "account").glob("*.csv"):
            with open(f) as fh:
                for rec in csv.DictReader(fh):
                    balances[int(rec["key_0"])] = int(rec["balance"])
        assert balances[1] == 70 and balances[2] == 130 and sum(balances.values()) == 1000

        r = _ordo("log", "prune", data_dir=data)
        assert r.returncode == 0, r.stderr
        assert "segment(s) deleted" in r.stdout
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGINT)  # Ctrl-C
        try:
            up.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    for pid in children:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        ), pid
