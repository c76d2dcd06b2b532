"""A simulated reader process for the seeded simulator: the real ``Follower`` and
``ReaderQueries`` roles and the glue of ``cluster.reader_server.ReaderServer``'s loop.

Why it lives here, and how the simulator gets it: readers sit above the deterministic
engine (lint-imports, inside executor: "replay | reader" over "deterministic |
traditional"), and the simulator that assembles a run lives in executor/deterministic/,
so the simulator may not import this module, statically or by name. It is handed the
node instead, as a role is handed its clock and network: ``Simulator(..., reader_node=
ReaderNode)`` (``run_seed(..., reader_node=ReaderNode)``; scripts/simulate.py and
tests/sim/test_sim_readers.py pass it), typed by ``sim_world.ReaderNodeFactory``, and
reaches each node only through ``sim_world.ReaderPeer``. Like every simulator node,
this one sees its ``World`` and never the ``Simulator`` (the lint-imports contract lists
it). Moving the simulator's assembly above both packages instead would move a module
every simulator test and script imports for the sake of one kind of node.

The glue, as ReaderServer's: the publication (SUB) is offered to the Follower, which
ignores a deposed leader's batches and heartbeats by term; heartbeats reveal a missed
tail; gaps and the catch-up at start are fetched from the leader's log service (DEALER:
a fetch sent while the sequencer is down waits for it). Batches are applied in order,
at most ``APPLY_BATCHES_PER_TURN`` per turn, ``APPLY_TURN_US`` of simulated time apart
(the live loop applies for at most APPLY_TURN_S between looks at its sockets), so
queries are answered between applies while the reader catches up. Queries (ROUTER) go
to ReaderQueries, its replies back to their client; waiting queries are retried every
turn. A crash (kill -9) loses everything; a restart starts empty, from genesis (the
live reader may start from a replica's checkpoint; here each incarnation verifies the
whole history), and catches up from the log.

What the checks read: every partition's state hash at the end of every epoch each
incarnation applied, and of the state it started from (``applied_hashes``); the
simulator's checks compare them with the serial oracle's hash and the replicas'
boundary hashes at the same epoch (executor.deterministic.checks).

Invariants: the node drives Follower and ReaderQueries only through the inputs and
outputs the live process uses, and adds no logic the live process lacks (planted bugs
are the world's hooks); it is an observer (``Node.observer``): nothing it does draws
from the cluster's generator, so a run's history is the same with readers or without.
"""

from __future__ import annotations

from executor.deterministic.delivery import REPAIR_RETRY_S
from executor.deterministic.sim_network import Deliver, Node, Payload
from executor.deterministic.sim_world import ClientPeer, World
from executor.deterministic.workloads import clone_storage
from executor.reader.follower import Follower
from executor.reader.queries import ReaderQueries
from txn_library.wire import sequencer as swire

POLL_US = 50_000  # ReaderServer.run polls with a 50 ms timeout
FETCH_ALL = 1 << 62  # at start: everything after the state it starts from
APPLY_BATCHES_PER_TURN = 8
APPLY_TURN_US = 1_000

COUNTED = ("starts", "batches_applied", "log_fetches", "queries_served", "queries_refused")


class ReaderNode:
    def __init__(self, sim: World, index: int) -> None:
        self.sim = sim
        self.index = index
        self.node = Node(f"reader{index}", up=False, observer=True)
        self.follower: Follower | None = None
        self.queries: ReaderQueries | None = None
        self._hashes: list[tuple[int, tuple[int, ...]]] = []
        self._apply_scheduled = False
        self._counts = dict.fromkeys(COUNTED, 0)

    # Life ------------------------------------------------------------------------
    def start(self) -> None:
        sim = self.sim
        storages = [clone_storage(s) for s in sim.image.partitions]
        f = self.follower = Follower(sim.partitions, storages)
        self.queries = ReaderQueries(f, f"reader {self.index}", sim.mono_s)
        self._hashes.append((f.applied_epoch, f.state_hashes()))
        self._apply_scheduled = False
        self._counts["starts"] += 1
        self.node.up = True
        sim.net.reconnect(self.node)
        sim.trace.note(sim.loop.now_us, f"start {self.node.name} from genesis")
        self._fetch(f.applied_epoch + 1, FETCH_ALL)
        f.requested(sim.mono_s())
        sim.loop.after(POLL_US, self._poll, self.node.incarnation)

    def crash(self) -> None:
        node, sim = self.node, self.sim
        self._retire()
        node.up = False
        node.incarnation += 1
        node.crashed_at_us = sim.loop.now_us
        self.follower = None
        self.queries = None
        sim.trace.note(sim.loop.now_us, f"crash {node.name}")

    def _retire(self) -> None:
        q = self.queries
        if q is not None:
            self._counts["queries_served"] += q.served
            self._counts["queries_refused"] += q.refused

    def _alive(self, life: int) -> bool:
        return self.node.up and self.node.incarnation == life

    def _poll(self, life: int) -> None:
        if not self._alive(life):
            return
        self._turn()
        self.sim.loop.after(POLL_US, self._poll, life)

    # Inputs ----------------------------------------------------------------------
    def on_pub(self, payload: Payload) -> None:
        assert isinstance(payload, tuple)
        f = self.follower
        if f is None:
            return
        topic, data = payload[0], payload[1]
        publisher = int(payload[2]) if len(payload) > 2 else None  # replicated: the member
        if topic == swire.TOPIC_BATCH:
            f.offer(self.sim.planted_reader_batch(self, data), published=True, publisher=publisher)
        elif topic == swire.TOPIC_HEARTBEAT:
            hb = swire.heartbeat(swire.unpack(data))
            assert hb is not None, "the simulated sequencer sends well-formed heartbeats"
            f.heartbeat(hb.last_epoch, hb.term, hb.leader)
        self._turn()

    def on_log_reply(self, payload: Payload) -> None:
        assert isinstance(payload, bytes)
        f = self.follower
        if f is None:
            return
        reply = swire.LogBatches._make(swire.unpack(payload)[1:])
        batches = [self.sim.planted_reader_batch(self, b) for b in reply.batches]
        f.log_reply(batches, reply.last_epoch_on_disk)
        self._turn()

    def on_query_frame(self, identity: bytes, frame: Payload) -> None:
        assert isinstance(frame, bytes)
        if self.queries is None:
            return  # down: the client asks again
        self.queries.on_client_frame(identity, frame)
        self._send_replies()

    # The loop turn -----------------------------------------------------------------
    def _turn(self) -> None:
        f, q = self.follower, self.queries
        if f is None or q is None:
            return
        self._apply(f)
        q.tick()
        self._send_replies()
        wanted = f.repair(self.sim.mono_s(), REPAIR_RETRY_S)
        if wanted is not None:
            self._fetch(*wanted)

    def _apply(self, f: Follower) -> None:
        """The batches next in order, at most APPLY_BATCHES_PER_TURN now; the rest a
        turn later."""
        for _ in range(APPLY_BATCHES_PER_TURN):
            if not f.apply_ready(1):
                return
            self._counts["batches_applied"] += 1
            self._hashes.append((f.applied_epoch, f.state_hashes()))
        if f.applied_epoch + 1 in f.held and not self._apply_scheduled:
            self._apply_scheduled = True
            self.sim.loop.after(APPLY_TURN_US, self._apply_turn, self.node.incarnation)

    def _apply_turn(self, life: int) -> None:
        if self._alive(life):
            self._apply_scheduled = False
            self._turn()

    # Outputs -----------------------------------------------------------------------
    def _send_replies(self) -> None:
        assert self.queries is not None
        sim = self.sim
        for identity, entries in self.queries.take_replies().items():
            client = sim.client_by_identity.get(identity)
            if client is None:
                continue
            data = swire.encode_query_reply(sim.planted_reader_replies(self, entries))
            sim.net.send(self.node, client.node, "rreply", data, self._to(client))

    def _to(self, client: ClientPeer) -> Deliver:
        index = self.index

        def deliver(frame: Payload) -> None:
            client.on_reader_reply(frame, index)

        return deliver

    def _fetch(self, first: int, last: int) -> None:
        self._counts["log_fetches"] += 1
        seq = self.sim.seq_node
        request = swire.encode(swire.LogFetch(first, last))
        self.sim.net.send(self.node, seq.node, "logreq", request, self._deliver_fetch, park=True)

    def _deliver_fetch(self, payload: Payload) -> None:
        self.sim.seq_node.on_log_fetch(self, payload)

    # Introspection -------------------------------------------------------------------
    def caught_up(self, last_epoch: int) -> bool:
        f, q = self.follower, self.queries
        return (
            self.node.up
            and f is not None
            and q is not None
            and f.live
            and f.applied_epoch == last_epoch
            and not q.waiting
        )

    def applied_epoch(self) -> int | None:
        return None if self.follower is None else self.follower.applied_epoch

    def applied_hashes(self) -> list[tuple[int, tuple[int, ...]]]:
        return list(self._hashes)

    def counters(self) -> dict[str, int]:
        out = dict(self._counts)
        q = self.queries
        if q is not None:
            out["queries_served"] += q.served
            out["queries_refused"] += q.refused
        return out

    def describe(self) -> str:
        f = self.follower
        if not self.node.up or f is None:
            return f"{self.node.name} down"
        return (
            f"{self.node.name} epoch {f.applied_epoch} (known {f.known_last_epoch}), held "
            f"{sorted(f.held)[:5]}, live={f.live}"
        )
