"""Hosts built from Linux network namespaces (cluster.netns), and ZooKeeper across them.

- Hosts reach each other over TCP on their 198.18.0.x addresses, which exist in no
  other namespace; a host cut off with link_down neither reaches nor is reached while
  its process keeps running (and still reaches itself); after link_up both ways work.
- close() kills every process started on the hosts (also one that left its process
  group) and leaves no namespace and no new interface behind; kill9 kills one process.
- A build that fails halfway is torn down; namespaces of a dead run are swept, those of
  a live one are left alone; bad host names are refused.
- Three ZooKeeper servers, one per host, elect a leader; a kazoo client running inside
  a client host writes and reads; the leader's host cut off stops serving while the
  other two elect and serve; healed, it rejoins as a follower with the writes it missed.

Where namespaces cannot be made (not root, no ip), these tests fail with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import cluster.netns as netns
from cluster.netns import Hosts, NetnsError, namespace_names, sweep_stale
from cluster.zookeeper import (
    SERVING_MODES,
    ZOOKEEPER_JAR,
    Ensemble,
    four_letter_word,
    mode_of,
)
from tests.process_checks import gone
from txn_library import limits

MakeHosts = Callable[[Sequence[str]], Hosts]
PORT = 7000  # every host has a port space of its own
CUT_TIMEOUT_S = 0.5  # a connection attempt that a cut link must leave unanswered
HEALED_TIMEOUT_S = 5.0  # a connection over a healthy link (covers one lost SYN)
DEADLINE_S = 20.0

# Accepts connections forever; answers each with what it read, prefixed by its address.
ECHO_SERVER = r"""
import socket, sys
addr = sys.argv[1]
s = socket.socket()
s.bind((addr, int(sys.argv[2])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    with c:
        c.sendall(addr.encode() + b":" + c.recv(64))
"""


def _echo_server(net: Hosts, host: str) -> subprocess.Popen[bytes]:
    p = net.run(
        host,
        [sys.executable, "-c", ECHO_SERVER, net.address(host), str(PORT)],
        stdout=subprocess.PIPE,
    )
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"  # it listens
    return p


def _echo(net: Hosts, src: str, dst: str, timeout_s: float = HEALED_TIMEOUT_S) -> bytes:
    """Connect from ``src`` to ``dst``'s echo server; its answer."""
    with net.connect(src, (net.address(dst), PORT), timeout_s) as s:
        s.sendall(b"ping")
        return s.recv(64)


def _unreachable(net: Hosts, src: str, dst: str) -> bool:
    """True if a connection from ``src`` to ``dst`` gets no answer at all (a refused
    connection would mean packets still pass)."""
    try:
        _echo(net, src, dst, timeout_s=CUT_TIMEOUT_S)
    except ConnectionRefusedError:
        return False
    except OSError:  # timed out, or no route to host once ARP gave up
        return True
    return False


def _root_interfaces() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return sorted(line.split(":")[1].strip() for line in out.stdout.splitlines())


def _root_addresses() -> str:
    return subprocess.run(
        ["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout


def _until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} within {DEADLINE_S}s")


def _ours(net: Hosts) -> list[str]:
    return [n for n in namespace_names() if n.startswith(net.prefix)]


def test_hosts_reach_each_other_and_a_cut_host_is_isolated_until_healed(
    make_hosts: MakeHosts,
) -> None:
    root_before = _root_interfaces()
    net = make_hosts(["h1", "h2", "h3"])
    assert [net.address(h) for h in net.names] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert sorted(_ours(net)) == sorted(net.prefix + n for n in ("h1", "h2", "h3", "sw"))
    # the addresses exist only inside the hosts' namespaces
    assert _root_interfaces() == root_before
    assert "198.18." not in _root_addresses()

    servers = {h: _echo_server(net, h) for h in ("h1", "h2")}
    assert _echo(net, "h2", "h1") == b"198.18.0.1:ping"
    assert _echo(net, "h1", "h2") == b"198.18.0.2:ping"
    assert _echo(net, "h3", "h1") == b"198.18.0.1:ping"

    net.link_down("h1")
    assert _unreachable(net, "h2", "h1")  # h1 is not reached
    assert _unreachable(net, "h3", "h1")
    assert _unreachable(net, "h1", "h2")  # and reaches no one
    assert servers["h1"].poll() is None  # while its process keeps running
    assert _echo(net, "h1", "h1") == b"198.18.0.1:ping"  # and serving locally
    assert _echo(net, "h3", "h2") == b"198.18.0.2:ping"  # the others are unaffected

    net.link_up("h1")
    assert _echo(net, "h2", "h1") == b"198.18.0.1:ping"
    assert _echo(net, "h1", "h2") == b"198.18.0.2:ping"


def test_close_kills_every_process_and_deletes_every_namespace(require_netns: None) -> None:
    root_before = _root_interfaces()
    net = Hosts(["h1", "h2"]).start()
    try:
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        on_h1 = net.run("h1", sleeper)
        on_h2 = net.run("h2", sleeper)
        # a grandchild that leaves the process group: only the namespace still holds it
        escaper = net.run(
            "h2",
            ["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 & echo $!; exec sleep 600"],
            stdout=subprocess.PIPE,
        )
        assert escaper.stdout is not None
        escaped_pid = int(escaper.stdout.readline())
        assert not gone(escaped_pid)

        net.kill9(on_h1)  # one process, the others run on
        assert on_h1.returncode == -9
        assert on_h2.poll() is None and escaper.poll() is None
    finally:
        net.close()
    assert on_h2.returncode == -9
    assert escaper.returncode == -9
    _until("the escaped grandchild is killed", lambda: gone(escaped_pid))
    assert _ours(net) == []
    assert _root_interfaces() == root_before
    net.close()  # closing twice is harmless
    with pytest.raises(ValueError, match="start the Hosts"):
        net.run("h1", ["true"])


def test_a_build_that_fails_halfway_is_torn_down(
    require_netns: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_ip = netns._ip
    calls: list[tuple[str, ...]] = []

    def failing_ip(*args: str) -> str:
        calls.append(args)
        if "addr" in args and args[1].endswith("-h2"):
            raise NetnsError("planted failure adding h2's address")
        return real_ip(*args)

    monkeypatch.setattr(netns, "_ip", failing_ip)
    net = Hosts(["h1", "h2", "h3"])
    with pytest.raises(NetnsError, match="planted"):
        net.start()
    assert any(a[:2] == ("netns", "add") and a[2].endswith("-h2") for a in calls)
    assert _ours(net) == []


def test_stale_namespaces_of_a_dead_run_are_swept_and_a_live_runs_are_kept(
    require_netns: None,
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netns.NAME_PREFIX}{dead.pid}-1-h1"
    live = f"{netns.NAME_PREFIX}{os.getppid()}-1-h1"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    left_running = subprocess.Popen(
        ["ip", "netns", "exec", stale, sys.executable, "-c", "import time; time.sleep(600)"]
    )
    try:
        _until("the process runs inside", lambda: str(left_running.pid) in _pids(stale))
        with Hosts(["h1"]) as net:  # starting sweeps
            assert stale not in namespace_names()
            assert live in namespace_names()
            assert net.prefix + "h1" in namespace_names()
        assert left_running.wait(timeout=limits.netns_process_exit_timeout_s) == -9
        assert sweep_stale() == []
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        left_running.kill()
        left_running.wait()


def _pids(name: str) -> list[str]:
    return subprocess.run(
        ["ip", "netns", "pids", name], capture_output=True, text=True, check=True
    ).stdout.split()


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "1..64 are allowed"),
        ([f"h{i}" for i in range(limits.netns_hosts_max + 1)], "1..64 are allowed"),
        (["sw"], "not 'sw'"),
        (["H1"], "a lowercase letter"),
        (["h-1"], "a lowercase letter"),
        (["averyveryverylongname"], "a lowercase letter"),
        (["h1", "h1"], "repeat"),
    ],
)
def test_bad_host_names_are_refused_before_anything_is_built(
    names: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Hosts(names)


def test_unknown_hosts_and_foreign_session_settings_are_refused(make_hosts: MakeHosts) -> None:
    net = make_hosts(["h1"])
    with pytest.raises(ValueError, match="unknown host 'h9'"):
        net.run("h9", ["true"])
    with pytest.raises(ValueError, match="unknown host"):
        net.link_down("h9")
    with pytest.raises(ValueError, match="session of their own"):
        net.run("h1", ["true"], start_new_session=False)
    with pytest.raises(ValueError, match="started once"):
        net.start()


# --- ZooKeeper, one server per host ------------------------------------------------

ZK_BASE_PORT = 2181  # the same on every host: each namespace has its own ports

# A kazoo client inside a namespace: creates argv[2] = argv[3], then prints (as JSON)
# the values of the paths that follow, each read after a sync.
KAZOO_CLIENT = r"""
import json, sys
from kazoo.client import KazooClient
hosts, path, value, *reads = sys.argv[1:]
zk = KazooClient(hosts=hosts, timeout=4.0)
zk.start(timeout=15)
zk.create(path, value.encode(), makepath=True)
out = {}
for p in reads:
    zk.sync(p)
    out[p] = zk.get(p)[0].decode()
zk.stop()
zk.close()
print(json.dumps(out))
"""


def _kazoo_in(net: Hosts, host: str, hosts: str, path: str, value: str, *reads: str) -> dict:
    p = net.run(
        host,
        [sys.executable, "-c", KAZOO_CLIENT, hosts, path, value, *reads],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = p.communicate(timeout=DEADLINE_S)
    assert p.returncode == 0, err.decode()
    return json.loads(out)


def test_zookeeper_one_server_per_host_survives_its_leaders_host_cut_off(
    make_hosts: MakeHosts, tmp_path: Path
) -> None:
    if not ZOOKEEPER_JAR.exists():
        pytest.fail(f"ZooKeeper is not installed ({ZOOKEEPER_JAR}): run scripts/setup.sh")
    net = make_hosts(["zk1", "zk2", "zk3", "client"])
    ens = Ensemble(
        tmp_path / "zk",
        ZK_BASE_PORT,
        hosts=[net.address(f"zk{n}") for n in (1, 2, 3)],
        spawn=lambda n, argv, **kw: net.run(f"zk{n}", argv, **kw),
        dial=net.dialer("client"),
    )
    try:
        _elect_write_cut_and_heal(net, ens)
    finally:
        ens.stop()


def _elect_write_cut_and_heal(net: Hosts, ens: Ensemble) -> None:
    assert ens.connect_string() == "198.18.0.1:2181,198.18.0.2:2184,198.18.0.3:2187"
    assert "server.2=198.18.0.2:2185:2186" in ens.zoo_cfg(1)
    ens.start()
    st = ens.wait_ready()
    assert sorted(s.mode or "" for s in st) == ["follower", "follower", "leader"]
    leader = next(s.server for s in st if s.mode == "leader")
    survivors = [n for n in (1, 2, 3) if n != leader]

    every = ens.connect_string()
    got = _kazoo_in(net, "client", every, "/ordo/probe", "before", "/ordo/probe")
    assert got == {"/ordo/probe": "before"}

    net.link_down(f"zk{leader}")

    def cut_leader_mode() -> str | None:
        reply = four_letter_word(  # asked from the cut host itself, which still runs
            ens.address(leader), ens.client_port(leader), "srvr", 1.0, net.dialer(f"zk{leader}")
        )
        return mode_of(reply)

    _until("the cut-off leader stops serving", lambda: cut_leader_mode() not in SERVING_MODES)
    assert ens.is_alive(leader)
    after = ens.wait_ready(servers=survivors)
    assert sorted(s.mode or "" for s in after) == ["follower", "leader"]
    got = _kazoo_in(
        net, "client", ens.connect_string(survivors), "/ordo/cut", "w", "/ordo/probe", "/ordo/cut"
    )
    assert got == {"/ordo/probe": "before", "/ordo/cut": "w"}

    net.link_up(f"zk{leader}")
    healed = ens.wait_ready()
    assert healed[leader - 1].mode == "follower"
    assert sorted(s.mode or "" for s in healed) == ["follower", "follower", "leader"]
    # the healed server serves the write it missed, to a client in this process whose
    # connections are made from the client host
    zk = ens.client(servers=[leader])
    zk.start(timeout=DEADLINE_S)
    try:
        zk.sync("/ordo/cut")
        assert zk.get("/ordo/cut")[0] == b"w"
    finally:
        zk.stop()
        zk.close()
