"""The sequencer process: sockets and the single-threaded poll loop around Sequencer.

Sockets (bound at this sequencer's host address, ports from cluster.config):
  ROUTER client_addr     client calls, status and cluster.info requests
  PUB    publish_addr    batches and heartbeats to every partition of every replica
  ROUTER log_service_addr  epoch ranges from the command log (gap repair, catch-up)
  PULL   results_addr    results and status from partitions
  PUSH   one per partition of every replica: read-only queries and recon reads
  DEALER every other sequencer's log service (replicated only): batches the
         ZooKeeper tail no longer holds
  SUB    one per other sequencer's PUB (replicated only): a follower's feed of batches

Embedded default (one sequencer, no ZooKeeper): this process always leads, term 0,
and its command log is the durable record, as in Calvin without replication.

Replicated (cluster.zookeeper_servers > 0, N sequencers): every sequencer process runs
this loop as a *follower* until ZooKeeper's election names it:
- a follower copies committed batches into its own log, serves the log service from
  it, reports its progress, and answers calls with ERR_NOT_LEADER naming the leader
  and the term it believes current (status requests with its own status). It takes
  them from the leader's publication as the partitions do (a published batch is a
  committed one: the leader publishes only after the commit, and the store holds
  exactly one batch per epoch), and syncs its log every
  ``limits.sequencer_local_sync_s``; what the feed missed (a gap, a start, a new
  leader) it copies from ZooKeeper, or from a peer for what ZooKeeper has trimmed,
  checking ZooKeeper at least every ``sequencer_copy_backstop_s``. Progress reported
  to ZooKeeper (which decides the trim) is always a synced epoch.
- elected, it claims a new term, copies every committed batch it lacks, then builds
  a Sequencer over that log (epochs continue after the last committed batch, and the
  exactly-once table is rebuilt from the log) whose appends commit to ZooKeeper
  first (sequencer.replication.ReplicatedLog); it publishes a batch only after that;
- a leader that cannot commit (deposed, ZooKeeper unreachable, session lost) steps
  down: its unanswered calls get ERR_NOT_LEADER and their clients resend them, same
  ids, to the next leader.

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

from cluster.cluster_info import cluster_info
from cluster.config import ClusterConfig
from cluster.deploy_check import SubprocessChecker
from cluster.heap_trim import HeapTrim
from cluster.metrics import SequencerMetrics, serve
from cluster.ownership import start_role
from cluster.security import SocketSecurity, partition_role, sequencer_role
from sequencer.calls import is_req_id, parse_log_fetch, serve_log_fetch
from sequencer.log import CommandLog, LogCorruption
from sequencer.replication import (
    CopyProgress,
    NotLeader,
    ReplicatedLog,
    copy_committed,
    copy_from_peer,
    trim_point,
)
from sequencer.sequencer import HEARTBEAT_MS, Sequencer
from txn_library import limits
from txn_library.errors import ERR_MALFORMED, ERR_NOT_LEADER, ERROR, DroppedMessages
from txn_library.procedure import load_modules
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire

log = logging.getLogger("ordo.sequencer")

LEADER, FOLLOWER, CANDIDATE = "leader", "follower", "candidate"


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
        self.seq: Sequencer | None = None
        self.store: Any = None  # cluster.ordering_zk.ZooKeeperStore when replicated
        self.term = 0
        self.leader: int | None = None
        self.role = FOLLOWER
        self._copy = CopyProgress(0, self.local.last_epoch, self.local.last_epoch)
        self._peer_fetch_at = 0.0
        self._next_progress = self._next_trim = self._next_election = 0.0
        self._candidate_since = 0.0
        self._next_copy = self._next_sync = self._election_backstop = 0.0
        self._announce = False
        self._reported_epoch = -1  # the last progress written to ZooKeeper
        self._feed_behind = False  # the feed showed an epoch past the next one
        if config.replicated:
            from cluster.ordering_zk import ZooKeeperStore

            self.store = ZooKeeperStore(config, member)
            self.store.start(limits.zk_connect_timeout_s)
            self.store.join_election()
            log.info(
                "sequencer %d up as follower: local log to epoch %d, client %s",
                member,
                self.local.last_epoch,
                config.client_addr_of(member),
            )
        else:
            self._lead(term=0)
        self.metrics = SequencerMetrics(self)  # served by main (cluster.metrics)
        self.heap = HeapTrim()  # freed heap back to the OS after a burst (cluster.heap_trim)

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
        for i in range(config.sequencers if config.replicated else 0):
            if i != m:
                s = c.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.RCVHWM, 0)
                s.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max * 8)
                s.setsockopt(zmq.SUBSCRIBE, wire.TOPIC_BATCH)
                sec.client(s, sequencer_role(i))
                s.connect(config.publish_addr_of(i))
                self.feeds.append(s)
        self._peer_rr = 0

    def stop(self, *_: object) -> None:
        self._stop = True

    # Roles --------------------------------------------------------------------
    def _lead(self, term: int) -> None:
        """Build the Sequencer over the (caught-up) local log and serve."""
        self._sync_local()
        cmd_log: CommandLog | ReplicatedLog = self.local
        if self.store is not None:
            cmd_log = ReplicatedLog(self.local, self.store, term)
        self.seq = Sequencer(
            cmd_log,
            self.config.replicas,
            self.config.partitions,
            checkpoint_every_epochs=self.config.checkpoint_every_epochs,
            checkpoint_every_s=self.config.checkpoint_every_s,
            term=term,
            dataflow_recovery=self.config.dataflow_recovery,
            deploy_checker=SubprocessChecker(self.config.procedure_modules),
        )
        self.term, self.leader, self.role = term, self.member, LEADER
        self._announce = True  # a heartbeat naming this leader goes out at once
        self.seq.status_extra = self._role_report
        self.seq.cluster_info = self.cluster_info
        log.info(
            "sequencer %d leads: term %d, epoch %d, next txn %d, client %s",
            self.member,
            term,
            self.seq.epoch,
            self.seq.next_txn_id,
            self.config.client_addr_of(self.member),
        )

    def _follow(self, reason: str) -> None:
        """Stop leading: answer what is unanswered (ERR_NOT_LEADER), then follow."""
        if self.seq is not None:
            self.seq.step_down(reason)
            self._flush()
            self.seq = None
        if self.role != FOLLOWER:
            log.warning("sequencer %d follows now (term %d): %s", self.member, self.term, reason)
        self.role = FOLLOWER
        self.leader = None

    def _replication_turn(self, now: float) -> None:
        """A replicated sequencer's housekeeping: session, election, copying, trim."""
        store = self.store
        try:
            if store.session_lost or (self.role == LEADER and store.surely_expired(now)):
                self._follow("ZooKeeper session lost")
                if store.session_lost and store.connected:
                    store.join_election()
            if now >= self._next_sync:
                self._next_sync = now + limits.sequencer_local_sync_s
                self._sync_local()
            if self.role == LEADER:
                if now >= self._next_progress:
                    self._next_progress = now + limits.sequencer_progress_every_s
                    self._report_progress()
                if now >= self._next_trim:
                    self._next_trim = now + limits.sequencer_trim_every_s
                    through = trim_point(
                        self.local.last_epoch, store.progress(), self.config.sequencers
                    )
                    store.trim_through(through)
                return
            if self._feed_behind or not self._copy.caught_up or now >= self._next_copy:
                self._feed_behind = False
                self._next_copy = now + limits.sequencer_copy_backstop_s
                self._copy_committed(now)
            if now >= self._next_progress:
                self._next_progress = now + limits.sequencer_progress_every_s
                self._report_progress()
            if (
                self.role == FOLLOWER
                and now >= self._next_election
                and (store.election_changed.is_set() or now >= self._election_backstop)
            ):
                store.election_changed.clear()  # before reading: a later change re-sets it
                self._next_election = now + limits.sequencer_election_check_s
                self._election_backstop = now + limits.sequencer_copy_backstop_s
                self.leader = store.leader()
                self.term = store.current_term()
                if store.i_lead():
                    self.term = store.claim_term()
                    self.role = CANDIDATE
                    self._candidate_since = now
                    log.info("sequencer %d elected: term %d, catching up", self.member, self.term)
                    self._copy_committed(now)
            if self.role == CANDIDATE and self._copy.caught_up:
                self._lead(self.term)
            elif (
                self.role == CANDIDATE
                and now - self._candidate_since > limits.sequencer_candidate_catch_up_s_max
            ):
                log.warning(
                    "sequencer %d cannot catch up (local %d, committed %d, gap %s): resigning",
                    self.member,
                    self._copy.local_last_epoch,
                    self._copy.store_last_epoch,
                    self._copy.gap,
                )
                self.role = FOLLOWER
                store.resign()
        except NotLeader as e:
            self._follow(str(e))
        except Exception as e:  # ZooKeeper unreachable or slow: try again next turn
            if not _is_zookeeper_error(e):
                raise
            # Housekeeping only: a leader steps down when a commit fails or its session
            # ends (above), not because a progress report met a server going away.
            self._junk.note(f"ZooKeeper: {type(e).__name__} (retrying)")

    def _on_feed(self, feed: zmq.Socket) -> None:
        """Batches another sequencer published (committed ones): a follower appends the
        next epoch; anything else it ignores (a gap is copied from the store)."""
        for _ in range(limits.sequencer_copy_batches_per_turn):
            if not feed.poll(0):
                return
            frames = feed.recv_multipart()
            if self.role == LEADER or len(frames) != 2:
                continue
            data = frames[1]
            try:
                epoch = wire.decode_batch(data).epoch  # checked whole, as a copy is
                if epoch != self.local.last_epoch + 1:
                    self._feed_behind = epoch > self.local.last_epoch
                    continue
                self.local.append(epoch, data)
            except (ValueError, TypeError, LogCorruption) as e:
                self._junk.note(f"bad published batch from a sequencer: {type(e).__name__}")
                continue

    def _report_progress(self) -> None:
        """Write this member's synced last epoch to ZooKeeper if it moved (a quorum
        write: only when there is news)."""
        self._sync_local()  # progress decides the trim: report synced epochs only
        epoch = self.local.last_epoch
        if epoch != self._reported_epoch:
            self.store.report_progress(self.member, epoch)
            self._reported_epoch = epoch

    def _sync_local(self) -> None:
        """fdatasync the local log (a no-op when nothing was appended since)."""
        self.local.sync()

    def _copy_committed(self, now: float) -> None:
        self._copy = copy_committed(self.local, self.store, limits.sequencer_copy_batches_per_turn)
        gap = self._copy.gap
        if gap is not None and now >= self._peer_fetch_at and self.peers:
            self._peer_fetch_at = now + 0.5
            self._peer_rr = (self._peer_rr + 1) % len(self.peers)
            self.peers[self._peer_rr].send(wire.encode(wire.LogFetch(*gap)))

    def _on_peer_batches(self, sock: zmq.Socket) -> None:
        data = sock.recv()
        try:
            msg = wire.unpack(data)
            reply = wire.LogBatches._make(msg[1:])
            copied = copy_from_peer(self.local, reply.batches)
        except (ValueError, TypeError, LogCorruption) as e:
            self._junk.note(f"bad log batches from a peer sequencer: {type(e).__name__}")
            return
        if copied:
            self._peer_fetch_at = 0.0
            log.info(
                "copied %d batches from a peer, now at epoch %d", copied, self.local.last_epoch
            )

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

    def _leader_hint(self) -> str:
        if self.leader is None or self.leader == self.member:
            return ""
        return self.config.client_addr_of(self.leader)

    def _answer_not_leader(self, identity: bytes, frames: list[bytes]) -> None:
        """A follower's answer: status and cluster.info requests get their answer, calls
        ERR_NOT_LEADER."""
        msg = None
        if len(frames) == 2 and len(frames[1]) <= limits.request_bytes_max:
            try:
                msg = wire.unpack(frames[1])
            except (ValueError, TypeError):
                msg = None
        kind = msg[0] if isinstance(msg, tuple) and msg else None
        hint = self._leader_hint()
        body: Any
        if kind == wire.REQ_STATUS:
            body = wire.StatusReply(self.status_report())
        elif kind == wire.REQ_CLUSTER_INFO:
            body = wire.ClusterInfoReply(self.cluster_info)
        elif kind in wire.CALLS_KINDS and isinstance(msg, tuple) and len(msg) == 3:
            calls = msg[2] if isinstance(msg[2], tuple) else ()
            req_ids = [c[0] for c in calls if isinstance(c, tuple) and c and is_req_id(c[0])]
            # the term it believes current: a client never follows an older term's hint
            answer = tuple(wire.NotLeaderAnswer(ERR_NOT_LEADER, hint, self.term))
            body = wire.ResultsReply([(r, ERROR, answer) for r in req_ids])
        else:
            body = wire.ErrorReply(f"{ERR_NOT_LEADER}: {hint or 'no leader known yet'}")
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
        if self.seq is not None:
            reply = self.seq.log_reply(*request)
        else:
            reply = serve_log_fetch(self.local, *request)
        if reply is None:
            self._junk.note("log service request while fail-stopped")
            return
        self.logsvc.send_multipart([frames[0], reply])

    def _flush(self) -> None:
        seq = self.seq
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
        report = dict(
            role=self.role,
            member=self.member,
            pid=os.getpid(),
            term=self.term,
            leader=self.leader,
            local_last_epoch=self.local.last_epoch,
            replicated=self.store is not None,
        )
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
        for s in self.feeds:
            poller.register(s, zmq.POLLIN)
        epoch_s = self.config.epoch_duration_ms / 1000.0
        next_tick = time.monotonic() + epoch_s
        next_heartbeat = time.monotonic()
        while not self._stop:
            seq = self.seq
            timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000.0)
            if seq is not None and seq.has_intake():
                timeout_ms = 0.0  # calls still wait for validation: no sleeping
            events = dict(poller.poll(math.ceil(timeout_ms)))
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
            if self.store is not None:
                self._replication_turn(now)
                seq = self.seq
            if seq is not None and (now >= next_tick or seq.batch_full()):
                data = seq.tick(int(time.time() * 1000))
                if data is not None:
                    self.pub.send_multipart([wire.TOPIC_BATCH, data])
                    next_heartbeat = now + HEARTBEAT_MS / 1000.0
                self.metrics.on_tick(seq, data)  # once published: counts, sizes, waits
                if data is None and seq.deposed is not None:
                    self._follow(seq.deposed)
                    seq = None
            if now >= next_tick:
                next_tick = max(next_tick + epoch_s, now)
            if seq is not None and (now >= next_heartbeat or self._announce):
                self._announce = False  # a new leader names itself before anything else
                self.pub.send_multipart(
                    [
                        wire.TOPIC_HEARTBEAT,
                        wire.pack(wire.Heartbeat(seq.epoch, self.term, self.member)),
                    ]
                )
                next_heartbeat = now + HEARTBEAT_MS / 1000.0
            self._flush()
            self._junk.report(now)
            self.metrics.turn(now)
            self.heap.turn(now)
        self.close()

    def close(self) -> None:
        socks = [self.client, self.pub, self.logsvc, self.results, *self.peers, *self.feeds]
        try:
            self._sync_local()
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
