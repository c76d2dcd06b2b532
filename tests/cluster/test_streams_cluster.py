"""Transactional streaming on real processes (docs/STREAMS.md): S-Store's Leaderboard
(txn_library.workloads.leaderboard, variant ``lb``: validate >> record >> (board, trending), every
table of it homed on one partition) fed batch by batch while processes die.

- kill -9 of the leaderboard's home partition (its peer in the other replica answers
  meanwhile), then of the sequencer, in the middle of one stream on one cluster;
- kill -9 of the leader under replicated ordering (3 ZooKeeper servers, 3 sequencers);
- weak recovery: a partition killed and restarted on a ``dataflow_recovery = "weak"``
  cluster ends with the hashes of a strong cluster fed the same votes, with a smaller
  command log;
- hostile pushes get clear errors and change nothing;
- ``ordo stream push / tail / list`` and ``ordo status``;
- a sink that keeps 20 batches (tests/cluster/sink_flow.py) and a subscriber that falls
  behind it: ``Client.subscribe`` and ``ordo stream tail`` name the batches gone, or,
  asked to (``on_gap``, ``--skip-gaps``), report each gap and go on; what they gave
  and what they reported cover every batch once, in order.

Each fault scenario ends with ``check_stream``: every pushed batch processed exactly
once and in order (``dataflow.status``; the progress rows count the distinct committed
pushes; in the log, the first committed push of each id comes in id order and every
push is answered ``[batch_id, tuples]``; no (client, request) is logged twice), the
sinks ``lb_board`` and ``lb_trending`` read from batch 1 give every batch once, in
order, each equal to what the plain-Python ``Model`` gives after that batch, the state
(contestants, totals, trend) equals the model fed the same votes, and the replicas'
hashes agree per partition and equal a serial replay of the log.

The pushing client (``Pusher``) keeps up to ``WINDOW`` pushes in flight; a push whose
answer never comes is pushed again with the same batch id and tuples (answered from the
first push if it had committed). Faults are placed by the stream's progress: a hook
runs in the pushing thread right after batch b is sent (pushes in flight), and a gate
holds batch b until the test has done what it waits for.
"""

from __future__ import annotations

import csv
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from click.testing import CliRunner

import txn_library.workloads.leaderboard as lb
from cluster.cli import main as cli_main
from cluster.commands.run import ha_layout
from cluster.config import ClusterConfig
from cluster.launcher import (
    LocalCluster,
    cluster_client,
    free_base_port,
    is_quiescent,
    leader_status,
    partition_status,
    wait_live_again,
    wait_quiescent,
)
from executor.deterministic.oracle import SerialExecutor
from sequencer.log import iter_frames
from txn_library import limits, placement
from txn_library.client import Client
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_TOO_LARGE,
    ERROR,
    BadRequest,
    BatchesGone,
    CallFailed,
    OrdoError,
)
from txn_library.streams import DERIVED_CLIENT, PUSH
from txn_library.wire import sequencer as wire

MODULES = ("txn_library.workloads.builtin", "txn_library.workloads.leaderboard")
LB = lb.VARIANT["lb"]
STREAM = LB.names["input"]  # lb_votes_in
BOARD = LB.names["board"]  # lb_board
TRENDING = LB.names["trending"]  # lb_trending
STEPS = ("lb.validate", "lb.record", "lb.board", "lb.trending")
PARTITIONS = 2
HOME = placement.partition_of(LB.contestants, (LB.home,), PARTITIONS)

PHONES = 150  # x VOTES_PER_PHONE_MAX = 1,500: the per-phone limit refuses votes
VOTES = 600  # batches; ~1,800 votes, so a contestant leaves at 1,000 recorded
WINDOW = 128  # pushes in flight
WAIT_S = 60.0  # any one condition a test waits for

MakeCluster = Callable[..., LocalCluster]  # the make_cluster fixture (tests/conftest.py)


def make_votes(batches: int, seed: int = 40) -> dict[int, list[tuple[int, int]]]:
    """Batches 1..``batches`` of 1-5 votes (phone, contestant); contestants 26 and 27
    are not in the show."""
    rng = random.Random(seed)
    return {
        b: [
            (rng.randrange(PHONES), rng.randint(1, lb.CONTESTANTS + 2))
            for _ in range(rng.randint(1, 5))
        ]
        for b in range(1, batches + 1)
    }


ALL_VOTES = make_votes(VOTES)  # every test pushes (a prefix of) these


@dataclass
class Expected:
    """What the dataflow must give for batches 1..last, from the plain-Python model."""

    model: lb.Model
    boards: dict[int, list[tuple]]
    trendings: dict[int, list[tuple]]


def expected(last: int) -> Expected:
    m = lb.Model()
    boards, trendings = {}, {}
    for b in range(1, last + 1):
        m.batch(ALL_VOTES[b])
        boards[b], trendings[b] = list(m.board), list(m.trending)
    return Expected(m, boards, trendings)


def wait_for(pred: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")


# The pushing client ------------------------------------------------------------------
@dataclass
class Pusher:
    """Pushes ``votes`` to STREAM in batch-id order from a thread, at most WINDOW
    unanswered. ``hooks[b]()`` runs in the pushing thread right after batch b is sent;
    ``gates[b]`` holds batch b until set; ``in_flight_at[b]``: the batches sent and not
    yet answered when hook b ran. Every answer's value is kept per batch id; a push
    that gets no answer is pushed again (same id, same tuples) until one comes."""

    client: Client
    votes: dict[int, list[tuple[int, int]]]
    hooks: dict[int, Callable[[], None]] = field(default_factory=dict)
    gates: dict[int, threading.Event] = field(default_factory=dict)
    answers: dict[int, list[Any]] = field(default_factory=dict)
    repushed: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    in_flight_at: dict[int, list[int]] = field(default_factory=dict)
    submitted: int = 0  # the last batch id sent
    sent: int = 0  # pushes sent so far
    answered: int = 0  # pushes answered (or failed) so far
    _unanswered: set[int] = field(default_factory=set)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None

    def start(self) -> Pusher:
        self._thread = threading.Thread(target=self._run, name="pusher", daemon=True)
        self._thread.start()
        return self

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join(timeout=4 * WAIT_S)
        assert not self._thread.is_alive(), "the pusher did not finish"
        assert not self.errors, self.errors[:5]
        for b, tuples in self.votes.items():
            assert self.answers.get(b), f"batch {b} was never answered"
            for value in self.answers[b]:  # a re-push gets the first push's answer
                assert list(value) == [b, len(tuples)], (b, value)

    def repush(self, batch_ids: list[int]) -> None:
        """Push these batches again, same ids and tuples: each gets its first answer."""
        for b in batch_ids:
            value = self.client.push(STREAM, b, self.votes[b]).value
            assert list(value) == [b, len(self.votes[b])], (b, value)
            self.answers[b].append(value)

    def wait(self, pred: Callable[[Pusher], bool], what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: pred(self) or bool(self.errors), WAIT_S):
                raise TimeoutError(f"pusher: waited {WAIT_S:.0f} s for {what}")
        assert not self.errors, self.errors[:5]

    def blocked(self) -> bool:
        """Every push of the window out, none answered: no more can be sent."""
        return self.sent - self.answered >= WINDOW

    def _count(self, b: int) -> Callable[[Any], None]:
        def done(_fut: Any) -> None:
            self._window.release()
            with self._cond:
                self.answered += 1
                self._unanswered.discard(b)
                self._cond.notify_all()

        return done

    def _run(self) -> None:
        self._window = threading.BoundedSemaphore(WINDOW)
        futures: dict[int, Any] = {}
        try:
            for b in sorted(self.votes):
                gate = self.gates.get(b)
                if gate is not None and not gate.wait(4 * WAIT_S):
                    raise TimeoutError(f"gate {b} was never opened")
                if not self._window.acquire(timeout=4 * WAIT_S):
                    raise TimeoutError(f"no push of the window answered (at batch {b})")
                with self._cond:
                    self._unanswered.add(b)
                fut = self.client.submit_push(STREAM, b, self.votes[b])
                fut.add_done_callback(self._count(b))
                futures[b] = fut
                with self._cond:
                    self.submitted = b
                    self.sent += 1
                    self._cond.notify_all()
                hook = self.hooks.get(b)
                if hook is not None:
                    with self._cond:
                        self.in_flight_at[b] = sorted(self._unanswered)
                    hook()
            for b, fut in futures.items():
                self._settle(b, fut)
        except Exception as e:  # the test fails with it (join, wait)
            with self._cond:
                self.errors.append(f"{type(e).__name__}: {e}")
                self._cond.notify_all()

    def _settle(self, b: int, fut: Any) -> None:
        try:
            r = fut.result(timeout=4 * WAIT_S)
        except OrdoError:  # no answer (timeout), or lost: push it again, same id
            r = None
        if r is not None and r.aborted:
            self.errors.append(f"batch {b} refused: {r.value}")
            return
        if r is None:
            self.repushed.append(b)
            r = self.client.push(STREAM, b, self.votes[b], timeout_s=2 * WAIT_S)
        self.answers.setdefault(b, []).append(r.value)


# Checks ------------------------------------------------------------------------------
def serial_replay(log_dir: Path) -> tuple[SerialExecutor, list[wire.Batch]]:
    serial = SerialExecutor()
    batches = []
    for _e, data in iter_frames(log_dir):
        batch = wire.decode_batch(data)
        serial.apply(batch)
        batches.append(batch)
    return serial, batches


def replicas_agree_with(serial: SerialExecutor, st: dict) -> dict[int, str]:
    """Hashes agree per partition across replicas and sum to the serial replay's."""
    assert st["determinism_violations"] == 0
    by_part: dict[int, set[str]] = {}
    for p in st["partitions"]:
        by_part.setdefault(p["partition"], set()).add(p["state_hash"])
    assert all(len(h) == 1 for h in by_part.values()), by_part
    hashes = {part: next(iter(h)) for part, h in by_part.items()}
    assert sum(int(h, 16) for h in hashes.values()) % (1 << 64) == serial.state_hash
    return hashes


def logged_pushes(serial: SerialExecutor, batches: list[wire.Batch]) -> list[tuple]:
    """(batch_id, status, value) of every client push to STREAM in log order, with the
    serial replay's result."""
    out = []
    keys: set[tuple[bytes, int]] = set()
    for batch in batches:
        for i, t in enumerate(batch.txns):
            if t.client_id == DERIVED_CLIENT or not t.client_id:
                continue
            key = (t.client_id, t.req_id)
            assert key not in keys, f"request {key} sequenced twice"
            keys.add(key)
            if t.proc == PUSH and t.args[0] == STREAM:
                status, value = serial.results[batch.first_txn_id + i]
                out.append((t.args[1], status, value))
    return out


def check_stream(client: Client, st: dict, log_dir: Path, last: int) -> dict[int, str]:
    """Batches 1..last pushed: every one processed once, in order; sinks complete and in
    order; state = the model's = a serial replay's on every replica. Returns the hashes
    per partition."""
    exp = expected(last)
    status = client.call("dataflow.status", "lb").value
    assert status["last_pushed"] == status["last_processed"] == last, status
    assert status["backlog"] == 0 and status["steps"] == dict.fromkeys(STEPS, last), status

    serial, batches = serial_replay(log_dir)
    hashes = replicas_agree_with(serial, st)
    pushes = logged_pushes(serial, batches)
    committed = []
    for b, status_, value in pushes:
        assert status_ == 0 and list(value) == [b, len(ALL_VOTES[b])], (b, status_, value)
        if b not in committed:
            committed.append(b)
    assert committed == list(range(1, last + 1))  # first pushes in id order, none lost
    storage = serial.storage
    votes_in = sum(len(ALL_VOTES[b]) for b in range(1, last + 1))
    for step in STEPS:
        row = storage.get("ordo_dataflow_progress", (LB.home, "lb", step))
        assert row is not None and row[:2] == (last, len(committed)), (step, row)
        if step == "lb.validate":
            assert row[2] == votes_in, row

    m = exp.model
    contestants = {k[1]: tuple(r) for k, r in storage.scan(LB.contestants, (LB.home,))}
    assert contestants == {c: (m.votes[c], int(m.active[c])) for c in m.votes}
    assert storage.get(LB.totals, (LB.home, "votes")) == (len(m.recorded),)
    trend = [(k[1], *r) for k, r in storage.scan(LB.trend, (LB.home,))]
    assert trend == m.trending

    for sink, want in ((BOARD, exp.boards), (TRENDING, exp.trendings)):
        got = read_sink(client, sink, 1, last)
        assert [b for b, _ in got] == list(range(1, last + 1)), sink
        for b, tuples in got:
            assert tuples == want[b], (sink, b, tuples, want[b])
    return hashes


def read_sink(client: Client, sink: str, first: int, last: int) -> list[tuple[int, list]]:
    deadline = time.monotonic() + WAIT_S
    got: list[tuple[int, list]] = []
    for b, tuples in client.subscribe(sink, first, stop=lambda: time.monotonic() > deadline):
        got.append((b, tuples))
        if b >= last:
            break
    return got


def checkpoint_now(client: Client, replicas: int) -> int:
    """A checkpoint of every partition at the current epoch, written."""
    epoch = client.control(wire.CheckpointRequest())
    wait_for(
        lambda: (
            all(p["newest_checkpoint_epoch"] >= epoch for p in client.status()["partitions"])
            and len(client.status()["partitions"]) == replicas * PARTITIONS
        ),
        f"a checkpoint at epoch {epoch}",
    )
    return int(epoch)


def log_bytes(cfg: ClusterConfig) -> int:
    return sum(f.stat().st_size for f in cfg.log_dir.glob("segment-*.log"))


# A partition and the sequencer -------------------------------------------------------
def kill_home_partition_mid_stream(
    lc: LocalCluster, c: Client, pusher_client: Client, first: int, last: int
) -> None:
    """Push first..last; after a third, checkpoint; mid-way kill -9 replica 0's home
    partition (pushes in flight); the next part is pushed and answered while it is
    down; restart it; the rest is pushed while it recovers (from the checkpoint and
    the log); then push again, same ids and tuples, the batches in flight at the kill."""
    third = (last - first + 1) // 3
    at_checkpoint, at_kill, at_restart = first + third, first + third + third // 2, last - third
    gates = {b: threading.Event() for b in (at_checkpoint, at_restart)}
    killed: dict[str, int] = {}

    def kill() -> None:
        killed["pid"] = partition_status(c, 0, HOME)["pid"]  # type: ignore[index]
        lc.kill(f"r0p{HOME}")
        killed["epoch"] = c.status()["epoch"]

    pusher = Pusher(
        pusher_client,
        {b: ALL_VOTES[b] for b in range(first, last + 1)},
        hooks={at_kill: kill},
        gates=gates,
    ).start()
    pusher.wait(lambda p: p.answered == at_checkpoint - first, "the first third answered")
    checkpoint_now(c, lc.config.replicas)
    gates[at_checkpoint].set()
    # answered with r0's home partition down: r1's answers
    pusher.wait(lambda p: p.answered == at_restart - first, "pushes answered while it is down")
    assert f"r0p{HOME}" not in lc.procs
    lc.start_partition(0, HOME)
    gates[at_restart].set()
    pusher.join()
    assert pusher.in_flight_at[at_kill], "no push in flight at the kill"
    pusher.repush(pusher.in_flight_at[at_kill])  # a client's retries across sessions
    wait_live_again(c, 0, HOME, killed["pid"], killed["epoch"])
    log_text = (lc.logs_dir / f"replica-0-partition-{HOME}.log").read_text()
    assert "loaded checkpoint" in log_text, log_text[-2000:]


def test_kill9_of_the_home_partition_then_the_sequencer_mid_stream(
    make_cluster: MakeCluster,
) -> None:
    """Batches 1..300 with the home partition of replica 0 killed and restarted, then
    301..600 with the sequencer killed (pushes in flight, more sent while it is down)
    and restarted; after each, every batch once, in order, state = the model."""
    lc = make_cluster(replicas=2, partitions=PARTITIONS, procedure_modules=MODULES)
    cfg = lc.config
    half = VOTES // 2
    with Client(cfg.client_addr) as c, Client(cfg.client_addr, retry_s=0.5) as pc:
        assert c.call("leaderboard.setup", "lb", lb.CONTESTANTS).value == lb.CONTESTANTS
        kill_home_partition_mid_stream(lc, c, pc, 1, half)
        st = wait_quiescent(c, 2, PARTITIONS, timeout_s=WAIT_S)
        check_stream(c, st, cfg.log_dir, half)

    # The sequencer: killed with pushes in flight; 20 more are sent while it is down.
    at_kill, at_restart = half + 50, half + 71
    gate = threading.Event()
    with Client(cfg.client_addr, retry_s=0.5, timeout_s=WAIT_S) as pc:
        pusher = Pusher(
            pc,
            {b: ALL_VOTES[b] for b in range(half + 1, VOTES + 1)},
            hooks={at_kill: lambda: lc.kill("sequencer")},
            gates={at_restart: gate},
        ).start()
        pusher.wait(
            lambda p: p.submitted == at_restart - 1 or p.blocked(), "pushes sent while it is down"
        )
        assert "sequencer" not in lc.procs
        lc.start_sequencer()
        gate.set()
        pusher.join()
        assert pusher.in_flight_at[at_kill], "no push in flight at the kill"
        pusher.repush(pusher.in_flight_at[at_kill])
    lc.wait_ready(WAIT_S)
    with Client(cfg.client_addr) as c:
        st = wait_quiescent(c, 2, PARTITIONS, timeout_s=WAIT_S)
        check_stream(c, st, cfg.log_dir, VOTES)
    lc.check_alive()
    assert not all(expected(VOTES).model.active.values())  # the votes made one leave


# Weak recovery -----------------------------------------------------------------------
def test_weak_recovery_after_kill9_reaches_the_strong_state_with_a_smaller_log(
    tmp_path: Path,
) -> None:
    """A weak cluster (only pushes logged; partitions derive the steps again) fed
    batches 1..300 with its home partition killed, checkpointed before and restarted,
    ends with the per-partition hashes of a strong cluster fed the same votes, which
    logs more."""
    half = VOTES // 2
    clusters: dict[str, LocalCluster] = {}
    try:
        for mode, replicas in (("weak", 2), ("strong", 1)):
            cfg = ClusterConfig(
                replicas=replicas,
                partitions=PARTITIONS,
                base_port=free_base_port(),
                data_dir=str(tmp_path / mode),
                procedure_modules=MODULES,
                dataflow_recovery=mode,
            )
            clusters[mode] = LocalCluster(cfg).start()
        weak, strong = clusters["weak"], clusters["strong"]
        with Client(strong.config.client_addr) as c:
            assert c.call("leaderboard.setup", "lb", lb.CONTESTANTS).ok
            Pusher(c, {b: ALL_VOTES[b] for b in range(1, half + 1)}).start().join()
            strong_st = wait_quiescent(c, 1, PARTITIONS, timeout_s=WAIT_S)
            strong_hashes = check_stream(c, strong_st, strong.config.log_dir, half)
        with Client(weak.config.client_addr) as c, Client(weak.config.client_addr) as pc:
            assert c.call("leaderboard.setup", "lb", lb.CONTESTANTS).ok
            kill_home_partition_mid_stream(weak, c, pc, 1, half)
            weak_st = wait_quiescent(c, 2, PARTITIONS, timeout_s=WAIT_S)
            weak_hashes = check_stream(c, weak_st, weak.config.log_dir, half)
        assert weak_hashes == strong_hashes
        frames = [wire.decode_batch(d) for _e, d in iter_frames(weak.config.log_dir)]
        assert any(b.flags & wire.FLAG_DERIVED_UNLOGGED and b.derived for b in frames)
        assert not any(t.client_id == DERIVED_CLIENT for b in frames for t in b.txns)
        weak_bytes, strong_bytes = log_bytes(weak.config), log_bytes(strong.config)
        assert weak_bytes < strong_bytes, (weak_bytes, strong_bytes)
    finally:
        for lc in clusters.values():
            lc.stop()


# Replicated ordering -----------------------------------------------------------------
def wait_for_leader(cfg: ClusterConfig, not_member: int | None = None) -> dict:
    def leader() -> dict | None:
        st = leader_status(cfg, timeout_s=1.0)
        return st if st is not None and st["member"] != not_member else None

    return wait_for(leader, "a leader")  # type: ignore[no-any-return]


def wait_settled(cfg: ClusterConfig) -> dict:
    """The leader and every partition at the same epoch, idle, hashes stable."""

    def settled() -> dict | None:
        st = leader_status(cfg, timeout_s=1.0)
        if st is None or not is_quiescent(st, st["partitions"], cfg.replicas, cfg.partitions):
            return None
        again = leader_status(cfg, timeout_s=1.0)
        hashes = [p["state_hash"] for p in st["partitions"]]
        if again is None or [p["state_hash"] for p in again["partitions"]] != hashes:
            return None
        return again if again["epoch"] == st["epoch"] else None

    return wait_for(settled, "the cluster to settle")  # type: ignore[no-any-return]


@pytest.fixture
def ha_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cfg = ha_layout(
        ClusterConfig(
            replicas=2,
            partitions=PARTITIONS,
            base_port=free_base_port(),
            data_dir=str(tmp_path / "data"),
            procedure_modules=MODULES,
        )
    )
    lc = LocalCluster(cfg)
    try:
        lc.start()
        yield lc
    finally:
        lc.stop()


def test_leader_kill9_mid_stream_loses_and_repeats_no_batch(ha_cluster: LocalCluster) -> None:
    """Batches 1..300 from a client given every sequencer's address; the leader is
    killed after batch 100 (pushes in flight), more are sent during the failover, the
    old leader rejoins as a follower; every batch once, in order, state = the model."""
    lc = ha_cluster
    cfg = lc.config
    half = VOTES // 2
    old = wait_for_leader(cfg)
    at_kill, at_restart = 100, 131
    gate = threading.Event()
    with cluster_client(cfg, retry_s=0.5, timeout_s=WAIT_S) as c:
        assert c.call("leaderboard.setup", "lb", lb.CONTESTANTS).ok
        pusher = Pusher(
            c,
            {b: ALL_VOTES[b] for b in range(1, half + 1)},
            hooks={at_kill: lambda: lc.kill(LocalCluster.sequencer_name(cfg, old["member"]))},
            gates={at_restart: gate},
        ).start()
        pusher.wait(lambda p: p.submitted == at_restart - 1 or p.blocked(), "the kill")
        new = wait_for_leader(cfg, not_member=old["member"])
        assert new["term"] > old["term"]
        lc.start_sequencer(old["member"])  # rejoins as a follower
        gate.set()
        pusher.join()
        assert c.failovers >= 1
        assert pusher.in_flight_at[at_kill], "no push in flight at the kill"
        pusher.repush(pusher.in_flight_at[at_kill])
        st = wait_settled(cfg)
        log_dir = cfg.sequencer_log_dir(st["member"])
        # a local log is fdatasynced every sequencer_local_sync_s: replay it once whole
        wait_for(
            lambda: sum(1 for _ in iter_frames(log_dir)) >= st["epoch"] - st["log_first_epoch"] + 1,
            "the leader's log to hold its epoch",
        )
        check_stream(c, st, log_dir, half)


# Hostile pushes ----------------------------------------------------------------------
def _raw_ask(address: str, frame: bytes) -> tuple:
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send(frame)
        assert sock.poll(10_000), "no reply within 10 s"
        kind, body = wire.unpack(sock.recv())
        assert kind == wire.REP_RESULTS, (kind, body)
        return body  # type: ignore[no-any-return]
    finally:
        sock.close()


def test_hostile_pushes_get_clear_errors_and_change_nothing(make_cluster: MakeCluster) -> None:
    lc = make_cluster(replicas=2, partitions=PARTITIONS, procedure_modules=MODULES)
    cfg = lc.config
    good = {10: ALL_VOTES[1], 20: ALL_VOTES[2], 30: ALL_VOTES[3]}
    with Client(cfg.client_addr) as c:
        assert c.call("leaderboard.setup", "lb", lb.CONTESTANTS).ok
        for b, tuples in good.items():
            assert list(c.push(STREAM, b, tuples).value) == [b, len(tuples)]
        wait_for(lambda: c.call("dataflow.status", "lb").value["last_processed"] == 30, "batch 30")
        before = wait_quiescent(c, 2, PARTITIONS, timeout_s=WAIT_S)
        status_before = c.call("dataflow.status", "lb").value
        logged_before = sum(1 for _ in _client_txns(cfg))

        # Refused by the push transaction (logged, aborted identically everywhere).
        with pytest.raises(
            BadRequest, match=f"batch ids of stream {STREAM} must increase: 25 is not after 30"
        ):
            c.push(STREAM, 25, [(1, 1)])
        with pytest.raises(
            BadRequest, match=f"batch 20 of stream {STREAM} was pushed before with other tuples"
        ):
            c.push(STREAM, 20, [*good[20], (1, 1)])
        # The same id with the same tuples: the first push's answer, nothing done again.
        assert list(c.push(STREAM, 20, good[20]).value) == [20, len(good[20])]

        # Refused before the log.
        big = limits.stream_batch_tuples_max
        refused: dict[str, tuple[Callable[[], Any], str]] = {
            "huge batch": (
                lambda: c.push(STREAM, 31, [(1, 1)] * (big + 1)),
                f"a batch of {big + 1} tuples > {big}",
            ),
            "unknown stream": (lambda: c.push("no_such_stream", 31, [(1, 1)]), "no_such_stream"),
            "short tuple": (lambda: c.push(STREAM, 31, [(1, 1), (1,)]), "tuple 1: a tuple of 2"),
            "long tuple": (lambda: c.push(STREAM, 31, [(1, 2, 3)]), "tuple 0: a tuple of 2"),
            "str for int": (lambda: c.push(STREAM, 31, [(1, "7")]), "value 1 must be int"),
            "bool for int": (lambda: c.push(STREAM, 31, [(True, 7)]), "value 0 must be int"),
            "float for int": (lambda: c.push(STREAM, 31, [(1.5, 7)]), "value 0 must be int"),
            "int past int64": (lambda: c.push(STREAM, 31, [(1 << 63, 7)]), "value 0 must be int"),
            "tuple not a list": (lambda: c.push(STREAM, 31, [5]), "tuple 0: a tuple of 2"),  # type: ignore[list-item]
            "tuples not a list": (
                lambda: c.call(PUSH, STREAM, 31, {"phone": 1}),
                "argument 'tuples' must be list",
            ),
            "batch id past int64": (
                lambda: c.push(STREAM, 1 << 63, [(1, 1)]),
                f"argument 'batch_id'={1 << 63} outside [0, {(1 << 63) - 1}]",
            ),
            "batch id uint64": (
                lambda: c.push(STREAM, (1 << 64) - 1, [(1, 1)]),
                f"argument 'batch_id'={(1 << 64) - 1} outside",
            ),
            "batch id negative": (
                lambda: c.push(STREAM, -1, [(1, 1)]),
                "argument 'batch_id'=-1 outside",
            ),
        }
        for name, (push, reason) in refused.items():
            with pytest.raises(CallFailed) as err:
                push()
            assert err.value.code == ERR_BAD_ARGUMENTS, (name, err.value)
            assert reason in err.value.message, (name, err.value.message)
        # Past what msgpack encodes, or past a frame: refused in the client, nothing sent.
        with pytest.raises(BadRequest) as too_big_id:
            c.push(STREAM, 1 << 64, [(1, 1)])
        assert too_big_id.value.code == ERR_BAD_ARGUMENTS
        fat = [("x" * (limits.request_bytes_max // 4), 1)] * 5
        with pytest.raises(BadRequest) as too_large:
            c.push(STREAM, 31, fat)
        assert too_large.value.code == ERR_TOO_LARGE
        # ... and a raw frame past request_bytes_max gets an error from the sequencer.
        frame = msgpack.packb([wire.REQ_CALLS, b"raw-client", [[1, PUSH, [STREAM, 31, fat]]]])
        assert len(frame) > limits.request_bytes_max
        body = _raw_ask(cfg.client_addr, frame)
        assert len(body) == 1 and body[0][1] == ERROR and body[0][2][0] == ERR_TOO_LARGE, body

        after = wait_quiescent(c, 2, PARTITIONS, timeout_s=WAIT_S)
        assert [p["state_hash"] for p in after["partitions"]] == [
            p["state_hash"] for p in before["partitions"]
        ]
        assert c.call("dataflow.status", "lb").value == status_before
        # the three refused in the push transaction and the repeated push; nothing else
        assert sum(1 for _ in _client_txns(cfg)) == logged_before + 3
        lc.check_alive()

        # A good push still works, and is processed.
        assert list(c.push(STREAM, 31, ALL_VOTES[4]).value) == [31, len(ALL_VOTES[4])]
        wait_for(lambda: c.call("dataflow.status", "lb").value["last_processed"] == 31, "batch 31")
        m = lb.Model()
        for b in range(1, 5):
            m.batch(ALL_VOTES[b])
        assert read_sink(c, BOARD, 31, 31) == [(31, m.board)]
        assert [b for b, _ in read_sink(c, BOARD, 1, 31)] == [10, 20, 30, 31]


def _client_txns(cfg: ClusterConfig) -> Iterator[wire.Txn]:
    for _e, data in iter_frames(cfg.log_dir):
        for t in wire.decode_batch(data).txns:
            if t.client_id and t.client_id != DERIVED_CLIENT:
                yield t


# The command line --------------------------------------------------------------------
def _write_csv(path: Path, rows: list[tuple[Any, ...]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phone", "contestant"])
        w.writerows(rows)
    return path


def test_ordo_stream_push_tail_list_and_status(make_cluster: MakeCluster, tmp_path: Path) -> None:
    lc = make_cluster(replicas=1, partitions=PARTITIONS, procedure_modules=MODULES)
    data = lc.config.data_dir
    run = CliRunner()
    # one vote a batch (--batch-rows 1): batches 1..12 are the first 12 votes
    votes = [v for b in range(1, 9) for v in ALL_VOTES[b]][:12]
    with Client(lc.config.client_addr) as c:
        assert c.call("leaderboard.setup", "lb", lb.CONTESTANTS).ok
        good = _write_csv(tmp_path / "votes.csv", votes)
        out = run.invoke(
            cli_main, ["stream", "push", STREAM, "--from", str(good), "--quiet", "--data-dir", data]
        )
        assert out.exit_code == 0, out.output
        assert f"pushed 12 batches (12 tuples) to {STREAM}" in out.output
        status = wait_for(
            lambda: (s := c.call("dataflow.status", "lb").value)["last_processed"] == 12 and s,
            "12 batches processed",
        )
        assert status["last_pushed"] == 12 and status["backlog"] == 0

        # A bad row late in the file (past the command's window of pushes in flight):
        # refused naming its line, nothing pushed.
        many = [v for b in range(1, VOTES + 1) for v in ALL_VOTES[b]][:300]
        bad = _write_csv(tmp_path / "bad.csv", [*many, ("555", "seven"), *votes])
        out = run.invoke(
            cli_main, ["stream", "push", STREAM, "--from", str(bad), "--quiet", "--data-dir", data]
        )
        assert out.exit_code == 1, out.output
        assert f"{bad}:302: 'seven' is not int" in out.output, out.output
        # Nothing of it was pushed: batch 13 is still free (a push of the file's first
        # row as batch 13 would make this one "pushed before with other tuples"), and
        # it is the last batch pushed once everything sent has run.
        other = (votes[0][0] + 1, votes[0][1])
        assert list(c.push(STREAM, 13, [other]).value) == [13, 1]
        wait_quiescent(c, 1, PARTITIONS, timeout_s=WAIT_S)
        status = c.call("dataflow.status", "lb").value
        assert status["last_pushed"] == status["last_processed"] == 13, status

    m = lb.Model()
    boards = []
    for v in votes[:3]:
        m.batch([v])
        boards.append(m.board)
    out = run.invoke(cli_main, ["stream", "tail", BOARD, "--count", "3", "--data-dir", data])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["1", "2", "3"], out.output
    for line, board in zip(lines, boards, strict=True):
        assert [tuple(json.loads(x)) for x in line.split("\t")[1:]] == board

    out = run.invoke(cli_main, ["status", "--data-dir", data])
    assert out.exit_code == 0, out.output
    rows = {line.split()[0]: line.split()[1:] for line in out.output.splitlines() if line.strip()}
    assert rows["lb"] == ["13", "13", "0"], out.output  # last pushed, processed, backlog
    assert rows["lbe"] == ["-", "-", "0"], out.output
    out = run.invoke(cli_main, ["status", "--json", "--data-dir", data])
    flows = {f["dataflow"]: f for f in json.loads(out.output)["dataflows"]}
    assert flows["lb"]["last_processed"] == 13 and flows["lb"]["steps"] == dict.fromkeys(STEPS, 13)

    out = run.invoke(cli_main, ["stream", "list", "--data-dir", data])
    assert out.exit_code == 0, out.output
    assert f"stream {STREAM}(phone:int, contestant:int)  home {LB.home}" in out.output
    assert (
        f"dataflow lb: {STREAM} -> lb.validate -> lb.record -> lb.board -> lb.trending"
        in out.output
    )
    assert "dataflows: border -> steps in order (a+b: nested, one transaction)" in out.output


# A sink that a subscriber falls behind (tests/cluster/sink_flow.py) -------------------
SINK_MODULES = ("txn_library.workloads.builtin", "tests.cluster.sink_flow")
# As tests/cluster/sink_flow.py declares them (not imported: this process's registry
# holds the leaderboard's streams and dataflows only, which `ordo status` lists).
SINK_IN, SINK_OUT, SINK_RETAIN = "sink_in", "sink_out", 20
GAP_LINE = re.compile(rf"gap: stream {SINK_OUT} no longer keeps batch(?:es)? (\d+)(?:\.\.(\d+))?")


def _sink_page(c: Client) -> dict:
    """The sink's first page from its oldest kept batch: "first", "last", "dropped"."""
    return c.call("stream.read", SINK_OUT, 0, 1).value  # type: ignore[no-any-return]


def _push_sink(c: Client, first: int, last: int) -> dict[int, int]:
    """Push batches first..last to the flow (batch b: the tuple (b,)), all in flight,
    and wait until the sink holds the last; {request id: batch id}."""
    sent = {b: c.submit_push_with_id(SINK_IN, b, [(b,)]) for b in range(first, last + 1)}
    for b, (_req_id, fut) in sent.items():
        assert list(fut.result(timeout=WAIT_S).value) == [b, 1]
    wait_for(lambda: _sink_page(c)["last"] == last, f"sink batch {last}")
    return {req_id: b for b, (req_id, _fut) in sent.items()}


def _covers(first: int, last: int, given: list[int], gaps: list[tuple[int, int]]) -> None:
    """What a subscriber was given and the gaps it was told of cover first..last, each
    id once, in order, every gap right before a batch given."""
    pieces = sorted([(b, b) for b in given] + gaps)
    assert [i for lo, hi in pieces for i in range(lo, hi + 1)] == list(range(first, last + 1)), (
        given,
        gaps,
    )
    assert given == sorted(given)
    assert all(hi + 1 in given for _lo, hi in gaps), (given, gaps)


def _slowed(
    sub: Iterator[tuple[int, list]], c: Client, last: int, pushes: dict[int, int]
) -> Iterator[int]:
    """Batch ids from ``sub``, a subscriber slowed while the sink moves on: after each
    batch it takes, two more are pushed (up to ``last``) and reach the sink. A page it
    reads is delivered whole (one read, one instant); by the page's end the sink has
    dropped what came after it."""
    for b, tuples in sub:
        assert tuples == [(b,)]
        yield b
        if b >= last:
            return
        pushed = _sink_page(c)["last"]
        if pushed < last:
            pushes |= _push_sink(c, pushed + 1, min(last, pushed + 2))


def test_a_subscriber_behind_a_sinks_retention_is_told_which_batches_are_gone(
    make_cluster: MakeCluster,
) -> None:
    lc = make_cluster(replicas=1, partitions=PARTITIONS, procedure_modules=SINK_MODULES)
    deadline = time.monotonic() + 10 * WAIT_S
    until = lambda: time.monotonic() > deadline  # noqa: E731
    pushes: dict[int, int] = {}
    with Client(lc.config.client_addr) as c:
        # Read batch 1, the sink moves on by 30: the same subscription names 2..dropped
        # (it used to yield the oldest kept, silently).
        pushes |= _push_sink(c, 1, 1)
        sub = c.subscribe(SINK_OUT, from_batch=1, stop=until)
        assert next(sub) == (1, [(1,)])
        pushes |= _push_sink(c, 2, 31)
        page = _sink_page(c)
        assert page["dropped"] >= 2
        with pytest.raises(BatchesGone) as err:
            next(sub)
        assert isinstance(err.value, BadRequest)
        assert (err.value.first_missing, err.value.last_missing, err.value.oldest_kept) == (
            2,
            page["dropped"],
            page["first"],
        )
        assert f"no longer keeps batches 2..{page['dropped']}" in str(err.value)

        # With on_gap: told, and it goes on with the oldest kept.
        gaps: list[BatchesGone] = []
        sub = c.subscribe(SINK_OUT, from_batch=32, stop=until, on_gap=gaps.append)
        pushes |= _push_sink(c, 32, 32)
        given = [next(sub)[0]]
        pushes |= _push_sink(c, 33, 62)
        while given[-1] < 62:
            given.append(next(sub)[0])
        assert [(g.first_missing, g.last_missing) for g in gaps] == [(33, _sink_page(c)["dropped"])]
        _covers(32, 62, given, [(g.first_missing, g.last_missing) for g in gaps])

        # Slowed while the sink moves on: told of every gap (more than one), or stopped
        # at the first one, having been given every batch before it.
        for opt_in in (True, False):
            first = _sink_page(c)["last"] + 1
            last = first + 150
            gaps = []
            pushes |= _push_sink(c, first, first + SINK_RETAIN - 1)
            sub = c.subscribe(SINK_OUT, first, stop=until, on_gap=gaps.append if opt_in else None)
            given = []
            slow = _slowed(sub, c, last, pushes)
            if opt_in:
                given += list(slow)
                assert len(gaps) >= 2, [(g.first_missing, g.last_missing) for g in gaps]
                _covers(first, last, given, [(g.first_missing, g.last_missing) for g in gaps])
            else:
                with pytest.raises(BatchesGone) as err:
                    for b in slow:
                        given.append(b)
                assert given == list(range(first, err.value.first_missing))
                assert err.value.oldest_kept == err.value.last_missing + 1

        # The pushes' request ids name them in the log (submit_push_with_id).
        logged = {
            t.req_id: t.args[1]
            for t in _client_txns(lc.config)
            if t.proc == PUSH and t.client_id == c.proto.client_id
        }
        assert {r: logged[r] for r in pushes} == pushes


class _Tail:
    """``ordo stream tail SINK_OUT`` in a process of its own, its stdout read line by
    line (a thread), its stderr at the end."""

    def __init__(self, data_dir: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", "stream", "tail", SINK_OUT, *args]
            + ["--data-dir", data_dir],
            cwd=Path(__file__).resolve().parents[2],
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def batch(self) -> int | None:
        """The id of the next batch printed (None: the tail ended)."""
        line = self.lines.get(timeout=WAIT_S)
        if line is None:
            self.lines.put(None)
            return None
        b, values = line.split("\t")
        assert json.loads(values) == [int(b)], line
        return int(b)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The tail stopped (SIGSTOP) meanwhile: a subscriber slowed."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.proc.pid, signal.SIGCONT)

    def finish(self, interrupt: bool = False) -> tuple[int, list[int], str]:
        """(exit code, the ids of what it printed after what was read, its stderr)."""
        if interrupt:
            os.kill(self.proc.pid, signal.SIGINT)  # Ctrl-C
        rc = self.proc.wait(timeout=WAIT_S)
        rest: list[int] = []
        while (b := self.batch()) is not None:
            rest.append(b)
        assert self.proc.stderr is not None
        return rc, rest, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_ordo_stream_tail_stops_at_a_gap_or_with_skip_gaps_reports_it(
    make_cluster: MakeCluster,
) -> None:
    lc = make_cluster(replicas=1, partitions=PARTITIONS, procedure_modules=SINK_MODULES)
    data = lc.config.data_dir
    with Client(lc.config.client_addr) as c:
        _push_sink(c, 1, 1)
        tail = _Tail(data, "--from-batch", "1")
        try:
            assert tail.batch() == 1
            # A read the tail sent before it stopped may be answered while the first
            # 30 go in (so it may print some of them), never after the next 30.
            with tail.stopped():
                _push_sink(c, 2, 31)
                _push_sink(c, 32, 61)
            rc, rest, err = tail.finish()
        finally:
            tail.kill()
        dropped = _sink_page(c)["dropped"]
        printed = [1, *rest]
        assert rc == 1, err
        assert printed == list(range(1, printed[-1] + 1)) and printed[-1] <= 31
        assert f"no longer keeps batches {printed[-1] + 1}..{dropped}" in err, err
        assert f"the oldest batch kept is {dropped + 1}" in err and "--skip-gaps" in err

        first = _sink_page(c)["first"]
        tail = _Tail(data, "--from-batch", str(first), "--skip-gaps")
        try:
            printed = [tail.batch() for _ in range(first, 62)]
            assert printed == list(range(first, 62))
            with tail.stopped():
                _push_sink(c, 62, 91)
                _push_sink(c, 92, 121)
            while printed[-1] != 121:
                b = tail.batch()
                assert b is not None
                printed.append(b)
            rc, rest, err = tail.finish(interrupt=True)
        finally:
            tail.kill()
        assert rc == 0 and rest == [], err
        gaps = [(int(m[1]), int(m[2] or m[1])) for m in GAP_LINE.finditer(err)]
        # One gap, or two when a read the tail sent before it stopped was answered
        # between the two pushes (as above): each reported on a line of its own.
        assert 1 <= len(gaps) <= 2 and len(err.splitlines()) == len(gaps), err
        assert err.rstrip().endswith("; going on"), err
        _covers(first, 121, printed, gaps)  # type: ignore[arg-type]
