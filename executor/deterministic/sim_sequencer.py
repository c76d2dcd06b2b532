"""A simulated sequencer process: the real ``Sequencer`` role over a crashable log.

The glue mirrors ``cluster.sequencer_server.SequencerServer``: client frames go to
``on_frame`` then ``run_intake``; partition reports to ``on_results_message``; every
``epoch_duration_ms`` ``tick`` cuts a batch, which is published to every partition of
every replica (PUB/SUB: may be dropped); a heartbeat carrying the last epoch goes out
when no batch did for ``HEARTBEAT_MS``; the log service answers LOG_FETCH from the
command log with at most ``log_service_epochs_per_reply_max`` epochs; queries go to
the chosen replica or, if its partition is not connected, the next one (PUSH with
ZMQ_IMMEDIATE). Its clock and seed source are the simulator's.

A crash discards the role objects and leaves the command log as a real crash would
(``sim_log``); a restart builds them anew over the recovered log.

The ordering member's state machine is ``sequencer.member.OrderingMember``, the class
the live process drives (one per incarnation); this node schedules it and carries its
outputs over the simulated network. Without replication it leads at once. Replicated
(``SimOptions.sequencers`` > 1): every member starts as a follower whose turn, every
epoch, copies committed batches from the shared store (through ``MemberStore``: a
cut-off member's copy fails and changes nothing); the member the simulator elects
``lead()``s: it claims a term, copies what it lacks and serves over ``ReplicatedLog``
(a batch is published only after its commit). A leader whose commit fails steps down
(its unanswered calls get ERR_NOT_LEADER) and follows. Batches and heartbeats carry
the term and the publishing member.

Where a simulated member differs from a live one (``sim_member_config``): the
simulator holds the election; the store keeps the whole log (no progress reports, no
trim: the end checks read every committed batch from it), so no gap is fetched from a
peer; the log syncs after each batch (the crash model), not on a timer; a follower
copies from the store, not from the leader's publication, and answers clients nothing
(the simulated clients send to the leader the simulator names).
"""

from __future__ import annotations

from executor.deterministic.sim_log import SimCommandLog, SimulatedCrash
from executor.deterministic.sim_network import Node, Payload
from executor.deterministic.sim_ordering import MemberStore, PublishFirstLog
from executor.deterministic.sim_world import LogFetcher, World
from sequencer.log import CommandLog
from sequencer.member import MemberConfig, OrderingMember
from sequencer.replication import OrderingStore, ReplicatedLog
from sequencer.sequencer import HEARTBEAT_MS, Sequencer
from sequencer.status import SequencerStats
from txn_library.errors import invariant
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire

WALL_BASE_MS = 1_750_000_000_000  # the batch timestamp is wall-clock time in a live run
HEARTBEAT_US = HEARTBEAT_MS * 1000
FOLLOWER_COPY_BATCHES = 256  # per epoch, from the store


def sim_member_config(member: int, members: int) -> MemberConfig:
    """A simulated member (see the module docstring): it copies from the store every
    turn, a candidate copies all it lacks at once, and the node syncs the log."""
    return MemberConfig(
        member,
        members,
        copy_batches_per_turn=FOLLOWER_COPY_BATCHES,
        catch_up_batches_per_turn=1 << 30,
        copy_backstop_s=0.0,
        sync_every_s=None,
        progress_every_s=None,
        trim_every_s=None,
    )


class SequencerNode:
    def __init__(self, sim: World, member: int = 0) -> None:
        self.sim = sim
        self.member = member
        replicated = sim.store is not None
        self.node = Node(f"seq{member}" if replicated else "seq", up=False)
        self.log_dir = sim.root / f"log-{member}" if replicated else sim.log_dir
        self.view = MemberStore(sim.store, member) if sim.store is not None else None
        self.ordering: OrderingMember | None = None  # this incarnation's member
        self.log: SimCommandLog | None = None
        self.crash_before_publish = False
        self.failed_stop_noted = False
        self.retired: list[SequencerStats] = []
        self.torn_tails = 0
        self.truncated_bytes = 0
        self._next_heartbeat_us = 0
        self.junk = 0

    @property
    def seq(self) -> Sequencer | None:
        """The Sequencer while this member leads."""
        return self.ordering.seq if self.ordering is not None else None

    @property
    def term(self) -> int:
        return self.ordering.term if self.ordering is not None else 0

    # Life ------------------------------------------------------------------------
    def start(self) -> None:
        sim = self.sim
        log = SimCommandLog(self.log_dir)
        if log.recovered_truncated_bytes:
            self.torn_tails += 1
            self.truncated_bytes += log.recovered_truncated_bytes
        self.log = log
        self.ordering = OrderingMember(
            log,
            self.view,
            sim_member_config(self.member, sim.opts.sequencers),
            self._new_sequencer,
            on_lead=self._serve,
            on_step_down=self._stepped_down,
            replicated_log=self._replicated_log,
        )
        if self.view is not None:  # replicated: every member starts as a follower
            self.node.up = True
            sim.net.reconnect(self.node)
            sim.trace.note(sim.loop.now_us, f"start seq{self.member} as follower")
            sim.loop.after(sim.opts.epoch_ms * 1000, self._follow_tick, self.node.incarnation)
            return
        self.ordering.lead_alone()

    def lead(self) -> None:
        """Elected (replicated): claim a term, copy what the store has that we lack,
        serve over ReplicatedLog."""
        ordering = self.ordering
        assert ordering is not None and self.node.up
        ordering.elected(self.sim.mono_s())
        # the simulator elects only a member that reaches the store, which holds every
        # committed batch: it catches up at once
        invariant(ordering.leading, f"seq{self.member} elected but not leading")

    def _new_sequencer(self, cmd_log: CommandLog | ReplicatedLog, term: int) -> Sequencer:
        sim = self.sim
        return Sequencer(
            cmd_log,
            sim.replicas,
            sim.partitions,
            checkpoint_every_epochs=sim.checkpoint_every_epochs,
            clock=sim.mono_s,
            seed_source=lambda: sim.rng.getrandbits(63),
            term=term,
            dataflow_recovery=sim.dataflow_recovery,
        )

    def _replicated_log(self, local: CommandLog, store: OrderingStore, term: int) -> ReplicatedLog:
        if self.sim.opts.plant == "publish-before-commit":
            return PublishFirstLog(local, store, term, self._publish_batch)
        return ReplicatedLog(local, store, term)

    def _publish_batch(self, data: bytes) -> None:
        self._publish(wire.TOPIC_BATCH, data)

    def _serve(self, seq: Sequencer) -> None:
        """The member leads (OrderingMember's on_lead): schedule its ticks."""
        sim, log = self.sim, self.log
        assert log is not None
        sim.planted_sequencer(seq)
        self.node.up = True
        sim.net.reconnect(self.node)
        self.crash_before_publish = False
        self.failed_stop_noted = False
        self._next_heartbeat_us = sim.loop.now_us
        term = seq.term
        led = f" leads term {term}" if term else ""
        sim.trace.note(
            sim.loop.now_us,
            f"start seq{led} epoch {seq.epoch} next txn {seq.next_txn_id} "
            f"(truncated {log.recovered_truncated_bytes} bytes)",
        )
        assert self.ordering is not None
        announce = self.ordering.take_announce()
        if announce and term and sim.opts.plant != "results-to-old-leader":
            # a new leader names itself at once (partitions send results there)
            self._publish(wire.TOPIC_HEARTBEAT, self.ordering.heartbeat())
        sim.loop.after(sim.opts.epoch_ms * 1000, self._tick, self.node.incarnation)

    def follow(self, reason: str) -> None:
        """Stop leading (replicated): unanswered calls get ERR_NOT_LEADER, then copy."""
        if self.ordering is not None:
            self.ordering.step_down(reason)
        self.sim.loop.after(self.sim.opts.epoch_ms * 1000, self._follow_tick, self.node.incarnation)

    def _stepped_down(self, seq: Sequencer | None, reason: str) -> None:
        """OrderingMember's on_step_down: send the retired leader's answers."""
        if seq is None:
            return
        self.flush(seq)
        self.retired.append(seq.stats)
        self.sim.trace.note(self.sim.loop.now_us, f"seq{self.member} follows: {reason}")

    def _follow_tick(self, life: int) -> None:
        node, sim = self.node, self.sim
        if not node.up or node.incarnation != life or self.seq is not None:
            return
        assert self.ordering is not None
        self.ordering.turn(sim.mono_s())
        sim.loop.after(sim.opts.epoch_ms * 1000, self._follow_tick, life)

    def crash(self, lose_synced: bool = False) -> None:
        node, sim = self.node, self.sim
        assert self.log is not None
        node.up = False
        node.incarnation += 1
        node.crashed_at_us = sim.loop.now_us
        if self.seq is not None:
            self.retired.append(self.seq.stats)
        tail = self.log.crash(sim.rng, lose_synced=lose_synced)
        self.ordering = self.log = None
        sim.trace.note(sim.loop.now_us, f"crash seq: {tail}")

    def close(self) -> None:
        if self.log is not None:
            self.log.crash_in_sync = self.log.fail_sync = False
            self.log.close()

    # Inputs ----------------------------------------------------------------------
    def on_client_frame(self, identity: bytes, frame: bytes) -> None:
        seq = self.seq
        if seq is None:  # a follower (replicated): the client resends to the leader
            return
        seq.on_frame(identity, frame)
        seq.run_intake()
        self.flush()

    def on_results(self, payload: Payload) -> None:
        seq = self.seq
        if seq is None:  # a follower (replicated): not for us
            return
        assert isinstance(payload, bytes)
        if not seq.on_results_frame(payload):
            self.junk += 1
            self.sim.failure(f"sequencer refused a partition's report ({len(payload)} bytes)")
        self.flush()

    def on_log_fetch(self, partition: LogFetcher, payload: Payload) -> None:
        """SequencerServer._on_log_fetch over the simulated DEALER/ROUTER pair (a
        partition's or a reader's)."""
        assert isinstance(payload, bytes)
        reply = self.seq.log_fetch_reply(payload) if self.seq is not None else None
        if reply is None:
            return  # fail-stopped: the log service answers nothing until a restart
        self.sim.net.send(self.node, partition.node, "logrep", reply, partition.on_log_reply)

    def _tick(self, life: int) -> None:
        node, sim = self.node, self.sim
        if not node.up or node.incarnation != life or self.seq is None:
            return
        seq = self.seq
        now = sim.loop.now_us
        try:
            data = seq.tick(WALL_BASE_MS + now // 1000)
        except SimulatedCrash:
            sim.sequencer_crashed("between append and sync")
            return
        if seq.deposed is not None:  # replicated: the commit failed; never published
            self.follow(seq.deposed)
            sim.leader_stepped_down(self)
            return
        if seq.failed is not None and not self.failed_stop_noted:
            self.failed_stop_noted = True
            sim.sequencer_failed_stop(seq.failed)
        if data is not None:
            sim.note_batch(data)
            if self.crash_before_publish:
                sim.sequencer_crashed("after sync, before publish")
                return
            if sim.opts.plant != "publish-before-commit" or self.view is None:
                self._publish(wire.TOPIC_BATCH, data)
            if self.view is not None:
                assert self.log is not None
                self.log.sync()  # live: every sequencer_local_sync_s; the store holds it
            self._next_heartbeat_us = now + HEARTBEAT_US
        if now >= self._next_heartbeat_us:
            assert self.ordering is not None
            self._publish(wire.TOPIC_HEARTBEAT, self.ordering.heartbeat())
            self._next_heartbeat_us = now + HEARTBEAT_US
        self.flush()
        sim.loop.after(sim.opts.epoch_ms * 1000, self._tick, life)

    # Outputs ---------------------------------------------------------------------
    def _publish(self, topic: bytes, data: bytes) -> None:
        net = self.sim.net
        payload: Payload = (topic, data)
        if self.view is not None:  # which member published: as a partition's SUB knows
            payload = (topic, data, b"%d" % self.member)
        for replica in self.sim.parts:
            for p in replica:
                net.send(self.node, p.node, "pub", payload, p.on_pub, lossy=True)
        for reader in self.sim.readers:
            net.send(self.node, reader.node, "pub", payload, reader.on_pub, lossy=True)

    def flush(self, seq: Sequencer | None = None) -> None:
        """Send the outboxes of ``seq`` (default: the leader's)."""
        if seq is None:
            seq = self.seq
        assert seq is not None
        sim = self.sim
        seq.take_control_out()  # the simulated clients send no control requests
        for identity, replies in seq.take_client_out().items():
            client = sim.client_by_identity[identity]
            frame = wire.encode_results_reply(replies)
            sim.net.send(self.node, client.node, "reply", frame, client.on_reply)
        for (r, p), queries in seq.take_query_out().items():
            self._send_queries(seq, r, p, queries)

    def _send_queries(self, seq: Sequencer, r: int, p: int, queries: list) -> None:
        """To replica r, or the next replica whose partition p is connected."""
        sim = self.sim
        for i in range(sim.replicas):
            rr = (r + i) % sim.replicas
            target = sim.parts[rr][p]
            if target.node.up:
                data = ewire.encode(ewire.Query(rr, queries))
                sim.net.send(self.node, target.node, "query", data, target.on_inbox)
                return
        seq.query_out.setdefault((r, p), []).extend(queries)  # nobody up: next turn
