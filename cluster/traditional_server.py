"""The traditional mode's partition process and its launcher.

One OS process per partition, one thread, a zmq.Poller loop around
executor.traditional.partition.TraditionalPartition (coordinator and participant in
one), handed the wall clock and an OS-seeded Random (the role reads neither itself):

  ROUTER client_addr(p)              client calls (wire/sequencer.py REQ_CALLS/REQ_STATUS),
                                     so txn_library.client.Client works unchanged
  PULL   config.partition_addr(0, p) batches of peer messages
                                     (executor.traditional.messages; a malformed
                                     batch is dropped whole, never half-applied)
  PUSH   every other partition's PULL

Every address is on 127.0.0.1. Partition 0's client port is ``config.client_addr``
(there is no sequencer in this mode), so ``ordo call`` and ``ordo status`` work
against it; partition p listens on ``base_port + p``.

One turn of the loop: drain a bounded number of frames from both sockets, fire due
timers, then take the role's outputs and, in this order, append the turn's log
records as one CommandLog frame and fdatasync it (group commit: one sync per turn,
whatever the number of prepares, decisions and commits in it), then send one
message per peer and one reply frame per client. Nothing leaves before the records
it depends on are durable.

The 2PC log of partition p is a CommandLog (the sequencer's segmented CRC32C format,
a frame per turn) in ``data_dir/traditional/partition-p``. On start the partition
loads the genesis rows (if any) and redoes its log (TraditionalPartition.recover).

Started by ``ordo up --mode traditional`` (TraditionalCluster below), which runs one
``ordo traditional-partition --data-dir D --partition P`` process per partition
(cluster/cli.py). Clients: txn_library.client.routing.RoutingClient.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import zmq

from cluster.config import HOST, ClusterConfig
from cluster.launcher import ProcessGroup
from cluster.metrics import TraditionalMetrics
from cluster.metrics import serve as serve_metrics
from cluster.ownership import start_role
from cluster.processes import batch_scheduling
from cluster.sockets import replica_mesh
from executor.core.genesis import genesis_storage
from executor.core.heap import settle_turn
from executor.traditional.messages import (
    DECODE_ERRORS,
    LogRecord,
    decode_batch,
    encode_batch,
    pack_records,
)
from executor.traditional.options import (
    FAULT_CRASH,
    PrepareFault,
    TraditionalOptions,
    every_nth_prepare,
)
from executor.traditional.partition import TraditionalPartition
from sequencer.log import CommandLog, iter_frames
from txn_library import limits
from txn_library.client import Client
from txn_library.errors import ERR_MALFORMED, ERR_TOO_LARGE, ERROR, OrdoError
from txn_library.procedure import load_modules
from txn_library.wire import sequencer as wire

log = logging.getLogger("ordo.traditional")

PARTITIONS_MAX = 16  # client ports are base_port + p, below the peer ports
FRAMES_PER_TURN_MAX = 512  # per socket; bounds a turn's latency and its log frame
POLL_MS_MAX = 50
CRASH_EXIT_CODE = 70


def wall_clock_us() -> int:
    """The real clock the partition role is handed (microseconds since the epoch)."""
    return time.time_ns() // 1000


def client_addr(config: ClusterConfig, partition: int) -> str:
    """Where clients reach partition ``partition`` (0 is config.client_addr)."""
    if not 0 <= partition < min(config.partitions, PARTITIONS_MAX):
        raise ValueError(f"no partition {partition} (traditional mode: <= {PARTITIONS_MAX})")
    return f"tcp://{HOST}:{config.base_port + partition}"


def log_dir(config: ClusterConfig, partition: int) -> Path:
    return Path(config.data_dir) / "traditional" / f"partition-{partition}"


def _check_config(config: ClusterConfig) -> None:
    if config.replicas != 1:
        raise ValueError("the traditional mode is not replicated: use replicas=1")
    if config.partitions > PARTITIONS_MAX:
        raise ValueError(f"the traditional mode supports at most {PARTITIONS_MAX} partitions")


class TraditionalServer:
    def __init__(
        self,
        config: ClusterConfig,
        partition: int,
        options: TraditionalOptions | None = None,
        ctx: zmq.Context | None = None,
        *,
        clock: Callable[[], int] = wall_clock_us,
    ) -> None:
        _check_config(config)
        self.config = config
        self.partition_id = partition
        self.options = options or TraditionalOptions.load(config.data_dir)
        load_modules(config.procedure_modules)
        storage = genesis_storage(config.genesis, config.genesis_args, partition, config.partitions)
        self.log = CommandLog(log_dir(config, partition), fsync=config.fsync)
        if self.log.recovered_truncated_bytes:
            cut = self.log.recovered_truncated_bytes
            log.warning("2PC log: truncated %d bytes of torn tail", cut)
        self.part = TraditionalPartition(
            partition,
            config.partitions,
            storage,
            clock=clock,
            rng=random.Random(),  # seeded by the OS: only restart backoff and body seeds
            options=self.options,
            prepare_fault=self._fault(),
        )
        self._clock = clock
        self.part.pid = os.getpid()
        t0 = time.monotonic()
        replayed = self.part.recover(p for _e, p in iter_frames(log_dir(config, partition)))
        if replayed:
            log.info(
                "recovered %d log records in %.2fs (%d in doubt)",
                replayed,
                time.monotonic() - t0,
                self.part.status().in_doubt,
            )
        c = self.ctx = ctx or zmq.Context.instance()
        self.client = c.socket(zmq.ROUTER)
        self.client.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max)
        self.client.setsockopt(zmq.SNDHWM, 0)
        self.client.bind(client_addr(config, partition))
        self.inbox, self.peers = replica_mesh(c, config, 0, partition)
        # Snapshot queries (docs/QUERIES.md) need row versions, which this baseline does
        # not keep: a query socket that says so at once, rather than a client waiting
        # out its timeout. Its read-only calls answer isolation="strict" queries.
        self.queries = c.socket(zmq.ROUTER)
        self.queries.setsockopt(zmq.LINGER, 0)
        self.queries.setsockopt(zmq.MAXMSGSIZE, limits.frame_bytes_hard_max)
        self.queries.bind(config.query_addr(0, partition))
        self._stop = False
        self.metrics = TraditionalMetrics(self)  # served by serve() (cluster.metrics)

    def _fault(self) -> PrepareFault | None:
        o = self.options
        if o.fault_prepare is None or o.fault_partition != self.partition_id:
            return None
        fault = every_nth_prepare(o.fault_prepare, o.fault_every)
        if o.fault_prepare != FAULT_CRASH:
            return fault

        def crash(aid: tuple) -> str | None:
            if fault(aid) is not None:
                log.error("injected fault: crashing before the vote on %s", aid)
                logging.shutdown()
                os._exit(CRASH_EXIT_CODE)
            return None

        return crash

    def stop(self, *_: object) -> None:
        self._stop = True

    # Inputs ---------------------------------------------------------------------------
    def _on_client(self, frames: list[bytes]) -> None:
        identity = frames[0]
        if len(frames) != 2:
            self._reject(identity, ERR_MALFORMED, "expected exactly one frame")
            return
        if len(frames[1]) > limits.request_bytes_max:
            self._reject(identity, ERR_TOO_LARGE, f"frame exceeds {limits.request_bytes_max}")
            return
        try:
            msg = wire.unpack(frames[1])
        except DECODE_ERRORS as e:
            self._reject(identity, ERR_MALFORMED, f"not msgpack: {e}")
            return
        if not isinstance(msg, tuple) or not msg:
            self._reject(identity, ERR_MALFORMED, "not a msgpack array")
            return
        kind = msg[0]
        if kind in wire.CALLS_KINDS and len(msg) == 3:
            self.part.on_calls(identity, msg[1], msg[2])
        elif kind == wire.REQ_STATUS:
            report = self.part.status_report()
            self.client.send_multipart([identity, wire.encode(wire.StatusReply(report))])
        else:
            self._reject(identity, ERR_MALFORMED, f"unknown request kind {kind!r}")

    def _reject(self, identity: bytes, code: str, message: str) -> None:
        self.part.reject(identity, code, message)

    def _on_peer(self, data: bytes) -> None:
        try:
            src, msgs = decode_batch(data)
        except DECODE_ERRORS as e:  # a stray or garbled batch must not kill the partition
            log.warning("dropped malformed peer message (%d bytes): %s", len(data), e)
            return
        if src not in self.peers:
            log.warning("dropped peer message (%d bytes) from unknown partition %r", len(data), src)
            return
        self.part.on_peer(src, msgs)

    # Loop -------------------------------------------------------------------------------
    def _flush(self) -> None:
        records, peer_out, client_out = self.part.take_outputs()
        if records:
            self._append(records)
            self.log.sync()  # group commit: the turn's records are durable before any send
        me = self.partition_id
        for q, msgs in peer_out.items():
            self.peers[q].send(encode_batch(me, msgs))
        for identity, replies in client_out.items():
            try:
                self.client.send_multipart(
                    [identity, wire.encode_results_reply(replies)], flags=zmq.NOBLOCK
                )
            except zmq.ZMQError:
                log.warning("client gone; dropped %d replies", len(replies))

    def _append(self, records: list[LogRecord]) -> None:
        data = pack_records(records)
        if len(data) <= limits.log_frame_bytes_max or len(records) == 1:
            self.log.append(self.log.last_epoch + 1, data)
            return
        half = len(records) // 2
        self._append(records[:half])
        self._append(records[half:])

    def _poll_ms(self) -> float:
        due = self.part.next_deadline_us()
        if due is None:
            return POLL_MS_MAX
        return min(POLL_MS_MAX, max(0.0, (due - self._clock()) / 1000.0))

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        poller.register(self.client, zmq.POLLIN)
        poller.register(self.queries, zmq.POLLIN)
        self._flush()  # recovery's resends and queries
        while not self._stop:
            events = dict(poller.poll(math.ceil(self._poll_ms())))
            peer_ready, client_ready = self.inbox in events, self.client in events
            # Alternate between the sockets so neither starves; one zmq.Again per socket
            # per turn at most (an exception per message would cost more than the work).
            for _ in range(FRAMES_PER_TURN_MAX):
                if not (peer_ready or client_ready):
                    break
                if peer_ready:
                    try:
                        data = self.inbox.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        peer_ready = False
                    else:
                        self._on_peer(data)
                if client_ready:
                    try:
                        frames = self.client.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        client_ready = False
                    else:
                        self._on_client(frames)
            if self.queries in events:
                self._refuse_queries()
            self.part.tick()
            self._flush()
            self.metrics.turn(time.monotonic())
            settle_turn()  # what outlived this turn is never scanned (see settle_turn)
        self.close()

    def _refuse_queries(self) -> None:
        """Answer every snapshot or read-committed query: not served in this mode."""
        for _ in range(FRAMES_PER_TURN_MAX):
            try:
                identity, *rest = self.queries.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:
                continue
            try:
                msg = wire.unpack(rest[0]) if len(rest) == 1 else None
            except Exception:  # noqa: BLE001 - a frame we cannot read: answered below
                msg = None
            ok = msg is not None and wire.query_request_problem(msg) is None
            ids = [q[0] for q in msg[2]] if ok else [0]  # type: ignore[index]
            text = msgpack.packb(
                [
                    "bad_arguments",
                    "the 2PL + 2PC baseline keeps no row versions: query it with "
                    "isolation='strict' (its read-only calls take shared locks)",
                ]
            )
            reply = wire.encode_query_reply([(i, ERROR, text, -1) for i in ids])
            try:
                self.queries.send_multipart([identity, reply], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def close(self) -> None:
        for s in [self.client, self.inbox, self.queries, *self.peers.values()]:
            s.close(linger=0)
        self.log.close()


def serve(config: ClusterConfig, partition: int) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s t-p{partition} %(levelname)s %(message)s"
    )
    batch_scheduling()  # as Ordo's partitions (cluster.processes): a fair baseline
    start_role(
        config.data_dir, f"traditional-p{partition}", f"traditional partition {partition}'s log"
    )
    server = TraditionalServer(config, partition)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    log.info("traditional partition %d up at %s", partition, client_addr(config, partition))
    serve_metrics(server.metrics, *config.partition_metrics_addr(0, partition))
    server.run()


# Launcher -----------------------------------------------------------------------------
class TraditionalCluster(ProcessGroup):
    """P traditional partition processes on 127.0.0.1, tracked by PID and always stopped.

    The counterpart of cluster.launcher.LocalCluster for the baseline mode.
    """

    def __init__(self, config: ClusterConfig, options: TraditionalOptions | None = None) -> None:
        _check_config(config)
        super().__init__(config)
        self.options = options or TraditionalOptions()

    @property
    def client_addrs(self) -> list[str]:
        return [client_addr(self.config, p) for p in range(self.config.partitions)]

    def start(self, wait_s: float = 60.0) -> TraditionalCluster:
        self.config.save()
        self.options.save(self.config.data_dir)
        self.serve_metrics()
        for p in range(self.config.partitions):
            self.start_partition(p)
        self.wait_ready(wait_s)
        return self

    def start_partition(self, p: int) -> None:
        self.spawn(
            f"p{p}",
            ["traditional-partition", "--data-dir", self.config.data_dir, "--partition", str(p)],
            f"traditional-partition-{p}.log",
        )

    def wait_ready(self, wait_s: float = 60.0) -> None:
        """Every partition answers status and has heard from all its peers."""
        deadline = time.monotonic() + wait_s
        want = self.config.partitions
        last_err: Exception | None = None
        for addr in self.client_addrs:
            with Client(addr, timeout_s=5) as c:
                while True:
                    self.check_alive()
                    try:
                        if len(c.status(timeout_s=2)["partitions"]) >= want:
                            break
                    except OrdoError as e:  # not up yet (no answer in time)
                        last_err = e
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"{addr} not ready after {wait_s}s ({last_err}); see {self.logs_dir}"
                        )
                    time.sleep(0.1)
