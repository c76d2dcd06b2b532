"""The ZooKeeper foundation of the replicated ordering layer, with real servers.

- A 3-server ensemble on 127.0.0.1 elects one leader and serves writes and reads on
  every server; a 1-server one runs standalone; stop() leaves no server running.
- The fencing primitive a leader will use: a multi-op that checks the term node's
  version and writes a batch node commits with the current version and, with a stale
  one, fails as a whole (nothing written).
- kill -9 of the leader: the other two still serve writes; the restarted server
  rejoins as follower or leader and serves the write it missed.
- Bad arguments (server count 2, ports out of range, a host that is not an IP address,
  a hosts list that does not name one address per server, unknown server numbers,
  starting a running server) get a clear error.
- A server dies with the process that started it (kill -9 of the launcher).
- One server per host (``hosts=``, on network namespaces): tests/cluster/test_netns.py.

ZooKeeper missing is a failure that says to run scripts/setup.sh, never a skip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.handlers.threading import KazooTimeoutError

from cluster.launcher import free_base_port
from cluster.zookeeper import PORTS_PER_SERVER, SERVING_MODES, ZOOKEEPER_JAR, Ensemble
from tests.process_checks import gone, gone_within

DEADLINE_S = 20.0


def _require_zookeeper() -> None:
    if not ZOOKEEPER_JAR.exists():
        pytest.fail(f"ZooKeeper is not installed ({ZOOKEEPER_JAR}): run scripts/setup.sh")


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[Ensemble]:
    _require_zookeeper()
    # free_base_port reserves 64 ports by default; three servers use 9
    with Ensemble(tmp_path / "zk", free_base_port(span=3 * PORTS_PER_SERVER)) as ens:
        yield ens


@pytest.fixture
def connect() -> Iterator[Callable[[str], KazooClient]]:
    clients: list[KazooClient] = []

    def make(hosts: str) -> KazooClient:
        c = KazooClient(hosts=hosts, timeout=5.0)
        clients.append(c)
        c.start(timeout=DEADLINE_S)
        return c

    yield make
    for c in clients:
        c.stop()
        c.close()


def _until(what: str, attempt: Callable[[], object]) -> object:
    """Retry ``attempt`` (ZooKeeper errors count as 'not yet') until a deadline."""
    deadline = time.monotonic() + DEADLINE_S
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            return attempt()
        except (KazooException, KazooTimeoutError) as e:
            last = e
        time.sleep(0.05)
    raise TimeoutError(f"{what} within {DEADLINE_S}s; last error: {last!r}")


def test_three_servers_elect_one_leader_and_serve_writes_and_reads(
    ensemble: Ensemble, connect: Callable[[str], KazooClient]
) -> None:
    st = ensemble.status()
    assert [s.alive for s in st] == [True, True, True]
    assert sorted(s.mode or "" for s in st) == ["follower", "follower", "leader"]
    assert ensemble.connect_string().count("127.0.0.1:") == 3

    zk = connect(ensemble.connect_string())
    zk.create("/ordo/probe", b"epoch-1", makepath=True)
    data, stat = zk.get("/ordo/probe")
    assert (data, stat.version) == (b"epoch-1", 0)

    # every server has the write (a read after sync on each one)
    for n in range(1, 4):
        one = connect(f"127.0.0.1:{ensemble.client_port(n)}")
        one.sync("/ordo/probe")
        assert one.get("/ordo/probe")[0] == b"epoch-1"

    with pytest.raises(ValueError, match="already running"):
        ensemble.start_server(1)

    pids = [s.pid for s in st]
    ensemble.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(s.alive for s in ensemble.status())


def test_one_server_runs_standalone(tmp_path: Path, connect: Callable[[str], KazooClient]) -> None:
    _require_zookeeper()
    with Ensemble(tmp_path / "zk1", free_base_port(span=PORTS_PER_SERVER), servers=1) as ens:
        assert [s.mode for s in ens.status()] == ["standalone"]
        zk = connect(ens.connect_string())
        zk.create("/one", b"x")
        assert zk.get("/one")[0] == b"x"


def test_a_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """kill -9 of the launcher (here a bare Python process): the kernel kills its
    ZooKeeper server too (setpriv's parent-death signal), so none is left holding the
    cluster's ports and data."""
    _require_zookeeper()
    code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from cluster.zookeeper import Ensemble
        ens = Ensemble(Path({str(tmp_path / "zk")!r}), {free_base_port(span=PORTS_PER_SERVER)},
                       servers=1)
        ens.start()
        print(ens.pid(1), flush=True)
        time.sleep(600)
        """
    )
    root = Path(__file__).resolve().parents[2]
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True
    )
    assert launcher.stdout is not None
    server = int(launcher.stdout.readline())
    try:
        assert Path(f"/proc/{server}").exists()
        launcher.kill()
        launcher.wait()
        assert gone_within(server, 10.0), "the ZooKeeper server outlived its launcher"
    finally:
        if not gone(server):
            os.kill(server, signal.SIGKILL)


def test_term_version_check_fences_a_stale_leaders_batch(
    ensemble: Ensemble, connect: Callable[[str], KazooClient]
) -> None:
    zk = connect(ensemble.connect_string())
    zk.create("/ordo/term", b"leader-a", makepath=True)
    zk.create("/ordo/batches/0", b"genesis", makepath=True)
    term_version = zk.exists("/ordo/term").version

    # the current leader: check its term, add a batch and advance the last one
    tx = zk.transaction()
    tx.check("/ordo/term", term_version)
    tx.create("/ordo/batches/1", b"batch-1")
    tx.set_data("/ordo/batches/0", b"sealed")
    results = tx.commit()
    assert results[0] is True
    assert results[1] == "/ordo/batches/1"
    assert not any(isinstance(r, Exception) for r in results)
    assert zk.get("/ordo/batches/1")[0] == b"batch-1"

    # a new leader takes the term; the old one's next batch must leave no trace
    zk.set("/ordo/term", b"leader-b")
    tx = zk.transaction()
    tx.check("/ordo/term", term_version)
    tx.create("/ordo/batches/2", b"stale")
    tx.set_data("/ordo/batches/1", b"overwritten")
    results = tx.commit()
    # ZooKeeper stops at the failed check: later ops are reported as not attempted
    assert isinstance(results[0], BadVersionError)
    assert all(isinstance(r, RuntimeInconsistency) for r in results[1:])
    assert zk.exists("/ordo/batches/2") is None

    # with the check last, the writes before it are applied and then rolled back
    tx = zk.transaction()
    tx.create("/ordo/batches/2", b"stale")
    tx.set_data("/ordo/batches/1", b"overwritten")
    tx.check("/ordo/term", term_version)
    results = tx.commit()
    assert [type(r) for r in results] == [RolledBackError, RolledBackError, BadVersionError]
    assert zk.exists("/ordo/batches/2") is None
    data, stat = zk.get("/ordo/batches/1")
    assert (data, stat.version) == (b"batch-1", 0)
    assert sorted(zk.get_children("/ordo/batches")) == ["0", "1"]


def test_killed_leader_leaves_a_serving_quorum_and_rejoins_when_restarted(
    ensemble: Ensemble, connect: Callable[[str], KazooClient]
) -> None:
    leader = next(s.server for s in ensemble.status() if s.mode == "leader")
    old_pid = ensemble.pid(leader)
    ensemble.kill(leader)  # kill -9
    assert not ensemble.is_alive(leader)
    assert ensemble.status()[leader - 1].mode is None

    zk = connect(ensemble.connect_string())
    _until(
        "the two survivors accept a write", lambda: zk.create("/while-down", b"w", makepath=True)
    )
    assert zk.get("/while-down")[0] == b"w"
    survivors = ensemble.wait_ready()
    assert sum(s.mode == "leader" for s in survivors) == 1

    new_pid = ensemble.start_server(leader)
    assert new_pid != old_pid
    st = ensemble.wait_ready()
    assert st[leader - 1].alive and st[leader - 1].mode in SERVING_MODES[:2]
    assert sorted(s.mode or "" for s in st) == ["follower", "follower", "leader"]

    # the rejoined server serves the write it missed
    rejoined = connect(f"127.0.0.1:{ensemble.client_port(leader)}")
    _until("the rejoined server syncs", lambda: rejoined.sync("/while-down"))
    assert rejoined.get("/while-down")[0] == b"w"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"servers": 2}, "1 or 3 servers"),
        ({"servers": 0}, "1 or 3 servers"),
        ({"servers": 5}, "1 or 3 servers"),
        ({"base_port": 80}, "1024..65535"),
        ({"base_port": 65530}, "1024..65535"),
        ({"host": "localhost:2181"}, "an IP address"),
        ({"hosts": ["198.18.0.1", "198.18.0.2"]}, "one address per server"),
        ({"hosts": ["198.18.0.1", "h2", "198.18.0.3"]}, "an IP address"),
        ({"host": "127.0.0.1", "hosts": ["198.18.0.1"] * 3}, "host .* or hosts"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    tmp_path: Path, kwargs: dict, message: str
) -> None:
    args: dict = {"data_dir": tmp_path / "zk", "base_port": 20000, **kwargs}
    with pytest.raises(ValueError, match=message):
        Ensemble(**args)
    assert not (tmp_path / "zk").exists()


def test_unknown_or_running_server_numbers_are_refused(tmp_path: Path) -> None:
    ens = Ensemble(tmp_path / "zk", base_port=20000, servers=3)
    for n in (0, 4):
        with pytest.raises(ValueError, match=r"servers 1\.\.3"):
            ens.client_port(n)
        with pytest.raises(ValueError, match=r"servers 1\.\.3"):
            ens.kill(n)
    with pytest.raises(ValueError, match="not running"):
        ens.kill(1)
