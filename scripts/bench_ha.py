"""Benchmark: what the replicated ordering layer (issue 12) costs and how fast it fails over.

Two parts, both on real local clusters (every process on this machine):

failover   ``ordo up --ha``'s layout (cluster.cli.ha_layout: 3 ZooKeeper servers, 3
           sequencers on 127.0.0.1-3, CURVE on), 2 replicas x 2 partitions, bank
           accounts opened. The load generator (cluster/loadgen.py) runs a closed loop
           of transfers from several client identities, each given every sequencer's
           address (it fails over between them, as txn_library.client does); every
           call's submit and answer time is kept. The leader is killed with SIGKILL
           under that load. Measured, from the kill:
             elected       the first status poll (every --poll-ms) in which a survivor
                           reports itself leader of a higher term;
             first commit  the first batch of the new term in the new leader's log: its
                           timestamp_ms (the batch is cut at that instant and published
                           only after ZooKeeper's quorum write, a few ms later);
             seen          the first poll in which the new leader's epoch reached it;
             by connection whether a survivor removed the dead leader from the election
                           (its connections closed: sequencer.member) or its
                           ZooKeeper session expired first;
           and on the client side: the longest gap between consecutive answers (all
           clients together, and the worst single client), the latency of the calls
           that were in flight at the kill (max), and errors. The killed sequencer is
           restarted and waited for (caught up as a follower) before the next run.

soak       ``ordo up --ha``'s layout as for failover, no fault: a saturating closed loop
           of transfers (--soak-clients x --soak-in-flight) for --soak-s seconds, every
           sequencer's status polled every --soak-poll-s. Counted: elections during the
           run (the leader's term at the end minus at the start: every election claims
           a term, so a busy leader deposed shows here; 0 expected), the leaders seen,
           dead leaders removed by the connection path (none: nobody dies), answers/s,
           the longest gap between answers, errors. Then the replicas settle.

overhead   Throughput and p50/p99 latency of bank transfers (cluster.bank_load, closed
           loop) and of TPC-C New Order (tpcc.driver's load loop, 100% New Order), on
           the same replicas x partitions with the durable log on, with one sequencer
           (ClusterConfig) and with the replicated ordering layer (ha_layout), the two
           alternating in one run (the order flips every pair). The load generator has
           no CURVE, so the replicated arm runs ha_layout with curve off: this measures
           the ordering layer (ZooKeeper commit before publication), not encryption
           (scripts/bench_curve.py measures CURVE). The load goes to the leader's
           client address (leader_status). One cluster per arm serves both workloads:
           tpcc genesis, then accounts opened through the log, transfers, then TPC-C.
           After each workload the replicas must settle with equal state hashes and no
           determinism violation.

Writes bench_ha.json and bench_ha.png to the scratch directory (scripts/bench_outputs.py),
or with ``--publish`` to results/ha/ (``--out`` names the JSON), and prints a table. The
machine is shared: numbers move with its load (load averages are recorded).

    .venv/bin/python scripts/bench_ha.py --runs 5 --pairs 3
    .venv/bin/python scripts/bench_ha.py --parts soak --soak-s 600
    .venv/bin/python scripts/bench_ha.py --parts failover --publish \
        --out results/ha/bench_ha_failover.json

Invariants: every process a part starts is stopped when it ends, on error too
(LocalCluster.stop in ``finally``; SIGTERM and SIGINT become exceptions so the
``finally`` blocks run); every cluster has its own free port range and temporary data
directory; a failed run is recorded with its error, never silently dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_outputs import BenchParser, wrote  # noqa: E402

from cluster.bank_load import run_transfers  # noqa: E402
from cluster.commands.run import ha_layout  # noqa: E402
from cluster.config import ClusterConfig  # noqa: E402
from cluster.launcher import (  # noqa: E402
    LocalCluster,
    cluster_client,
    free_base_port,
    leader_status,
    sequencer_statuses,
    wait_quiescent,
)
from cluster.load_background import Background  # noqa: E402
from cluster.load_shapes import Call, ClosedLoop  # noqa: E402
from cluster.loadgen import TIMEOUT_CODE, LoadGenerator  # noqa: E402
from cluster.measure import CpuMeter, latency_percentiles_ms, process_cpu_s  # noqa: E402
from cluster.security import ADMIN_CLIENT, client_curves  # noqa: E402
from sequencer.log import iter_frames  # noqa: E402
from txn_library import limits  # noqa: E402
from txn_library.client import Client  # noqa: E402
from txn_library.client.protocol import Result, to_outcome  # noqa: E402
from txn_library.errors import CallFailed, CallTimeout, OrdoError  # noqa: E402
from txn_library.wire import sequencer as wire  # noqa: E402
from txn_library.workloads.bank import make_transfers, open_accounts  # noqa: E402

REPLICAS, PARTITIONS = 2, 2
ACCOUNTS = 1_000
START_BALANCE = 1_000_000
QUANTILES = (0.50, 0.99)
CLUSTER_START_S = 240.0  # a TPC-C cluster's partitions generate their rows at start
SETTLE_S = 120.0
FAILOVER_WAIT_S = 30.0  # a run without a new leader's commit by then failed
REJOIN_WAIT_S = 60.0


class Interrupted(Exception):
    """SIGTERM or SIGINT: unwind so every cluster is stopped."""


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(f"signal {signum}")


# --- Clusters ----------------------------------------------------------------------------


def ha_config(base: ClusterConfig, curve: bool) -> ClusterConfig:
    """``ordo up --ha``'s layout over ``base``; ``curve`` False for the load generator."""
    return replace(ha_layout(base), curve=curve)


@contextmanager
def data_dir(prefix: str, keep_under: str | None) -> Iterator[str]:
    """A fresh temporary directory, removed afterwards unless ``keep_under`` (then it is
    made there and kept, for a look at the processes' logs)."""
    if keep_under is None:
        with tempfile.TemporaryDirectory(prefix=f"ordo-bench-ha-{prefix}") as tmp:
            yield tmp
        return
    Path(keep_under).mkdir(parents=True, exist_ok=True)
    yield tempfile.mkdtemp(prefix=prefix, dir=keep_under)


@contextmanager
def running(cfg: ClusterConfig, wait_s: float = CLUSTER_START_S) -> Iterator[LocalCluster]:
    """A started cluster, stopped (every process, ZooKeeper too) however the block ends."""
    lc = LocalCluster(cfg)
    try:
        lc.start(wait_s=wait_s)
        yield lc
    finally:
        lc.stop()


def leader_address(cfg: ClusterConfig, timeout_s: float = 30.0) -> str:
    """The client address of the sequencer that leads (the only one if not replicated)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = leader_status(cfg, timeout_s=1.0)
        if st is not None:
            return cfg.client_addr_of(int(st.get("member", 0)))
        time.sleep(0.05)
    raise TimeoutError("no sequencer leads")


def settle(cfg: ClusterConfig, address: str) -> dict:
    """Wait until every replica applied everything; check hashes agree and no
    determinism violation. Returns the leader's status."""
    with cluster_client(cfg, address, timeout_s=10) as c:
        st = wait_quiescent(c, cfg.replicas, cfg.partitions, timeout_s=SETTLE_S)
    hashes: dict[int, set[str]] = {}
    for p in st["partitions"]:
        hashes.setdefault(p["partition"], set()).add(p["state_hash"])
    if any(len(h) != 1 for h in hashes.values()):
        raise AssertionError(f"replicas' state hashes differ: {hashes}")
    if st["determinism_violations"]:
        raise AssertionError(f"{st['determinism_violations']} determinism violations")
    return st


# --- Failover ----------------------------------------------------------------------------


@dataclass
class Answer:
    """One call as its client saw it (time.perf_counter seconds)."""

    client: int
    submitted: float
    answered: float
    outcome: str  # "ok", "aborted" or the name of the error a Client would raise


def outcome_of(status: int, value: Any) -> str:
    """A result entry as ``Answer.outcome`` names it."""
    out = to_outcome(status, value, 0.0)
    if isinstance(out, Result):
        return "ok" if out.ok else "aborted"
    if isinstance(out, CallFailed) and out.code == TIMEOUT_CODE:
        return CallTimeout.__name__
    return type(out).__name__


class ClosedLoopClients:
    """``clients`` client identities of one load generator, each failing over between
    every sequencer (CURVE keys when the cluster runs CURVE) with ``in_flight``
    transfers outstanding, resubmitting from ``transfers`` round robin until ``stop``.
    Every answer is kept (``answers``), and every connection's move (``moves``:
    (time.perf_counter, address))."""

    def __init__(
        self,
        cfg: ClusterConfig,
        transfers: list[tuple[int, int, int]],
        clients: int,
        in_flight: int,
    ) -> None:
        self.answers: list[Answer] = []  # appended on the load's thread, read after stop
        self.moves: list[tuple[float, str]] = []
        self.failovers = 0
        shares = [transfers[i::clients] for i in range(clients)]
        submitted = [0] * clients

        def next_transfer(client: int) -> Call:
            share = shares[client]
            t = share[submitted[client] % len(share)]
            submitted[client] += 1
            return Call("bank.transfer", t, "transfer")

        curve = client_curves(cfg, ADMIN_CLIENT) if cfg.curve else None
        self._load = Background(
            lambda source: LoadGenerator(
                cfg.client_addrs,
                source,
                ClosedLoop(terminals=clients, in_flight_per_terminal=in_flight),
                connections=clients,  # terminal i is client i, on connection i
                timeout_s=60.0,
                failover=True,
                curve=curve,
            ),
            next_transfer,
        )

    def start(self) -> None:
        self._load.start(on_answer=self._answered, on_move=self._moved)

    def stop(self, drain_s: float = 90.0) -> None:
        self._load.stop(timeout_s=drain_s)
        self.failovers = self._load.failovers

    def _answered(
        self, client: int, _call: Any, status: int, value: Any, submitted: float, answered: float
    ) -> None:
        self.answers.append(Answer(client, submitted, answered, outcome_of(status, value)))

    def _moved(self, at: float, _connection: int, address: str) -> None:
        self.moves.append((at, address))


@dataclass
class Poll:
    """One status answer of a surviving sequencer, seconds after the kill."""

    at_s: float
    member: int
    role: str
    term: int
    epoch: int


def poll_takeover(
    cfg: ClusterConfig,
    survivors: list[int],
    pollers: dict[int, Client],
    killed_at: float,
    old_term: int,
    poll_s: float,
) -> list[Poll]:
    """Poll the survivors' status every ``poll_s`` until one leads a higher term and has
    committed a batch since it was first seen leading (or FAILOVER_WAIT_S passes)."""
    polls: list[Poll] = []
    first_seen_epoch: int | None = None
    deadline = killed_at + FAILOVER_WAIT_S
    while time.perf_counter() < deadline:
        next_at = time.perf_counter() + poll_s
        for m in survivors:
            try:
                st = pollers[m].status(timeout_s=1.0)
            except CallTimeout:  # a late reply would pair with the next request: reconnect
                pollers[m].close()
                pollers[m] = cluster_client(cfg, cfg.client_addr_of(m), timeout_s=5.0)
                continue
            p = Poll(
                round(time.perf_counter() - killed_at, 4),
                m,
                str(st.get("role")),
                int(st.get("term", 0)),
                int(st.get("epoch", 0)),
            )
            polls.append(p)
            if p.role == "leader" and p.term > old_term:
                if first_seen_epoch is None:
                    first_seen_epoch = p.epoch
                elif p.epoch > first_seen_epoch:
                    return polls
        time.sleep(max(0.0, next_at - time.perf_counter()))
    return polls


def first_batch_of_term(
    cfg: ClusterConfig, member: int, term_above: int, from_epoch: int
) -> tuple[int, int, int] | None:
    """(epoch, term, timestamp_ms) of the first batch in ``member``'s log with a term
    above ``term_above``, looking from ``from_epoch``."""
    for epoch, data in iter_frames(cfg.sequencer_log_dir(member), first_epoch=max(1, from_epoch)):
        b = wire.decode_batch(data)
        if b.term > term_above:
            return epoch, b.term, b.timestamp_ms
    return None


def last_local_epoch(cfg: ClusterConfig, member: int) -> int:
    last = 0
    for epoch, _data in iter_frames(cfg.sequencer_log_dir(member)):
        last = epoch
    return last


def wait_all_following(cfg: ClusterConfig, timeout_s: float = REJOIN_WAIT_S) -> dict:
    """Every sequencer answers, one leads, each follower holds the leader's epoch
    locally (the load is stopped, so the leader's epoch stands still). Returns the
    leader's status."""
    deadline = time.monotonic() + timeout_s
    last: list[dict | None] = []
    while time.monotonic() < deadline:
        last = sequencer_statuses(cfg, timeout_s=1.0)
        leaders = [s for s in last if s is not None and s.get("role") == "leader"]
        if all(s is not None for s in last) and len(leaders) == 1:
            epoch = leaders[0]["epoch"]
            if all(s is not None and s.get("local_last_epoch", -1) >= epoch for s in last):
                return leaders[0]
        time.sleep(0.1)
    raise TimeoutError(f"the sequencers did not all follow one leader: {last}")


def client_side(answers: list[Answer], killed_at: float, clients: int) -> dict[str, Any]:
    """Stalls and latencies the clients saw around the kill (seconds)."""
    ok = [a for a in answers if a.outcome in ("ok", "aborted")]
    times = sorted(a.answered for a in ok)
    gaps = [(b - a, a) for a, b in zip(times, times[1:], strict=False) if b >= killed_at]
    gap, gap_from = max(gaps) if gaps else (float("nan"), float("nan"))
    per_client = []
    for i in range(clients):
        ts = sorted(a.answered for a in ok if a.client == i)
        g = [b - a for a, b in zip(ts, ts[1:], strict=False) if b >= killed_at]
        per_client.append(max(g) if g else float("nan"))
    in_flight = [a.answered - a.submitted for a in ok if a.submitted <= killed_at < a.answered]
    after = [a.answered for a in ok if a.answered > killed_at]
    before = [a for a in ok if killed_at - 2.0 <= a.answered <= killed_at]
    return {
        "longest_answer_gap_s": round(gap, 4),
        "longest_gap_starts_s": round(gap_from - killed_at, 4),
        "longest_answer_gap_one_client_s": round(max(per_client), 4),
        "in_flight_at_kill": len(in_flight),
        "max_latency_in_flight_at_kill_s": round(max(in_flight), 4) if in_flight else None,
        "max_latency_after_kill_s": round(
            max((a.answered - a.submitted for a in ok if a.answered > killed_at), default=0.0),
            4,
        ),
        "first_answer_after_kill_s": round(min(after) - killed_at, 4) if after else None,
        "answers_per_s_before_kill": round(len(before) / 2.0, 1),
        "answered": len(ok),
        "errors": sum(1 for a in answers if a.outcome not in ("ok", "aborted")),
    }


def one_failover(
    lc: LocalCluster, transfers: list[tuple[int, int, int]], a: argparse.Namespace
) -> dict[str, Any]:
    cfg = lc.config
    old = wait_all_following(cfg)
    old_member, old_term = int(old["member"]), int(old["term"])
    survivors = [m for m in range(cfg.sequencers) if m != old_member]
    pollers = {m: cluster_client(cfg, cfg.client_addr_of(m), timeout_s=5.0) for m in survivors}
    load = ClosedLoopClients(cfg, transfers, a.clients, a.in_flight)
    try:
        removed_before = 0
        for m in survivors:  # connected (and CURVE handshake done) before the kill
            removed_before += int(pollers[m].status(timeout_s=5.0).get("dead_leaders_removed", 0))
        load.start()
        time.sleep(a.warmup)
        killed_wall = time.time()
        killed_at = time.perf_counter()
        lc.kill(LocalCluster.sequencer_name(cfg, old_member))
        polls = poll_takeover(cfg, survivors, pollers, killed_at, old_term, a.poll_ms / 1000.0)
        time.sleep(a.after)  # clients back at full speed on the new leader
        watched_until = time.perf_counter()
        removed_after = sum(
            int(pollers[m].status(timeout_s=5.0).get("dead_leaders_removed", 0)) for m in survivors
        )
    finally:
        for p in pollers.values():
            p.close()
        load.stop()
    out: dict[str, Any] = {
        "old_leader": old_member,
        "old_term": old_term,
        # how the dead leader left the election: a survivor saw its connections close
        # (sequencer.member), or its ZooKeeper session expired
        "by_connection": removed_after > removed_before,
        "killed_at": time.strftime("%H:%M:%S", time.localtime(killed_wall))
        + f".{int(killed_wall * 1000) % 1000:03d}",
    }
    elected = next((p for p in polls if p.role == "leader" and p.term > old_term), None)
    if elected is None:
        out["error"] = f"no new leader within {FAILOVER_WAIT_S}s"
        return out
    old_last = last_local_epoch(cfg, old_member)
    first = first_batch_of_term(cfg, elected.member, old_term, old_last - 2)
    out.update(
        new_leader=elected.member,
        new_term=elected.term,
        old_leader_last_local_epoch=old_last,
        elected_s=elected.at_s,
        polls=len(polls),
    )
    if first is None:
        out["error"] = "the new leader's log has no batch of its term"
    else:
        epoch, _term, ts_ms = first
        seen = next(
            (
                p
                for p in polls
                if p.member == elected.member
                and p.role == "leader"
                and p.term > old_term
                and p.epoch >= epoch
            ),
            None,
        )
        out.update(
            first_new_epoch=epoch,
            first_commit_s=round(ts_ms / 1000.0 - killed_wall, 4),
            first_commit_seen_s=None if seen is None else seen.at_s,
        )
    out["client"] = client_side(load.answers, killed_at, a.clients)
    out["client_failovers"] = load.failovers
    member_of = {cfg.client_addr_of(m): m for m in range(cfg.sequencers)}
    out["client_moves"] = [  # (seconds after the kill, sequencer moved to)
        (round(t - killed_at, 3), member_of.get(addr, -1))
        for t, addr in load.moves
        if killed_at <= t <= watched_until
    ]
    restarted = time.monotonic()
    lc.start_sequencer(old_member)
    wait_all_following(cfg)
    out["rejoined_s"] = round(time.monotonic() - restarted, 2)
    return out


def _failover_config(tmp: str) -> ClusterConfig:
    """ha_layout's cluster with CURVE and fsync in ``tmp``: what failover and soak run."""
    return ha_config(
        ClusterConfig(
            replicas=REPLICAS,
            partitions=PARTITIONS,
            base_port=free_base_port(),
            data_dir=str(Path(tmp) / "data"),
            fsync=True,
        ),
        curve=True,
    )


def failover_part(a: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with data_dir("failover-", a.keep_data) as tmp:
        cfg = _failover_config(tmp)
        with running(cfg) as lc:
            with cluster_client(cfg, timeout_s=60) as c:
                open_accounts(c, ACCOUNTS, START_BALANCE)
            transfers = make_transfers(20_000, ACCOUNTS, PARTITIONS, a.multi, seed=11)
            for i in range(a.runs):
                try:
                    r = one_failover(lc, transfers, a)
                except (TimeoutError, AssertionError, OrdoError, RuntimeError) as e:
                    r = {"error": f"{type(e).__name__}: {e}"}
                r["run"] = i
                runs.append(r)
                log(f"failover run {i}: {_failover_line(r)}")
                if "error" in r and "client" not in r:
                    break  # the cluster is in an unknown state: stop here, keep the rest
            total = _bank_total(cfg)
    return {"runs": runs, "money_conserved": total == ACCOUNTS * START_BALANCE}


# --- Soak -------------------------------------------------------------------------------


class CountingClients(ClosedLoopClients):
    """ClosedLoopClients that keep counts and the longest gap between answers instead of
    every answer (a long saturating run answers millions of calls)."""

    def start(self) -> None:
        self.ok = self.errors = 0
        self.error_kinds: dict[str, int] = {}
        self.last_answer = time.perf_counter()
        self.longest_gap_s = 0.0
        super().start()

    def _answered(
        self, client: int, _call: Any, status: int, value: Any, submitted: float, answered: float
    ) -> None:
        outcome = outcome_of(status, value)
        if outcome in ("ok", "aborted"):
            self.ok += 1
            self.longest_gap_s = max(self.longest_gap_s, answered - self.last_answer)
            self.last_answer = max(self.last_answer, answered)
        else:
            self.errors += 1
            self.error_kinds[outcome] = self.error_kinds.get(outcome, 0) + 1


def soak_part(a: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    with data_dir("soak-", a.keep_data) as tmp:
        cfg = _failover_config(tmp)
        with running(cfg):
            with cluster_client(cfg, timeout_s=60) as c:
                open_accounts(c, ACCOUNTS, START_BALANCE)
            transfers = make_transfers(20_000, ACCOUNTS, PARTITIONS, a.multi, seed=13)
            start = wait_all_following(cfg)
            load = CountingClients(cfg, transfers, a.soak_clients, a.soak_in_flight)
            leaders: dict[int, int] = {int(start["term"]): int(start["member"])}
            removed = unanswered_polls = polls = 0
            load.start()
            t0 = next_log = time.perf_counter()
            try:
                while time.perf_counter() - t0 < a.soak_s:
                    time.sleep(a.soak_poll_s)
                    statuses = sequencer_statuses(cfg, timeout_s=2.0)
                    polls += 1
                    unanswered_polls += sum(1 for st in statuses if st is None)
                    for st in statuses:
                        if st is None:
                            continue
                        removed = max(removed, int(st.get("dead_leaders_removed", 0)))
                        if st.get("role") == "leader":
                            leaders.setdefault(int(st["term"]), int(st["member"]))
                    if time.perf_counter() >= next_log:
                        next_log += 60.0
                        log(
                            f"soak {time.perf_counter() - t0:.0f}s: {load.ok} answered, "
                            f"terms seen {sorted(leaders)}, longest gap "
                            f"{load.longest_gap_s:.3f}s, errors {load.errors}"
                        )
            finally:
                wall = time.perf_counter() - t0
                load.stop()
            end = wait_all_following(cfg)
            settle(cfg, cfg.client_addr_of(int(end["member"])))
            total = _bank_total(cfg)
    return {
        "soak_s": round(wall, 1),
        "clients": a.soak_clients,
        "in_flight_per_client": a.soak_in_flight,
        "term_start": int(start["term"]),
        "term_end": int(end["term"]),
        "elections": int(end["term"]) - int(start["term"]),
        "leaders_by_term": {str(t): m for t, m in sorted(leaders.items())},
        "dead_leaders_removed": removed,
        "answered": load.ok,
        "answers_per_s": round(load.ok / wall, 1),
        "longest_answer_gap_s": round(load.longest_gap_s, 4),
        "errors": load.errors,
        "error_kinds": load.error_kinds,
        "status_polls": polls,
        "unanswered_status_polls": unanswered_polls,
        "money_conserved": total == ACCOUNTS * START_BALANCE,
    }


def _bank_total(cfg: ClusterConfig) -> int | None:
    try:
        with cluster_client(cfg, timeout_s=30) as c:
            r = c.call("bank.total", 0, ACCOUNTS)
        return int(r.value) if r.ok else None
    except OrdoError:
        return None


def _failover_line(r: dict[str, Any]) -> str:
    if "client" not in r:
        return f"FAILED {r.get('error')}"
    c = r["client"]
    return (
        f"leader {r['old_leader']}->{r['new_leader']} (term {r['old_term']}->{r['new_term']}"
        f"{', by connection' if r.get('by_connection') else ', by session'}): "
        f"elected {r['elected_s']:.3f}s, first commit {r.get('first_commit_s')}s "
        f"(seen {r.get('first_commit_seen_s')}s); clients: longest gap "
        f"{c['longest_answer_gap_s']:.3f}s, max latency in flight at kill "
        f"{c['max_latency_in_flight_at_kill_s']}s, errors {c['errors']}; "
        f"rejoined in {r['rejoined_s']}s"
    )


# --- Overhead ----------------------------------------------------------------------------


def tpcc_config(a: argparse.Namespace, data_dir: str) -> tuple[ClusterConfig, Any]:
    from tpcc.driver import RunOptions, embedded_config

    opts = RunOptions(
        warehouses=a.warehouses,
        partitions=PARTITIONS,
        replicas=REPLICAS,
        fsync=True,
        mix="new-order",
        duration_s=a.tpcc_duration,
        warmup_s=a.tpcc_warmup,
        terminals=a.terminals,
        check=False,
        out=None,
        progress=False,
    )
    return embedded_config(opts, data_dir, free_base_port()), opts


def process_groups(lc: LocalCluster, leader: str) -> dict[str, list[int]]:
    """PIDs of the cluster's processes by role (ZooKeeper's servers too); ``leader`` is
    the leading sequencer's process name."""
    groups: dict[str, list[int]] = {
        "leader": [],
        "followers": [],
        "partitions": [],
        "zookeeper": [],
    }
    for name, p in lc.procs.items():
        if name == leader:
            groups["leader"].append(p.pid)
        else:
            groups["followers" if name.startswith("sequencer") else "partitions"].append(p.pid)
    if lc.ensemble is not None:
        groups["zookeeper"] = [p.pid for p in lc.ensemble.procs.values()]
    return groups


def _cpu_by_group(groups: dict[str, list[int]]) -> dict[str, float]:
    out = {g: sum(process_cpu_s(pid) or 0.0 for pid in pids) for g, pids in groups.items()}
    out["driver"] = time.process_time()
    return out


@contextmanager
def phase(lc: LocalCluster, address: str, into: dict[str, Any]) -> Iterator[None]:
    """Measure the block: wall seconds, epochs and sequenced txns (the leader's status),
    CPU seconds per role (this process is "driver"); stored in ``into["phase"]``."""
    with Client(address, timeout_s=10) as c:
        st0 = c.status(timeout_s=10)
    groups = process_groups(lc, LocalCluster.sequencer_name(lc.config, st0.get("member", 0)))
    cpu0 = _cpu_by_group(groups)
    t0 = time.perf_counter()
    yield
    wall = time.perf_counter() - t0
    cpu1 = _cpu_by_group(groups)
    with Client(address, timeout_s=10) as c:
        st1 = c.status(timeout_s=10)
    epochs = st1["epoch"] - st0["epoch"]
    txns = st1["next_txn_id"] - st0["next_txn_id"]
    cpu = {g: round(cpu1[g] - cpu0[g], 2) for g in cpu1}
    into["phase"] = {
        "wall_s": round(wall, 2),
        "epochs": epochs,
        "epochs_per_s": round(epochs / wall, 1),
        "txns_per_epoch": round(txns / epochs, 1) if epochs else None,
        "cpu_s": cpu,
        "cpu_share_of_all_cores": round(sum(cpu.values()) / (wall * (os.cpu_count() or 1)), 2),
    }


def transfer_run(
    lc: LocalCluster,
    address: str,
    n: int,
    clients: int,
    in_flight: int,
    multi: float,
    seed: int,
) -> dict[str, Any]:
    """``n`` transfers (``multi`` of them multi-partition), closed loop, ``clients`` x
    ``in_flight``; then the replicas settle."""
    transfers = make_transfers(n, ACCOUNTS, PARTITIONS, multi, seed)
    out: dict[str, Any] = {"transfers": n, "clients": clients, "in_flight_per_client": in_flight}
    with phase(lc, address, out):
        w = run_transfers(address, transfers, clients, in_flight)
    settle(lc.config, address)
    out.update(
        per_s=round(w.answered / w.measured_s, 1),
        latency_ms=w.percentiles_ms(QUANTILES),
        ok=w.ok,
        aborted=w.aborted,
        errors=w.errors,
        seconds=round(w.measured_s, 3),
    )
    return out


def one_arm(mode: str, a: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """One cluster (single sequencer or replicated): transfers, then TPC-C New Order."""
    from tpcc.driver import drive, summarize
    from tpcc.inputs import NEW_ORDER, TpccInputs

    with data_dir(f"{mode}-", a.keep_data) as tmp:
        base, opts = tpcc_config(a, str(Path(tmp) / "data"))
        cfg = ha_config(base, curve=False) if mode == "ha" else base
        out: dict[str, Any] = {"mode": mode, "loadavg_before": os.getloadavg()[0]}
        with running(cfg) as lc:
            addr = leader_address(cfg)
            with Client(addr, timeout_s=60) as c:
                open_accounts(c, ACCOUNTS, START_BALANCE)
            tr = out["transfers"] = transfer_run(
                lc, addr, a.transfers, a.clients_overhead, a.in_flight_overhead, a.multi, 1
            )
            light = out["transfers_light"] = transfer_run(
                lc, addr, a.transfers_light, a.clients_overhead, a.in_flight_light, a.multi, 2
            )
            inputs = TpccInputs(
                opts.warehouses,
                cfg.partitions,
                opts.seed,
                load_seed=opts.load_seed,
                mix=opts.mix,
                remote_line_pct=opts.remote_pct,
            )
            tp: dict[str, Any] = {}
            with phase(lc, addr, tp):  # warm-up, window and drain
                window = drive(addr, inputs, opts, lambda _line: None, CpuMeter({}))
            s = summarize(window, opts, cfg.partitions, cfg.replicas)
            st = settle(cfg, addr)
            out["tpcc"] = tp
            tp.update(
                {
                    "new_order_per_s": s["new_order_per_s"],
                    "txn_per_s": s["txn_per_s"],
                    "latency_ms": latency_percentiles_ms(
                        window.kinds[NEW_ORDER].latencies_s if NEW_ORDER in window.kinds else [],
                        QUANTILES,
                    ),
                    "rollbacks": s["new_order_rollbacks"],
                    "errors": s["errors"],
                    "unanswered": s["unanswered_after_drain"],
                    "measured_s": s["measured_s"],
                }
            )
            out["epochs"] = st["epoch"]
            lc.check_alive()
        out["loadavg_after"] = os.getloadavg()[0]
    log(
        f"{mode:>6}: transfers {tr['per_s']:,.0f}/s p50 {tr['latency_ms']['p50']} ms "
        f"p99 {tr['latency_ms']['p99']} ms; light load {light['per_s']:,.0f}/s p50 "
        f"{light['latency_ms']['p50']} ms p99 {light['latency_ms']['p99']} ms; "
        f"New Order {tp['new_order_per_s']:,.0f}/s p50 {tp['latency_ms']['p50']} ms "
        f"p99 {tp['latency_ms']['p99']} ms"
    )
    return out


def overhead_part(a: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    pairs: list[dict[str, Any]] = []
    for i in range(a.pairs):
        order = ["single", "ha"] if i % 2 == 0 else ["ha", "single"]
        pair: dict[str, Any] = {"pair": i, "order": order}
        for mode in order:
            try:
                pair[mode] = one_arm(mode, a, log)
            except (TimeoutError, AssertionError, OrdoError, RuntimeError) as e:
                pair[mode] = {"mode": mode, "error": f"{type(e).__name__}: {e}"}
                log(f"{mode:>6}: FAILED {pair[mode]['error']}")
        pairs.append(pair)
    return {"pairs": pairs}


# --- Summary, table, plot ----------------------------------------------------------------


def _mmm(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def summarize_failover(part: dict[str, Any]) -> dict[str, Any]:
    ok = [r for r in part["runs"] if "client" in r and "first_commit_s" in r]
    return {
        "runs_ok": len(ok),
        "runs": len(part["runs"]),
        "elected_s": _mmm([r["elected_s"] for r in ok]),
        "first_commit_s": _mmm([r["first_commit_s"] for r in ok]),
        "first_commit_seen_s": _mmm(
            [r["first_commit_seen_s"] for r in ok if r["first_commit_seen_s"] is not None]
        ),
        "longest_answer_gap_s": _mmm([r["client"]["longest_answer_gap_s"] for r in ok]),
        "longest_answer_gap_one_client_s": _mmm(
            [r["client"]["longest_answer_gap_one_client_s"] for r in ok]
        ),
        "max_latency_in_flight_at_kill_s": _mmm(
            [
                r["client"]["max_latency_in_flight_at_kill_s"]
                for r in ok
                if r["client"]["max_latency_in_flight_at_kill_s"] is not None
            ]
        ),
        "client_errors": sum(r["client"]["errors"] for r in ok),
        "money_conserved": part.get("money_conserved"),
    }


METRICS = (
    ("transfers/s", "transfers", "per_s", True),
    ("transfer p50 ms", "transfers", "p50", False),
    ("transfer p99 ms", "transfers", "p99", False),
    ("light transfers/s", "transfers_light", "per_s", True),
    ("light p50 ms", "transfers_light", "p50", False),
    ("light p99 ms", "transfers_light", "p99", False),
    ("New Order/s", "tpcc", "new_order_per_s", True),
    ("New Order p50 ms", "tpcc", "p50", False),
    ("New Order p99 ms", "tpcc", "p99", False),
)


def _metric(arm: dict[str, Any], group: str, key: str) -> float | None:
    g = arm.get(group)
    if g is None:
        return None
    if key in ("p50", "p99"):
        v = g["latency_ms"].get(key)
        return None if v is None else float(v)
    return float(g[key])


def summarize_overhead(part: dict[str, Any]) -> dict[str, Any]:
    """Per metric: each mode's values and median, and the median of the per-pair
    ratios ha/single (throughput: overhead = 1 - ratio; latency: ratio - 1)."""
    out: dict[str, Any] = {}
    for label, group, key, higher_better in METRICS:
        single, ha, ratios = [], [], []
        for p in part["pairs"]:
            s = _metric(p["single"], group, key) if "error" not in p["single"] else None
            h = _metric(p["ha"], group, key) if "error" not in p["ha"] else None
            if s is not None:
                single.append(s)
            if h is not None:
                ha.append(h)
            if s and h is not None:
                ratios.append(h / s)
        ratio = statistics.median(ratios) if ratios else None
        overhead = None
        if ratio is not None:
            overhead = 1.0 - ratio if higher_better else ratio - 1.0
        out[label] = {
            "single": single,
            "ha": ha,
            "single_median": statistics.median(single) if single else None,
            "ha_median": statistics.median(ha) if ha else None,
            "ha_over_single_median": None if ratio is None else round(ratio, 4),
            "overhead": None if overhead is None else round(overhead, 4),
        }
    return out


def phase_medians(part: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per workload and mode: medians over pairs of epochs/s, txns per epoch and CPU
    seconds per 1,000 sequenced txns of each role (where the time went)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for group in ("transfers", "transfers_light", "tpcc"):
        for mode in ("single", "ha"):
            phases = [
                p[mode][group]["phase"]
                for p in part["pairs"]
                if "error" not in p[mode] and group in p[mode]
            ]
            if not phases:
                continue
            row: dict[str, float] = {}
            for key in ("epochs_per_s", "txns_per_epoch", "cpu_share_of_all_cores"):
                row[key] = statistics.median(ph[key] or 0.0 for ph in phases)
            for role in phases[0]["cpu_s"]:
                row[f"cpu_ms_per_1k_txns_{role}"] = round(
                    statistics.median(
                        1e6
                        * ph["cpu_s"][role]
                        / max(1.0, ph["epochs"] * (ph["txns_per_epoch"] or 0))
                        for ph in phases
                    ),
                    1,
                )
            out.setdefault(group, {})[mode] = row
    return out


def print_table(result: dict[str, Any]) -> None:
    f = result.get("failover_summary")
    if f:
        print(f"\nFailover (kill -9 of the leader), {f['runs_ok']}/{f['runs']} runs ok; seconds")
        print(f"{'':42} {'min':>7} {'median':>7} {'max':>7}")
        for label, key in (
            ("kill -> new leader elected (status poll)", "elected_s"),
            ("kill -> first batch of new term (log)", "first_commit_s"),
            ("kill -> that batch seen (status poll)", "first_commit_seen_s"),
            ("longest answer gap, all clients", "longest_answer_gap_s"),
            ("longest answer gap, worst client", "longest_answer_gap_one_client_s"),
            ("max latency of calls in flight at kill", "max_latency_in_flight_at_kill_s"),
        ):
            m = f[key]
            if m:
                print(f"{label:42} {m['min']:7.3f} {m['median']:7.3f} {m['max']:7.3f}")
        print(f"client errors: {f['client_errors']}; money conserved: {f['money_conserved']}")
    o = result.get("overhead_summary")
    if o:
        print("\nOverhead: replicated ordering layer (ha) vs single sequencer, medians of pairs")
        print(f"{'':18} {'single':>10} {'ha':>10} {'ha/single':>10} {'overhead':>9}")
        for label, m in o.items():
            if m["single_median"] is None or m["ha_median"] is None:
                print(f"{label:18} {'-':>10} {'-':>10}")
                continue
            print(
                f"{label:18} {m['single_median']:10.1f} {m['ha_median']:10.1f} "
                f"{m['ha_over_single_median']:10.3f} {100 * m['overhead']:8.1f}%"
            )
    d = result.get("overhead_phases")
    if d:
        print("\nWhere the time went (medians): epochs/s, txns/epoch, CPU ms per 1k txns")
        for group, modes in d.items():
            for mode, row in modes.items():
                cpu = " ".join(
                    f"{k.removeprefix('cpu_ms_per_1k_txns_')} {v:.0f}"
                    for k, v in row.items()
                    if k.startswith("cpu_ms_per_1k_txns_")
                )
                print(
                    f"{group:16} {mode:6} {row['epochs_per_s']:6.1f} ep/s "
                    f"{row['txns_per_epoch']:7.1f} txn/ep  cpu {cpu}  "
                    f"(all cores busy {100 * row['cpu_share_of_all_cores']:.0f}%)"
                )


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    _plot_failover(axes[0][0], result)
    pairs = result.get("overhead", {}).get("pairs", [])
    for ax, group, title in (
        (axes[0][1], "transfers", "bank transfers/s (closed loop, saturating)"),
        (axes[1][0], "tpcc", "TPC-C New Order/s (200 terminals)"),
    ):
        key = "per_s" if group == "transfers" else "new_order_per_s"
        for mode, color in (("single", "tab:blue"), ("ha", "tab:orange")):
            pts = [
                (i, _metric(p[mode], group, key))
                for i, p in enumerate(pairs)
                if "error" not in p[mode]
            ]
            ax.plot([i for i, _ in pts], [y for _, y in pts], "o-", color=color, label=mode)
        ax.set_xticks(range(len(pairs)))
        ax.set_xlabel("pair (the order alternates)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend()
    summary = result.get("overhead_summary") or {}
    labels = [k for k in summary if k.endswith(" ms")]
    ax = axes[1][1]
    if labels:
        xs = range(len(labels))
        w = 0.38
        for i, mode in enumerate(("single", "ha")):
            ax.bar(
                [x + (i - 0.5) * w for x in xs],
                [summary[k][f"{mode}_median"] or 0.0 for k in labels],
                w,
                label=mode,
            )
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=20, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (median over pairs, log)")
        ax.set_title("latency: single sequencer vs replicated ordering")
        ax.legend()
    fig.suptitle(
        f"Ordo HA (issue 12), 2 replicas x 2 partitions, fsync on; {result['when']}; "
        "shared 2-core machine"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_failover(ax: Any, result: dict[str, Any]) -> None:
    runs = [r for r in result.get("failover", {}).get("runs", []) if "first_commit_s" in r]
    if not runs:
        ax.set_title("failover: no run")
        return
    xs = range(len(runs))
    series = (
        ("elected (status poll)", [r["elected_s"] for r in runs]),
        ("first commit of new term (log)", [r["first_commit_s"] for r in runs]),
        ("longest gap between answers", [r["client"]["longest_answer_gap_s"] for r in runs]),
        (
            "max latency, in flight at kill",
            [r["client"]["max_latency_in_flight_at_kill_s"] or 0.0 for r in runs],
        ),
    )
    w = 0.2
    for i, (label, ys) in enumerate(series):
        ax.bar([x + (i - 1.5) * w for x in xs], ys, w, label=label)
    ax.axhline(2.0, color="red", linestyle="--", linewidth=1, label="target 2 s")
    ax.axhline(1.0, color="green", linestyle=":", linewidth=1, label="goal 1 s")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"run {r['run']}" for r in runs])
    ax.set_ylabel("seconds after kill -9 of the leader")
    ax.set_title("failover (ordo up --ha layout, CURVE on)")
    ax.legend(fontsize=7, loc="lower right")


# --- Main --------------------------------------------------------------------------------


def parser() -> BenchParser:
    ap = BenchParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--parts", default="failover,overhead", help="comma-separated")
    ap.add_argument("--runs", type=int, default=5, help="failover runs")
    ap.add_argument("--clients", type=int, default=4, help="failover: client threads")
    ap.add_argument("--in-flight", type=int, default=20, help="failover: calls out per client")
    ap.add_argument("--warmup", type=float, default=3.0, help="failover: load before the kill")
    ap.add_argument("--after", type=float, default=2.0, help="failover: load after takeover")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="failover: status poll period")
    ap.add_argument("--soak-s", type=float, default=600.0, help="soak: seconds of load")
    ap.add_argument("--soak-clients", type=int, default=4, help="soak: client threads")
    ap.add_argument("--soak-in-flight", type=int, default=250, help="soak: per client")
    ap.add_argument("--soak-poll-s", type=float, default=1.0, help="soak: status poll period")
    ap.add_argument("--pairs", type=int, default=3, help="overhead: (single, ha) pairs")
    ap.add_argument("--transfers", type=int, default=30_000, help="overhead: per arm")
    ap.add_argument("--clients-overhead", type=int, default=4)
    ap.add_argument("--in-flight-overhead", type=int, default=250, help="per client")
    ap.add_argument("--transfers-light", type=int, default=4_000, help="overhead: light load")
    ap.add_argument("--in-flight-light", type=int, default=10, help="per client, light load")
    ap.add_argument("--multi", type=float, default=0.5, help="multi-partition share")
    ap.add_argument("--warehouses", type=int, default=2)
    ap.add_argument("--terminals", type=int, default=200)
    ap.add_argument("--tpcc-duration", type=float, default=20.0)
    ap.add_argument("--tpcc-warmup", type=float, default=5.0)
    ap.output("--out", "results/ha/bench_ha.json", "JSON; the PNG beside it")
    ap.add_argument("--keep-data", metavar="DIR", help="keep every cluster's data under DIR")
    return ap


def main() -> None:
    a = parser().parse()
    parts = {p.strip() for p in a.parts.split(",") if p.strip()}
    if not parts <= {"failover", "soak", "overhead"}:
        raise SystemExit("--parts takes failover, soak and/or overhead")
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "options": vars(a),
        "layout": {"replicas": REPLICAS, "partitions": PARTITIONS, "fsync": True},
        "limits": {
            "zk_session_timeout_s": limits.zk_session_timeout_s,
            "client_failover_silence_s": limits.client_failover_silence_s,
            "sequencer_election_check_s": limits.sequencer_election_check_s,
            "sequencer_feed_reconnect_ms": limits.sequencer_feed_reconnect_ms,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
    }
    if "failover" in parts:
        result["failover"] = failover_part(a, log)
        result["failover_summary"] = summarize_failover(result["failover"])
    if "soak" in parts:
        result["soak"] = soak_part(a, log)
        log(f"soak: {json.dumps(result['soak'])}")
    if "overhead" in parts:
        result["overhead"] = overhead_part(a, log)
        result["overhead_summary"] = summarize_overhead(result["overhead"])
        result["overhead_phases"] = phase_medians(result["overhead"])
    result["machine"]["loadavg_end"] = os.getloadavg()
    print_table(result)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=_json_default))
    plot(result, out.with_suffix(".png"))
    wrote(out, out.with_suffix(".png"))


def _json_default(o: object) -> object:
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)  # type: ignore[call-overload]
    return str(o)


if __name__ == "__main__":
    main()
