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

import zmq

from cluster.config import ClusterConfig
from sequencer.calls import parse_log_fetch
from sequencer.log import CommandLog, LogCorruption
from sequencer.sequencer import HEARTBEAT_MS, Sequencer
from txn_library import limits, wire
from txn_library import partition_wire as ewire
from txn_library.errors import ERR_MALFORMED, ERROR, DroppedMessages
from txn_library.procedure import load_modules

log = logging.getLogger("ordo.sequencer")


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
        self.logsvc.setsockopt(zmq.MAXMSGSIZE, limits.log_service_request_bytes_max)
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
        self._junk = DroppedMessages(log, "internal messages")
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
    def _receive_clients(self) -> None:
        """Read client frames for at most a bounded time and number of bytes.

        ZeroMQ's ROUTER reads its connections fairly and stops reading one whose
        queue is full, so a flooding client is throttled at its own socket while this
        turn's budget leaves room to serve everyone else.
        """
        deadline = time.monotonic() + limits.receive_turn_s_max
        received = 0
        while received < limits.receive_bytes_per_turn_max and self.seq.intake_room():
            try:
                frames = self.client.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0]
            if len(frames) != 2:
                self.seq._error(identity, None, ERR_MALFORMED, "expected exactly one frame")
                received += sum(len(f) for f in frames)
            else:
                self.seq.on_frame(identity, frames[1])
                received += len(frames[1])
            if time.monotonic() >= deadline:
                return

    def _on_results(self) -> None:
        data = self.results.recv()
        if not self.seq.on_results_frame(data):
            self._junk.note(f"malformed results message ({len(data)} bytes)")

    def _on_log_fetch(self) -> None:
        frames = self.logsvc.recv_multipart()
        request = parse_log_fetch(frames[1]) if len(frames) == 2 else None
        if request is None:
            self._junk.note("malformed log service request")
            return
        reply = self.seq.log_reply(*request)
        if reply is None:
            self._junk.note("log service request while fail-stopped")
            return
        self.logsvc.send_multipart([frames[0], reply])

    def _flush(self) -> None:
        for identity, body in self.seq.take_control_out():
            try:
                self.client.send_multipart([identity, wire.encode(body)], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                log.warning("client gone; dropped a control reply")
        for identity, replies in self.seq.take_client_out().items():
            try:
                self.client.send_multipart(
                    [identity, wire.encode(wire.ResultsReply(replies))], flags=zmq.NOBLOCK
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
                    ewire.encode(ewire.Query(rr, queries)), flags=zmq.NOBLOCK
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
        seq = self.seq
        while not self._stop:
            timeout_ms = max(0.0, (next_tick - time.monotonic()) * 1000.0)
            if seq.has_intake():
                timeout_ms = 0.0  # calls still wait for validation: no sleeping
            events = dict(poller.poll(math.ceil(timeout_ms)))
            if events.get(self.client):
                self._receive_clients()
            seq.run_intake(time.monotonic() + limits.intake_turn_s_max)
            for _ in range(256):
                if not self.results.poll(0):
                    break
                self._on_results()
            if events.get(self.logsvc):
                for _ in range(64):
                    if not self.logsvc.poll(0):
                        break
                    self._on_log_fetch()
            now = time.monotonic()
            if now >= next_tick or seq.batch_full():
                data = seq.tick(int(time.time() * 1000))
                if data is not None:
                    self.pub.send_multipart([wire.TOPIC_BATCH, data])
                    next_heartbeat = now + HEARTBEAT_MS / 1000.0
                if now >= next_tick:
                    next_tick = max(next_tick + epoch_s, now)
            if now >= next_heartbeat:
                self.pub.send_multipart(
                    [wire.TOPIC_HEARTBEAT, wire.pack(wire.Heartbeat(seq.epoch))]
                )
                next_heartbeat = now + HEARTBEAT_MS / 1000.0
            self._flush()
            self._junk.report(now)
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
