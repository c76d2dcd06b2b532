"""The sequencer process: sockets and the single-threaded poll loop around the
ordering member (sequencer.member.OrderingMember) and, while it leads, its Sequencer.

Sockets (bound at this sequencer's host address, ports from cluster.config):
  ROUTER client_addr     client calls, status and cluster.info requests
  PUB    publish_addr    batches and heartbeats to every partition of every replica
  ROUTER log_service_addr  epoch ranges from the command log (gap repair, catch-up)
  PULL   results_addr    results and status from partitions
  PUSH   one per partition of every replica: read-only queries and recon reads
  DEALER every other sequencer's log service (replicated only): batches the
         ZooKeeper tail no longer holds
  SUB    one per other sequencer's PUB (replicated only): a follower's feed of batches;
         each with a monitor (PAIR, inproc), whose events tell the member when the
         connection closed, when a reconnect was refused, when it is up again

The ordering member's state machine (follow, copy committed batches, get elected,
claim a term, lead, step down, resign) is ``OrderingMember``, the class the simulator's
node drives too; this module keeps the sockets, the loop, the clock and ZooKeeper's
session events, hands the member its inputs and the time, and sends what it returns.

Embedded default (one sequencer, no ZooKeeper): this process always leads, term 0,
and its command log is the durable record, as in Calvin without replication.

Replicated (cluster.zookeeper_servers > 0, N sequencers): every sequencer process runs
this loop as a *follower* until ZooKeeper's election names it:
- a follower copies committed batches into its own log, serves the log service from
  it, reports its progress, and answers calls with ERR_NOT_LEADER naming the leader
  and the term it believes current (status requests with its own status). It takes
  them from the leader's publication (SUB: a published batch is a committed one),
  and what the feed missed from ZooKeeper, or from a peer's log service (DEALER) for
  what ZooKeeper has trimmed;
- elected, it claims a new term, copies every committed batch it lacks, then leads
  over a log whose appends commit to ZooKeeper first
  (sequencer.replication.ReplicatedLog); it publishes a batch only after that;
- a leader that cannot commit (deposed, ZooKeeper unreachable, session lost) steps
  down: its unanswered calls get ERR_NOT_LEADER and their clients resend them, same
  ids, to the next leader. A lost session is this module's to see (kazoo's state
  events, ``ZooKeeperStore.surely_expired``): it steps the member down and rejoins
  the election; so does a member whose election node another removed
  (``ZooKeeperStore.take_removed``).
- a dead leader is seen by its connections: each feed's monitor reports
  EVENT_DISCONNECTED (the peer's kernel closed the connection), EVENT_CLOSED after it
  (a reconnect, retried every ``limits.sequencer_feed_reconnect_ms``, refused: nobody
  listens there) and EVENT_CONNECTED to the member, which removes a leader gone that
  way from the election (sequencer.member) instead of waiting out its session.

- a leader whose loop stalled for half a session or more (SIGSTOP, a starved host)
  asks ZooKeeper whether the term is still its own before it answers anything
  (``_still_leading``): kazoo may not yet have said that the session ended, and a
  successor may have committed meanwhile.

A client's mistake never kills this process: every frame is decoded inside a guard
and answered with an error.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from cluster.cluster_info import cluster_info
from cluster.config import ClusterConfig
from cluster.deploy_check import SubprocessChecker
from cluster.heap_trim import HeapTrim
from cluster.metrics import SequencerMetrics, serve
from cluster.ownership import start_role
from cluster.security import SocketSecurity, partition_role, sequencer_role
from sequencer.calls import parse_log_fetch
from sequencer.log import CommandLog, LogCorruption
from sequencer.member import MemberConfig, OrderingMember
from sequencer.replication import CopyProgress, ReplicatedLog
from sequencer.sequencer import HEARTBEAT_MS, Sequencer
from txn_library import limits
from txn_library.errors import ERR_MALFORMED, ERROR, DroppedMessages
from txn_library.procedure import load_modules
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire

log = logging.getLogger("ordo.sequencer")

LEADER, FOLLOWER, CANDIDATE = "leader", "follower", "candidate"

# What a feed's monitor reports: the connection closed, a (re)connect attempt failed
# (EVENT_CLOSED of a connecter: refused or unreachable), a connection is up.
FEED_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED | zmq.EVENT_CONNECTED


class SequencerServer:
    def __init__(
        self, config: ClusterConfig, member: int = 0, ctx: zmq.Context | None = None
    ) -> None:
        self.config = config
        self.member = member
        load_modules(config.procedure_modules)
        if config.log_segment_bytes:
            limits.segment_bytes_max = config.log_segment_bytes
        self.local = CommandLog(config.sequencer_log_dir(member), fsync=config.fsync)
        if self.local.recovered_truncated_bytes:
            log.warning(
                "command log: truncated %d bytes of torn tail", self.local.recovered_truncated_bytes
            )
        self.ctx = ctx or zmq.Context.instance()
        self._bind_sockets()
        self._junk = DroppedMessages(log, "internal messages")
        self._stop = False
        self.store: Any = None  # cluster.ordering_zk.ZooKeeperStore when replicated
        if config.replicated:
            from cluster.ordering_zk import ZooKeeperStore

            self.store = ZooKeeperStore(config, member)
            self.store.start(limits.zk_connect_timeout_s)
            self.store.join_election()
        self.ordering = OrderingMember(
            self.local,
            self.store,
            MemberConfig(member, config.sequencers),
            self._new_sequencer,
            election=self.store,
            on_lead=self._on_lead,
            on_step_down=self._on_step_down,
        )
        if self.store is not None:
            log.info(
                "sequencer %d up as follower: local log to epoch %d, client %s",
                member,
                self.local.last_epoch,
                config.client_addr_of(member),
            )
        else:
            self.ordering.lead_alone()
        self.metrics = SequencerMetrics(self)  # served by main (cluster.metrics)
        self.heap = HeapTrim()  # freed heap back to the OS after a burst (cluster.heap_trim)

    # What the member decides (metrics and status read these) -------------------------
    @property
    def seq(self) -> Sequencer | None:
        """The Sequencer while this process leads."""
        return self.ordering.seq

    @property
    def term(self) -> int:
        return self.ordering.term

    @property
    def leader(self) -> int | None:
        return self.ordering.leader

    @property
    def role(self) -> str:
        return self.ordering.role

    @property
    def _copy(self) -> CopyProgress:
        """The follower's last copy: what ZooKeeper held then (the lag metric)."""
        return self.ordering.copy

    def _bind_sockets(self) -> None:
        """Every socket; with CURVE (cluster.security) the client socket admits role and
        allowlisted client keys, the others role keys only, and every connect
        authenticates the server it reaches."""
        config, c, m = self.config, self.ctx, self.member
        sec = SocketSecurity.for_role(config, sequencer_role(m))
        # Where queries go, for REQ_CLUSTER_INFO: leader and followers answer it alike.
        self.cluster_info = cluster_info(config, sec.servers)
        self._auth = sec.start(c)  # the ZAP handler, before any bind
        self.client = c.socket(zmq.ROUTER)
        self.client.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max)
        self.client.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sec.server(self.client, clients=True)
        self.client.bind(config.client_addr_of(m))
        self.pub = c.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        sec.server(self.pub, clients=False)
        self.pub.bind(config.publish_addr_of(m))
        self.logsvc = c.socket(zmq.ROUTER)
        self.logsvc.setsockopt(zmq.MAXMSGSIZE, limits.log_service_request_bytes_max)
        sec.server(self.logsvc, clients=False)
        self.logsvc.bind(config.log_service_addr_of(m))
        self.results = c.socket(zmq.PULL)
        self.results.setsockopt(zmq.RCVHWM, 0)
        sec.server(self.results, clients=False)
        self.results.bind(config.results_addr_of(m))
        self.query_socks: dict[tuple[int, int], zmq.Socket] = {}
        for r in range(config.replicas):
            for p in range(config.partitions):
                s = c.socket(zmq.PUSH)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.IMMEDIATE, 1)
                sec.client(s, partition_role(r, p))
                s.connect(config.partition_addr(r, p))
                self.query_socks[(r, p)] = s
        self.peers: list[zmq.Socket] = []  # other sequencers' log services
        for i in range(config.sequencers):
            if i != m:
                s = c.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max * 8)
                sec.client(s, sequencer_role(i))
                s.connect(config.log_service_addr_of(i))
                self.peers.append(s)
        self.feeds: list[zmq.Socket] = []  # other sequencers' publications (one key each)
        self.feed_monitors: dict[zmq.Socket, int] = {}  # monitor -> the feed's member
        for i in range(config.sequencers if config.replicated else 0):
            if i != m:
                s = c.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.RCVHWM, 0)
                s.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max * 8)
                s.setsockopt(zmq.SUBSCRIBE, wire.TOPIC_BATCH)
                s.setsockopt(zmq.RECONNECT_IVL, limits.sequencer_feed_reconnect_ms)
                s.setsockopt(zmq.RECONNECT_IVL_MAX, limits.sequencer_feed_reconnect_max_ms)
                sec.client(s, sequencer_role(i))
                addr = f"inproc://ordo-feed-{id(self):x}-{i}"  # unique per server in a process
                mon = s.get_monitor_socket(FEED_EVENTS, addr=addr)
                self.feed_monitors[mon] = i
                s.connect(config.publish_addr_of(i))
                self.feeds.append(s)
        self._peer_rr = 0

    def stop(self, *_: object) -> None:
        self._stop = True

    # The member's outputs ----------------------------------------------------------
    def _new_sequencer(self, cmd_log: CommandLog | ReplicatedLog, term: int) -> Sequencer:
        seq = Sequencer(
            cmd_log,
            self.config.replicas,
            self.config.partitions,
            checkpoint_every_epochs=self.config.checkpoint_every_epochs,
            checkpoint_every_s=self.config.checkpoint_every_s,
            term=term,
            dataflow_recovery=self.config.dataflow_recovery,
            deploy_checker=SubprocessChecker(self.config.procedure_modules),
        )
        seq.status_extra = self._role_report
        seq.cluster_info = self.cluster_info
        return seq

    def _on_lead(self, seq: Sequencer) -> None:
        log.info(
            "sequencer %d leads: term %d, epoch %d, next txn %d, client %s",
            self.member,
            seq.term,
            seq.epoch,
            seq.next_txn_id,
            self.config.client_addr_of(self.member),
        )

    def _on_step_down(self, seq: Sequencer | None, reason: str) -> None:
        """Send the retired leader's answers (ERR_NOT_LEADER to what was unanswered)."""
        if seq is not None:
            self._flush(seq)
        log.warning("sequencer %d follows now (term %d): %s", self.member, self.term, reason)

    def _replication_turn(self, now: float) -> None:
        """A replicated sequencer's housekeeping: ZooKeeper's session, then the member's
        turn (copying, progress, trim, election)."""
        store = self.store
        try:
            if store.session_lost or (self.ordering.leading and store.surely_expired(now)):
                self.ordering.step_down("ZooKeeper session lost")
                if store.session_lost and store.connected:
                    store.join_election()
            elif store.take_removed():  # believed dead by a peer: its term gets fenced
                self.ordering.step_down("removed from the election by a peer")
                store.join_election()
            self.ordering.turn(now)
        except Exception as e:  # ZooKeeper unreachable or slow: try again next turn
            if not _is_zookeeper_error(e):
                raise
            # Housekeeping only: a leader steps down when a commit fails or its session
            # ends (above), not because a progress report met a server going away.
            self._junk.note(f"ZooKeeper: {type(e).__name__} (retrying)")
        for gap in self.ordering.take_peer_fetches():
            self._peer_rr = (self._peer_rr + 1) % len(self.peers)
            self.peers[self._peer_rr].send(wire.encode(wire.LogFetch(*gap)))

    def _still_leading(self, stalled_s: float) -> Sequencer | None:
        """After a stall of the loop (a SIGSTOP, a starved host) long enough that the
        session may have ended meanwhile, ask ZooKeeper whether the term is still ours
        before anything is answered: a leader that resumes after its successor committed
        must answer nothing (kazoo may not have told us of the lost session yet)."""
        store = self.store
        if store is None:
            return self.seq
        try:
            deposed = store.session_lost or store.current_term() != self.term
            why = "the term moved on" if deposed else ""
        except Exception as e:
            if not _is_zookeeper_error(e):
                raise
            deposed, why = True, f"ZooKeeper unreachable ({type(e).__name__})"
        if deposed:
            self.ordering.step_down(f"after a {stalled_s:.1f} s stall of the loop: {why}")
        return self.seq

    def _on_feed(self, feed: zmq.Socket) -> None:
        """Batches another sequencer published: the member takes the next epoch."""
        for _ in range(limits.sequencer_copy_batches_per_turn):
            if not feed.poll(0):
                return
            frames = feed.recv_multipart()
            if self.ordering.leading or len(frames) != 2:
                continue
            try:
                self.ordering.on_published(frames[1])
            except (ValueError, TypeError, LogCorruption) as e:
                self._junk.note(f"bad published batch from a sequencer: {type(e).__name__}")

    def _on_feed_events(self, mon: zmq.Socket, now: float) -> None:
        """A feed's connection events, for the member (which judges whether the peer's
        process is gone)."""
        peer = self.feed_monitors[mon]
        while mon.poll(0):
            event = parse_monitor_message(mon.recv_multipart())["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self.ordering.on_peer_connection_lost(peer, now)
            elif event == zmq.EVENT_CLOSED:
                self.ordering.on_peer_connection_refused(peer)
            elif event == zmq.EVENT_CONNECTED:
                self.ordering.on_peer_connection_up(peer)

    def _on_peer_batches(self, sock: zmq.Socket) -> None:
        data = sock.recv()
        try:
            self.ordering.on_peer_reply(data)
        except (ValueError, TypeError, LogCorruption) as e:
            self._junk.note(f"bad log batches from a peer sequencer: {type(e).__name__}")

    # Handlers -----------------------------------------------------------------
    def _receive_clients(self, deadline: float) -> None:
        """Read client frames until ``deadline`` (``turn_deadline``), and at most
        ``receive_bytes_per_turn_max`` bytes.

        ZeroMQ's ROUTER reads its connections fairly and stops reading one whose
        queue is full, so a flooding client is throttled at its own socket while this
        turn's budget leaves room to serve everyone else.
        """
        received = 0
        seq = self.seq
        while received < limits.receive_bytes_per_turn_max and (seq is None or seq.intake_room()):
            try:
                frames = self.client.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0]
            received += sum(len(f) for f in frames)
            if seq is None:
                self._answer_not_leader(identity, frames)
            elif len(frames) != 2:
                seq._error(identity, None, ERR_MALFORMED, "expected exactly one frame")
            else:
                seq.on_frame(identity, frames[1])
            if time.monotonic() >= deadline:
                return

    def _answer_not_leader(self, identity: bytes, frames: list[bytes]) -> None:
        """A follower's answer (OrderingMember.follower_reply)."""
        body = self.ordering.follower_reply(
            frames, self.config.client_addr_of, self.status_report, self.cluster_info
        )
        try:
            self.client.send_multipart([identity, wire.encode(body)], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _on_results(self) -> None:
        data = self.results.recv()
        if self.seq is None:
            return  # a partition that has not heard of the new leader yet
        if not self.seq.on_results_frame(data):
            self._junk.note(f"malformed results message ({len(data)} bytes)")

    def _on_log_fetch(self) -> None:
        frames = self.logsvc.recv_multipart()
        request = parse_log_fetch(frames[1]) if len(frames) == 2 else None
        if request is None:
            self._junk.note("malformed log service request")
            return
        reply = self.ordering.serve_log(*request)
        if reply is None:
            self._junk.note("log service request while fail-stopped")
            return
        self.logsvc.send_multipart([frames[0], reply])

    def _flush(self, seq: Sequencer | None) -> None:
        """Send ``seq``'s outboxes (the leader's, or a retired one's last answers)."""
        if seq is None:
            return
        for identity, body in seq.take_control_out():
            try:
                self.client.send_multipart([identity, wire.encode(body)], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                log.warning("client gone; dropped a control reply")
        out, epochs = seq.take_client_replies()
        for identity, replies in out.items():
            # the leader's term (0: one sequencer): clients never follow an older one's
            frame = wire.encode_results_reply(replies, epochs.get(identity), self.term)
            try:
                self.client.send_multipart([identity, frame], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                log.warning("client gone; dropped %d replies", len(replies))
        self.metrics.on_replies(out, epochs)  # once sent: outcomes, latencies
        for (r, p), queries in seq.take_query_out().items():
            self._send_queries(seq, r, p, queries)

    def _send_queries(self, seq: Sequencer, r: int, p: int, queries: list) -> None:
        """Send to replica r, or the next replica whose partition p is connected."""
        for i in range(self.config.replicas):
            rr = (r + i) % self.config.replicas
            try:
                self.query_socks[(rr, p)].send(
                    ewire.encode(ewire.Query(rr, queries)), flags=zmq.NOBLOCK
                )
                return
            except zmq.Again:
                continue
        seq.query_out.setdefault((r, p), []).extend(queries)  # nobody up: next turn

    def status_report(self) -> dict:
        """The leader's full report, or a follower's own; both name role and term."""
        if self.seq is not None:
            return self.seq.status_report()  # with _role_report
        report: dict = {"epoch": self.local.last_epoch, "partitions": []}
        report.update(self._role_report())
        return report

    def _role_report(self) -> dict:
        mine = self.ordering.role_report()
        report = {"role": mine["role"], "member": self.member, "pid": os.getpid(), **mine}
        if self.store is not None and self.seq is not None:
            try:
                # map keys are strings: msgpack readers refuse others by default
                progress = self.store.progress()
                report["sequencer_progress"] = {str(m): e for m, e in progress.items()}
            except Exception as e:
                if not _is_zookeeper_error(e):
                    raise
                report["sequencer_progress"] = {}
        return report

    # Loop ---------------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        for s in (self.client, self.results, self.logsvc, *self.peers):
            poller.register(s, zmq.POLLIN)
        for s in [*self.feeds, *self.feed_monitors]:
            poller.register(s, zmq.POLLIN)
        epoch_s = self.config.epoch_duration_ms / 1000.0
        next_tick = time.monotonic() + epoch_s
        next_heartbeat = time.monotonic()
        turned_at = time.monotonic()
        while not self._stop:
            seq = self.seq
            timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000.0)
            if seq is not None and seq.has_intake():
                timeout_ms = 0.0  # calls still wait for validation: no sleeping
            events = dict(poller.poll(math.ceil(timeout_ms)))
            stalled = time.monotonic() - turned_at
            turned_at = time.monotonic()
            if seq is not None and stalled > limits.zk_session_timeout_s / 2:
                seq = self._still_leading(stalled)
            if events.get(self.client):
                self._receive_clients(turn_deadline(limits.receive_turn_s_max, next_tick))
            if seq is not None:
                seq.run_intake(turn_deadline(limits.intake_turn_s_max, next_tick))
            for _ in range(256):
                if not self.results.poll(0):
                    break
                self._on_results()
            if events.get(self.logsvc):
                for _ in range(64):
                    if not self.logsvc.poll(0):
                        break
                    self._on_log_fetch()
            for peer in self.peers:
                if events.get(peer):
                    while peer.poll(0):
                        self._on_peer_batches(peer)
            for feed in self.feeds:
                if events.get(feed):
                    self._on_feed(feed)
            now = time.monotonic()
            for mon in self.feed_monitors:
                if events.get(mon):
                    self._on_feed_events(mon, now)
            if self.store is not None:
                self._replication_turn(now)
                seq = self.seq
            if seq is not None and (now >= next_tick or seq.batch_full()):
                data = seq.tick(int(time.time() * 1000))
                if data is not None:
                    self.pub.send_multipart([wire.TOPIC_BATCH, data])
                    next_heartbeat = now + HEARTBEAT_MS / 1000.0
                self.metrics.on_tick(seq, data)  # once published: counts, sizes, waits
                if data is None and self.ordering.check_deposed():
                    seq = None
            if now >= next_tick:
                next_tick = max(next_tick + epoch_s, now)
            # a new leader names itself (take_announce) before anything else
            if seq is not None and (self.ordering.take_announce() or now >= next_heartbeat):
                self.pub.send_multipart([wire.TOPIC_HEARTBEAT, self.ordering.heartbeat()])
                next_heartbeat = now + HEARTBEAT_MS / 1000.0
            self._flush(self.seq)
            self._junk.report(now)
            self.metrics.turn(now)
            self.heap.turn(now)
        self.close()

    def close(self) -> None:
        for feed in self.feeds:  # a monitor stops before its reading end closes
            try:
                feed.disable_monitor()
            except zmq.ZMQError:
                pass
        socks = [self.client, self.pub, self.logsvc, self.results, *self.peers, *self.feeds]
        socks += list(self.feed_monitors)
        try:
            self.local.sync()
        except (OSError, RuntimeError, ValueError) as e:  # failed or closed: start-up says so
            log.error("local log not synced at shutdown: %s", e)
        for s in [*socks, *self.query_socks.values()]:
            s.close(linger=0)
        self._auth.stop()
        if self.store is not None:
            self.store.close()
        self.local.close()


def turn_deadline(budget_s: float, tick_at: float) -> float:
    """When one phase of a loop turn (reading client frames, validating calls) stops:
    after ``budget_s``, and no later than the epoch's tick at ``tick_at`` unless that
    leaves less than ``limits.turn_s_min``. Under a flood both phases use their whole
    budgets; ending them at the tick keeps every client's epoch on time (a turn of
    4 + 4 ms against a 10 ms epoch made ticks late, and put a good client's p99 at
    2x idle under a 15 s flood: docs/BENCHMARKS.md, "Hostile input")."""
    now = time.monotonic()
    return min(now + budget_s, max(tick_at, now + limits.turn_s_min))


def _is_zookeeper_error(e: Exception) -> bool:
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    return isinstance(e, (KazooException, KazooTimeoutError))


def main(config: ClusterConfig, member: int = 0) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s s{member} %(name)s %(levelname)s %(message)s",
    )
    start_role(config.data_dir, f"sequencer-{member}", f"sequencer {member}'s command log")
    try:
        server = SequencerServer(config, member)
    except LogCorruption as e:
        log.critical("command log is corrupt, refusing to start: %s", e)
        raise SystemExit(3) from None
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    serve(server.metrics, *config.sequencer_metrics_addr(member))
    server.run()


__all__ = ["SequencerServer", "main", "ERROR"]
