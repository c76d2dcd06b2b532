"""Seeded whole-cluster simulation: one process, one seed, one clock (FoundationDB's
simulation and TigerBeetle's VOPR are the models).

    from executor.deterministic.simulator import run_seed
    result = run_seed(42, "bank")            # or "tpcc"; options: see SimOptions
    assert result.ok, result.failures
    .venv/bin/python scripts/simulate.py --workload bank --seeds 200   # many seeds
    .venv/bin/python scripts/simulate.py --seed 42 --trace             # replay one

A run wires the real roles together in memory: the ``Sequencer`` over a real
``CommandLog`` in a temp directory (``sim_log``), every ``Partition`` of every replica
(``sim_partition``), and several clients (``sim_client``, ClientProtocol), over a
simulated network with ZeroMQ's guarantees and nothing stronger (``sim_network``).
Every message is msgpack-encoded as on the wire. One ``random.Random(seed)`` draws
everything: the cluster's shape, the workload, delays and drops, and the faults:

- a partition crashes and restarts from its newest durable checkpoint (or genesis),
  asks its peers to resend reads and catches up from the log service;
- the sequencer crashes (between batches, between a batch's append and its sync, or
  after its sync but before it is published) and a new one starts over the same log,
  which lost its un-synced tail and may end in a torn frame; or its log's fdatasync
  fails (EIO), it fail-stops, and its supervisor restarts it;
- a batch published on PUB/SUB is dropped (the partition repairs the gap);
- a checkpoint file is corrupted before a restart (the previous one is used).
When peers no longer retain the reads a restarted partition needs (MSG_RESEND_GAP),
the simulator does what the operator is told to: restore the whole replica from its
newest common checkpoint (or genesis).

When every client has its answers (or gave up) and the cluster is quiescent, the
checks in ``checks`` run against the serial oracle. Same seed, same options: the same
run, event for event; ``trace_digest`` proves it.

Planted bugs (``plant=``), injected by the simulator, never in engine code, to show
that the checks catch them: ``swap`` (two txns of a batch swapped at one partition of
one replica), ``drop-read`` (one txn's read exchange lost forever in one replica),
``lose-synced`` (a disk that loses the last synced frame of the log on a crash),
``no-retry-rebuild`` (a restarted sequencer that forgot which calls its log holds).

Invariants: no wall clock, no sockets, no threads, no entropy besides the seed; the
simulator drives the roles only through the inputs and outputs the live processes
use (plus the planted bugs, which are marked as such).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any

from executor.deterministic.checks import RunRecord, run_checks
from executor.deterministic.partition import Partition
from executor.deterministic.sim_client import SimClient
from executor.deterministic.sim_network import EventLoop, LinkProfile, Network, Trace
from executor.deterministic.sim_options import Fault, SimOptions, SimResult
from executor.deterministic.sim_partition import MONOTONIC_BASE_US, PartitionNode
from executor.deterministic.sim_sequencer import SequencerNode
from executor.deterministic.workloads import (
    Workload,
    clone_storage,
    workload_class,
    workload_genesis,
)
from sequencer.log import iter_frames
from sequencer.replication import MemoryStore
from sequencer.retry_cache import RetryCache
from sequencer.sequencer import Sequencer
from sequencer.status import SequencerStats
from txn_library import partition_wire as ewire
from txn_library import wire
from txn_library.procedure import load_modules

PLANTS = ("swap", "drop-read", "lose-synced", "no-retry-rebuild", "publish-before-commit")
REPLICATED_PLANTS = ("publish-before-commit",)  # need SimOptions.sequencers > 1

# What a seed draws from (when SimOptions leaves it None), in one place.
SHAPES = ((2, 2), (2, 2), (2, 3), (3, 2), (1, 3))  # (replicas, partitions)
CLIENTS = (2, 6)
IN_FLIGHT_PER_CLIENT = (1, 4)
THINK_MAX_US = (0, 2_000, 20_000)
CLIENT_RETRY_MS = (100, 1_000)
CHECKPOINT_EVERY_EPOCHS = (4, 25)
DELAY_MIN_US = (20, 50, 100)
DELAY_MAX_US = (300, 1_500, 5_000)
SPIKE_PCT = (0.0, 1.0, 5.0)
SPIKE_MAX_US = (5_000, 30_000)
PUB_DROP_PCT = (0, 0, 1, 5, 15)
PARTITION_CRASHES_MAX = 3
PARTITION_DOWN_US = (5_000, 400_000)
CORRUPT_CHECKPOINT_SHARE = 0.2
SEQUENCER_CRASHES_MAX = 2
SEQUENCER_DOWN_US = (5_000, 500_000)
SEQUENCER_CRASH_MODES = ("now", "now", "in_sync", "before_publish", "sync_error")
LEADER_FAULT_MODES = ("kill", "cut")  # replicated ordering layer
FAULT_FIRST_US = 10_000
HORIZON_MIN_US = 200_000  # faults fall in [FAULT_FIRST_US, horizon]: while clients work
CALL_LATENCY_GUESS_US = 25_000  # for the horizon: ~2 epochs per call
SUPERVISOR_RESTART_US = (1_000, 100_000)  # a fail-stopped sequencer is restarted after
REPLICA_RESTORE_US = (1_000, 50_000)  # the operator restores a replica after
CLIENT_START_US = 5_000

MONITOR_US = 100_000
FAULT_RETRY_US = 50_000
FAULT_RETRIES_MAX = 20
LOG_LINES_MAX = 50
REPLICA_RESTORES_MAX = 5


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < LOG_LINES_MAX:
            self.lines.append(f"{record.name} {record.levelname}: {record.getMessage()}")


def _temp_root() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class Simulator:
    def __init__(self, seed: int, workload: str, opts: SimOptions) -> None:
        if opts.plant is not None and opts.plant not in PLANTS:
            raise ValueError(f"unknown planted bug {opts.plant!r}; choose from {PLANTS}")
        if opts.checkpoint_store not in ("file", "memory"):
            raise ValueError("checkpoint_store is 'file' or 'memory'")
        self.seed = seed
        self.rng = rng = random.Random(seed)
        cls = workload_class(workload)
        self.opts = opts
        shape = rng.choice(SHAPES)
        self.replicas = opts.replicas or shape[0]
        self.partitions = opts.partitions or shape[1]
        self.workload: Workload = cls(rng, self.partitions)
        load_modules(self.workload.procedure_modules)
        self.image = workload_genesis(self.workload, self.partitions)
        self.checkpoint_every_epochs = opts.checkpoint_every_epochs or rng.randint(
            *CHECKPOINT_EVERY_EPOCHS
        )
        self.checkpoint_write_max_us = opts.checkpoint_write_max_us
        self.loop = EventLoop()
        self.trace = Trace(opts.keep_trace)
        profile = LinkProfile(
            delay_min_us=rng.choice(DELAY_MIN_US),
            delay_max_us=rng.choice(DELAY_MAX_US),
            spike_pct=rng.choice(SPIKE_PCT),
            spike_max_us=rng.choice(SPIKE_MAX_US),
            pub_drop_pct=(
                opts.pub_drop_pct if opts.pub_drop_pct is not None else rng.choice(PUB_DROP_PCT)
            ),
        )
        self.net = Network(self.loop, rng, profile, self.trace)
        self.root = Path(tempfile.mkdtemp(prefix=f"ordo-sim-{seed}-", dir=_temp_root()))
        self.log_dir = self.root / "log"
        if opts.sequencers < 1:
            raise ValueError("sequencers is at least 1")
        if opts.plant == "publish-before-commit" and opts.sequencers < 2:
            raise ValueError("publish-before-commit needs a replicated layer (sequencers >= 2)")
        # Replicated ordering layer (sim_ordering): N members over one store, a leader.
        self.store = MemoryStore() if opts.sequencers > 1 else None
        self.seq_nodes = [SequencerNode(self, m) for m in range(opts.sequencers)]
        self.leader = 0
        self._electing = False
        self.parts = [
            [PartitionNode(self, r, p) for p in range(self.partitions)]
            for r in range(self.replicas)
        ]
        self.clients = self._make_clients()
        self.client_by_identity = {c.identity: c for c in self.clients}
        self.faults = self._plan_faults()
        self._failures: list[str] = []
        self._finished = False
        self._clients_done_us: int | None = None
        self._restoring: set[int] = set()
        self._seq_down_us = 0
        self.reported: list[tuple[int, int, int, int, Any]] = []
        self.logged_at: list[tuple[int, int]] = []
        self.counters = dict.fromkeys(
            (
                "partition_crashes",
                "sequencer_crashes",
                "replica_restores",
                "resend_gaps",
                "corrupted_checkpoints",
                "faults_skipped",
                "sequencer_fail_stops",
                *(("failovers", "leader_cutoffs") if self.store is not None else ()),
            ),
            0,
        )
        self._plant_state: dict[str, Any] = {}

    # Set-up ----------------------------------------------------------------------
    def _make_clients(self) -> list[SimClient]:
        rng, opts = self.rng, self.opts
        n = opts.clients or rng.randint(*CLIENTS)
        in_flight = opts.in_flight_max or rng.randint(*IN_FLIGHT_PER_CLIENT)
        think = opts.think_max_us if opts.think_max_us is not None else rng.choice(THINK_MAX_US)
        retry_ms = opts.client_retry_ms or rng.randint(*CLIENT_RETRY_MS)
        clients = []
        for i in range(n):
            count = opts.calls // n + (1 if i < opts.calls % n else 0)
            clients.append(
                SimClient(
                    self,
                    i,
                    self.workload.client_calls(i, n),
                    count,
                    in_flight,
                    retry_ms * 1000,
                    opts.client_timeout_ms * 1000,
                    think,
                )
            )
        return clients

    def _plan_faults(self) -> list[Fault]:
        rng, opts = self.rng, self.opts
        if not opts.faults:
            return []
        c0 = self.clients[0]
        per_client = opts.calls / len(self.clients)
        per_call_us = c0.think_max_us / 2 + CALL_LATENCY_GUESS_US
        horizon_us = int(max(HORIZON_MIN_US, per_client * per_call_us / c0.in_flight_max))
        n_part = opts.partition_crashes
        if n_part is None:
            n_part = rng.randint(0, PARTITION_CRASHES_MAX)
        n_seq = opts.sequencer_crashes
        if n_seq is None:
            n_seq = rng.randint(0, SEQUENCER_CRASHES_MAX)
        if opts.plant in ("lose-synced", "no-retry-rebuild"):
            n_seq = max(n_seq, 1)
        faults = []
        for _ in range(n_part):
            faults.append(
                Fault(
                    rng.randint(FAULT_FIRST_US, horizon_us),
                    "partition",
                    rng.randrange(self.replicas),
                    rng.randrange(self.partitions),
                    down_us=rng.randint(*PARTITION_DOWN_US),
                    corrupt_checkpoint=(
                        opts.checkpoint_store == "file" and rng.random() < CORRUPT_CHECKPOINT_SHARE
                    ),
                )
            )
        if self.store is not None:  # replicated: leader kills and cut-offs
            if opts.plant == "publish-before-commit":
                n_seq = max(n_seq, 2)
            for _ in range(n_seq):
                faults.append(
                    Fault(
                        rng.randint(FAULT_FIRST_US, horizon_us),
                        "sequencer",
                        mode=rng.choice(LEADER_FAULT_MODES),
                        down_us=rng.randint(*SEQUENCER_DOWN_US),
                    )
                )
            return sorted(faults, key=lambda f: f.at_us)
        for _ in range(n_seq):
            mode = rng.choice(SEQUENCER_CRASH_MODES)
            if opts.plant == "lose-synced":
                mode = "now"
            faults.append(
                Fault(
                    rng.randint(FAULT_FIRST_US, horizon_us),
                    "sequencer",
                    mode=mode,
                    down_us=rng.randint(*SEQUENCER_DOWN_US),
                )
            )
        return sorted(faults, key=lambda f: f.at_us)

    @property
    def seq_node(self) -> SequencerNode:
        """The leader (replicated: the member elected last), where clients and
        partitions send."""
        return self.seq_nodes[self.leader]

    # Time ------------------------------------------------------------------------
    def mono_s(self) -> float:
        """The roles' clock (time.monotonic in a live process)."""
        return (MONOTONIC_BASE_US + self.loop.now_us) / 1e6

    def pid_of(self, node: PartitionNode) -> int:
        return 1000 + 100 * node.node.incarnation + 10 * node.replica + node.partition

    # Running ---------------------------------------------------------------------
    def run(self) -> SimResult:
        capture = _Capture()
        ordo_log = logging.getLogger("ordo")
        ordo_log.addHandler(capture)
        try:
            self._start()
            try:
                stopped = self.loop.run(lambda: self._finished, self.opts.time_limit_ms * 1000)
                if not stopped:
                    self.failure(f"not finished after {self.opts.time_limit_ms} ms simulated")
                    self._describe_cluster()
            except Exception as e:  # a role raised: that is the finding; keep its type
                frames = traceback.extract_tb(e.__traceback__)[-3:]
                where = " <- ".join(
                    f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames)
                )
                self.failure(f"{type(e).__name__}: {e} (at {self.loop.now_us} us, in {where})")
            stalls = self._stalls()
            failures = list(self._failures)
            record = self._run_record()
            failures += run_checks(record, self.workload)
            return self._result(record, failures, stalls, capture.lines)
        finally:
            ordo_log.removeHandler(capture)
            for node in self.seq_nodes:
                node.close()
            for replica in self.parts:
                for p in replica:
                    p.store.close()
            shutil.rmtree(self.root, ignore_errors=True)

    def _start(self) -> None:
        if self.store is not None:
            for node in self.seq_nodes:
                node.start()  # followers
            self.seq_node.lead()
        else:
            self.seq_node.start()
        for replica in self.parts:
            for p in replica:
                p.start()
        setup = self.workload.setup_calls()
        first = self.clients[0]
        rest = self.clients[1:]

        def start_rest() -> None:
            for c in rest:
                self.loop.after(self.rng.randint(0, CLIENT_START_US), c.start)

        if setup:
            first.on_setup_done = start_rest
            self.loop.after(self.rng.randint(0, CLIENT_START_US), first.start, setup)
        else:
            self.loop.after(self.rng.randint(0, CLIENT_START_US), first.start)
            start_rest()
        for fault in self.faults:
            self.loop.at(fault.at_us, self._apply_fault, fault, 0)
        self.loop.after(MONITOR_US, self._monitor)

    def failure(self, text: str) -> None:
        self._failures.append(text)
        self.trace.note(self.loop.now_us, f"FAILURE {text}")

    def _monitor(self) -> None:
        now = self.loop.now_us
        if all(c.done for c in self.clients):
            if self._clients_done_us is None:
                self._clients_done_us = now
                self.trace.note(now, "clients done")
            if self._quiescent():
                self._finished = True
                return
            if now - self._clients_done_us > self.opts.quiesce_limit_ms * 1000:
                limit = self.opts.quiesce_limit_ms
                self.failure(f"cluster not quiescent {limit} ms after the clients finished")
                self._describe_cluster()
                self._finished = True
                return
        self.loop.after(MONITOR_US, self._monitor)

    def _quiescent(self) -> bool:
        seq = self.seq_node.seq
        if seq is None or self._restoring:
            return False
        return all(p.caught_up(seq.epoch) for replica in self.parts for p in replica)

    def _describe_cluster(self) -> None:
        seq = self.seq_node.seq
        self.failure(f"sequencer: {'down' if seq is None else f'epoch {seq.epoch}'}")
        for replica in self.parts:
            for p in replica:
                if seq is None or not p.caught_up(seq.epoch):
                    self.failure(f"  {p.describe()}")

    # Faults ----------------------------------------------------------------------
    def _apply_fault(self, fault: Fault, attempt: int) -> None:
        if self._clients_done_us is not None or all(c.done for c in self.clients):
            self.counters["faults_skipped"] += 1
            return
        if not self._fault_allowed(fault):
            if attempt < FAULT_RETRIES_MAX:
                self.loop.after(FAULT_RETRY_US, self._apply_fault, fault, attempt + 1)
            else:
                self.counters["faults_skipped"] += 1
            return
        self.trace.note(self.loop.now_us, f"fault {fault.describe()}")
        if fault.kind == "partition":
            node = self.parts[fault.replica][fault.partition]
            node.crash()
            self.counters["partition_crashes"] += 1
            self.loop.after(fault.down_us, self._restart_partition, node, fault.corrupt_checkpoint)
            return
        if self.store is not None:
            self._leader_fault(fault)
            return
        self._seq_down_us = fault.down_us
        seq_node = self.seq_node
        if fault.mode == "in_sync":
            assert seq_node.log is not None
            seq_node.log.crash_in_sync = True
        elif fault.mode == "sync_error":
            assert seq_node.log is not None
            seq_node.log.fail_sync = True
        elif fault.mode == "before_publish":
            seq_node.crash_before_publish = True
        else:
            self.sequencer_crashed("between batches")

    def _fault_allowed(self, fault: Fault) -> bool:
        """Within what recovery alone handles: one partition of a replica at a time
        (its peers must be live to resend reads), one sequencer crash at a time."""
        if fault.kind == "sequencer" and self.store is not None:
            node = self.seq_node
            assert node.view is not None
            return node.node.up and node.seq is not None and not node.view.cut
        if fault.kind == "sequencer":
            node = self.seq_node
            return (
                node.node.up
                and not node.crash_before_publish
                and not (node.log is not None and node.log.crash_in_sync)
            )
        if fault.replica in self._restoring:
            return False
        return all(p.node.up and p.live for p in self.parts[fault.replica])

    def _restart_partition(self, node: PartitionNode, corrupt: bool) -> None:
        if corrupt:
            what = node.store.corrupt_newest(self.rng)
            if what is not None:
                self.counters["corrupted_checkpoints"] += 1
                self.trace.note(self.loop.now_us, f"corrupt checkpoint {what}")
        node.start()

    # Replicated ordering layer -------------------------------------------------------
    def _leader_fault(self, fault: Fault) -> None:
        """Kill the leader (restarted later as a follower) or cut it off the network
        for a while; either way its session expires and another member is elected."""
        node = self.seq_node
        assert node.view is not None
        if fault.mode == "kill":
            self.counters["sequencer_crashes"] += 1
            node.crash()
            self.loop.after(fault.down_us, self._restart_member, node)
        else:
            self.counters["leader_cutoffs"] += 1
            node.view.cut = True
            self.loop.after(fault.down_us, self._heal, node)
        self._expect_election()

    def leader_stepped_down(self, node: SequencerNode) -> None:
        """A leader's commit failed (cut off, or fenced by a newer term)."""
        self.trace.note(self.loop.now_us, f"seq{node.member} stepped down")
        if node is self.seq_node:
            self._expect_election()

    def _expect_election(self) -> None:
        if not self._electing:
            self._electing = True
            self.loop.after(self.opts.session_timeout_ms * 1000, self._elect)

    def _elect(self) -> None:
        """ZooKeeper's part: the lost leader's session has expired; the lowest-numbered
        member that is up and reachable (other than the lost leader, if there is
        another) claims the next term and leads."""
        old = self.leader
        able = [
            n
            for n in self.seq_nodes
            if n.node.up and n.view is not None and not n.view.cut and n.seq is None
        ]
        others = [n for n in able if n.member != old]
        if not able:  # nobody can lead now: ask again shortly
            self.loop.after(self.opts.epoch_ms * 1000, self._elect)
            return
        pick = (others or able)[0]
        self._electing = False
        self.leader = pick.member
        self.counters["failovers"] += 1
        self.trace.note(self.loop.now_us, f"elect seq{pick.member} (was seq{old})")
        pick.lead()

    def _restart_member(self, node: SequencerNode) -> None:
        node.start()  # a follower; it copies what it missed from the store

    def _heal(self, node: SequencerNode) -> None:
        assert node.view is not None
        node.view.cut = False
        self.trace.note(self.loop.now_us, f"heal seq{node.member}")
        if node.seq is not None and node is not self.seq_node:
            node.follow("healed after a newer leader was elected")

    def sequencer_crashed(self, when: str) -> None:
        self.counters["sequencer_crashes"] += 1
        self.trace.note(self.loop.now_us, f"sequencer crashes {when}")
        self.seq_node.crash(lose_synced=self.opts.plant == "lose-synced")
        self.loop.after(self._seq_down_us, self._restart_sequencer)

    def sequencer_failed_stop(self, reason: str) -> None:
        """The log failed under the sequencer, which fail-stopped: it refuses every
        call until its supervisor restarts it (a crash, then a start)."""
        self.counters["sequencer_fail_stops"] += 1
        self.trace.note(self.loop.now_us, f"sequencer fail-stop: {reason}")
        self.loop.after(self.rng.randint(*SUPERVISOR_RESTART_US), self._supervisor_restart)

    def _supervisor_restart(self) -> None:
        if self.seq_node.node.up:
            self.sequencer_crashed("by its supervisor after a fail-stop")

    def _restart_sequencer(self) -> None:
        self.seq_node.start()

    def on_resend_gap(self, node: PartitionNode, peer: int, retained_from: int) -> None:
        """A restarted partition cannot recover alone: restore its whole replica from the
        newest checkpoint all its partitions hold (the operator's documented action)."""
        self.counters["resend_gaps"] += 1
        r = node.replica
        self.trace.note(
            self.loop.now_us, f"resend gap r{r}p{node.partition} from p{peer} ({retained_from})"
        )
        if r in self._restoring:
            return
        if self.counters["replica_restores"] >= REPLICA_RESTORES_MAX:
            self.failure(f"replica {r} still cannot recover after {REPLICA_RESTORES_MAX} restores")
            self._finished = True
            return
        self._restoring.add(r)
        self.counters["replica_restores"] += 1
        nodes = self.parts[r]
        common = set.intersection(*(p.store.epochs() for p in nodes))
        epoch = max(common) if common else None
        self.trace.note(self.loop.now_us, f"restore replica {r} from {epoch or 'genesis'}")
        for p in nodes:
            if p.node.up:
                p.crash()
            p.store.discard_after(epoch)
        self.loop.after(self.rng.randint(*REPLICA_RESTORE_US), self._restore_replica, r, epoch)

    def _restore_replica(self, r: int, epoch: int | None) -> None:
        for p in self.parts[r]:
            p.start(from_epoch=epoch)
        self._restoring.discard(r)

    # Observation -----------------------------------------------------------------
    def note_batch(self, data: bytes) -> None:
        batch = wire.decode_batch(data)
        self.logged_at.append((self.loop.now_us, batch.next_txn_id - 1))
        self.trace.note(self.loop.now_us, f"batch {batch.epoch} txns {len(batch.txns)}")

    def note_results(self, node: PartitionNode, data: bytes) -> None:
        msg = ewire.Results._make(ewire.unpack(data)[1:])
        for txn_id, status, packed in msg.results:
            value = ewire.unpack(packed)
            self.reported.append((node.replica, node.partition, txn_id, status, value))

    # Planted bugs (never engine code) --------------------------------------------------
    def planted_batch(self, node: PartitionNode, batch: wire.Batch) -> wire.Batch:
        """``swap``: at one partition of the last replica, two txns of one batch trade
        places (so each runs under the other's id and order)."""
        if self.opts.plant != "swap" or node.replica != self.replicas - 1:
            return batch
        st = self._plant_state
        epoch = batch.epoch
        target = st.get("swap")
        if target is None:
            local = [i for i, t in enumerate(batch.txns) if node.partition in t.participants]
            if epoch < 2 or len(local) < 2:
                return batch
            target = st["swap"] = (node.partition, epoch, local[0], local[1])
            self.trace.note(self.loop.now_us, f"PLANT swap {target}")
        p, e, i, j = target
        if (node.partition, epoch) != (p, e):
            return batch
        txns = list(batch.txns)
        txns[i], txns[j] = txns[j], txns[i]
        return batch._replace(txns=tuple(txns))

    def planted_reads(self, node: PartitionNode, entries: list) -> list:
        """``drop-read``: the first read exchange in the last replica, and every resend
        of it, vanishes."""
        if self.opts.plant != "drop-read" or node.replica != self.replicas - 1:
            return entries
        doomed: set[int] | None = self._plant_state.get("drop-read")
        if doomed is None and entries:
            doomed = self._plant_state["drop-read"] = {e[0] for e in entries}
            self.trace.note(self.loop.now_us, f"PLANT drop-read txns {sorted(doomed)}")
        return [e for e in entries if doomed is None or e[0] not in doomed]

    def planted_sequencer(self, seq: Sequencer) -> None:
        """``no-retry-rebuild``: a restarted sequencer forgets which calls its log holds."""
        if self.opts.plant == "no-retry-rebuild" and self.counters["sequencer_crashes"]:
            seq.retries = RetryCache()
            seq._logged_txns.clear()

    # Results -------------------------------------------------------------------------
    def _stalls(self) -> list[str]:
        out = []
        for c in self.clients:
            for r in c.records:
                if r.timed_out and not r.answers:
                    out.append(
                        f"client {c.index} req {r.req_id} {r.proc}{r.args!r:.60} never answered "
                        f"(sent {r.sends} times from {r.sent_us // 1000} ms)"
                    )
        return out

    def _sequencer_stats(self) -> list[SequencerStats]:
        out: list[SequencerStats] = []
        for node in self.seq_nodes:
            out += list(node.retired) + ([node.seq.stats] if node.seq is not None else [])
        return out

    def _run_record(self) -> RunRecord:
        if self.store is None:
            log = [data for _e, data in iter_frames(self.log_dir)]
        else:  # the committed history; every member's log must be a prefix of it
            log = [self.store.batches[e] for e in range(1, self.store.last + 1)]
            self._check_member_logs(log)
        replicas: list[list[Partition | None]] = [
            [p.part for p in replica] for replica in self.parts
        ]
        return RunRecord(
            log,
            clone_storage(self.image.whole),
            replicas,
            [r for c in self.clients for r in c.records],
            self.reported,
            self.logged_at,
            sum(s.determinism_violations for s in self._sequencer_stats()),
            self.partitions,
        )

    def _check_member_logs(self, committed: list[bytes]) -> None:
        terms = [wire.decode_batch(data).term for data in committed]
        if terms != sorted(terms):
            self.failure("terms decrease along the committed log")
        for node in self.seq_nodes:
            if node.log is not None:
                node.log.sync()
            mine = [data for _e, data in iter_frames(node.log_dir)]
            if mine != committed[: len(mine)]:
                self.failure(f"seq{node.member}'s log is not a prefix of the committed log")

    def _result(
        self, record: RunRecord, failures: list[str], stalls: list[str], log_lines: list[str]
    ) -> SimResult:
        seq = self.seq_node
        records = [r for c in self.clients for r in c.records]
        logged = [wire.decode_batch(data).txns for data in record.log]
        net = self.net.stats
        counters = dict(self.counters)
        counters.update(
            epochs=len(record.log),
            txns=sum(len(txns) for txns in logged),
            multi_partition_txns=sum(len(t.participants) > 1 for txns in logged for t in txns),
            dependent_restarts=sum(st.restarts for st in self._sequencer_stats()),
            calls=len(records),
            answered=sum(1 for r in records if r.answers),
            timeouts=sum(1 for r in records if r.timed_out),
            client_retries=sum(c.retries for c in self.clients),
            messages=net.sent,
            pub_drops=net.dropped_pub,
            lost_in_crash=net.lost_crash,
            torn_tails=seq.torn_tails,
            truncated_bytes=seq.truncated_bytes,
            checkpoints=sum(p.store.durable for replica in self.parts for p in replica),
            checkpoint_deltas=sum(p.store.deltas for replica in self.parts for p in replica),
            base_rows_copied=sum(p.store.copied_rows for replica in self.parts for p in replica),
            log_fetches=sum(p.log_fetches for replica in self.parts for p in replica),
            early_results=sum(p.early_results for replica in self.parts for p in replica),
            events=self.loop.events,
            sim_ms=self.loop.now_us // 1000,
        )
        for f in failures:
            self.trace.note(self.loop.now_us, f"check failed: {f}")
        self.trace.note(self.loop.now_us, f"counters {sorted(counters.items())}")
        # The outcome, so that the trace digest fingerprints it: every partition's final
        # state and every answer a client got (compiled and pure engines must agree).
        states = [
            (r, i, p.last_epoch, p.storage.state_hash)
            for r, replica in enumerate(record.replicas)
            for i, p in enumerate(replica)
            if p is not None
        ]
        answers = [(r.answers, r.timed_out) for r in records]
        answers_digest = hashlib.sha256(repr(answers).encode()).hexdigest()[:16]
        self.trace.note(self.loop.now_us, f"final states {states} answers {answers_digest}")
        return SimResult(
            self.seed,
            self.workload.name,
            f"{self.replicas}x{self.partitions}",
            failures,
            stalls,
            counters,
            self.trace.digest(),
            [f.describe() for f in self.faults],
            self.opts.strict_liveness,
            self.trace.lines or [],
            log_lines,
        )


def options_for(workload: str, **options: Any) -> SimOptions:
    """SimOptions: the workload's defaults, then the caller's ``options``."""
    return SimOptions(**{**workload_class(workload).defaults, **options})


def run_seed(seed: int, workload: str = "bank", **options: Any) -> SimResult:
    """One simulated run; ``options`` are SimOptions fields."""
    return Simulator(seed, workload, options_for(workload, **options)).run()
