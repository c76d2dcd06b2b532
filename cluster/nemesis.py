"""Nemesis: a seeded random schedule of faults against the HA cluster on namespace hosts.

The cluster is cluster.netns_cluster's HostCluster (3 ZooKeeper servers and 3
sequencers on h1-h3, replica 0's partitions on h2, replica 1's on h3, CURVE on, the
load on the ``client`` host). Under a ledgered bank-transfer load (``python -m
cluster.ledger`` in chunks of ``CHUNK_TRANSFERS``, one started at most every
``CHUNK_EVERY_S``, each drawn from its own seed; every answered call recorded
client-side, every unanswered one too, as outcome unknown) it applies a schedule of
faults, then heals everything, lets the cluster settle and checks it (``check_run``).

The schedule (``make_schedule``) is a pure function of (seed, duration): a list of
faults, each a start event and an end event ``(time_s, action, target)``:

  kill9 / restart        SIGKILL a sequencer (``sequencer:leader`` or
                         ``sequencer:follower``, resolved when the fault starts) or a
                         partition (``r<R>p<P>``); restarted with the same command
                         after a drawn 1-6 s, as the launcher's supervisor restarts a
                         role
  sigstop / sigcont      SIGSTOP a sequencer, a partition or a ZooKeeper server
                         (``zk<N>``) for a drawn 1-8 s
  link_down / link_up    cut host ``h<K>`` off the bridge for a drawn 3-15 s (its
                         ZooKeeper server, its sequencer and the partitions on it)
  zk_kill / zk_restart   SIGKILL ZooKeeper server ``zk<N>``, restart it on its data
                         after a drawn 2-10 s

Faults start a drawn 2-10 s apart and every fault ends within the run. Survivability
rules, checked for every fault against those still open when it starts:
  - at most ``OPEN_FAULTS_MAX`` (2) faults open at once, never two on one target
    (a process killed while stopped would have nothing to continue);
  - at most one ZooKeeper server impaired (killed, stopped or cut off): a quorum of 2
    of 3 always serves;
  - at most one sequencer impaired: 2 of 3 are reachable, so one can lead;
  - at least one replica with none of its partitions impaired: a multi-partition
    transfer needs every partition of one replica (they exchange reads), so one
    partition down in each replica stalls the cluster as surely as both replicas of
    one partition;
  - the client host is never cut: it is the observer, not part of the cluster.
A leader stopped or cut off is a fault like any other: the survivors elect a new one
and the old one must rejoin as a follower. The cluster has no readers, so none is
targeted.

A partition restarted after kill -9 is impaired until it has caught up (its
checkpoint, then the log since), which the schedule cannot know: so before a fault
that impairs a replica's partitions starts, the run waits (at most ``GATE_WAIT_S``)
until every partition of the other replica reports live, and a wait that runs out is
a finding (``replicas_live_before_faults``). End events keep their fault's drawn
length. The cluster writes a checkpoint every ``CHECKPOINT_EVERY_EPOCHS``, as an
operator would run it, so that catching up takes seconds, not a replay from genesis.

Invariants of a run: every fault's end event is applied (heal), and ``heal_all``
undoes whatever is still impaired before the checks, also after an error; a role that
exits without being killed is restarted (as the supervisor would) and counted; every
event is printed as applied, with the process it resolved to. TPC-C is not part of the
load: its driver (tpcc.driver) drives one sequencer address without CURVE or failover,
and the cluster layer may not import tpcc (lint-imports), see ``TPCC_LEFT_OUT``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from subprocess import SubprocessError
from typing import Any

from cluster.history_checks import check_history, record
from cluster.ledger import Ledger
from cluster.netns import Hosts, NetnsError
from cluster.netns_cluster import (
    PARTITIONS,
    REPLICA_HOSTS,
    SERVER_HOSTS,
    ClusterCommandError,
    HostCluster,
    partition_name,
    sequencer_host,
)
from executor.deterministic.oracle import SerialExecutor
from txn_library.errors import OK, invariant

ACCOUNTS, START_BALANCE = 400, 10_000
CHUNK_TRANSFERS = 1_500  # transfers of one cluster.ledger process
CHUNK_TIMEOUT_S = 900.0  # a chunk still running after this is a wedged load
CHUNK_EVERY_S = 4.0  # chunks start at most this often: a modest load on a shared machine
OPEN_FAULTS_MAX = 2
GAP_S = (2.0, 10.0)  # between fault starts
DURATION_S = {"kill9": (1.0, 6.0), "sigstop": (1.0, 8.0), "link": (3.0, 15.0), "zk": (2.0, 10.0)}
KIND_WEIGHTS = {"kill9": 3, "sigstop": 3, "link": 2, "zk": 2}
END_ACTION = {"kill9": "restart", "sigstop": "sigcont", "link": "link_up", "zk": "zk_restart"}
START_ACTION = {"kill9": "kill9", "sigstop": "sigstop", "link": "link_down", "zk": "zk_kill"}
SEQUENCER_ROLES = ("sequencer:leader", "sequencer:follower")
ZK_SERVERS = tuple(f"zk{n}" for n in range(1, len(SERVER_HOSTS) + 1))
PARTITION_TARGETS = tuple(
    partition_name(r, p) for r in range(len(REPLICA_HOSTS)) for p in range(PARTITIONS)
)
LEADER_WAIT_S = 15.0  # a fault on "the leader" waits this long for one to be seen
GATE_WAIT_S = 180.0  # a partition fault waits this long for the other replica to be live
GATE_POLL_S = 1.0
CHECKPOINT_EVERY_EPOCHS = 200
SETTLE_S_MIN = 120.0  # after healing: partitions restarted late replay the log
TPCC_LEFT_OUT = (
    "TPC-C not run: tpcc.driver drives one sequencer address with no CURVE and no "
    "failover (a leader change stalls it), and cluster/ may not import tpcc"
)
invariant(0 < GAP_S[0] <= GAP_S[1], "fault starts move forward")
invariant(
    DURATION_S.keys() == KIND_WEIGHTS.keys() == START_ACTION.keys() == END_ACTION.keys(),
    "every fault kind has a length, a weight, a start and an end",
)
invariant(all(0 < lo <= hi for lo, hi in DURATION_S.values()), "every fault lasts a while")
invariant(CHUNK_EVERY_S < CHUNK_TIMEOUT_S, "a chunk's pacing is within its timeout")


# --- the schedule: a pure function of (seed, duration) ----------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str  # kill9 | sigstop | link | zk
    target: str  # sequencer:leader | sequencer:follower | r<R>p<P> | zk<N> | h<K>
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Event:
    at_s: float
    action: str
    target: str
    fault: int  # index of the fault this event starts or ends


@dataclass(frozen=True)
class Impairment:
    """What one fault takes away while it is open."""

    zookeepers: frozenset[int]
    sequencers: int
    partitions: frozenset[tuple[int, int]]


def candidates(kind: str) -> tuple[str, ...]:
    """Every target a fault of ``kind`` may pick, in a fixed order."""
    if kind == "kill9":
        return (*SEQUENCER_ROLES, *PARTITION_TARGETS)
    if kind == "sigstop":
        return (*SEQUENCER_ROLES, *PARTITION_TARGETS, *ZK_SERVERS)
    if kind == "link":
        return SERVER_HOSTS
    if kind == "zk":
        return ZK_SERVERS
    raise ValueError(f"unknown fault kind {kind!r}")


def impairment(target: str) -> Impairment:
    """What ``target`` being down, stopped or cut off takes away."""
    none: frozenset[Any] = frozenset()
    if target in SEQUENCER_ROLES:
        return Impairment(none, 1, none)
    if target in ZK_SERVERS:
        return Impairment(frozenset({int(target[2:])}), 0, none)
    if target in PARTITION_TARGETS:
        return Impairment(none, 0, frozenset({(int(target[1]), int(target[3]))}))
    if target in SERVER_HOSTS:
        k = SERVER_HOSTS.index(target)
        parts = frozenset(
            (r, p) for r, h in enumerate(REPLICA_HOSTS) if h == target for p in range(PARTITIONS)
        )
        return Impairment(frozenset({k + 1}), 1, parts)
    raise ValueError(f"unknown target {target!r}")


def survivable(targets: list[str]) -> bool:
    """Whether the cluster serves with every one of ``targets`` impaired at once (the
    rules of the module docstring)."""
    if len(targets) > OPEN_FAULTS_MAX or len(set(targets)) < len(targets):
        return False
    imps = [impairment(t) for t in targets]
    zk = [n for i in imps for n in i.zookeepers]
    parts = {rp for i in imps for rp in i.partitions}
    replicas_hit = {r for r, _p in parts}
    whole_replica = len(replicas_hit) < len(REPLICA_HOSTS)
    return len(zk) <= 1 and sum(i.sequencers for i in imps) <= 1 and whole_replica


def make_schedule(seed: int, duration_s: float) -> list[Fault]:
    """The faults of a run of ``duration_s`` seconds drawn from ``seed`` (module
    docstring): a pure function of its arguments."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    t = 0.0
    while True:
        t += rng.uniform(*GAP_S)
        open_targets = [f.target for f in faults if f.end_s > t]
        choices = {
            kind: [c for c in candidates(kind) if survivable([*open_targets, c])]
            for kind in KIND_WEIGHTS
        }
        kinds = [k for k in KIND_WEIGHTS if choices[k]]
        if not kinds:  # as many faults open as allowed: wait for the first to end
            t = min(f.end_s for f in faults if f.end_s > t)
            continue
        kind = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0]
        target = rng.choice(choices[kind])
        length = rng.uniform(*DURATION_S[kind])
        if t + length > duration_s:
            return faults
        faults.append(Fault(kind, target, round(t, 2), round(t + length, 2)))


def events_of(faults: list[Fault]) -> list[Event]:
    """Start and end events of ``faults`` in time order (an end before a start at the
    same instant)."""
    out = []
    for i, f in enumerate(faults):
        out.append(Event(f.start_s, START_ACTION[f.kind], f.target, i))
        out.append(Event(f.end_s, END_ACTION[f.kind], f.target, i))
    return sorted(out, key=lambda e: (e.at_s, e.action not in END_ACTION.values(), e.fault))


def open_faults_at(faults: list[Fault], t: float) -> list[Fault]:
    return [f for f in faults if f.start_s <= t < f.end_s]


# --- applying it to a running cluster ---------------------------------------------------


@dataclass
class Applied:
    at_s: float  # since the schedule started, when it was applied
    planned_s: float
    action: str
    target: str
    resolved: str  # the process or host it acted on
    note: str = ""


class Nemesis:
    """Applies events to ``hc``; remembers what is impaired so ``heal_all`` can undo it."""

    def __init__(self, hc: HostCluster, log: Callable[[str], None]) -> None:
        self.hc = hc
        self.log = log
        self.by_fault: dict[int, str] = {}  # fault -> process name or host it resolved to
        self.killed: set[str] = set()  # role names and zk<N>, down by our hand
        self.stopped: set[str] = set()
        self.cut: set[str] = set()
        self.unasked_exits: list[dict[str, Any]] = []
        self.gate_timeouts: list[dict[str, Any]] = []

    # resolving role targets ---------------------------------------------------------

    def _sequencer_roles(self) -> tuple[int | None, list[int]]:
        """(the leader's member id or None, the other members), from one status."""
        try:
            st = self.hc.wait(lambda s: s.get("role") == "leader", "a leader", LEADER_WAIT_S)
        except (TimeoutError, ClusterCommandError):
            return None, list(range(self.hc.cfg.sequencers))
        leader = int(st["member"])
        return leader, [m for m in range(self.hc.cfg.sequencers) if m != leader]

    def resolve(self, ev: Event) -> tuple[str, str]:
        """The process name (or host) ``ev`` acts on, and a note."""
        if ev.fault in self.by_fault:
            return self.by_fault[ev.fault], ""
        note = ""
        name = ev.target
        if ev.target in SEQUENCER_ROLES:
            leader, others = self._sequencer_roles()
            if ev.target == "sequencer:leader" and leader is not None:
                m = leader
            else:
                m = others[ev.fault % len(others)]
                if leader is None:
                    note = "no leader seen"
            name = f"sequencer-{m}"
        self.by_fault[ev.fault] = name
        return name, note

    # actions --------------------------------------------------------------------------

    def _group(self, name: str) -> int:
        if name.startswith("zk"):
            pid = self.hc.ensemble.pid(int(name[2:]))
            if pid is None:
                raise ValueError(f"{name} has no process")
            return pid
        return self.hc.procs[name].pid

    def restart(self, name: str) -> None:
        if name.startswith("sequencer-"):
            self.hc.start_sequencer(int(name.split("-")[1]))
        elif name.startswith("zk"):
            self.hc.ensemble.start_server(int(name[2:]))
        else:
            self.hc.start_partition(int(name[1]), int(name[3]))

    def act(self, action: str, name: str) -> None:
        if action in ("kill9", "zk_kill"):
            if name.startswith("zk"):
                self.hc.ensemble.kill(int(name[2:]))
            else:
                Hosts.kill9(self.hc.procs[name])
            self.killed.add(name)
        elif action in ("restart", "zk_restart"):
            self.restart(name)
            self.killed.discard(name)
        elif action == "sigstop":
            os.killpg(self._group(name), signal.SIGSTOP)
            self.stopped.add(name)
        elif action == "sigcont":
            try:
                os.killpg(self._group(name), signal.SIGCONT)
            except ProcessLookupError:  # gone: nothing left to continue
                pass
            self.stopped.discard(name)
        elif action == "link_down":
            self.hc.net.link_down(name)
            self.cut.add(name)
        elif action == "link_up":
            self.hc.net.link_up(name)
            self.cut.discard(name)
        else:
            raise ValueError(f"unknown action {action!r}")

    def apply(self, ev: Event, started: float) -> Applied:
        name, note = self.resolve(ev)
        at = time.monotonic() - started
        self.act(ev.action, name)
        where = self._where(name)
        a = Applied(round(at, 2), ev.at_s, ev.action, ev.target, name, note)
        shown = name if name == ev.target else f"{ev.target} -> {name}"
        self.log(f"[{at:7.1f}s] {ev.action:<10} {shown}{where}{' (' + note + ')' if note else ''}")
        return a

    @staticmethod
    def _where(name: str) -> str:
        if name.startswith("sequencer-"):
            return f" on {sequencer_host(int(name.split('-')[1]))}"
        if name.startswith("zk"):
            return f" on {SERVER_HOSTS[int(name[2:]) - 1]}"
        if name in PARTITION_TARGETS:
            return f" on {REPLICA_HOSTS[int(name[1])]}"
        return ""

    def replica_live(self, st: dict, r: int) -> bool:
        """Whether every partition of replica ``r`` reports, from its current process,
        that it has caught up."""
        parts = {p["partition"]: p for p in st.get("partitions", []) if p["replica"] == r}
        return all(
            p in parts
            and not parts[p]["down"]
            and not parts[p]["catching_up"]
            and parts[p]["pid"] == self.hc.procs[partition_name(r, p)].pid
            for p in range(self.hc.cfg.partitions)
        )

    def gate(self, ev: Event, started: float) -> None:
        """Before ``ev`` impairs a replica's partitions: wait until every other replica
        is live (at most GATE_WAIT_S; a wait that runs out is recorded)."""
        if ev.action not in START_ACTION.values():
            return
        hit = {r for r, _p in impairment(ev.target).partitions}
        if not hit:
            return
        others = [r for r in range(self.hc.cfg.replicas) if r not in hit]
        t = time.monotonic()
        while True:
            try:
                st = self.hc.status()
            except ClusterCommandError:
                st = {}
            if all(self.replica_live(st, r) for r in others):
                break
            if time.monotonic() - t > GATE_WAIT_S:
                at = round(time.monotonic() - started, 2)
                self.gate_timeouts.append({"at_s": at, "before": asdict(ev)})
                self.log(f"[{at:7.1f}s] replica(s) {others} not live after {GATE_WAIT_S}s")
                return
            self.restart_unasked_exits(started)
            time.sleep(GATE_POLL_S)
        waited = time.monotonic() - t
        if waited > 1.0:
            self.log(f"[{time.monotonic() - started:7.1f}s] waited {waited:.1f}s for {others}")

    def restart_unasked_exits(self, started: float) -> None:
        """A role that exited though nobody killed it is restarted, as the launcher's
        supervisor would, and recorded."""
        for name, p in list(self.hc.procs.items()):
            if p.poll() is None or name in self.killed:
                continue
            at = round(time.monotonic() - started, 2)
            self.unasked_exits.append({"at_s": at, "role": name, "returncode": p.returncode})
            self.log(f"[{at:7.1f}s] {name} exited by itself ({p.returncode}): restarted")
            self.restart(name)
        for n in range(1, self.hc.cfg.zookeeper_servers + 1):
            if f"zk{n}" not in self.killed and not self.hc.ensemble.is_alive(n):
                at = round(time.monotonic() - started, 2)
                self.unasked_exits.append({"at_s": at, "role": f"zk{n}", "returncode": None})
                self.log(f"[{at:7.1f}s] zk{n} exited by itself: restarted")
                self.hc.ensemble.start_server(n)

    def heal_all(self) -> list[str]:
        """Undo everything still impaired; what was undone."""
        done = []
        for name in sorted(self.stopped):
            self.act("sigcont", name)
            done.append(f"sigcont {name}")
        for host in sorted(self.cut):
            self.act("link_up", host)
            done.append(f"link_up {host}")
        for name in sorted(self.killed):
            self.act("restart", name)
            done.append(f"restart {name}")
        return done


# --- the load -----------------------------------------------------------------------


@dataclass
class LoadRun:
    """Chunks of ledgered transfers run back to back until ``stop`` is set."""

    hc: HostCluster
    work: Path
    seed: int
    stop: threading.Event = field(default_factory=threading.Event)
    ledgers: list[Path] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    def open_accounts(self) -> None:
        path = self.work / "ledger-open.json"
        p = self.hc.load(path, 0, ACCOUNTS, START_BALANCE, open_accounts=True)
        out, _ = p.communicate(timeout=CHUNK_TIMEOUT_S)
        if p.returncode != 0:
            raise ClusterCommandError(f"opening the accounts failed: {out!r}")

    def _chunk(self, i: int) -> None:
        path = self.work / f"ledger-{i:04d}.json"
        seed = self.seed * 100_000 + i
        p = self.hc.load(path, CHUNK_TRANSFERS, ACCOUNTS, START_BALANCE, False, seed)
        try:
            out, _ = p.communicate(timeout=CHUNK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            Hosts.kill9(p)
            self.errors.append(f"chunk {i}: no end within {CHUNK_TIMEOUT_S}s (killed)")
            return
        if p.returncode != 0 or not path.exists():
            self.errors.append(f"chunk {i}: exit {p.returncode}: {out!r}")
            return
        self.ledgers.append(path)

    def _loop(self) -> None:
        i = 0
        while not self.stop.is_set():
            t = time.monotonic()
            self._chunk(i)
            i += 1
            self.stop.wait(max(0.0, t + CHUNK_EVERY_S - time.monotonic()))

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="nemesis-load", daemon=True)
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def ledger(self) -> Ledger:
        merged = Ledger()
        for path in self.ledgers:
            one = Ledger.from_json(path.read_text())
            clash = merged.acked.keys() & one.acked.keys()
            invariant(not clash, f"{len(clash)} (client, request) ids in two chunks")
            merged.acked.update(one.acked)
            merged.failed.extend(one.failed)
        return merged


# --- the checks ---------------------------------------------------------------------


def check_run(hc: HostCluster, ledger: Ledger, st: dict) -> dict[str, dict[str, Any]]:
    """The ledger, the logs and the replicas against each other, and the money (each
    check a name with ok and a detail)."""
    checks, serial = check_history(hc.cfg, ledger, st)
    _check_money(checks, hc, serial, ledger)
    return checks


def _check_money(
    checks: dict[str, dict[str, Any]], hc: HostCluster, serial: SerialExecutor, ledger: Ledger
) -> None:
    """Money conserved (live ``bank.total`` and the replay's), and each account's balance
    equal to its opening balance plus the ledger's acknowledged transfers (accounts that
    an unanswered call touched are left out: its outcome is unknown)."""
    want = ACCOUNTS * START_BALANCE
    try:
        live: Any = hc.call("bank.total", "0", str(ACCOUNTS))
    except ClusterCommandError as e:
        live = f"bank.total failed: {e}"
    rows = [serial.storage.get("account", (a,)) for a in range(ACCOUNTS)]
    balances = [None if row is None else int(row[0]) for row in rows]
    replayed = sum(b for b in balances if b is not None)
    record(checks, "money_conserved", live == want == replayed, f"live {live}, replay {replayed}")
    unknown: set[int] = set()
    for text in ledger.failed:  # "(src, dst, amount): Error: ..."
        src, dst, _amount = (int(x) for x in text[1 : text.index(")")].split(","))
        unknown.update((src, dst))
    expect = [START_BALANCE] * ACCOUNTS
    for (src, dst, amount), status in ledger.acked.values():
        if status == OK and src != dst:
            expect[src] -= amount
            expect[dst] += amount
    off = [a for a in range(ACCOUNTS) if a not in unknown and balances[a] != expect[a]]
    record(
        checks,
        "balances_equal_ledger",
        not off,
        f"{ACCOUNTS - len(unknown)} accounts compared, {len(off)} differ",
    )


# --- a whole run ---------------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


def run_nemesis(
    net: Hosts,
    work: Path,
    duration_s: float,
    seed: int,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Start the cluster on ``net`` (started Hosts with netns_cluster.HOSTS), open the
    accounts, run the load under ``make_schedule(seed, duration_s)``, heal, settle and
    check. The result (schedule, applied events, load, checks, ``ok``) as JSON-ready
    data; the cluster's logs stay under ``work``/data/logs."""
    log = log or say
    faults = make_schedule(seed, duration_s)
    events = events_of(faults)
    result: dict[str, Any] = {
        "seed": seed,
        "duration_s": duration_s,
        "rules": {"open_faults_max": OPEN_FAULTS_MAX, "gap_s": GAP_S, "durations_s": DURATION_S},
        "schedule": [asdict(e) for e in events],
        "tpcc": TPCC_LEFT_OUT,
        "data_dir": str(work / "data"),
    }
    log(f"nemesis: seed {seed}, {duration_s:g}s, {len(faults)} faults ({len(events)} events)")
    hc = HostCluster(net, work / "data", checkpoint_every_epochs=CHECKPOINT_EVERY_EPOCHS)
    nemesis = Nemesis(hc, log)
    load = LoadRun(hc, work, seed)
    applied: list[Applied] = []
    t0 = time.monotonic()
    try:
        hc.start()
        load.open_accounts()
        log(f"cluster up and accounts open in {time.monotonic() - t0:.0f}s; faults start")
        load.start()
        started = time.monotonic()
        began: dict[int, float] = {}  # fault -> when its start event was applied
        for ev in events:
            due = ev.at_s
            if ev.fault in began:  # an end event keeps the drawn length of its fault
                f = faults[ev.fault]
                due = max(due, began[ev.fault] + f.end_s - f.start_s)
            while time.monotonic() - started < due:
                nemesis.restart_unasked_exits(started)
                time.sleep(min(0.2, max(0.0, due - (time.monotonic() - started))))
            nemesis.gate(ev, started)
            a = nemesis.apply(ev, started)
            began.setdefault(ev.fault, a.at_s)
            applied.append(a)
        while time.monotonic() - started < duration_s:
            nemesis.restart_unasked_exits(started)
            time.sleep(0.2)
        result["healed"] = nemesis.heal_all()
        nemesis.restart_unasked_exits(started)
        log(f"[{time.monotonic() - started:7.1f}s] schedule over: healed; load finishing")
        load.finish()
        result.update(settle_and_check(hc, load, nemesis, duration_s, log))
    except (TimeoutError, ClusterCommandError, NetnsError, OSError, SubprocessError) as e:
        # the run could not go on (a wedged cluster, a host that broke): a result too
        result["error"] = f"{type(e).__name__}: {e}"
        result["ok"] = False
        log(f"nemesis stopped: {result['error']}")
    finally:
        result["applied"] = [asdict(a) for a in applied]
        result["counts"] = dict(Counter(a.action for a in applied))
        result["unasked_exits"] = nemesis.unasked_exits
        result["gate_timeouts"] = nemesis.gate_timeouts
        result["load_errors"] = load.errors
        result["wall_s"] = round(time.monotonic() - t0, 1)
        try:
            nemesis.heal_all()
        finally:
            load.stop.set()
            hc.stop()
    return result


def settle_and_check(
    hc: HostCluster,
    load: LoadRun,
    nemesis: Nemesis,
    duration_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Wait for the cluster to settle (a wedged one fails here), then run the checks."""
    ledger = load.ledger()
    out: dict[str, Any] = {
        "acked": len(ledger.acked),
        "acked_ok": sum(1 for _t, s in ledger.acked.values() if s == OK),
        "failed": len(ledger.failed),
        "failed_sample": ledger.failed[:5],
        "chunks": len(load.ledgers),
    }
    checks: dict[str, dict[str, Any]] = {}
    record(checks, "load_chunks_completed", not load.errors, "; ".join(load.errors[:5]))
    record(
        checks,
        "replicas_live_before_faults",
        not nemesis.gate_timeouts,
        json.dumps(nemesis.gate_timeouts[:5]),
    )
    record(
        checks,
        "no_role_exited_unasked",
        not nemesis.unasked_exits,
        json.dumps(nemesis.unasked_exits[:10]),
    )
    t = time.monotonic()
    try:
        st = hc.settled(timeout_s=max(SETTLE_S_MIN, duration_s / 3))
    except (TimeoutError, ClusterCommandError) as e:
        record(checks, "settled", False, str(e)[:2000])
        out["checks"] = checks
        out["ok"] = False
        return out
    record(checks, "settled", True, f"in {time.monotonic() - t:.1f}s at epoch {st['epoch']}")
    out["final_status"] = {k: st.get(k) for k in ("member", "term", "epoch", "txns_sequenced")}
    log(f"settled at epoch {st['epoch']} (term {st['term']}); checking")
    checks.update(check_run(hc, ledger, st))
    out["checks"] = checks
    out["ok"] = all(c["ok"] for c in checks.values())
    return out


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The final summary a person reads: counts per action, the load, every check."""
    counts = result.get("counts", {})
    lines = [
        f"seed {result['seed']}, {result['duration_s']:g}s of faults, wall {result['wall_s']}s",
        "events applied: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        f"transfers: {result.get('acked', '?')} acknowledged ({result.get('acked_ok', '?')} "
        f"committed, the rest aborted for funds), {result.get('failed', '?')} unanswered "
        f"(outcome unknown), {result.get('chunks', '?')} ledger chunks",
    ]
    for name, c in result.get("checks", {}).items():
        lines.append(f"  {'ok  ' if c['ok'] else 'FAIL'} {name}: {c['detail']}")
    if "error" in result:
        lines.append(f"stopped early: {result['error']}")
    lines.append(f"{result['tpcc']}")
    lines.append("RESULT: " + ("PASS" if result.get("ok") else "FAIL"))
    return lines
