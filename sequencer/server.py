"""The sequencer process: sockets and the single-threaded poll loop around Sequencer.

Sockets (all on 127.0.0.1):
  ROUTER client_addr     client calls and status requests
  PUB    publish_addr    batches and heartbeats to every partition of every replica
  ROUTER log_service_addr  epoch ranges from the command log (gap repair, catch-up)
  PULL   results_addr    results and status from partitions
  PUSH   one per partition of every replica: read-only queries and recon reads

A client's mistake never kills this process: every frame is decoded inside a guard
and answered with an error.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from typing import Any

import zmq

from cluster import limits
from cluster.config import ClusterConfig
from executor import wire as ewire
from sequencer import wire
from sequencer.log import CommandLog, LogCorruption
from sequencer.sequencer import Sequencer
from txn_library.errors import ERR_MALFORMED, ERROR, BadRequest
from txn_library.procedure import load_modules

log = logging.getLogger("ordo.sequencer")

HEARTBEAT_MS = 100


class SequencerServer:
    def __init__(self, config: ClusterConfig, ctx: zmq.Context | None = None) -> None:
        self.config = config
        load_modules(config.procedure_modules)
        if config.log_segment_bytes:
            limits.segment_bytes_max = config.log_segment_bytes
        self.log = CommandLog(config.log_dir, fsync=config.fsync)
        if self.log.recovered_truncated_bytes:
            log.warning(
                "command log: truncated %d bytes of torn tail", self.log.recovered_truncated_bytes
            )
        self.seq = Sequencer(
            self.log,
            config.replicas,
            config.partitions,
            checkpoint_every_epochs=config.checkpoint_every_epochs,
            checkpoint_every_s=config.checkpoint_every_s,
        )
        self.ctx = ctx or zmq.Context.instance()
        c = self.ctx
        self.client = c.socket(zmq.ROUTER)
        self.client.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max)
        self.client.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.client.bind(config.client_addr)
        self.pub = c.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(config.publish_addr)
        self.logsvc = c.socket(zmq.ROUTER)
        self.logsvc.bind(config.log_service_addr)
        self.results = c.socket(zmq.PULL)
        self.results.setsockopt(zmq.RCVHWM, 0)
        self.results.bind(config.results_addr)
        self.query_socks: dict[tuple[int, int], zmq.Socket] = {}
        for r in range(config.replicas):
            for p in range(config.partitions):
                s = c.socket(zmq.PUSH)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.IMMEDIATE, 1)
                s.connect(config.partition_addr(r, p))
                self.query_socks[(r, p)] = s
        self._stop = False
        log.info(
            "sequencer up: epoch %d, next txn %d, client %s",
            self.seq.epoch,
            self.seq.next_txn_id,
            config.client_addr,
        )

    def stop(self, *_: object) -> None:
        self._stop = True

    # Handlers -----------------------------------------------------------------
    def _on_client(self) -> None:
        frames = self.client.recv_multipart(copy=True)
        identity = frames[0]
        if len(frames) != 2:
            self.seq._error(identity, None, ERR_MALFORMED, "expected exactly one frame")
            return
        frame = frames[1]
        if not self.seq.check_frame_size(identity, frame):
            return
        try:
            msg = wire.unpack(frame)
            kind = msg[0]
        except Exception as e:
            self.seq._error(identity, None, ERR_MALFORMED, f"not a msgpack array: {e}")
            return
        try:
            if kind == wire.REQ_CALLS and len(msg) == 3:
                self.seq.on_calls(identity, msg[1], msg[2])
            elif kind == wire.REQ_CHECKPOINT:
                epoch = self.seq.request_checkpoint()
                self.client.send_multipart([identity, wire.pack((wire.REP_OK, epoch))])
            elif kind == wire.REQ_PRUNE and len(msg) == 2:
                reply: tuple[int, Any]
                try:
                    removed = self.seq.prune_log(msg[1])
                    reply = (wire.REP_OK, removed)
                except BadRequest as e:
                    reply = (wire.REP_ERROR, e.message)
                self.client.send_multipart([identity, wire.pack(reply)])
            elif kind == wire.REQ_STATUS:
                self.client.send_multipart(
                    [identity, wire.pack((wire.REP_STATUS, self.seq.status_report()))]
                )
            else:
                self.seq._error(identity, None, ERR_MALFORMED, f"unknown request kind {kind!r}")
        except Exception as e:  # never die of a client's frame
            log.exception("error handling a client frame")
            self.seq._error(identity, None, ERR_MALFORMED, f"{type(e).__name__}: {e}")

    def _on_results(self) -> None:
        data = self.results.recv()
        try:
            msg = ewire.unpack(data)
            if msg[0] != ewire.MSG_RESULTS or len(msg) != 6:
                raise ValueError("not a results message")
        except Exception as e:
            log.warning("dropped malformed results message (%d bytes): %s", len(data), e)
            return
        _, replica, partition, results, qresults, status = msg
        self.seq.on_results(replica, partition, results, qresults, status)

    def _on_log_fetch(self) -> None:
        identity, frame = self.logsvc.recv_multipart()
        try:
            kind, first, last = wire.unpack(frame)
            assert kind == wire.LOG_FETCH
        except Exception:
            return
        last = min(last, first + limits.log_service_epochs_per_reply_max - 1)
        batches = [data for _e, data in self.log.read_range(first, last)]
        self.logsvc.send_multipart(
            [identity, wire.pack((wire.LOG_BATCHES, batches, self.log.last_epoch))]
        )

    def _flush(self) -> None:
        for identity, replies in self.seq.take_client_out().items():
            try:
                self.client.send_multipart(
                    [identity, wire.pack((wire.REP_RESULTS, replies))], flags=zmq.NOBLOCK
                )
            except zmq.ZMQError:
                log.warning("client gone; dropped %d replies", len(replies))
        for (r, p), queries in self.seq.take_query_out().items():
            self._send_queries(r, p, queries)

    def _send_queries(self, r: int, p: int, queries: list) -> None:
        """Send to replica r, or the next replica whose partition p is connected."""
        for i in range(self.config.replicas):
            rr = (r + i) % self.config.replicas
            try:
                self.query_socks[(rr, p)].send(
                    ewire.pack((ewire.MSG_QUERY, rr, queries)), flags=zmq.NOBLOCK
                )
                return
            except zmq.Again:
                continue
        self.seq.query_out.setdefault((r, p), []).extend(queries)  # nobody up: next turn

    # Loop ---------------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.client, zmq.POLLIN)
        poller.register(self.results, zmq.POLLIN)
        poller.register(self.logsvc, zmq.POLLIN)
        epoch_s = self.config.epoch_duration_ms / 1000.0
        next_tick = time.monotonic() + epoch_s
        next_heartbeat = time.monotonic()
        while not self._stop:
            timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000.0)
            events = dict(poller.poll(math.ceil(timeout_ms)))
            # Drain a bounded number of messages per socket per turn, fairly.
            for _ in range(256):
                progressed = False
                if events.get(self.client) and self.client.poll(0):
                    self._on_client()
                    progressed = True
                if events.get(self.results) and self.results.poll(0):
                    self._on_results()
                    progressed = True
                if not progressed:
                    break
            if events.get(self.logsvc):
                while self.logsvc.poll(0):
                    self._on_log_fetch()
            now = time.monotonic()
            if now >= next_tick:
                data = self.seq.tick(int(time.time() * 1000))
                if data is not None:
                    self.pub.send_multipart([wire.TOPIC_BATCH, data])
                    next_heartbeat = now + HEARTBEAT_MS / 1000.0
                next_tick = max(next_tick + epoch_s, now)
            if now >= next_heartbeat:
                self.pub.send_multipart([wire.TOPIC_HEARTBEAT, wire.pack((self.seq.epoch,))])
                next_heartbeat = now + HEARTBEAT_MS / 1000.0
            self._flush()
        self.close()

    def close(self) -> None:
        for s in [self.client, self.pub, self.logsvc, self.results, *self.query_socks.values()]:
            s.close(linger=0)
        self.log.close()


def main(config: ClusterConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        server = SequencerServer(config)
    except LogCorruption as e:
        log.critical("command log is corrupt, refusing to start: %s", e)
        raise SystemExit(3) from None
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    server.run()


__all__ = ["SequencerServer", "main", "ERROR"]
