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
The nodes see the run only through ``sim_world.World``, which the ``Simulator``
implements; what a seed draws before the run starts is ``sim_plan``, and reading the
finished run (the record for the checks, the counters) is ``sim_outcome``.
Every message is msgpack-encoded as on the wire. One ``random.Random(seed)`` draws
everything: the cluster's shape, the workload, delays and drops, and the faults:

- a partition crashes and restarts from its newest durable checkpoint (or genesis),
  asks its peers to resend reads and catches up from the log service;
- the sequencer crashes (between batches, between a batch's append and its sync, or
  after its sync but before it is published) and a new one starts over the same log,
  which lost its un-synced tail and may end in a torn frame; or its log's fdatasync
  fails (EIO), it fail-stops, and its supervisor restarts it;
- a batch published on PUB/SUB is dropped (the partition repairs the gap);
- a checkpoint file is corrupted before a restart (the previous one is used);
- with readers (``readers=N``; the node is handed in, ``reader_node``, since readers
  sit above this package: executor.reader.sim_reader), a reader is killed and
  restarted empty, and catches up from the log service.
- with a replicated ordering layer (``sequencers`` > 1), the leader is killed or cut
  off the store; with ``ha_faults`` also (``sim_plan.plan_ha_faults``, overlapping): a
  member paused (``sim_network.Network.pause``: its inputs and timers wait, its own
  ``NodeLoop``), past its session or not; one-way cuts (``Network.cut``: leader to
  replicas, replicas to leader, clients to one sequencer); a follower crashing with
  a wiped disk; the store losing a server (every member's view cut, then slow) or
  slow (``sim_ordering.SimStore``: each commit stalls its committer, some time out
  after they were applied); a member's wall clock jumping (its ``NodeLoop`` skew).
When peers no longer retain the reads a restarted partition needs (MSG_RESEND_GAP),
the simulator does what the operator is told to: restore the whole replica from its
newest common checkpoint (or genesis).

Readers follow the publication and the log service as partitions do, and clients send
a share of their read-only calls to them as queries too (``reader_query_share``).
Everything about readers (their network traffic, crashes, the clients' queries to
them) draws from a generator of their own (``readers_rng``), so a seed's history is
the same with readers or without.

When every client has its answers (or gave up), every reader query is settled and the
cluster (readers included) is quiescent, the checks in ``checks`` run against the
serial oracle: for readers, every answer equals the oracle's at the epoch it names,
and every reader's partition hashes at every epoch it applied equal the oracle's
(summed) and the replicas' boundary hashes. Same seed, same options: the same
run, event for event; ``trace_digest`` proves it.

The simulator plays ZooKeeper: it elects the lowest-numbered able member once the lost
leader's session timeout has passed. With ``ha_faults`` the lost leader learns that its
session ended: at once if it runs (live: ``surely_expired`` or the expiry event), and
if it is paused, when it resumes, before it handles anything it missed (the live loop
should do the same: see ``_lose_session``). Each member sees the run through its own
``MemberWorld`` (its loop; everything else is the simulator's). The store's commits and
every answer a sequencer sends (``Network.tap``) are recorded in one order, for the
check that no deposed leader answers after its successor committed.

Planted bugs (``plant=``), injected by the simulator, never in engine code, to show
that the checks catch them: ``swap`` (two txns of a batch swapped at one partition of
one replica), ``drop-read`` (one txn's read exchange lost forever in one replica),
``lose-synced`` (a disk that loses the last synced frame of the log on a crash),
``no-retry-rebuild`` (a restarted sequencer that forgot which calls its log holds);
with sequencers > 1 (``REPLICATED_PLANTS``): ``publish-before-commit`` (a leader hands a
batch to the partitions before the store commits it), ``results-to-old-leader``
(partitions learn a new leader from its heartbeats only, and a new leader does not
announce itself: the results of its first batches go to the deposed leader and their
calls are never answered; the cause of the client hangs that got the client rule of
54a0fcf reverted, fixed live by 7981127; caught with ``strict_liveness``);
``no-exactly-once-rebuild`` (every newly elected leader after the first forgets which
calls the log holds),
``client-new-ids-on-resend`` (a client resends a call under a new request id); with
``ha_faults`` (``HA_FAULT_PLANTS``): ``partition-accepts-old-term`` (partitions take a
deposed leader's late batches and heartbeats, and send it results),
``fenced-leader-serves-reads`` (a leader learns it was fenced only from a failed
commit: after its session is lost, with no write to commit, it keeps answering from
what reaches it, after its successor committed); with
readers (``READER_PLANTS``): ``reader-ahead`` (reader 0's answers name the epoch after
the one they read), ``reader-skip`` (reader 0 applies one batch as empty).

Invariants: no wall clock, no sockets, no threads, no entropy besides the seed; the
simulator drives the roles only through the inputs and outputs the live processes
use (plus the planted bugs, which are marked as such).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import traceback
from pathlib import Path
from typing import Any, cast

from executor.deterministic.checks import RunRecord, run_checks
from executor.deterministic.partition import Partition
from executor.deterministic.sim_network import EventLoop, Network, Node, NodeLoop, Payload, Trace
from executor.deterministic.sim_options import Fault, SimOptions, SimResult
from executor.deterministic.sim_ordering import SimStore
from executor.deterministic.sim_outcome import (
    committed_log,
    final_hashes,
    find_stalls,
    note_outcome,
    run_counters,
    sequencer_stats,
)
from executor.deterministic.sim_partition import MONOTONIC_BASE_US, PartitionNode
from executor.deterministic.sim_plan import (
    CHECKPOINT_EVERY_EPOCHS,
    CLIENT_START_US,
    REPLICA_RESTORE_US,
    SHAPES,
    SUPERVISOR_RESTART_US,
    link_profile,
    make_clients,
    plan_faults,
    plan_reader_faults,
)
from executor.deterministic.sim_sequencer import SequencerNode
from executor.deterministic.sim_world import (
    PartitionPeer,
    ReaderNodeFactory,
    ReaderPeer,
    SequencerPeer,
    World,
)
from executor.deterministic.workloads import (
    Workload,
    clone_storage,
    workload_class,
    workload_genesis,
)
from sequencer.replication import MemoryStore
from sequencer.retry_cache import RetryCache
from sequencer.sequencer import Sequencer
from txn_library.errors import ERR_NOT_LEADER, ERR_RETRY_EXPIRED, ERR_UNAVAILABLE, ERROR
from txn_library.procedure import load_modules, lookup
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire

PLANTS = (
    "swap",
    "drop-read",
    "lose-synced",
    "no-retry-rebuild",
    "client-new-ids-on-resend",
    "publish-before-commit",
    "results-to-old-leader",
    "no-exactly-once-rebuild",
    "partition-accepts-old-term",
    "fenced-leader-serves-reads",
)
# need SimOptions.sequencers > 1
REPLICATED_PLANTS = (
    "client-new-ids-on-resend",
    "publish-before-commit",
    "results-to-old-leader",
    "no-exactly-once-rebuild",
    "partition-accepts-old-term",
    "fenced-leader-serves-reads",
)
# need SimOptions.ha_faults too (the faults that show them)
HA_FAULT_PLANTS = ("partition-accepts-old-term", "fenced-leader-serves-reads")
# An answer that is none: the call may or may not have run, or goes to the leader
NOT_ANSWERS = frozenset((ERR_NOT_LEADER, ERR_UNAVAILABLE, ERR_RETRY_EXPIRED, "result_unknown"))
READER_PLANTS = ("reader-ahead", "reader-skip")  # need SimOptions.readers > 0

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
    """One run: builds the cluster, plays the fault plan, does what the supervisor,
    ZooKeeper and the operator do, and checks the outcome (implements sim_world.World)."""

    def __init__(
        self,
        seed: int,
        workload: str,
        opts: SimOptions,
        reader_node: ReaderNodeFactory | None = None,
    ) -> None:
        if opts.plant is not None and opts.plant not in PLANTS + READER_PLANTS:
            raise ValueError(
                f"unknown planted bug {opts.plant!r}; choose from {PLANTS + READER_PLANTS}"
            )
        if opts.plant in READER_PLANTS and opts.readers < 1:
            raise ValueError(f"{opts.plant} needs readers (readers >= 1)")
        if opts.readers > 0 and reader_node is None:
            raise ValueError(
                "readers need a reader node: pass reader_node="
                "executor.reader.sim_reader.ReaderNode (readers sit above the simulator)"
            )
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
        if opts.dataflow_recovery not in (None, "strong", "weak"):
            raise ValueError("dataflow_recovery is 'strong' or 'weak'")
        # not drawn from rng: every other seed's run stays what it was
        self.dataflow_recovery = opts.dataflow_recovery or ("weak" if seed % 2 else "strong")
        self.loop = EventLoop()
        self.trace = Trace(opts.keep_trace)
        profile = link_profile(rng, opts)
        # Not drawn from rng: readers leave the cluster's draws as they were.
        self.readers_rng = random.Random(f"ordo-sim-readers-{seed}")
        self.net = Network(self.loop, rng, profile, self.trace, self.readers_rng)
        self.root = Path(tempfile.mkdtemp(prefix=f"ordo-sim-{seed}-", dir=_temp_root()))
        self.log_dir = self.root / "log"
        if opts.sequencers < 1:
            raise ValueError("sequencers is at least 1")
        if opts.plant in REPLICATED_PLANTS and opts.sequencers < 2:
            raise ValueError(f"{opts.plant} needs a replicated layer (sequencers >= 2)")
        if opts.plant in HA_FAULT_PLANTS and not opts.ha_faults:
            raise ValueError(f"{opts.plant} needs ha_faults")
        # Replicated ordering layer (sim_ordering): N members over one store, a leader.
        self.ha = opts.ha_faults and opts.sequencers > 1
        self.store: MemoryStore | None = None
        if opts.sequencers > 1:
            self.store = SimStore(rng, self._on_commit) if self.ha else MemoryStore()
        # ha_faults: each member sees the run through its own loop (pauses, clock jumps)
        self.member_loops: list[NodeLoop] = []
        self.member_worlds: list[MemberWorld] = []
        self.seq_nodes = [SequencerNode(self._member_world(m), m) for m in range(opts.sequencers)]
        for loop, node in zip(self.member_loops, self.seq_nodes, strict=False):
            loop.node = node.node
        self.leader = 0
        self._electing = False
        self.parts = [
            [PartitionNode(self, r, p) for p in range(self.partitions)]
            for r in range(self.replicas)
        ]
        self.readers: list[ReaderPeer] = []
        if reader_node is not None:
            self.readers = [reader_node(self, i) for i in range(opts.readers)]
        self.clients = make_clients(self, self.workload)
        self.client_by_identity = {c.identity: c for c in self.clients}
        self.faults = plan_faults(
            rng, opts, self.clients, self.replicas, self.partitions, self.store is not None
        )
        self.reader_faults = plan_reader_faults(self.readers_rng, opts, self.clients)
        self.boundaries: list[tuple[int, int, int, int]] = []
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
                *(("reader_crashes", "reader_faults_skipped") if self.readers else ()),
            ),
            0,
        )
        self._plant_state: dict[str, Any] = {}
        # ha_faults: the store's commits and the leaders' answers, in one order (the
        # check that no deposed leader answers after its successor committed)
        self._order = 0
        self.commits: list[tuple[int, int, int, int]] = []  # (order, time, epoch, term)
        self.leader_answers: list[tuple[int, int, int, int, str, tuple[int, ...]]] = []
        self._pause_depth = [0] * len(self.seq_nodes)
        self._paused_since = [-1] * len(self.seq_nodes)
        self._session_lost: set[int] = set()
        self._store_cut: set[int] = set()  # members cut off the store ("cut" faults)
        self._store_down = False
        self._store_fault = False
        for world in self.member_worlds:  # built after the members: bound now
            world.bind(self)
        if self.ha:
            self.counters.update(
                dict.fromkeys(
                    (
                        "pauses",
                        "oneway_cuts",
                        "wiped_followers",
                        "store_faults",
                        "store_timeouts",
                        "clock_jumps",
                        "sessions_lost",
                    ),
                    0,
                )
            )
            self.net.tap = self._tap

    def _member_world(self, member: int) -> World:
        """What sequencer ``member`` sees: the simulator, or with ha_faults the simulator
        with its own loop (its timers wait while it is paused; its clock jumps)."""
        if not self.ha:
            return self
        loop = NodeLoop(self.loop, self.net)
        self.member_loops.append(loop)
        world = MemberWorld(self, loop)
        self.member_worlds.append(world)
        return cast(World, world)

    @property
    def seq_node(self) -> SequencerNode:
        """The leader (replicated: the member elected last), where clients send."""
        return self.seq_nodes[self.leader]

    def sequencer_of(self, member: int) -> SequencerNode:
        """Sequencer ``member``: where a partition that believes it leads sends results."""
        return self.seq_nodes[member] if 0 <= member < len(self.seq_nodes) else self.seq_node

    # Time ------------------------------------------------------------------------
    def mono_s(self) -> float:
        """The roles' clock (time.monotonic in a live process)."""
        return (MONOTONIC_BASE_US + self.loop.now_us) / 1e6

    def pid_of(self, node: PartitionPeer) -> int:
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
            stalls = find_stalls(self.clients)
            record = self._run_record()  # its own checks (member logs, terms) fail here
            failures = list(self._failures)
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
        for reader in self.readers:
            reader.start()
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
        for fault in self.reader_faults:
            self.loop.at(fault.at_us, self._apply_reader_fault, fault)
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
        return (
            all(p.caught_up(seq.epoch) for replica in self.parts for p in replica)
            and all(r.caught_up(seq.epoch) for r in self.readers)
            and all(c.reader_queries_done for c in self.clients)
        )

    def _describe_cluster(self) -> None:
        seq = self.seq_node.seq
        self.failure(f"sequencer: {'down' if seq is None else f'epoch {seq.epoch}'}")
        for replica in self.parts:
            for p in replica:
                if seq is None or not p.caught_up(seq.epoch):
                    self.failure(f"  {p.describe()}")
        for r in self.readers:
            if seq is None or not r.caught_up(seq.epoch):
                self.failure(f"  {r.describe()}")

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
        if fault.kind in HA_FAULT_KINDS:
            self._ha_fault(fault)
            return
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

    def _apply_reader_fault(self, fault: Fault) -> None:
        """kill -9 of a reader, restarted (empty) ``down_us`` later; a reader needs
        nobody else to recover, so any reader may fall at any time."""
        reader = self.readers[fault.replica]
        clients_done = self._clients_done_us is not None or all(c.done for c in self.clients)
        if clients_done or not reader.node.up:  # down: a fault before restarted it
            self.counters["reader_faults_skipped"] += 1
            return
        self.trace.note(self.loop.now_us, f"fault {fault.describe()}")
        self.counters["reader_crashes"] += 1
        reader.crash()
        self.loop.after(fault.down_us, reader.start)

    def _fault_allowed(self, fault: Fault) -> bool:
        """Within what recovery alone handles: one partition of a replica at a time
        (its peers must be live to resend reads), one sequencer crash at a time."""
        if fault.kind in HA_FAULT_KINDS:
            return self._ha_fault_allowed(fault)
        if fault.kind == "sequencer" and self.store is not None:
            node = self.seq_node
            assert node.view is not None
            return (
                node.node.up and node.seq is not None and not node.view.cut and not node.node.paused
            )
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
            self._store_cut.add(node.member)
            self._set_store_reach()
            self.loop.after(fault.down_us, self._heal, node)
        self._expect_election()

    def leader_stepped_down(self, node: SequencerPeer) -> None:
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
        lost = self.seq_nodes[old]
        if self.ha and lost.node.up:
            self._lose_session(lost)
        able = [
            n
            for n in self.seq_nodes
            if n.node.up
            and n.view is not None
            and not n.view.cut
            and n.seq is None
            and not n.node.paused
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
        self._store_cut.discard(node.member)
        self._set_store_reach()
        self.trace.note(self.loop.now_us, f"heal seq{node.member}")
        if node.seq is not None and node is not self.seq_node and not node.node.paused:
            node.follow("healed after a newer leader was elected")

    def _set_store_reach(self) -> None:
        """Who reaches the store: nobody while it is down, else all but the cut."""
        for node in self.seq_nodes:
            assert node.view is not None
            node.view.cut = self._store_down or node.member in self._store_cut

    def _lose_session(self, node: SequencerNode) -> None:
        """ZooKeeper ended ``node``'s session (the simulator elects another): a running
        member learns it at once (live: ``surely_expired``, or the expiry event); a
        paused one when it resumes, before anything else it does. The planted bug
        ``fenced-leader-serves-reads`` ignores it: only a failed commit stops it."""
        if node.seq is None:
            return
        if node.node.paused:
            self._session_lost.add(node.member)
            return
        if self.opts.plant == "fenced-leader-serves-reads":
            self.trace.note(self.loop.now_us, f"PLANT seq{node.member} keeps its lost session")
            return
        self.counters["sessions_lost"] += 1
        node.follow("its ZooKeeper session expired")

    # Replicated layer's harder faults (ha_faults; sim_plan.plan_ha_faults) -----------
    def _member_of(self, fault: Fault) -> SequencerNode:
        return self.seq_node if fault.member < 0 else self.seq_nodes[fault.member]

    def _wipe_target(self, fault: Fault) -> SequencerNode:
        """The fault's member, or the next one if it leads now (a follower is wiped)."""
        m = fault.member % len(self.seq_nodes)
        if m == self.leader:
            m = (m + 1) % len(self.seq_nodes)
        return self.seq_nodes[m]

    def _ha_fault_allowed(self, fault: Fault) -> bool:
        if fault.kind in ("pause", "clock"):
            node = self._member_of(fault)
            return node.node.up and not node.node.paused
        if fault.kind == "wipe":
            node = self._wipe_target(fault)
            return node.node.up and not node.node.paused and node.seq is None
        if fault.kind == "store":
            return not self._store_fault
        return True

    def _ha_fault(self, fault: Fault) -> None:
        if fault.kind == "pause":
            self.counters["pauses"] += 1
            self._pause(self._member_of(fault), fault.down_us, session=True)
        elif fault.kind == "oneway":
            self.counters["oneway_cuts"] += 1
            links = self._oneway_links(fault)
            for src, dst in links:
                self.net.cut(src, dst)
            self.loop.after(fault.down_us, self._heal_links, links)
        elif fault.kind == "wipe":
            self.counters["wiped_followers"] += 1
            node = self._wipe_target(fault)
            node.crash()
            shutil.rmtree(node.log_dir, ignore_errors=True)
            node.log_dir.mkdir()  # a new, empty disk
            self.trace.note(self.loop.now_us, f"wiped seq{node.member}'s disk")
            self.loop.after(fault.down_us, self._restart_member, node)
        elif fault.kind == "store":
            self.counters["store_faults"] += 1
            self._store_fault = True
            if fault.mode == "lose-server":
                self._store_down = True
                self._set_store_reach()
                self.loop.after(fault.down_us, self._store_back, fault)
            else:
                self._store_slow(fault)
        else:
            self.counters["clock_jumps"] += 1
            member = self._member_of(fault).member
            self.member_loops[member].skew_us += fault.delta_us

    def _oneway_links(self, fault: Fault) -> list[tuple[Node, Node]]:
        leader = self.seq_node.node
        if fault.mode == "clients-to-seqs":
            seq = self._member_of(fault).node
            return [(self.clients[c].node, seq) for c in fault.targets if c < len(self.clients)]
        parts = [p.node for r in fault.targets for p in self.parts[r]]
        if fault.mode == "leader-to-parts":
            return [(leader, p) for p in parts]
        return [(p, leader) for p in parts]

    def _heal_links(self, links: list[tuple[Node, Node]]) -> None:
        self.trace.note(self.loop.now_us, f"heal {len(links)} one-way links")
        for src, dst in links:
            self.net.heal(src, dst)

    def _store_back(self, fault: Fault) -> None:
        """The ensemble has a quorum again, and is slow as long again."""
        self._store_down = False
        self._set_store_reach()
        self.trace.note(self.loop.now_us, "store reachable again")
        self._store_slow(fault)

    def _store_slow(self, fault: Fault) -> None:
        store = self.store
        assert isinstance(store, SimStore)
        store.slow_us = fault.delta_us
        store.timeout_pct = fault.timeout_pct
        self.loop.after(fault.down_us, self._store_fast)

    def _store_fast(self) -> None:
        store = self.store
        assert isinstance(store, SimStore)
        store.slow_us, store.timeout_pct = 0, 0.0
        self._store_fault = False
        self.trace.note(self.loop.now_us, "store fast again")

    def _pause(self, node: SequencerNode, pause_us: int, session: bool) -> None:
        """``node`` stops for ``pause_us`` (pauses nest). A fault's pause (``session``)
        that outlasts the session timeout loses the leader its session: another member
        is elected; a store's slow commit stalls its committer well within it."""
        m = node.member
        self._pause_depth[m] += 1
        if self._pause_depth[m] == 1:
            self.net.pause(node.node)
            self._paused_since[m] = self.loop.now_us
            self.trace.note(self.loop.now_us, f"pause seq{m}")
        if session and node is self.seq_node and node.seq is not None:
            since = self._paused_since[m]
            self.loop.after(self.opts.session_timeout_ms * 1000, self._session_check, node, since)
        self.loop.after(pause_us, self._resume, node)

    def _session_check(self, node: SequencerNode, since: int) -> None:
        """The session timeout has passed since ``node`` (the leader) was paused: still
        silent, its session has expired and another member is elected."""
        if self._paused_since[node.member] == since and node is self.seq_node:
            self.trace.note(self.loop.now_us, f"seq{node.member}'s session expired (paused)")
            if not self._electing:
                self._electing = True
                self._elect()

    def _resume(self, node: SequencerNode) -> None:
        m = node.member
        self._pause_depth[m] -= 1
        if self._pause_depth[m]:
            return
        self._paused_since[m] = -1
        self.trace.note(self.loop.now_us, f"resume seq{m}")
        self.net.resume(node.node)  # what it missed runs next, in order
        if m in self._session_lost:
            self._session_lost.discard(m)
            self._lose_session(node)

    def _on_commit(self, term: int, epoch: int) -> None:
        """The store committed ``epoch`` under ``term`` (ha_faults): recorded (as logged
        too: a commit that times out is logged though its leader never says so), and a
        slow store stalls the committer for the commit's latency."""
        self._order += 1
        self.commits.append((self._order, self.loop.now_us, epoch, term))
        store = self.store
        assert isinstance(store, SimStore)
        last_txn = wire.decode_batch(store.batches[epoch]).next_txn_id - 1
        self.logged_at.append((self.loop.now_us, last_txn))
        if store.slow_us:
            for node in self.seq_nodes:
                if node.term == term and node.seq is not None:
                    self._pause(node, store.slow_us, session=False)

    def _tap(self, src: Node, dst: Node, kind: str, payload: Payload) -> None:
        """Every reply a sequencer sends a client (ha_faults): which calls it answered,
        with the answering member's term, in order with the store's commits."""
        if kind != "reply" or not src.name.startswith("seq"):
            return
        assert isinstance(payload, bytes)
        msg = wire.unpack(payload)
        answered = tuple(
            req_id
            for req_id, status, value in msg[1]
            if req_id is not None
            and not (
                status == ERROR
                and isinstance(value, tuple)
                and value[:1]
                and value[0] in NOT_ANSWERS
            )
        )
        if answered:
            member = int(src.name[3:])
            self._order += 1
            term = self.seq_nodes[member].term
            self.leader_answers.append(
                (self._order, self.loop.now_us, member, term, dst.name, answered)
            )

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

    def on_resend_gap(self, node: PartitionPeer, peer: int, retained_from: int) -> None:
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

    def note_boundary(self, node: PartitionPeer, epoch: int, state_hash: int) -> None:
        self.boundaries.append((node.replica, node.partition, epoch, state_hash))

    def note_results(self, node: PartitionPeer, data: bytes) -> None:
        msg = ewire.Results._make(ewire.unpack(data)[1:])
        for txn_id, status, packed in msg.results:
            value = ewire.unpack(packed)
            self.reported.append((node.replica, node.partition, txn_id, status, value))

    # Planted bugs (never engine code) --------------------------------------------------
    def planted_batch(self, node: PartitionPeer, batch: wire.Batch) -> wire.Batch:
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

    def planted_reads(self, node: PartitionPeer, entries: list) -> list:
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
        """``no-retry-rebuild``: a restarted sequencer forgets which calls its log holds;
        ``no-exactly-once-rebuild``: so does every newly elected leader after the first."""
        plant = self.opts.plant
        if (plant == "no-retry-rebuild" and self.counters["sequencer_crashes"]) or (
            plant == "no-exactly-once-rebuild" and seq.term > 1
        ):
            if plant == "no-exactly-once-rebuild":
                self.trace.note(self.loop.now_us, f"PLANT term {seq.term} forgets the log's calls")
            seq.retries = RetryCache()
            seq._logged_txns.clear()

    def planted_reader_batch(self, reader: ReaderPeer, data: bytes) -> bytes:
        """``reader-skip``: reader 0 applies one batch (the first it sees from epoch 3
        on that writes) as if it held no transaction, every time it gets it."""
        if self.opts.plant != "reader-skip" or reader.index != 0:
            return data
        batch = wire.decode_batch(data)
        target = self._plant_state.get("reader-skip")
        if target is None:
            writes = any(not lookup(t.proc).read_only for t in batch.txns)
            if batch.epoch < 3 or batch.derived or not writes:
                return data
            target = self._plant_state["reader-skip"] = batch.epoch
            self.trace.note(self.loop.now_us, f"PLANT reader-skip epoch {target}")
        if batch.epoch != target:
            return data
        return wire.pack(batch._replace(txns=()))

    def planted_reader_replies(self, reader: ReaderPeer, replies: list) -> list:
        """``reader-ahead``: reader 0's answers name the epoch after the one they read."""
        if self.opts.plant != "reader-ahead" or reader.index != 0:
            return replies
        return [
            (qid, status, packed, epoch if status == ERROR else epoch + 1)
            for qid, status, packed, epoch in replies
        ]

    # Results -------------------------------------------------------------------------
    def _run_record(self) -> RunRecord:
        log = committed_log(self.log_dir, self.store, self.seq_nodes, self.failure)
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
            sum(s.determinism_violations for s in sequencer_stats(self.seq_nodes)),
            self.partitions,
            [q for c in self.clients for q in c.queries],
            [q for c in self.clients for q in c.reader_queries],
            [(r.index, e, h) for r in self.readers for e, h in r.applied_hashes()],
            [r.applied_epoch() for r in self.readers],
            self.boundaries,
            self.commits,
            self.leader_answers,
        )

    def _result(
        self, record: RunRecord, failures: list[str], stalls: list[str], log_lines: list[str]
    ) -> SimResult:
        records = [r for c in self.clients for r in c.records]
        if isinstance(self.store, SimStore):
            self.counters["store_timeouts"] = self.store.timeouts
        counters = run_counters(
            self.counters,
            record,
            self.clients,
            self.seq_nodes,
            self.seq_node,
            self.parts,
            self.readers,
            self.net.stats,
            self.loop,
        )
        answers = note_outcome(self.trace, self.loop.now_us, record, records, failures, counters)
        return SimResult(
            self.seed,
            self.workload.name,
            f"{self.replicas}x{self.partitions}",
            failures,
            stalls,
            counters,
            self.trace.digest(),
            [f.describe() for f in sorted(self.faults + self.reader_faults, key=_at)],
            self.opts.strict_liveness,
            self.trace.lines or [],
            log_lines,
            final_hashes(record),
            answers,
        )


def _at(fault: Fault) -> int:
    return fault.at_us


HA_FAULT_KINDS = frozenset(("pause", "oneway", "wipe", "store", "clock"))


class MemberWorld:
    """The run as one sequencer member sees it with ha_faults: the simulator, except
    the event loop, which is the member's own ``NodeLoop`` (its timers wait while it is
    paused; its clock may jump). Everything else is the simulator's, looked up when
    used (the partitions and clients are built after the members)."""

    def __init__(self, sim: Simulator, loop: NodeLoop) -> None:
        self._sim = sim
        self.loop = loop
        # read on every message: bound once, not looked up
        self.net = sim.net
        self.rng = sim.rng
        self.trace = sim.trace
        self.opts = sim.opts
        self.store = sim.store

    def bind(self, sim: Simulator) -> None:
        """The run's peers and shape, once the simulator has built them."""
        self.parts = sim.parts
        self.readers = sim.readers
        self.client_by_identity = sim.client_by_identity
        self.replicas = sim.replicas
        self.partitions = sim.partitions
        self.mono_s = sim.mono_s
        self.note_batch = sim.note_batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sim, name)


def options_for(workload: str, **options: Any) -> SimOptions:
    """SimOptions: the workload's defaults, then the caller's ``options``."""
    return SimOptions(**{**workload_class(workload).defaults, **options})


def run_seed(
    seed: int,
    workload: str = "bank",
    reader_node: ReaderNodeFactory | None = None,
    **options: Any,
) -> SimResult:
    """One simulated run; ``options`` are SimOptions fields; ``reader_node`` builds the
    readers (``readers=N``): executor.reader.sim_reader.ReaderNode."""
    return Simulator(seed, workload, options_for(workload, **options), reader_node).run()
