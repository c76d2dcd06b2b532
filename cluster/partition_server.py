"""The partition process: one OS process, one thread, a zmq.Poller loop around Partition.

Sockets:
  SUB    every sequencer's publish_addr   batches and heartbeats from the leader
  DEALER every sequencer's log service    fetches missing epochs (gap repair and
                                          catch-up); any sequencer's log will do
  PULL   partition_addr      reads from peer partitions, queries from the sequencer
  PUSH   peers' partition_addr (same replica)    reads of multi-partition txns
  PUSH   one per sequencer's results_addr: results, query answers and status go to
         the leader named by the newest term's heartbeat

With a replicated ordering layer a published batch or heartbeat of a term older than
the newest seen comes from a deposed leader and is ignored (BatchFeed).

Delivery is reliable and totally ordered although PUB/SUB is neither: a batch whose
epoch is not last+1 is held back and the gap is fetched from the log service;
heartbeats reveal a missed tail. Batches already applied are ignored.

Checkpoints (cluster.partition_checkpoints): after a flagged epoch the partition
stops applying batches until its active transactions drain and its checkpoint's rows
are captured, then goes straight back to work while the loop, which turns at least
every 50 ms, advances the writer; a checkpoint counts once its file is in place and
its directory fsynced. The loop then tells the sequencer at once and the peers the
new reads floor.

Reads cross in the middle of a batch: between admissions, while reads are
outstanding, the partition sends what it queued and takes what peers sent
(``_interleave``, at most INTERLEAVE_MESSAGES_MAX inbox messages each time), so a
multi-partition transaction does not hold its locks until both partitions finish the
batch. How the partition spends CPU follows the host's idle share (SpareCores, 1 s
windows): with cores to spare, results also go out mid-batch (once
Partition.results_due) and batches run ahead of peers' reads; without, results wait for the batch's
end and a batch waits for peers while a multi-partition txn is unfinished here
(executor.deterministic.delivery). Timing only: what is computed is the same.

Inbound messages (PULL) are checked whole against the wire contract before the role
sees them (txn_library.wire.partition.decode_inbound); malformed ones are dropped and counted,
and the count is logged at most once a second. No message can stop
the partition.

Recovery: at start the partition loads its newest valid checkpoint (corrupt ones are
skipped with a warning), or the genesis state, then fetches every later epoch from
the log service and replays it through the normal path, reporting progress, before
it counts as live (BatchFeed.caught_up: every epoch known applied, every transaction
of those it replayed finished; live traffic may be in flight). Its boundary hashes let
the sequencer verify it against the other replicas.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Iterable
from pathlib import Path

import zmq

from cluster.config import ClusterConfig
from cluster.metrics import PartitionMetrics, serve
from cluster.ownership import partition_owner, start_role
from cluster.partition_checkpoints import PartitionCheckpoints
from cluster.processes import SpareCores, batch_scheduling
from cluster.security import SocketSecurity, partition_role, sequencer_role
from cluster.sockets import replica_mesh
from executor.core import checkpoint
from executor.core.genesis import genesis_storage
from executor.core.heap import settle_heap, settle_turn
from executor.core.storage import Storage
from executor.deterministic.delivery import (
    PEER_HOLD_RETRY_S,
    REPAIR_RETRY_S,
    STATUS_EVERY_S,
    BatchFeed,
)
from executor.deterministic.partition import Partition
from executor.deterministic.query_service import QueryService
from txn_library import limits
from txn_library.deployed import CodeStore
from txn_library.errors import DroppedMessages, invariant
from txn_library.procedure import load_modules
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as swire

log = logging.getLogger("ordo.replica")

PROGRESS_EVERY_S = 1.0
# Inbox messages taken between two admissions of a batch (Partition.on_batch's
# interleave): the batch goes on after that many, whatever peers send.
INTERLEAVE_MESSAGES_MAX = 16
RESEND_EVERY_S = 1.0  # at most one resend of every retained read per peer per interval
QUERY_FRAMES_PER_TURN = 256  # client query frames taken per loop turn, at most


class PartitionServer:
    def __init__(
        self,
        config: ClusterConfig,
        replica: int,
        partition: int,
        storage: Storage | None = None,
        ctx: zmq.Context | None = None,
    ) -> None:
        self.config = config
        self.replica = replica
        self.partition_id = partition
        load_modules(config.procedure_modules)
        self.checkpoint_dir = Path(config.checkpoint_dir(replica))
        # Procedures deployed through the log, as this replica installed them (a later
        # deploy is met again in the log): before any batch is applied.
        self.code = CodeStore(self.checkpoint_dir / "deploys")
        self.code.install_all()
        started = time.monotonic()
        restored = None
        if storage is None:
            t0 = time.monotonic()
            restored = checkpoint.load_newest(self.checkpoint_dir, partition, config.partitions)
            if restored is not None:
                info, storage = restored
                settle_heap()  # a loaded checkpoint is long-lived (genesis_storage settles too)
                log.info(
                    "loaded checkpoint %s (epoch %d, %s, %d rows, hash %016x) in %.2fs",
                    info.path.name,
                    info.epoch,
                    "base" if info.depth == 0 else f"base {info.base_epoch} + {info.depth} deltas",
                    storage.row_count(),
                    info.state_hash,
                    time.monotonic() - t0,
                )
        genesis_loaded = storage is None and bool(config.genesis)
        if storage is None and config.genesis:
            t0 = time.monotonic()
            storage = genesis_storage(
                config.genesis, config.genesis_args, partition, config.partitions
            )
            log.info(
                "genesis %s: %d rows in %.1fs",
                config.genesis,
                storage.row_count(),
                time.monotonic() - t0,
            )
        self.part = Partition(replica, partition, config.partitions, storage)
        self.part.hold_clock = time.monotonic  # honour ctx.hold_locks (benchmarks)
        self.part.on_deploy = self.code.save
        if restored is not None:
            info = restored[0]
            self.part.restore(info.epoch, info.next_txn_id, info.txns_applied)
            try:  # the answers it carries: retries of calls run before it (format.py)
                self.part.answers.remember(checkpoint.read_answers(info.path))
            except checkpoint.CheckpointInvalid as e:  # loaded whole just now: unlikely
                log.warning("the answers of %s are unreadable: %s", info.path.name, e)
        if config.replica_versions:
            self.part.keep_versions()  # snapshot queries from here on (docs/QUERIES.md)
        self.checkpoints = PartitionCheckpoints(
            config,
            replica,
            partition,
            self.part,
            self.checkpoint_dir,
            restored[0] if restored else None,
        )
        if restored is None and genesis_loaded and self.checkpoints.periodic():
            self.checkpoints.write_genesis_base()
        self._started = time.monotonic()
        self._start_epoch = self.part.last_epoch
        self._live = False
        self.recovered_s: float | None = None  # start of the loop to live, once live
        self._next_progress = time.monotonic() + PROGRESS_EVERY_S
        self.ctx = ctx or zmq.Context.instance()
        c = self.ctx
        sec = SocketSecurity.for_role(config, partition_role(replica, partition))
        self._auth = sec.start(c)  # ZAP handler, before any bind (no-op without CURVE)
        # One SUB, log-service DEALER and results PUSH per sequencer: with CURVE each
        # authenticates its own server.
        self.subs: list[zmq.Socket] = []
        self.logsvcs: list[zmq.Socket] = []
        self.results_to: list[zmq.Socket] = []
        for m in range(config.sequencers):
            server = sequencer_role(m)
            sub = c.socket(zmq.SUB)
            sub.setsockopt(zmq.RCVHWM, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sec.client(sub, server)
            sub.connect(config.publish_addr_of(m))
            self.subs.append(sub)
            fetch = c.socket(zmq.DEALER)
            fetch.setsockopt(zmq.LINGER, 0)
            sec.client(fetch, server)
            fetch.connect(config.log_service_addr_of(m))
            self.logsvcs.append(fetch)
            s = c.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 1000)
            sec.client(s, server)
            s.connect(config.results_addr_of(m))
            self.results_to.append(s)
        self._fetch_from = 0  # the sequencer whose log service the next repair asks
        self._fetch_unanswered = False
        self.inbox, self.peers = replica_mesh(c, config, replica, partition, sec)
        # Snapshot and read-committed queries straight from clients (no log, no locks).
        self.qsock = c.socket(zmq.ROUTER)
        self.qsock.setsockopt(zmq.LINGER, 0)
        self.qsock.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max)
        sec.server(self.qsock, clients=True)
        self.qsock.bind(config.query_addr(replica, partition))
        self.queries = QueryService(self.part, self._send_peer, time.monotonic)
        # Ordered delivery, gap repair; reads cross mid-batch.
        # Batches wait for peers' reads while this process waits for a core.
        self.feed = BatchFeed(
            self.part,
            REPAIR_RETRY_S,
            interleave=self._interleave,
            peer_hold_max=limits.peer_hold_s_max,
            peer_hold_retry=PEER_HOLD_RETRY_S,
        )
        self._cores = SpareCores()
        self._received = 0
        self._stop = False
        self._gaps_reported: set[int] = set()  # peers that said they cannot resend
        self._resend_wanted: dict[int, int] = {}  # peer -> first txn id it asked for
        self._resent_at: dict[int, float] = {}  # peer -> when its reads were last resent
        self.dropped = DroppedMessages(log, "inbound messages or reads")
        self._derived_failures_logged = 0
        self._derived_failures_next_log = 0.0
        self._status_requested = False  # MSG_STATUS_REQUEST, or a checkpoint became durable
        self.metrics = PartitionMetrics(self, self._started - started)  # served by main

    def stop(self, *_: object) -> None:
        self._stop = True

    # Batches ------------------------------------------------------------------
    # Checkpoints ----------------------------------------------------------------
    def _maybe_checkpoint(self) -> None:
        """Advance the checkpoint being written; at a drained checkpoint boundary record
        it and start writing its file (PartitionCheckpoints.take_boundary)."""
        if self.checkpoints.advance_writer(block=False):
            self._checkpoint_durable()
        if self.checkpoints.take_boundary():
            self.feed.apply_held()

    def _checkpoint_durable(self) -> None:
        self._status_requested = True  # tell the sequencer now, not at the next tick
        self._announce_reads_floor(self.peers)

    def _announce_reads_floor(self, peers: Iterable[int]) -> None:
        """Tell ``peers`` the first txn a restart of this partition could replay from
        (its oldest checkpoint on disk), so they keep the reads they sent it from there
        on and may forget older ones (MSG_READS_FLOOR). Nothing before a first
        checkpoint: a restart would replay from genesis."""
        floor = checkpoint.reads_floor(
            self.checkpoint_dir, self.partition_id, self.config.partitions
        )
        if floor is None:
            return
        msg = ewire.encode(ewire.ReadsFloor(self.partition_id, floor))
        for q in peers:
            self.peers[q].send(msg)

    def _maybe_repair(self, now: float) -> None:
        """Ask the leader's log service for a gap; an unanswered ask goes to the next
        sequencer (any sequencer's log holds only committed batches)."""
        wanted = self.feed.repair(now)
        if wanted is not None:
            n = len(self.logsvcs)
            if self._fetch_unanswered:
                self._fetch_from = (self._fetch_from + 1) % n
            else:
                self._fetch_from = self.feed.leader % n
            self._fetch_unanswered = True
            self.logsvcs[self._fetch_from].send(swire.encode(swire.LogFetch(*wanted)))

    def _on_log_reply(self, sock: zmq.Socket) -> None:
        self._fetch_unanswered = False
        reply = swire.LogBatches._make(swire.unpack(sock.recv())[1:])
        self.feed.log_reply(reply.batches, reply.last_epoch_on_disk)

    def _on_sub(self, sub: zmq.Socket) -> None:
        topic, payload = sub.recv_multipart()
        if topic == swire.TOPIC_BATCH:
            n = self.config.fault_drop_every_nth_batch
            if n:
                self._received += 1
                if self._received % n == 0:
                    return  # injected loss: the gap is repaired from the log service
            leader = self.feed.leader
            self.feed.offer(payload, published=True, publisher=self.subs.index(sub))
            if self.feed.leader != leader:
                log.info(
                    "sequencer %d leads (term %d): results go there",
                    self.feed.leader,
                    self.feed.term,
                )
                self._status_requested = True
        elif topic == swire.TOPIC_HEARTBEAT:
            hb = swire.heartbeat(swire.unpack(payload))
            if hb is None or hb.leader >= len(self.results_to):
                self.dropped.note("malformed heartbeat")
                return
            leader = self.feed.leader
            if self.feed.heartbeat(hb.last_epoch, hb.term, hb.leader) and hb.leader != leader:
                log.info("sequencer %d leads (term %d): results go there", hb.leader, hb.term)
                self._status_requested = True

    def _on_inbox(self) -> None:
        data = self.inbox.recv()
        msg, problem = ewire.decode_inbound(data)
        if msg is None:  # a stray or garbled message must not kill the partition
            self.dropped.note(f"{problem} ({len(data)} bytes)")
            return
        if isinstance(msg, ewire.Reads):
            self.part.on_reads(msg.from_partition, msg.entries)
        elif isinstance(msg, ewire.QueryReads):
            self.queries.on_query_reads(msg)
        elif isinstance(msg, ewire.QueryReadsReply):
            self.queries.on_query_reads_reply(msg)
        elif isinstance(msg, ewire.Watermark):
            self.queries.on_watermark(msg)
        elif isinstance(msg, ewire.ReadsFloor):
            self.part.on_reads_floor(msg.from_partition, msg.txn_id)
        elif isinstance(msg, ewire.Query):
            for qid, tag, name, args, min_txn_id in msg.calls:
                self.part.on_query(qid, tag, name, args, min_txn_id)
        elif isinstance(msg, ewire.Resend):
            self._on_resend(msg.from_partition, msg.first_txn_id)
        elif isinstance(msg, ewire.ResendGap):
            peer = msg.from_partition
            if peer not in self.peers:
                self.dropped.note(f"resend gap from partition {peer}, not a peer")
                return
            if self._live or peer in self._gaps_reported:
                # Only a recovering partition asked for resends, and once is enough to
                # say it cannot recover alone: anything more is noise (or hostile).
                self.dropped.note(f"resend gap from partition {peer}, not asked for")
                return
            self._gaps_reported.add(peer)
            log.critical(
                "cannot recover alone: partition %d retains reads only from txn %d, this "
                "partition replays from txn %d; restore the whole replica from a common "
                "checkpoint or copy a peer replica's",
                peer,
                msg.oldest_retained_txn_id,
                self.part.next_txn_id,
            )
        else:
            invariant(isinstance(msg, ewire.StatusRequest), f"decode_inbound passed {msg!r}")
            self._status_requested = True

    def _on_resend(self, peer: int, first_txn_id: int) -> None:
        """A peer restarted and asks for our reads again. Served at most once per
        RESEND_EVERY_S per peer (each costs every retained read): requests in between
        are merged and served when the interval ends, so a flood of them costs one."""
        if peer not in self.peers:
            self.dropped.note(f"resend for partition {peer}, not a peer")
            return
        waiting = self._resend_wanted.get(peer)
        self._resend_wanted[peer] = first_txn_id if waiting is None else min(waiting, first_txn_id)
        self._serve_resends(time.monotonic())

    def _serve_resends(self, now: float) -> None:
        for peer in list(self._resend_wanted):
            if now < self._resent_at.get(peer, 0.0) + RESEND_EVERY_S:
                continue
            self._resent_at[peer] = now
            self._resend(peer, self._resend_wanted.pop(peer))

    def _resend(self, peer: int, first_txn_id: int) -> None:
        self._announce_reads_floor([peer])  # the restarted peer forgot it
        if self.part.resend(peer, first_txn_id):
            log.info("peer %d restarted: resending its reads from txn %d", peer, first_txn_id)
        else:
            log.error(
                "peer %d asks for reads from txn %d; retained only from %d",
                peer,
                first_txn_id,
                self.part.sent_complete_from,
            )
            self.peers[peer].send(
                ewire.encode(ewire.ResendGap(self.partition_id, self.part.sent_complete_from))
            )

    # Loop ---------------------------------------------------------------------
    def _pace(self, now: float) -> None:
        """Spend CPU for latency while the host has cores to spare (cluster.processes.
        SpareCores: results go out mid-batch, batches run ahead of peers' reads), save
        it while it has not (results at the batch's end, batches held for peers:
        BatchFeed.pace); say when that changes, and when a hold runs out."""
        cores = self._cores
        was = cores.spare
        self.part.results_early = cores.update(now, self.part.txns_applied)
        if cores.spare != was:
            log.info(
                "host %.0f%% idle: %s",
                100 * (cores.idle or 0.0),
                "results go out mid-batch, batches run ahead of peers' reads"
                if cores.spare
                else "results wait for the batch's end, batches wait for peers' reads",
            )
        if self.feed.pace(now, contended=not cores.spare):
            log.info(
                "a batch waited %.0f ms for peers' reads: batches run ahead for %.0f s",
                1000 * limits.peer_hold_s_max,
                PEER_HOLD_RETRY_S,
            )

    def _interleave(self) -> None:
        """Between admissions of a batch (Partition.on_batch's interleave): send the
        reads queued so far and take the reads peers sent, so they cross while the
        batch runs; while the host has cores to spare, send the results waiting too
        (their clients need not wait for the batch's end; ``_pace``)."""
        if self.part.results_due():
            self._flush(False)
        else:
            self._send_reads(self.part.take_peer_out())
        for _ in range(INTERLEAVE_MESSAGES_MAX):
            if not self.inbox.poll(0):
                return
            self._on_inbox()

    def _send_reads(self, peer_out: dict[int, list]) -> None:
        for q, entries in peer_out.items():
            self.peers[q].send(ewire.encode(ewire.Reads(self.partition_id, entries)))

    def _flush(self, force_status: bool) -> None:
        peer_out, results, queries = self.part.take_outputs()
        self._send_reads(peer_out)
        if results or queries or force_status:
            self.results_to[self.feed.leader].send(
                ewire.results_message(
                    self.replica,
                    self.partition_id,
                    results,
                    queries,
                    self.part.status(catching_up=not self._live),
                )
            )

    def _report_derived_failures(self, now: float) -> None:
        """Dataflow steps that failed here (nobody waits for their results): one line
        a second at most, with the count and the latest."""
        n = self.part.derived_failures
        if n != self._derived_failures_logged and now >= self._derived_failures_next_log:
            log.error(
                "%d dataflow step(s) failed since the last report (%d in all; latest: %s)",
                n - self._derived_failures_logged,
                n,
                self.part.derived_failure_last,
            )
            self._derived_failures_logged = n
            self._derived_failures_next_log = now + 1.0

    def _report_progress(self, now: float) -> None:
        """Log catch-up progress until the partition has applied everything known."""
        if self._live:
            return
        part = self.part
        if self.feed.caught_up():
            elapsed = now - self._started
            log.info(
                "live: caught up from epoch %d to %d in %.1fs (%d txns applied)",
                self._start_epoch,
                part.last_epoch,
                elapsed,
                part.txns_applied,
            )
            self._live = True
            self.recovered_s = elapsed
        elif now >= self._next_progress:
            self._next_progress = now + PROGRESS_EVERY_S
            log.info(
                "recovering: epoch %d of %d known", part.last_epoch, self.feed.known_last_epoch
            )

    def run(self) -> None:
        poller = zmq.Poller()
        for s in (*self.subs, *self.logsvcs, self.inbox, self.qsock):
            poller.register(s, zmq.POLLIN)
        # Reads our previous incarnation received are gone: ask the peers again.
        for sock in self.peers.values():
            sock.send(ewire.encode(ewire.Resend(self.partition_id, self.part.next_txn_id)))
        self._announce_reads_floor(self.peers)
        # Catch up from the log service right away (slow-joiner safe: SUB is connected).
        for fetch in self.logsvcs:  # every sequencer: the leader is not known yet
            fetch.send(swire.encode(swire.LogFetch(self.part.last_epoch + 1, 1 << 62)))
        self.feed.requested(time.monotonic())
        next_status = 0.0
        part = self.part
        while not self._stop:
            timeout_ms = 50.0
            if self.checkpoints.writer is not None and part.checkpoint_requested:
                timeout_ms = 0.0  # a requested boundary waits for the writer: no pauses
            due = part.next_hold_due()
            if due is not None:
                timeout_ms = min(timeout_ms, max(0.0, 1000.0 * (due - time.monotonic())))
            events = dict(poller.poll(math.ceil(timeout_ms)))
            if due is not None:
                part.release_holds(time.monotonic())
            for _ in range(512):
                progressed = False
                if self.inbox.poll(0):
                    self._on_inbox()
                    progressed = True
                    self.feed.after_reads()
                for sub in self.subs:
                    if sub.poll(0):
                        self._on_sub(sub)
                        progressed = True
                for fetch in self.logsvcs:
                    if fetch.poll(0):
                        self._on_log_reply(fetch)
                        progressed = True
                if self.qsock.poll(0):
                    self._on_query_frames()
                    progressed = True
                if not progressed:
                    break
                if progressed and self.part.peer_out:
                    break  # unblock peers promptly
            del events
            now = time.monotonic()
            self._pace(now)
            self._maybe_checkpoint()
            self._maybe_repair(now)
            if self._resend_wanted:
                self._serve_resends(now)
            self._report_progress(now)
            self._serve_queries(now)
            self.dropped.report(now, part.inputs_dropped)
            self._report_derived_failures(now)
            force = now >= next_status or self._status_requested
            if force:
                next_status = now + STATUS_EVERY_S
                self._status_requested = False
            self._flush(force)
            self.metrics.turn(now)
            settle_turn()  # what outlived this turn is never scanned (see settle_turn)
        self.close()

    # Queries ------------------------------------------------------------------
    def _send_peer(self, q: int, msg: bytes) -> None:
        sock = self.peers.get(q)
        if sock is not None:
            sock.send(msg)

    def _on_query_frames(self) -> None:
        """Client query frames, a bounded number per turn (batches go on between)."""
        for _ in range(QUERY_FRAMES_PER_TURN):
            try:
                parts = self.qsock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(parts) != 2:
                self.dropped.note(f"query message of {len(parts)} frames")
                continue
            self.queries.on_client_frame(parts[0], parts[1])
        self._send_query_replies()

    def _serve_queries(self, now: float) -> None:
        self.queries.live = self._live
        self.queries.tick(now)
        self._send_query_replies()

    def _send_query_replies(self) -> None:
        for identity, entries in self.queries.take_replies().items():
            try:
                self.qsock.send_multipart(
                    [identity, swire.encode_query_reply(entries)], zmq.NOBLOCK
                )
            except zmq.ZMQError:
                pass  # the client went away: its answers go with it

    def close(self) -> None:
        if self.checkpoints.advance_writer(block=True):
            self._checkpoint_durable()
        socks = [
            *self.subs,
            *self.logsvcs,
            self.inbox,
            self.qsock,
            *self.results_to,
            *self.peers.values(),
        ]
        for s in socks:
            s.close(linger=0)
        self._auth.stop()


def main(config: ClusterConfig, replica: int, partition: int) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s r{replica}p{partition} %(levelname)s %(message)s"
    )
    batch_scheduling()  # before the sockets: zmq's I/O thread inherits it
    start_role(
        config.data_dir,
        partition_owner(replica, partition),
        f"partition {partition} of replica {replica} (its checkpoints)",
    )
    for path in checkpoint.remove_temp_files(config.checkpoint_dir(replica), partition):
        log.warning("removed %s: a checkpoint writer was killed before it finished", path)
    server = PartitionServer(config, replica, partition)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    log.info("partition r%d p%d up", replica, partition)
    serve(server.metrics, *config.partition_metrics_addr(replica, partition))
    server.run()
