"""cluster.ownership: one live process owns each piece of a cluster's state (a second
claimant is refused, touching nothing; a crashed owner's claim is free at once), and a
launcher's children stop when it dies, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cluster import ownership
from cluster.ownership import (
    StateInUse,
    claim,
    claim_cluster_dir,
    held_owners,
    owner_file,
    start_role,
)
from tests.process_checks import gone, gone_within

ROOT = Path(__file__).resolve().parents[2]


def _holder(data_dir: Path, name: str) -> subprocess.Popen[str]:
    """Another process that claims ``name`` in ``data_dir`` and then waits."""
    code = textwrap.dedent(
        f"""
        import time
        from cluster.ownership import claim
        claim({str(data_dir)!r}, {name!r}, "test state", wait_s=0)
        print("held", flush=True)
        time.sleep(600)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_second_claimant_is_refused_and_the_first_keeps_its_claim(tmp_path: Path) -> None:
    first = claim(tmp_path, "sequencer-0", "sequencer 0's command log")
    assert owner_file(tmp_path, "sequencer-0").read_text().strip() == str(os.getpid())
    t0 = time.monotonic()
    with pytest.raises(StateInUse) as e:
        claim(tmp_path, "sequencer-0", "sequencer 0's command log", wait_s=0.2)
    assert time.monotonic() - t0 >= 0.2  # it waited for the owner to go first
    assert e.value.pid == os.getpid()
    assert f"in use by process {os.getpid()}" in str(e.value)
    assert held_owners(tmp_path) == [("sequencer-0", os.getpid())]
    claim(tmp_path, "r0p0", "a partition").release()  # another name is another owner
    first.release()
    assert held_owners(tmp_path) == []
    claim(tmp_path, "sequencer-0", "sequencer 0's command log", wait_s=0).release()


def test_the_claim_of_a_process_killed_with_sigkill_is_free_at_once(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "r1p0")
    try:
        with pytest.raises(StateInUse) as e:
            claim(tmp_path, "r1p0", "partition 0 of replica 1", wait_s=0)
        assert e.value.pid == holder.pid
    finally:
        holder.kill()
        holder.wait()
    c = claim(tmp_path, "r1p0", "partition 0 of replica 1", wait_s=0)
    assert c.held
    c.release()


def test_a_claim_kept_across_exec_is_held_by_the_program_execed(tmp_path: Path) -> None:
    """``ordo zookeeper`` claims, then execs the JVM, which holds the claim until it ends."""
    code = textwrap.dedent(
        f"""
        import os
        from cluster.ownership import claim
        claim({str(tmp_path)!r}, "zookeeper-1", "ZooKeeper server 1's data").keep_across_exec()
        os.execv("/bin/sleep", ["sleep", "60"])
        """
    )
    execed = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        cmdline = Path(f"/proc/{execed.pid}/cmdline")
        while not cmdline.read_bytes().startswith(b"sleep"):  # until it has exec'd
            assert execed.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(StateInUse):
            claim(tmp_path, "zookeeper-1", "ZooKeeper server 1's data", wait_s=0)
    finally:
        execed.kill()
        execed.wait()
    claim(tmp_path, "zookeeper-1", "ZooKeeper server 1's data", wait_s=0).release()


def test_a_role_whose_state_is_owned_exits_without_touching_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = _holder(tmp_path, "sequencer-0")
    monkeypatch.setattr(ownership.limits, "owner_wait_s", 0.1)
    try:
        with pytest.raises(SystemExit) as e:
            start_role(tmp_path, "sequencer-0", "sequencer 0's command log")
        assert e.value.code == ownership.EXIT_STATE_IN_USE
        assert sorted(p.name for p in tmp_path.iterdir()) == ["owners"]
    finally:
        holder.kill()
        holder.wait()


def test_fresh_clears_a_cluster_dir_only_when_no_process_owns_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ownership.limits, "owner_wait_s", 0.1)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "00000001.seg").write_bytes(b"acknowledged")
    (tmp_path / "cluster.json").write_text("{}")
    role = _holder(tmp_path, "r0p1")  # a partition whose launcher died, still running
    try:
        with pytest.raises(StateInUse, match="r0p1"):
            claim_cluster_dir(tmp_path, fresh=True)
        assert (tmp_path / "log" / "00000001.seg").read_bytes() == b"acknowledged"
    finally:
        role.kill()
        role.wait()
    launcher = claim_cluster_dir(tmp_path, fresh=True)
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["owners"]
        with pytest.raises(StateInUse, match="cluster directory"):
            claim_cluster_dir(tmp_path, fresh=True)  # a second launcher, even in-process
    finally:
        launcher.release()


def test_children_stop_when_their_launcher_is_killed(tmp_path: Path) -> None:
    """A launcher (spawn_python) killed with SIGKILL: its child sees the lifeline end and
    stops; a process started without a lifeline watches nothing."""
    code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from cluster.processes import spawn_python
        p = spawn_python([], Path({str(tmp_path / "child.log")!r}), "tests.lifeline_child")
        print(p.pid, flush=True)
        time.sleep(600)
        """
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    child = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        log = tmp_path / "child.log"
        while "watching" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the child did not start watching"
            time.sleep(0.02)
        assert not gone_within(child, 0.3)  # alive while its launcher is
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert gone_within(child, 5.0), "the child outlived its launcher"
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)
    plain = subprocess.run(
        [sys.executable, "-c", "from cluster.ownership import watch_lifeline as w; print(w())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != ownership.LIFELINE_ENV},
    )
    assert plain.stdout.strip() == "False"
