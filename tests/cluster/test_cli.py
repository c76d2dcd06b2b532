"""The `ordo` command line: against a real `ordo up` (call, status, checkpoint, dump,
log prune, and Ctrl-C stopping every child process), and in-process against a scripted
stand-in for the sequencer (argument handling, waiting for checkpoints, clear errors
instead of tracebacks)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from click.testing import CliRunner, Result

from cluster.cli import main
from cluster.config import CONFIG_FILE, ClusterConfig
from cluster.launcher import free_base_port
from tests.process_checks import children, gone
from txn_library import limits
from txn_library.errors import OK
from txn_library.wire import sequencer as wire


def _ordo(*args: str, data_dir: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args, "--data-dir", data_dir],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
    roles: list[int] = []
    try:
        assert up.stdout is not None
        line = up.stdout.readline()
        deadline = time.monotonic() + 60
        while "ordo up: sequencer at" not in line and time.monotonic() < deadline:
            assert up.poll() is None, line
            line = up.stdout.readline()
        roles = children(up.pid)
        assert len(roles) == 5  # sequencer + 2 x 2 partitions

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
        r = _ordo("call", "bank.balance", "1", "2", "3", data_dir=data)
        assert r.returncode == 2 and "bank.balance takes 1 argument(s), got 3" in r.stderr
        r = _ordo("call", "kv.add", "neg", "-5", "--timeout", "20", data_dir=data)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"status": "ok", "value": -5}
        r = _ordo("call", "bank.transfer", "1", "2", str(2**70), data_dir=data)
        assert r.returncode == 2 and "cannot be encoded" in r.stderr, r.stderr
        assert "client closed" not in r.stderr
        # Too large for one client frame (in-process: an OS caps one exec argument).
        big = CliRunner().invoke(
            main,
            ["call", "kv.put", "big", json.dumps("x" * limits.request_bytes_max)]
            + ["--data-dir", data],
        )
        assert big.exit_code == 2 and "too_large" in big.stderr, big.output

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
        # A second dump to the same --out replaces the first whole: no file of the old one
        # is left to be read with it. A directory Ordo did not write is never replaced.
        stale = out / "account" / "part-0007.csv"
        stale.write_text("key_0,balance\n1,999999\n")
        r = _ordo("dump", "--replica", "0", "--out", str(out), "--format", "csv", data_dir=data)
        assert r.returncode == 0, r.stderr
        assert not stale.exists() and json.loads((out / "_ordo.json").read_text())["complete"]
        foreign = tmp_path / "mine"
        foreign.mkdir()
        (foreign / "notes.txt").write_text("keep me")
        r = _ordo("dump", "--out", str(foreign), data_dir=data)
        assert r.returncode == 1 and "choose another --out" in r.stderr, r.stderr
        assert (foreign / "notes.txt").read_text() == "keep me"

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
    for pid in roles:
        assert gone(pid), pid


# In-process, against a scripted stand-in for the sequencer ------------------------------


class FakeSequencer(threading.Thread):
    """Answers the client port like the sequencer: calls are recorded and answered OK
    with their arguments, status reports ``partitions``, a checkpoint request ``epoch``."""

    def __init__(self, addr: str, partitions: list[dict[str, Any]], epoch: int = 5) -> None:
        super().__init__(daemon=True)
        self.addr, self.partitions, self.epoch = addr, partitions, epoch
        self.calls: list[tuple] = []
        self.checkpoint_requests = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.addr)
        try:
            while not self.stopping.is_set():
                if sock.poll(50):
                    identity, frame = sock.recv_multipart()
                    sock.send_multipart([identity, wire.pack(self._answer(wire.unpack(frame)))])
        finally:
            sock.close()

    def _answer(self, msg: tuple) -> tuple:
        if msg[0] == wire.REQ_CALLS:
            self.calls += msg[2]
            return (wire.REP_RESULTS, [(c[0], OK, c[2]) for c in msg[2]])
        if msg[0] == wire.REQ_CHECKPOINT:
            self.checkpoint_requests += 1
            return (wire.REP_OK, self.epoch)
        return (wire.REP_STATUS, {"epoch": self.epoch - 1, "partitions": self.partitions})


def _partition(
    p: int, newest_checkpoint_epoch: int, down: bool = False, boundary_epoch: int = 0
) -> dict[str, Any]:
    return {
        "replica": 0,
        "partition": p,
        "newest_checkpoint_epoch": newest_checkpoint_epoch,
        "boundary_epoch": boundary_epoch,
        "checkpoint_writing": -1,
        "down": down,
    }


@pytest.fixture
def fake_cluster(tmp_path: Path) -> Iterator[tuple[str, FakeSequencer]]:
    """(data dir, its sequencer stand-in) of a 1 x 2 cluster; no real process runs."""
    cfg = ClusterConfig(
        replicas=1, partitions=2, base_port=free_base_port(), data_dir=str(tmp_path / "d")
    )
    cfg.save()
    fake = FakeSequencer(cfg.client_addr, [_partition(0, 5), _partition(1, 5)])
    fake.start()
    try:
        yield cfg.data_dir, fake
    finally:
        fake.stopping.set()
        fake.join(timeout=5)


def _invoke(*args: str, data_dir: str) -> Result:
    return CliRunner().invoke(main, [*args, "--data-dir", data_dir])


def test_call_checks_arity_and_names_before_sending(fake_cluster) -> None:  # type: ignore[no-untyped-def]
    data, fake = fake_cluster
    cases = {
        ("bank.balance", "1", "2", "3"): "bank.balance takes 1 argument(s), got 3 values",
        ("bank.transfer", "1", "2", "3", "4"): "bank.transfer takes 3 argument(s), got 4",
        ("bank.transfer", "1", "2", "3", "src=4"): "argument src given both positionally",
        ("bank.transfer", "1", "2", "amount=3", "amount=4"): "argument amount given twice",
        ("bank.transfer", "1", "2", "amout=3"): "has no argument named 'amout'",
        ("bank.transfer", "1", "2"): "missing argument amount",
        ("bank.transfer", "1", "2", "amount=abc"): "argument amount (int): invalid literal",
        ("bank.transfer", "1", "2", "--amount", "3"): "no such option: --amount",
        ("bank.transfer", "1", "2", str(2**70)): "argument 3 (int) cannot be encoded",
    }
    for args, message in cases.items():
        r = _invoke("call", *args, data_dir=data)
        assert r.exit_code == 2 and message in r.stderr, (args, r.output)
    assert fake.calls == []  # none of them reached the sequencer


def test_call_takes_negative_numbers_as_values_and_options_anywhere(fake_cluster) -> None:  # type: ignore[no-untyped-def]
    data, fake = fake_cluster
    r = _invoke("call", "bank.transfer", "1", "2", "-5", "--timeout", "5", data_dir=data)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"status": "ok", "value": [1, 2, -5]}
    r = _invoke("call", "--timeout", "5", "kv.add", "k", "-7", data_dir=data)
    assert r.exit_code == 0, r.output
    r = _invoke("call", "kv.add", "key=a=b", "delta=-1", data_dir=data)  # "=" in a value
    assert r.exit_code == 0, r.output
    assert [c[1:] for c in fake.calls] == [
        ("bank.transfer", (1, 2, -5)),
        ("kv.add", ("k", -7)),
        ("kv.add", ("a=b", -1)),
    ]


def test_dump_waits_for_every_partition_with_progress_then_fails_clearly(
    fake_cluster,  # type: ignore[no-untyped-def]
) -> None:
    data, fake = fake_cluster
    fake.partitions = [_partition(0, 5), _partition(1, 4, down=True)]
    r = _invoke("dump", "--out", str(Path(data) / "out"), "--timeout", "1", data_dir=data)
    assert r.exit_code == 1, r.output
    assert "waiting for checkpoint at epoch 5: 1/2 partitions durable" in r.stderr
    assert "not durable within 1 s on replica 0 partition 1 (down)" in r.stderr
    assert "Traceback" not in r.output

    # Reported durable, yet the files are not there: a clear error, not a traceback.
    fake.partitions = [_partition(0, 5), _partition(1, 5)]
    r = _invoke("dump", "--out", str(Path(data) / "out"), data_dir=data)
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert "no checkpoint of every partition at or after it" in r.stderr, r.stderr
    assert not list(Path(data, "replica-0", "checkpoints", "holds").glob("*")), "hold left"


def test_a_failed_checkpoint_writer_is_asked_again_then_named(
    fake_cluster,  # type: ignore[no-untyped-def]
) -> None:
    """A partition past the asked boundary, writing nothing, with nothing durable at or
    after it lost its writer: asked again (limits.checkpoint_asks_max in all), then
    named, long before the timeout."""
    data, fake = fake_cluster
    fake.partitions = [_partition(0, 5, boundary_epoch=5), _partition(1, 3, boundary_epoch=5)]
    t0 = time.monotonic()
    r = _invoke("checkpoint", "--timeout", "60", data_dir=data)
    assert r.exit_code == 1, r.output
    assert "checkpoint writers failed 3 times on replica 0 partition 1" in r.stderr, r.stderr
    assert fake.checkpoint_requests == 3
    assert time.monotonic() - t0 < 30


def test_every_command_without_a_valid_cluster_config_fails_with_one_clear_line(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "nowhere")
    commands = [
        ["status"],
        ["call", "bank.balance", "1"],
        ["checkpoint"],
        ["dump", "--out", str(tmp_path / "out")],
        ["log", "prune"],
        ["log", "archive", str(tmp_path / "archive")],
        ["backup", str(tmp_path / "backup")],
        ["sequencer"],
        ["replica", "--replica", "0"],
        ["tpcc", "check"],
    ]
    broken = {"not json": "{not json", "wrong fields": '{"replicas": 2, "bogus": 1}'}
    dirs = {"missing": missing}
    for name, text in broken.items():
        d = tmp_path / name.replace(" ", "-")
        d.mkdir()
        (d / CONFIG_FILE).write_text(text)
        dirs[name] = str(d)
    runs = [(cmd, d) for cmd in commands for d in dirs.values()]
    runs += [(["up"], dirs["not json"]), (["procedures"], dirs["wrong fields"])]
    runs += [(["tpcc", "run", "--attach", d], None) for d in dirs.values()]
    for cmd, d in runs:
        args = cmd if d is None else [*cmd, "--data-dir", d]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (args, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (args, r.stderr)
        assert "no cluster config at" in lines[0] or "not a valid cluster config" in lines[0]


def test_up_refuses_to_switch_a_data_dir_between_single_and_replicated(tmp_path: Path) -> None:
    """A single-sequencer data dir started again with --ha (or the reverse) would leave
    its command log unused: refused, naming --fresh."""
    from click.testing import CliRunner

    from cluster.cli import main

    ClusterConfig(data_dir=str(tmp_path)).save()
    out = CliRunner().invoke(main, ["up", "--ha", "--data-dir", str(tmp_path)])
    assert out.exit_code != 0 and "--fresh" in out.output


def test_up_keeps_the_data_dirs_genesis_and_retention(tmp_path: Path) -> None:
    """`ordo up` on a directory that `ordo tpcc run --keep-data` made built its config
    from its flags and dropped the genesis: the partitions replayed the command log
    over empty tables and served that state as live (every state hash 0)."""
    from cluster.commands.run import _config_for_up

    ClusterConfig(
        data_dir=str(tmp_path),
        procedure_modules=("txn_library.workloads.builtin", "tpcc.transactions"),
        genesis="tpcc.loader:genesis",
        genesis_args={"warehouses": 2, "seed": 1, "load_ts_ms": 1_700_000_000_000},
        checkpoint_every_s=30.0,
        checkpoint_keep=7,
        log_segment_bytes=1 << 20,
    ).save()
    cfg = _config_for_up(str(tmp_path), 2, 2, free_base_port(), 5, True, ("kv.extra",), 100)
    assert cfg.genesis == "tpcc.loader:genesis"
    assert cfg.genesis_args == {"warehouses": 2, "seed": 1, "load_ts_ms": 1_700_000_000_000}
    assert (cfg.checkpoint_every_s, cfg.checkpoint_keep, cfg.log_segment_bytes) == (
        30.0,
        7,
        1 << 20,
    )
    assert cfg.procedure_modules == (
        "txn_library.workloads.builtin",
        "tpcc.transactions",
        "kv.extra",
    )
    assert (cfg.epoch_duration_ms, cfg.checkpoint_every_epochs) == (5, 100)  # the flags'
    fresh = _config_for_up(str(tmp_path / "new"), 2, 2, free_base_port(), 10, True, (), 0)
    assert fresh.genesis is None and fresh.checkpoint_keep == ClusterConfig().checkpoint_keep


def test_up_without_shape_flags_takes_the_data_dirs_shape(tmp_path: Path) -> None:
    """`ordo up --data-dir D` on a directory holding a 1 x 2 cluster with a reader
    recovers that cluster (it refused: the flags' defaults, 2 x 2, did not match); a
    shape flag that contradicts the directory is still refused, naming both."""
    import click

    from cluster.commands.run import _config_for_up

    ClusterConfig(data_dir=str(tmp_path), replicas=1, partitions=2, readers=1).save()
    port = free_base_port()
    cfg = _config_for_up(str(tmp_path), None, None, port, 10, True, (), 0, "strong", None)
    assert (cfg.replicas, cfg.partitions, cfg.readers) == (1, 2, 1)
    assert not cfg.replica_versions  # decided by its reader, as when it was made
    assert _config_for_up(str(tmp_path), 1, None, port, 10, True, (), 0, "strong", 0).readers == 0
    with pytest.raises(click.ClickException, match="holds a 1x2 cluster"):
        _config_for_up(str(tmp_path), 2, None, port, 10, True, (), 0)
    new = _config_for_up(str(tmp_path / "new"), None, None, port, 10, True, (), 0, "strong", None)
    assert (new.replicas, new.partitions, new.readers) == (2, 2, 0)  # the defaults


def test_readers_take_the_replicas_versions_off_unless_told_otherwise(tmp_path: Path) -> None:
    """With readers serving snapshots the transactional replicas keep no row versions
    (issue 46 item 5): `ordo up` decides it from --readers or its flag, and cluster.json
    records it."""
    from cluster.commands.run import _config_for_up

    def up(d: str, readers: int, flag: bool | None = None) -> ClusterConfig:
        return _config_for_up(
            str(tmp_path / d), 1, 2, 20_000, 5, True, (), 0, "strong", readers, flag
        )

    assert up("plain", 0).query_versions is True and up("plain", 0).replica_versions
    with_readers = up("readers", 2)
    assert with_readers.query_versions is False and not with_readers.replica_versions
    assert up("told", 2, True).replica_versions and not up("told", 0, False).replica_versions
    with_readers.save()
    assert ClusterConfig.load(with_readers.data_dir).replica_versions is False
    # a config written by hand (or by a test) without the field decides by its readers
    assert ClusterConfig(readers=1).replica_versions is False
    assert ClusterConfig().replica_versions is True


def test_up_places_every_config_field() -> None:
    """Each ClusterConfig field is kept by `ordo up`, set by its flags, set by --ha, or
    deliberately dropped: a new field cannot be lost on a restart unnoticed."""
    from dataclasses import fields

    from cluster.commands import run

    groups = (run._KEPT_BY_UP, run._SET_BY_UP_FLAGS, run._SET_BY_HA, run._NOT_KEPT_BY_UP)
    placed = [name for group in groups for name in group]
    assert sorted(placed) == sorted(f.name for f in fields(ClusterConfig))


def test_tpcc_run_never_deletes_an_existing_data_dir_unasked(tmp_path: Path) -> None:
    """`ordo tpcc run --data-dir D` deleted D first, whatever database it held."""
    d = tmp_path / "ordo-data"
    d.mkdir()
    (d / CONFIG_FILE).write_text("{}")
    r = CliRunner().invoke(main, ["tpcc", "run", "--data-dir", str(d), "--duration", "1"])
    assert r.exit_code != 0 and "--fresh" in r.output and "--attach" in r.output, r.output
    assert (d / CONFIG_FILE).read_text() == "{}"


def test_fresh_never_deletes_a_directory_a_live_process_owns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ordo up --fresh` and `ordo tpcc run --fresh` on a directory whose partition still
    runs (its launcher died): refused with the owner's pid, nothing deleted."""
    d = tmp_path / "ordo-data"
    d.mkdir()
    (d / CONFIG_FILE).write_text("{}")
    code = (
        "import time\n"
        "from cluster.ownership import claim, partition_owner\n"
        f"claim({str(d)!r}, partition_owner(0, 1), 'a partition', wait_s=0)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen(
        [sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True
    )
    monkeypatch.setattr(limits, "owner_wait_s", 0.2)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for args in (
            ["up", "--fresh", "--data-dir", str(d)],
            ["tpcc", "run", "--fresh", "--data-dir", str(d), "--duration", "1"],
        ):
            r = CliRunner().invoke(main, args)
            assert r.exit_code == 1, r.output
            assert f"in use by process {holder.pid}" in r.output, r.output
            assert (d / CONFIG_FILE).read_text() == "{}"
    finally:
        holder.kill()
        holder.wait()
