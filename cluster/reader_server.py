"""The reader process: one OS process, one thread, a zmq.Poller loop around the reader
role (executor/reader/: every partition in one process, following the log by
re-executing its batches, answering queries).

Sockets:
  SUB    every sequencer's publish_addr   batches and heartbeats from the leader
  DEALER every sequencer's log service    gaps and the catch-up (any sequencer's log)
  DEALER every sequencer's client socket  its status, to compare the replicas' state
                                          hashes with the reader's (once a second)
  ROUTER reader_addr                      clients' queries (wire.QueryRequest), sink
                                          subscriptions (pushed: executor/reader/
                                          sinks.py) and status requests
                                          (txn_library.wire.reader)

Delivery as a partition's (cluster.partition_server): a batch ahead of a gap is held
and the gap fetched from the log service; heartbeats reveal a missed tail; a published
batch or heartbeat of an older term is ignored. Batches are applied for at most
``APPLY_TURN_S`` per loop turn, so queries and status are answered while the reader
catches up; after each batch the queries parked for its epoch are answered
(read-your-writes: a query naming ``after_epoch``), and every turn those whose wait
is over are refused. Snapshots are served ``ClusterConfig.reader_retention_s`` back
in batch time (executor/reader/follower.py).

Start and restart (kill -9 included): the reader keeps no state on disk. It loads the
newest checkpoint every partition of some replica on this host has at one epoch
(the replicas' checkpoint directories under the data directory; a chain that does not
validate is passed over for an older one), else the genesis (always with
``--from-genesis``: the reader then verifies the whole history), and fetches every
later epoch from the log service, then counts as live. Until then it answers only
queries naming an epoch it has applied.

Every second it asks the leading sequencer's status: a replica's partition that
reports a checkpoint boundary's hash, or its hash while idle, is compared with the
reader's hash at that epoch, and a difference is logged as a DETERMINISM VIOLATION and
counted (``ordo status`` shows the count).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import zmq

from cluster.config import ClusterConfig
from cluster.metrics import ReaderMetrics, serve
from cluster.ownership import start_role
from cluster.processes import batch_scheduling
from cluster.security import SocketSecurity, reader_role, sequencer_role
from executor.core import checkpoint
from executor.core.genesis import genesis_storage
from executor.core.heap import settle_heap, settle_turn
from executor.core.storage import Storage
from executor.deterministic.delivery import REPAIR_RETRY_S
from executor.reader.follower import Follower, Restored
from executor.reader.queries import ReaderQueries
from executor.reader.sinks import ReaderSinks
from txn_library import limits
from txn_library.deployed import CodeStore
from txn_library.errors import DroppedMessages
from txn_library.wire import reader as rwire
from txn_library.wire import sequencer as swire

log = logging.getLogger("ordo.reader")

# Batches are applied for at most this long between two looks at the sockets (at least
# one): queries and status are answered while the reader catches up.
APPLY_TURN_S = 0.005
QUERY_FRAMES_PER_TURN = 256
CHECK_EVERY_S = 1.0  # the leader's status is asked this often
PROGRESS_EVERY_S = 1.0


def initial_state(
    config: ClusterConfig, from_genesis: bool
) -> tuple[list[Storage], list[Restored] | None, str]:
    """Every partition's state to start from, where it stands, and what it is (a log
    line): the newest complete checkpoint of a replica on this host, else genesis."""
    n = config.partitions
    candidates: list[tuple[int, int]] = []  # (epoch, replica)
    for r in range(config.replicas) if not from_genesis else ():
        directory = Path(config.checkpoint_dir(r))
        if directory.is_dir():
            candidates += [(e, r) for e in checkpoint.complete_epochs(directory, n) if e > 0]
    for epoch, r in sorted(candidates, reverse=True):
        directory = Path(config.checkpoint_dir(r))
        try:
            loaded = [
                checkpoint.load(directory / checkpoint.checkpoint_name(epoch, p)) for p in range(n)
            ]
        except (checkpoint.CheckpointInvalid, OSError) as e:  # pruned meanwhile, or corrupt
            log.warning("replica %d's checkpoint at epoch %d passed over: %s", r, epoch, e)
            continue
        if any(
            (i.epoch, i.partition, i.partitions) != (epoch, p, n) for p, (i, _) in enumerate(loaded)
        ):
            log.warning("replica %d's checkpoint at epoch %d passed over: headers differ", r, epoch)
            continue
        settle_heap()
        restored = [Restored(i.epoch, i.next_txn_id) for i, _ in loaded]
        return [s for _, s in loaded], restored, f"replica {r}'s checkpoint at epoch {epoch}"
    storages = [genesis_storage(config.genesis, config.genesis_args, p, n) for p in range(n)]
    return storages, None, f"genesis {config.genesis}"


def reader_status(
    reader: int,
    follower: Follower,
    queries: ReaderQueries,
    epochs: tuple = (),
    sinks: ReaderSinks | None = None,
) -> dict:
    """What ``ordo status`` shows of a reader (txn_library.wire.reader)."""
    f = follower
    return {
        "reader": reader,
        "pid": os.getpid(),
        "applied_epoch": f.applied_epoch,
        "known_last_epoch": f.known_last_epoch,
        "lag_epochs": max(0, f.behind()),
        "live": f.live,
        "started_epoch": f.started_epoch,
        "txns_applied": f.txns_applied,
        "state_hashes": [f"{h:016x}" for h in f.state_hashes()],
        "versions_oldest": f.versions_oldest,
        "retention_s": f.retention_s,
        "hashes_checked": f.hashes_checked,
        "determinism_violations": f.violations_count,
        "queries_served": queries.served,
        "queries_refused": queries.refused,
        "queries_waiting": queries.waiting,
        "subscriptions": len(sinks.subs) if sinks is not None else 0,
        "sink_batches_pushed": sinks.pushed_batches if sinks is not None else 0,
        "hashes": f.hashes_at(epochs),
    }


class ReaderServer:
    def __init__(
        self,
        config: ClusterConfig,
        reader: int,
        ctx: zmq.Context | None = None,
        from_genesis: bool = False,
    ) -> None:
        from txn_library.procedure import load_modules

        self.config = config
        self.reader = reader
        self.name = f"reader {reader}"
        load_modules(config.procedure_modules)
        t0 = time.monotonic()
        # Procedures deployed through the log before the checkpoint it starts from, as
        # the replicas on this host keep them (later ones are met in the log).
        for r in range(config.replicas):
            CodeStore(Path(config.checkpoint_dir(r)) / "deploys").install_all()
        storages, restored, what = initial_state(config, from_genesis)
        log.info(
            "loaded %s: %d rows in %.1fs",
            what,
            sum(s.row_count() for s in storages),
            time.monotonic() - t0,
        )
        self.follower = Follower(
            config.partitions, storages, restored, retention_s=config.reader_retention_s
        )
        self.queries = ReaderQueries(self.follower, self.name, time.monotonic)
        self.sinks = ReaderSinks(self.follower, self.name)
        self.ctx = ctx or zmq.Context.instance()
        c = self.ctx
        sec = SocketSecurity.for_role(config, reader_role(reader))
        self._auth = sec.start(c)
        self.subs: list[zmq.Socket] = []
        self.logsvcs: list[zmq.Socket] = []
        self.statuses: list[zmq.Socket] = []
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
            st = c.socket(zmq.DEALER)
            st.setsockopt(zmq.LINGER, 0)
            st.setsockopt(zmq.SNDHWM, 4)
            sec.client(st, server)
            st.connect(config.client_addr_of(m))
            self.statuses.append(st)
        self.qsock = c.socket(zmq.ROUTER)
        self.qsock.setsockopt(zmq.LINGER, 0)
        self.qsock.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max)
        sec.server(self.qsock, clients=True)
        self.qsock.bind(config.reader_addr(reader))
        self._fetch_from = 0
        self._fetch_unanswered = False
        self._status_asked: float | None = None
        self._next_check = 0.0
        self._next_progress = 0.0
        self._started = time.monotonic()
        self._live_logged = False
        self._stop = False
        self.dropped = DroppedMessages(log, "inbound messages")
        self.metrics = ReaderMetrics(self)  # served by main (cluster.metrics)

    def stop(self, *_: object) -> None:
        self._stop = True

    # Batches -------------------------------------------------------------------------
    def _on_sub(self, sub: zmq.Socket) -> None:
        topic, payload = sub.recv_multipart()
        f = self.follower
        if topic == swire.TOPIC_BATCH:
            f.offer(payload, published=True, publisher=self.subs.index(sub))
        elif topic == swire.TOPIC_HEARTBEAT:
            hb = swire.heartbeat(swire.unpack(payload))
            if hb is None or hb.leader >= len(self.subs):
                self.dropped.note("malformed heartbeat")
                return
            f.heartbeat(hb.last_epoch, hb.term, hb.leader)

    def _on_log_reply(self, sock: zmq.Socket) -> None:
        self._fetch_unanswered = False
        reply = swire.LogBatches._make(swire.unpack(sock.recv())[1:])
        self.follower.log_reply(reply.batches, reply.last_epoch_on_disk)

    def _maybe_repair(self, now: float) -> None:
        wanted = self.follower.repair(now, REPAIR_RETRY_S)
        if wanted is not None:
            n = len(self.logsvcs)
            if self._fetch_unanswered:
                self._fetch_from = (self._fetch_from + 1) % n
            else:
                self._fetch_from = self.follower.leader % n
            self._fetch_unanswered = True
            self.logsvcs[self._fetch_from].send(swire.encode(swire.LogFetch(*wanted)))

    # Checking the replicas -------------------------------------------------------------
    def _ask_status(self, now: float) -> None:
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        sock = self.statuses[self.follower.leader % len(self.statuses)]
        try:
            sock.send(swire.encode(swire.StatusRequest()), zmq.NOBLOCK)
        except zmq.Again:
            pass  # that sequencer is not reachable now: next time

    def _on_status(self, sock: zmq.Socket) -> None:
        try:
            msg = swire.unpack(sock.recv())
        except (ValueError, TypeError):
            self.dropped.note("undecodable status reply")
            return
        if not (isinstance(msg, tuple) and len(msg) == 2 and msg[0] == swire.REP_STATUS):
            return  # an error reply (a follower sequencer, say): nothing to compare
        report = msg[1]
        parts = report.get("partitions") if isinstance(report, dict) else None
        if not isinstance(parts, (list, tuple)):
            return
        try:
            violations = self.follower.compare_status(parts)
        except (KeyError, TypeError, ValueError) as e:
            self.dropped.note(f"status report not understood: {e}")
            return
        for v in violations:
            log.error("%s (%s)", v, self.name)

    # Queries and status ----------------------------------------------------------------
    def _on_frames(self) -> None:
        for _ in range(QUERY_FRAMES_PER_TURN):
            try:
                parts = self.qsock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(parts) != 2:
                self.dropped.note(f"message of {len(parts)} frames")
                continue
            identity, frame = parts
            try:
                msg = swire.unpack(frame)
            except Exception:  # noqa: BLE001 - any undecodable frame is the client's
                self.queries.on_client_frame(identity, frame)  # answered as malformed
                continue
            kind = msg[0] if isinstance(msg, tuple) and msg else None
            if kind == rwire.REQ_READER_STATUS:
                self._on_status_request(identity, msg)
            elif kind in (rwire.REQ_SUBSCRIBE, rwire.REQ_UNSUBSCRIBE):
                self.sinks.on_message(identity, msg, time.monotonic())
            else:
                self.queries.on_client_message(identity, msg)
        self._send_replies()

    def _on_status_request(self, identity: bytes, msg: tuple) -> None:
        problem = rwire.status_request_problem(msg)
        epochs = () if problem is not None or len(msg) < 2 else msg[1]
        report = reader_status(self.reader, self.follower, self.queries, epochs, self.sinks)
        if problem is not None:
            report["error"] = problem
        try:
            self.qsock.send_multipart(
                [identity, rwire.encode(rwire.ReaderStatusReply(report))], zmq.NOBLOCK
            )
        except zmq.ZMQError:
            pass  # the asker went away

    def _send_replies(self) -> None:
        for identity, entries in self.queries.take_replies().items():
            try:
                self.qsock.send_multipart(
                    [identity, swire.encode_query_reply(entries)], zmq.NOBLOCK
                )
            except zmq.ZMQError:
                pass  # the client went away: its answers go with it
        for identity, pushes in self.sinks.take().items():
            for push in pushes:
                try:
                    self.qsock.send_multipart([identity, rwire.encode(push)], zmq.NOBLOCK)
                except zmq.ZMQError:
                    break  # gone, or its queue is full: pushed again when it acknowledges

    def _report_progress(self, now: float) -> None:
        f = self.follower
        if f.live and not self._live_logged:
            self._live_logged = True
            log.info(
                "live: caught up from epoch %d to %d in %.1fs (%d txns applied)",
                f.started_epoch,
                f.applied_epoch,
                now - self._started,
                f.txns_applied,
            )
        elif not f.live and now >= self._next_progress:
            self._next_progress = now + PROGRESS_EVERY_S
            log.info("catching up: epoch %d of %d known", f.applied_epoch, f.known_last_epoch)

    # Loop ------------------------------------------------------------------------------
    def _apply(self) -> None:
        """Apply the batches next in order, for at most APPLY_TURN_S; then push what
        they made to the sinks' subscribers."""
        f, on_applied = self.follower, self.queries.on_applied
        until = time.monotonic() + APPLY_TURN_S
        while f.apply_ready(1):
            on_applied()  # the queries parked for this epoch (read-your-writes)
            if time.monotonic() >= until:
                break
        if self.sinks.subs:
            self.sinks.after_apply(time.monotonic())

    def run(self) -> None:
        poller = zmq.Poller()
        socks = (*self.subs, *self.logsvcs, *self.statuses, self.qsock)
        for s in socks:
            poller.register(s, zmq.POLLIN)
        first = self.follower.applied_epoch + 1
        for fetch in self.logsvcs:  # the leader is not known yet: ask every sequencer
            fetch.send(swire.encode(swire.LogFetch(first, 1 << 62)))
        self.follower.requested(time.monotonic())
        f = self.follower
        while not self._stop:
            ready = f.applied_epoch + 1 in f.held
            events = dict(poller.poll(0 if ready else 50))
            for sub in self.subs:
                for _ in range(1024):
                    if not sub.poll(0):
                        break
                    self._on_sub(sub)
            for fetch in self.logsvcs:
                if fetch in events:
                    while fetch.poll(0):
                        self._on_log_reply(fetch)
            for st in self.statuses:
                if st in events:
                    while st.poll(0):
                        self._on_status(st)
            if self.qsock in events:
                self._on_frames()
            self._apply()
            now = time.monotonic()
            self.queries.tick()
            self._send_replies()
            self._maybe_repair(now)
            self._ask_status(now)
            self._report_progress(now)
            self.dropped.report(now, 0)
            self.metrics.turn(now)
            settle_turn()
        self.close()

    def close(self) -> None:
        for s in (*self.subs, *self.logsvcs, *self.statuses, self.qsock):
            s.close(linger=0)
        self._auth.stop()


def main(config: ClusterConfig, reader: int, from_genesis: bool = False) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s reader{reader} %(levelname)s %(message)s"
    )
    batch_scheduling()
    start_role(config.data_dir, reader_role(reader), f"reader {reader}")
    server = ReaderServer(config, reader, from_genesis=from_genesis)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    log.info("reader %d up at %s", reader, config.reader_addr(reader))
    serve(server.metrics, *config.reader_metrics_addr(reader))
    server.run()
