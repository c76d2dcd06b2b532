"""A replicated (HA) cluster on network-namespace hosts: every role a process on its host.

Hosts h1, h2, h3 (cluster.netns) each run a ZooKeeper server (server n on hn) and a
sequencer (member m on h(m+1)); replica 0's partitions run on h2, replica 1's on h3;
CURVE is on. Clients (the ledgered load, ``ordo`` commands, the status probe) run
inside a fourth host, ``client``. Used by tests/cluster/test_ha_hosts.py (one fault per
scenario) and cluster/nemesis.py (a seeded schedule of many).

Invariants:
- Role ``name`` logs to ``data_dir/logs/<name>.log`` (appended across restarts) and is
  started by ``run_role`` with the same command every time, as the launcher's
  supervisor restarts a role; ``procs[name]`` is its newest process.
- The cluster's status (``ordo status --json``) is read from inside the client host by
  one process that runs the command once a request (``STATUS_LOOP``): one interpreter
  start-up per cluster instead of one per poll.
- ``stop()`` kills every role process, the status probe and the ZooKeeper servers; the
  Hosts' own ``close()`` remains the backstop for anything else inside the namespaces.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cluster.config import ClusterConfig
from cluster.netns import Hosts
from cluster.ordering_zk import ensure_secret
from cluster.security import ADMIN_CLIENT, create_keys, role_names
from cluster.zookeeper import Ensemble

SERVER_HOSTS = ("h1", "h2", "h3")  # a ZooKeeper server and a sequencer each
CLIENT_HOST = "client"
HOSTS = (*SERVER_HOSTS, CLIENT_HOST)
REPLICA_HOSTS = ("h2", "h3")  # replica r's partitions run on REPLICA_HOSTS[r]
PARTITIONS = 2
BASE_PORT = 21000
ROOT = str(Path(__file__).resolve().parents[1])
STATUS_ANSWER_S = 60.0  # one `ordo status` (it waits 2 s for each silent sequencer)
START_WAIT_S = 60.0
CLIENT_COMMAND_TIMEOUT_S = 240.0
STATUS_POLL_S = 0.2
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


class ClusterCommandError(RuntimeError):
    """A command run inside the client host (``ordo status``, ``ordo call``) failed or
    did not answer; the message carries its output."""


def sequencer_host(member: int) -> str:
    return SERVER_HOSTS[member]


def partition_name(replica: int, partition: int) -> str:
    return f"r{replica}p{partition}"


class HostCluster:
    """Every role of the cluster as a process on its namespace host."""

    def __init__(
        self,
        net: Hosts,
        data_dir: Path,
        base_port: int = BASE_PORT,
        checkpoint_every_epochs: int = 0,
    ) -> None:
        self.net = net
        self.cfg = ClusterConfig(
            replicas=len(REPLICA_HOSTS),
            partitions=PARTITIONS,
            base_port=base_port,
            data_dir=str(data_dir),
            sequencers=len(SERVER_HOSTS),
            zookeeper_servers=len(SERVER_HOSTS),
            hosts={h: net.address(h) for h in HOSTS},
            sequencer_hosts=SERVER_HOSTS,
            zookeeper_hosts=SERVER_HOSTS,
            partition_hosts=tuple((h,) * PARTITIONS for h in REPLICA_HOSTS),
            curve=True,
            checkpoint_every_epochs=checkpoint_every_epochs,
        )
        self.cfg.save()
        create_keys(self.cfg.data_dir, role_names(self.cfg), [ADMIN_CLIENT])
        ensure_secret(self.cfg)
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self.status_probe: subprocess.Popen[str] | None = None
        self.ensemble = Ensemble(
            self.cfg.zookeeper_dir,
            self.cfg.zookeeper_base_port,
            servers=len(SERVER_HOSTS),
            hosts=[net.address(h) for h in SERVER_HOSTS],
            spawn=lambda n, argv, **kw: net.run(SERVER_HOSTS[n - 1], argv, **kw),
            dial=net.dialer(CLIENT_HOST),
        )

    @property
    def logs_dir(self) -> Path:
        return Path(self.cfg.data_dir) / "logs"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def run_role(self, name: str, host: str, args: Sequence[str]) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with open(self.logs_dir / f"{name}.log", "ab") as out:
            self.procs[name] = self.net.run(
                host,
                [sys.executable, "-m", "cluster.cli", *args, "--data-dir", self.cfg.data_dir],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
            )

    def start_sequencer(self, m: int) -> None:
        self.run_role(f"sequencer-{m}", sequencer_host(m), ["sequencer", "--id", str(m)])

    def start_partition(self, r: int, p: int) -> None:
        args = ["replica", "--replica", str(r), "--partition", str(p)]
        self.run_role(partition_name(r, p), REPLICA_HOSTS[r], args)

    def start(self) -> HostCluster:
        self.ensemble.start()
        self.ensemble.wait_ready()
        for m in range(self.cfg.sequencers):
            self.start_sequencer(m)
        for r in range(self.cfg.replicas):
            for p in range(self.cfg.partitions):
                self.start_partition(r, p)
        parts = self.cfg.replicas * self.cfg.partitions
        self.wait(lambda st: len(st.get("partitions", [])) == parts, "all partitions report")
        return self

    def client(self, args: Sequence[str], timeout_s: float = CLIENT_COMMAND_TIMEOUT_S) -> str:
        """Run ``python ARGS`` inside the client host; its stdout (ClusterCommandError if
        it exits non-zero)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.net.namespace(CLIENT_HOST), sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=self.env(),
        )
        if out.returncode != 0:
            raise ClusterCommandError(f"{args}: exit {out.returncode}: {out.stdout}{out.stderr}")
        return out.stdout

    def call(self, proc: str, *args: str) -> Any:
        """``ordo call PROC ARGS`` from the client host; the answer's value."""
        argv = ["-m", "cluster.cli", "call", "--data-dir", self.cfg.data_dir, proc, *args]
        return json.loads(self.client(argv))["value"]

    def status(self) -> dict:
        """``ordo status --json`` run inside the client host (by ``STATUS_LOOP``)."""
        p = self.status_probe
        if p is None or p.poll() is not None:
            argv = [sys.executable, "-c", STATUS_LOOP, self.cfg.data_dir]
            p = self.status_probe = self.net.run(
                CLIENT_HOST,
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=self.env(),
            )
        if p.stdin is None or p.stdout is None:
            raise ClusterCommandError("the status probe has no pipes")
        p.stdin.write("status\n")
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], STATUS_ANSWER_S)
        if not ready:
            raise ClusterCommandError(f"no status within {STATUS_ANSWER_S}s")
        line = p.stdout.readline()
        if not line:
            raise ClusterCommandError(f"the status process exited with {p.wait()}")
        code, out, shown = json.loads(line)
        if code != 0:
            raise ClusterCommandError(f"ordo status: exit {code}: {shown}")
        return dict(json.loads(out))

    def wait(
        self, cond: Callable[[dict], bool], what: str, timeout_s: float = START_WAIT_S
    ) -> dict:
        deadline = time.monotonic() + timeout_s
        st: dict = {}
        while time.monotonic() < deadline:
            st = self.status()
            if "member" in st and cond(st):
                return st
            time.sleep(STATUS_POLL_S)
        raise TimeoutError(f"not seen within {timeout_s}s: {what}; last status {st}")

    def leader(self) -> int:
        return int(self.wait(lambda st: st.get("role") == "leader", "a leader")["member"])

    def load(
        self,
        ledger_path: Path,
        transfers: int,
        accounts: int,
        balance: int,
        open_accounts: bool,
        seed: int = 7,
    ) -> subprocess.Popen[Any]:
        """``python -m cluster.ledger`` inside the client host (its stdout piped): open
        the accounts first with ``open_accounts``, run ``transfers`` drawn from ``seed``,
        write the ledger to ``ledger_path``."""
        args = [
            sys.executable,
            "-m",
            "cluster.ledger",
            "--data-dir",
            self.cfg.data_dir,
            "--accounts",
            str(accounts),
            "--balance",
            str(balance),
            "--transfers",
            str(transfers),
            "--seed",
            str(seed),
            "--out",
            str(ledger_path),
        ]
        if open_accounts:
            args.append("--open")
        return self.net.run(CLIENT_HOST, args, env=self.env(), stdout=subprocess.PIPE)

    def settled(self, timeout_s: float = START_WAIT_S) -> dict:
        """The status once a leader reports nothing pending and every partition of every
        replica at its epoch with nothing active."""
        parts_n = self.cfg.replicas * self.cfg.partitions

        def done(st: dict) -> bool:
            parts = st["partitions"]
            return (
                st.get("role") == "leader"
                and st["pending"] == 0
                and len(parts) == parts_n
                and all(p["last_epoch"] == st["epoch"] and p["active"] == 0 for p in parts)
            )

        return self.wait(done, "every partition at the leader's epoch", timeout_s)

    def stop(self) -> None:
        for p in [*self.procs.values(), *filter(None, [self.status_probe])]:
            if p.poll() is None:
                Hosts.kill9(p)
        self.ensemble.stop()
