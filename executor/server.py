"""The partition process: one OS process, one thread, a zmq.Poller loop around Partition.

Sockets:
  SUB    publish_addr        batches and heartbeats from the sequencer
  DEALER log_service_addr    fetches missing epochs (gap repair and catch-up)
  PULL   partition_addr      reads from peer partitions, queries from the sequencer
  PUSH   peers' partition_addr (same replica)    reads of multi-partition txns
  PUSH   results_addr        results, query answers and status to the sequencer

Delivery is reliable and totally ordered although PUB/SUB is neither: a batch whose
epoch is not last+1 is held back and the gap is fetched from the log service;
heartbeats reveal a missed tail. Batches already applied are ignored.
"""

from __future__ import annotations

import logging
import signal
import time

import zmq

from cluster.config import ClusterConfig
from executor import wire as ewire
from executor.engine import genesis_storage
from executor.partition import Partition
from executor.storage import Storage
from sequencer import wire as swire
from txn_library.procedure import load_modules

log = logging.getLogger("ordo.replica")

STATUS_EVERY_S = 0.2
REPAIR_RETRY_S = 0.5


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
        self.ctx = ctx or zmq.Context.instance()
        c = self.ctx
        self.sub = c.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(config.publish_addr)
        self.logsvc = c.socket(zmq.DEALER)
        self.logsvc.setsockopt(zmq.LINGER, 0)
        self.logsvc.connect(config.log_service_addr)
        self.inbox = c.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.RCVHWM, 0)
        self.inbox.bind(config.partition_addr(replica, partition))
        self.peers: dict[int, zmq.Socket] = {}
        for q in range(config.partitions):
            if q != partition:
                s = c.socket(zmq.PUSH)
                s.setsockopt(zmq.SNDHWM, 0)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(config.partition_addr(replica, q))
                self.peers[q] = s
        self.results = c.socket(zmq.PUSH)
        self.results.setsockopt(zmq.SNDHWM, 0)
        self.results.setsockopt(zmq.LINGER, 1000)
        self.results.connect(config.results_addr)
        self._held: dict[int, tuple] = {}  # epoch -> batch, arrived ahead of a gap
        self._known_last_epoch = 0  # highest epoch we know exists
        self._repair_sent_at = 0.0
        self._stop = False

    def stop(self, *_: object) -> None:
        self._stop = True

    # Batches ------------------------------------------------------------------
    def _offer(self, data: bytes) -> None:
        batch = swire.unpack(data)
        epoch = batch[swire.B_EPOCH]
        self._known_last_epoch = max(self._known_last_epoch, epoch)
        if epoch <= self.part.last_epoch:
            return
        self._held[epoch] = batch
        while self.part.last_epoch + 1 in self._held:
            self.part.on_batch(self._held.pop(self.part.last_epoch + 1))

    def _maybe_repair(self, now: float) -> None:
        want = self.part.last_epoch + 1
        if self._known_last_epoch < want or now - self._repair_sent_at < REPAIR_RETRY_S:
            return
        last = self._known_last_epoch
        if self._held:
            last = min(self._held) - 1
            if last < want:
                return
        self.logsvc.send(swire.pack((swire.LOG_FETCH, want, last)))
        self._repair_sent_at = now

    def _on_log_reply(self) -> None:
        kind, batches, last_on_disk = swire.unpack(self.logsvc.recv())
        self._known_last_epoch = max(self._known_last_epoch, last_on_disk)
        for data in batches:
            self._offer(data)
        self._repair_sent_at = 0.0  # ask for the next chunk at once if still behind

    def _on_sub(self) -> None:
        topic, payload = self.sub.recv_multipart()
        if topic == swire.TOPIC_BATCH:
            self._offer(payload)
        elif topic == swire.TOPIC_HEARTBEAT:
            (last,) = swire.unpack(payload)
            self._known_last_epoch = max(self._known_last_epoch, last)

    def _on_inbox(self) -> None:
        data = self.inbox.recv()
        try:
            msg = ewire.unpack(data)
            kind = msg[0]
            if kind == ewire.MSG_READS:
                entries = msg[2]
                reads = self.part.on_reads
            elif kind == ewire.MSG_QUERY:
                entries = [tuple(q) for q in msg[2] if len(q) == 5]
                reads = None
            else:
                raise ValueError(f"unknown message kind {kind!r}")
        except Exception as e:  # a stray or garbled message must not kill the partition
            log.warning("dropped malformed inbound message (%d bytes): %s", len(data), e)
            return
        if reads is not None:
            reads(msg[1], entries)
        else:
            for qid, tag, name, args, min_txn_id in entries:
                self.part.on_query(qid, tag, name, args, min_txn_id)

    # Loop ---------------------------------------------------------------------
    def _flush(self, force_status: bool) -> None:
        peer_out, results, queries = self.part.take_outputs()
        for q, entries in peer_out.items():
            self.peers[q].send(ewire.pack((ewire.MSG_READS, self.partition_id, entries)))
        if results or queries or force_status:
            self.results.send(
                ewire.pack(
                    (
                        ewire.MSG_RESULTS,
                        self.replica,
                        self.partition_id,
                        results,
                        queries,
                        self.part.status(),
                    )
                )
            )

    def run(self) -> None:
        poller = zmq.Poller()
        for s in (self.sub, self.logsvc, self.inbox):
            poller.register(s, zmq.POLLIN)
        # Catch up from the log service right away (slow-joiner safe: SUB is connected).
        self.logsvc.send(swire.pack((swire.LOG_FETCH, self.part.last_epoch + 1, 1 << 62)))
        self._repair_sent_at = time.monotonic()
        next_status = 0.0
        while not self._stop:
            events = dict(poller.poll(50))
            for _ in range(512):
                progressed = False
                if self.inbox.poll(0):
                    self._on_inbox()
                    progressed = True
                if self.sub.poll(0):
                    self._on_sub()
                    progressed = True
                if self.logsvc.poll(0):
                    self._on_log_reply()
                    progressed = True
                if not progressed:
                    break
                if progressed and self.part.peer_out:
                    break  # unblock peers promptly
            del events
            now = time.monotonic()
            self._maybe_repair(now)
            force = now >= next_status
            if force:
                next_status = now + STATUS_EVERY_S
            self._flush(force)
        self.close()

    def close(self) -> None:
        for s in [self.sub, self.logsvc, self.inbox, self.results, *self.peers.values()]:
            s.close(linger=0)


def main(config: ClusterConfig, replica: int, partition: int) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s r{replica}p{partition} %(levelname)s %(message)s"
    )
    server = PartitionServer(config, replica, partition)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    log.info("partition r%d p%d up", replica, partition)
    server.run()
