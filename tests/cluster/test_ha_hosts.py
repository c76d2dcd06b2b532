"""High availability across hosts: a cluster on three network-namespace hosts.

Hosts h1, h2, h3 (198.18.0.1-3, cluster.netns) each run a ZooKeeper server and a
sequencer; replica 0's partitions run on h2, replica 1's on h3; CURVE is on. The load
(cluster.ledger, a client-side ledger) runs inside a fourth host, ``client``. Each
scenario from issue 12 injects its fault once transfers flow and ends with the checks
of tests/ha_checks.py: no acknowledged call lost, none applied twice, equal replica
hashes, equality with serial replay. The cluster's status (``ordo status --json``) is
read from inside the client host by one process that runs the command once a request
(one interpreter start-up a test instead of one a poll). These tests fail, never
skip, where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cluster.config import ClusterConfig
from cluster.ledger import Ledger
from cluster.netns import Hosts
from cluster.ordering_zk import ensure_secret
from cluster.security import ADMIN_CLIENT, create_keys, role_names
from cluster.zookeeper import Ensemble
from tests.ha_checks import check_outcome

HOSTS = ("h1", "h2", "h3", "client")
BASE_PORT = 21000
ACCOUNTS, START = 400, 10_000
TRANSFERS = 8_000
# A fault comes once the load has had this many transfers sequenced (the ledger opens
# the accounts in one call first): well under way, far from done.
FLOWING_TXNS = 1 + TRANSFERS // 16
ROOT = str(Path(__file__).resolve().parents[2])
STATUS_ANSWER_S = 60.0  # one `ordo status` (it waits 2 s for each silent sequencer)
# Inside the client host: for each line read, `ordo status --json` once, its exit code
# and output as one JSON line.
STATUS_LOOP = """
import json, sys
from click.testing import CliRunner
from cluster.cli import main
args = ["status", "--json", "--data-dir", sys.argv[1]]
for _ in sys.stdin:
    r = CliRunner().invoke(main, args)
    print(json.dumps([r.exit_code, r.stdout, r.output]), flush=True)
"""


class HostCluster:
    """Every role of the cluster as a process on its namespace host."""

    def __init__(self, net: Hosts, data_dir: Path) -> None:
        self.net = net
        names = ("h1", "h2", "h3")
        self.cfg = ClusterConfig(
            replicas=2,
            partitions=2,
            base_port=BASE_PORT,
            data_dir=str(data_dir),
            sequencers=3,
            zookeeper_servers=3,
            hosts={h: net.address(h) for h in HOSTS},
            sequencer_hosts=names,
            zookeeper_hosts=names,
            partition_hosts=(("h2", "h2"), ("h3", "h3")),
            curve=True,
        )
        self.cfg.save()
        create_keys(self.cfg.data_dir, role_names(self.cfg), [ADMIN_CLIENT])
        ensure_secret(self.cfg)
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self.status_probe: subprocess.Popen[str] | None = None
        self.ensemble = Ensemble(
            self.cfg.zookeeper_dir,
            self.cfg.zookeeper_base_port,
            servers=3,
            hosts=[net.address(h) for h in names],
            spawn=lambda n, argv, **kw: net.run(f"h{n}", argv, **kw),
            dial=net.dialer("client"),
        )

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def run_role(self, name: str, host: str, args: Sequence[str]) -> None:
        logs = Path(self.cfg.data_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            self.procs[name] = self.net.run(
                host,
                [sys.executable, "-m", "cluster.cli", *args, "--data-dir", self.cfg.data_dir],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
            )

    def start_sequencer(self, m: int) -> None:
        self.run_role(f"sequencer-{m}", f"h{m + 1}", ["sequencer", "--id", str(m)])

    def start(self) -> HostCluster:
        self.ensemble.start()
        self.ensemble.wait_ready()
        for m in range(3):
            self.start_sequencer(m)
        for r, host in ((0, "h2"), (1, "h3")):
            for p in range(2):
                self.run_role(
                    f"r{r}p{p}", host, ["replica", "--replica", str(r), "--partition", str(p)]
                )
        self.wait(lambda st: len(st.get("partitions", [])) == 4, "all partitions report")
        return self

    def client(self, args: Sequence[str], timeout_s: float = 240) -> str:
        """Run a command of this cluster inside the client host; its stdout."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.net.namespace("client"), sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=self._env(),
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def status(self) -> dict:
        """``ordo status --json`` run inside the client host (by ``STATUS_LOOP``)."""
        p = self.status_probe
        if p is None or p.poll() is not None:
            argv = [sys.executable, "-c", STATUS_LOOP, self.cfg.data_dir]
            p = self.status_probe = self.net.run(
                "client",
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=self._env(),
            )
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write("status\n")
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], STATUS_ANSWER_S)
        assert ready, f"no status within {STATUS_ANSWER_S}s"
        line = p.stdout.readline()
        assert line, f"the status process exited with {p.wait()}"
        code, out, shown = json.loads(line)
        assert code == 0, shown
        return dict(json.loads(out))

    def wait(self, cond: Callable[[dict], bool], what: str, timeout_s: float = 60) -> dict:
        deadline = time.monotonic() + timeout_s
        st: dict = {}
        while time.monotonic() < deadline:
            st = self.status()
            if "member" in st and cond(st):
                return st
            time.sleep(0.2)
        raise TimeoutError(f"not seen within {timeout_s}s: {what}; last status {st}")

    def leader(self) -> int:
        return int(self.wait(lambda st: st.get("role") == "leader", "a leader")["member"])

    def load(self, transfers: int, ledger_path: Path, open_accounts: bool) -> subprocess.Popen:
        args = [
            sys.executable,
            "-m",
            "cluster.ledger",
            "--data-dir",
            self.cfg.data_dir,
            "--accounts",
            str(ACCOUNTS),
            "--balance",
            str(START),
            "--transfers",
            str(transfers),
            "--out",
            str(ledger_path),
        ]
        if open_accounts:
            args.append("--open")
        return self.net.run("client", args, env=self._env(), stdout=subprocess.PIPE)

    def settled(self) -> dict:
        def done(st: dict) -> bool:
            parts = st["partitions"]
            return (
                st.get("role") == "leader"
                and st["pending"] == 0
                and len(parts) == 4
                and all(p["last_epoch"] == st["epoch"] and p["active"] == 0 for p in parts)
            )

        return self.wait(done, "every partition at the leader's epoch")

    def stop(self) -> None:
        for p in [*self.procs.values(), *filter(None, [self.status_probe])]:
            if p.poll() is None:
                Hosts.kill9(p)
        self.ensemble.stop()


@pytest.fixture
def host_cluster(
    make_hosts: Callable[[Sequence[str]], Hosts], tmp_path: Path
) -> Iterator[HostCluster]:
    net = make_hosts(HOSTS)
    hc = HostCluster(net, tmp_path / "data")
    try:
        yield hc.start()
    finally:
        hc.stop()


def run_scenario(
    hc: HostCluster,
    fault: Callable[[HostCluster], None],
    tmp_path: Path,
    new_term: bool = False,
) -> None:
    """Open accounts, start the ledgered load, inject ``fault`` once transfers flow,
    then check (``new_term``: the fault must have made another sequencer lead)."""
    ledger_path = tmp_path / "ledger.json"
    term = hc.wait(lambda st: st.get("role") == "leader", "a leader")["term"]
    load = hc.load(TRANSFERS, ledger_path, open_accounts=True)
    hc.wait(lambda st: st.get("txns_sequenced", 0) >= FLOWING_TXNS, "transfers flowing")
    assert load.poll() is None, "the load ended before the fault"
    fault(hc)
    out, _ = load.communicate(timeout=300)
    assert load.returncode == 0, out
    ledger = Ledger.from_json(ledger_path.read_text())
    st = hc.settled()
    check_outcome(hc.cfg, ledger, st, TRANSFERS)
    assert (st["term"] > term) == new_term, (term, st["term"])
    total = hc.client(
        [
            "-m",
            "cluster.cli",
            "call",
            "--data-dir",
            hc.cfg.data_dir,
            "bank.total",
            "0",
            str(ACCOUNTS),
        ]
    )
    assert json.loads(total)["value"] == ACCOUNTS * START


def test_a_leader_killed_with_kill9_is_replaced(host_cluster: HostCluster, tmp_path: Path) -> None:
    def kill_leader(hc: HostCluster) -> None:
        m = hc.leader()
        Hosts.kill9(hc.procs[f"sequencer-{m}"])
        hc.wait(lambda st: st["member"] != m and st["role"] == "leader", "a new leader")
        hc.start_sequencer(m)

    run_scenario(host_cluster, kill_leader, tmp_path, new_term=True)


def test_a_leader_cut_off_stops_committing_and_rejoins_as_follower(
    host_cluster: HostCluster, tmp_path: Path
) -> None:
    def cut_leader(hc: HostCluster) -> None:
        m = hc.leader()
        host = f"h{m + 1}"
        hc.net.link_down(host)
        try:
            hc.wait(lambda st: st["member"] != m and st["role"] == "leader", "a new leader")
            assert hc.procs[f"sequencer-{m}"].poll() is None  # still running, cut off
        finally:
            hc.net.link_up(host)
        hc.wait(
            lambda st: any(s["id"] == m and s["role"] == "follower" for s in st["sequencers"]),
            "the old leader following",
        )

    run_scenario(host_cluster, cut_leader, tmp_path, new_term=True)


def test_a_follower_killed_and_wiped_rejoins_from_a_peer(
    host_cluster: HostCluster, tmp_path: Path
) -> None:
    def wipe_follower(hc: HostCluster) -> None:
        m = (hc.leader() + 1) % 3
        Hosts.kill9(hc.procs[f"sequencer-{m}"])
        shutil.rmtree(hc.cfg.sequencer_log_dir(m).parent)
        time.sleep(1.5)
        hc.start_sequencer(m)

    run_scenario(host_cluster, wipe_follower, tmp_path)


def test_a_zookeeper_server_killed_changes_nothing_clients_see(
    host_cluster: HostCluster, tmp_path: Path
) -> None:
    def kill_zookeeper(hc: HostCluster) -> None:
        leader_host = hc.leader() + 1
        victim = leader_host % 3 + 1  # not the leader's own host's server
        hc.ensemble.kill(victim)
        time.sleep(2.0)
        hc.ensemble.start_server(victim)

    run_scenario(host_cluster, kill_zookeeper, tmp_path)


def test_a_client_without_keys_is_refused_across_hosts(host_cluster: HostCluster) -> None:
    hc = host_cluster
    script = (
        "import sys\n"
        "from txn_library.client import Client\n"
        "from txn_library.errors import OrdoError\n"
        f"c = Client({hc.cfg.client_addrs!r}, timeout_s=3, retry_s=0.5)\n"
        "try:\n"
        "    c.call('kv.put', 'k', 'intruder')\n"
        "    print('SERVED')\n"
        "except OrdoError as e:\n"
        "    print('REFUSED', type(e).__name__)\n"
        "c.close()\n"
    )
    assert hc.client(["-c", script]).startswith("REFUSED")
    got = hc.client(["-m", "cluster.cli", "call", "--data-dir", hc.cfg.data_dir, "kv.get", '"k"'])
    assert json.loads(got)["value"] is None
