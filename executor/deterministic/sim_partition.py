"""A simulated partition process: the real ``Partition`` role and the glue of its loop.

The glue mirrors ``cluster.partition_server.PartitionServer`` step by step, with the sockets
replaced by the simulated network and ``time.monotonic`` by the simulated clock:
batches are taken strictly in epoch order (held back behind a gap, gaps fetched from
the log service, a missed tail revealed by heartbeats); after every input the loop
turn runs: checkpoint if drained, repair, progress, flush (peer reads, results,
status every ``STATUS_EVERY_S``). At start it loads its newest durable checkpoint (or
genesis), asks its peers to resend reads (MSG_RESEND) and fetches every later epoch.

Checkpoints: at the drain the image is taken (files: the process's checkpoint chain,
as the live process keeps one, writes a base or a delta at once, a base copying the
frames of tables that only grew since the last one; or an in-memory copy), the
boundary is recorded and batches resume;
the checkpoint becomes durable a random while later (the writer's run time), unless
the partition crashes first (then the file never reaches its name; a torn ``.tmp``
is left behind, as a killed writer leaves it). A boundary reached while a writer runs
is recorded but not written, as live.

With a replicated ordering layer, the node also checks what the feed believes: the
leader term it follows never decreases within one incarnation (a deposed leader's
late batches and heartbeats are ignored). The planted bug
``partition-accepts-old-term`` makes the feed forget the newest term before every
publication, so a deposed leader's late batch is taken and its results go back there.

Invariant: everything this node does goes through ``Partition``'s public inputs and
outputs; the node adds no logic the live process does not have.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import replace
from pathlib import Path

from executor.core import checkpoint
from executor.core.storage import Storage
from executor.deterministic.delivery import (
    PEER_HOLD_RETRY_S,
    REPAIR_RETRY_S,
    STATUS_EVERY_S,
    BatchFeed,
)
from executor.deterministic.partition import Partition
from executor.deterministic.query_service import QueryService
from executor.deterministic.sim_network import Node, Payload
from executor.deterministic.sim_world import World
from executor.deterministic.workloads import clone_storage
from txn_library import limits
from txn_library.errors import invariant
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as swire

POLL_US = 50_000  # PartitionServer.run polls with a 50 ms timeout
STATUS_EVERY_US = int(STATUS_EVERY_S * 1e6)
REPAIR_RETRY_US = int(REPAIR_RETRY_S * 1e6)
PEER_HOLD_MAX_US = int(limits.peer_hold_s_max * 1e6)
# The simulator's batches are small: its partitions call the interleave hook every 4th
# admission (live: partition.INTERLEAVE_EVERY) and, on a replica that spends CPU, send
# results from it once 2 wait (live: partition.EARLY_RESULTS_MIN), so that reads and
# results crossing mid-batch happen in most seeds.
SIM_INTERLEAVE_EVERY = 4
SIM_EARLY_RESULTS_MIN = 2
PEER_HOLD_RETRY_US = int(PEER_HOLD_RETRY_S * 1e6)
MONOTONIC_BASE_US = 1_000_000_000  # time.monotonic() is far from 0 in a live process
FETCH_ALL = 1 << 62  # PartitionServer.run asks for everything after its last epoch

Restored = tuple[int, int, int]  # (epoch, next_txn_id, txns_applied)


class CheckpointStore:
    """Durable checkpoints of one partition: files (executor.core.checkpoint) or memory."""

    def __init__(
        self, root: Path, replica: int, partition: int, partitions: int, keep: int, in_memory: bool
    ) -> None:
        self.replica = replica
        self.partition = partition
        self.partitions = partitions
        self.keep = keep
        self.in_memory = in_memory
        self.directory = root / f"replica-{replica}" / "checkpoints"
        self._staging = root / f"staging-r{replica}p{partition}"
        self._staged: tuple[int, Path | None, tuple[Restored, Storage] | None] | None = None
        self._memory: list[tuple[Restored, Storage]] = []
        self.durable = 0
        # Files: the running process's chain (as PartitionServer keeps one), from the
        # checkpoint it loaded (``begin``); its deltas and bases, copying frames.
        self.chain: checkpoint.CheckpointChain | None = None
        self._loaded: checkpoint.CheckpointInfo | None = None
        self._planned: checkpoint.PlannedCheckpoint | None = None
        self._copied = 0  # rows the staged base copied from the last base
        self.deltas = 0  # durable deltas
        self.copied_rows = 0  # rows durable bases copied

    def begin(self, storage: Storage) -> None:
        """A process starts on ``storage`` (the checkpoint ``load`` returned, or genesis)."""
        self.chain = None if self.in_memory else checkpoint.CheckpointChain(storage, self._loaded)

    def stage(self, part: Partition) -> None:
        """The image at the drain (what the forked writer sees)."""
        epoch = part.checkpoint_due
        assert epoch is not None
        meta = (epoch, part.next_txn_id, part.txns_applied)
        if self.in_memory:
            self._staged = (epoch, None, (meta, clone_storage(part.storage)))
            return
        assert self.chain is not None
        self._planned = self.chain.plan(epoch)
        writer = self.chain.writer(
            self._staging,
            self._planned,
            replica=self.replica,
            partition=self.partition,
            partitions=self.partitions,
            next_txn_id=part.next_txn_id,
            txns_applied=part.txns_applied,
        )
        self._staged = (epoch, writer.finish(), None)
        self._copied = writer.copied_rows

    def commit(self, epoch: int) -> None:
        """The writer finished: the checkpoint is in place and durable."""
        staged = self._staged
        invariant(staged is not None and staged[0] == epoch, "commit of an unstaged checkpoint")
        assert staged is not None
        self._staged = None
        self.durable += 1
        if staged[2] is not None:
            self._memory.append(staged[2])
            del self._memory[: -self.keep]
            return
        assert staged[1] is not None and self.chain is not None and self._planned is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / staged[1].name
        os.replace(staged[1], path)
        self.chain.written(self._planned)
        self.deltas += self._planned.parent is not None
        self.copied_rows += self._copied
        base = self.chain.base
        if base is not None and base.path == staged[1]:  # the next base copies from here
            self.chain.base = replace(base, path=path)
        # The writer wrote the replicated tables' file, if it had to, beside its temp
        # file (a live writer works in the checkpoint directory itself). It is named by
        # its content's hash and written once, so the directory gets that very file.
        for static in self._staging.glob(f"static-p{self.partition}-*.ckpt"):
            target = self.directory / static.name
            if not target.exists():
                os.link(static, target)
        self._planned = None
        checkpoint.prune(self.directory, self.partition, self.keep)

    def reads_floor(self) -> int | None:
        """The first txn a restart could replay from (checkpoint.reads_floor)."""
        if self.in_memory:
            return min((meta[1] for meta, _ in self._memory), default=None)
        return checkpoint.reads_floor(self.directory, self.partition, self.partitions)

    def abort(self, rng: random.Random) -> None:
        """The partition died while its writer ran: only a torn temp file remains."""
        staged, self._staged = self._staged, None
        self.chain = self._planned = None  # the process is gone
        if staged is None or staged[1] is None:
            return
        data = staged[1].read_bytes()
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = (self.directory / staged[1].name).with_suffix(".tmp")
        tmp.write_bytes(data[: rng.randint(0, len(data))])
        staged[1].unlink()

    def load(self, epoch: int | None) -> tuple[Restored, Storage] | None:
        """The newest valid checkpoint (or the one of ``epoch``); None: genesis."""
        if self.in_memory:
            for meta, storage in reversed(self._memory):
                if epoch is None or meta[0] == epoch:
                    return meta, clone_storage(storage)
            return None
        if epoch is None:
            found = checkpoint.load_newest(self.directory, self.partition, self.partitions)
        else:
            path = self.directory / checkpoint.checkpoint_name(epoch, self.partition)
            try:
                found = checkpoint.load(path)
            except (checkpoint.CheckpointInvalid, OSError):
                found = None
        self._loaded = None if found is None else found[0]
        if found is None:
            return None
        info, storage = found
        return (info.epoch, info.next_txn_id, info.txns_applied), storage

    def epochs(self) -> set[int]:
        """Epochs of the durable checkpoints that load (validated whole, as a restore
        would: a header alone may belong to a corrupt file)."""
        if self.in_memory:
            return {meta[0] for meta, _ in self._memory}
        out = set()
        for info in checkpoint.list_checkpoints(self.directory, self.partition):
            try:
                checkpoint.load(info.path)
            except checkpoint.CheckpointInvalid:
                continue
            out.add(info.epoch)
        return out

    def discard_after(self, epoch: int | None) -> None:
        """Operator action before a replica restore: newer checkpoints are moved away."""
        if self.in_memory:
            self._memory = [m for m in self._memory if epoch is not None and m[0][0] <= epoch]
            return
        for info in checkpoint.list_checkpoints(self.directory, self.partition):
            if epoch is None or info.epoch > epoch:
                info.path.unlink()

    def corrupt_newest(self, rng: random.Random) -> str | None:
        """Flip one byte of the newest checkpoint file (a bad sector); None if none."""
        if self.in_memory:
            return None
        infos = checkpoint.list_checkpoints(self.directory, self.partition)
        if not infos:
            return None
        path = infos[-1].path
        data = bytearray(path.read_bytes())
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        return f"{path.name} byte {at}"

    def close(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)


class PartitionNode:
    def __init__(self, sim: World, replica: int, partition: int) -> None:
        self.sim = sim
        self.replica = replica
        self.partition = partition
        self.node = Node(f"r{replica}p{partition}", up=False)
        opts = sim.opts
        self.store = CheckpointStore(
            sim.root,
            replica,
            partition,
            sim.partitions,
            opts.checkpoint_keep,
            opts.checkpoint_store == "memory",
        )
        self.part: Partition | None = None
        self.feed: BatchFeed | None = None  # the live process's ordered delivery
        self.live = False
        self._reset_glue()
        self.log_fetches = 0
        self.early_results = 0  # results sent from the interleave hook, mid-batch

    def _reset_glue(self) -> None:
        self.live = False
        self._term_max = 0  # the newest term this incarnation followed
        self._status_requested = False
        self._next_status = 0
        self._writing: int | None = None  # epoch whose checkpoint writer runs

    @property
    def mono_us(self) -> int:
        return MONOTONIC_BASE_US + self.sim.loop.now_us

    # Life ------------------------------------------------------------------------
    def start(self, from_epoch: int | None = None) -> None:
        sim = self.sim
        restored = self.store.load(from_epoch)
        if restored is None and from_epoch is not None:
            sim.failure(f"{self.node.name}: checkpoint {from_epoch} to restore from does not load")
        if restored is None:
            storage = clone_storage(sim.image.partitions[self.partition])
        else:
            storage = restored[1]
        self.store.begin(storage)
        part = Partition(self.replica, self.partition, sim.partitions, storage)
        if restored is not None:
            part.restore(*restored[0])
        part.interleave_every = SIM_INTERLEAVE_EVERY
        part.results_early = self._spare
        part.early_results_min = SIM_EARLY_RESULTS_MIN
        self.part = part
        self.queries: QueryService | None = None
        if sim.opts.query_share > 0:  # as live: versions kept, queries served
            part.keep_versions()
            self.queries = QueryService(part, self._send_peer, lambda: self.mono_us / 1e6)
        self.feed = BatchFeed(
            part,
            REPAIR_RETRY_US,
            lambda b: self.sim.planted_batch(self, b),
            interleave=self._interleave,
            peer_hold_max=PEER_HOLD_MAX_US,
            peer_hold_retry=PEER_HOLD_RETRY_US,
        )
        self._reset_glue()
        self.node.up = True
        sim.net.reconnect(self.node)
        origin = f"checkpoint {restored[0][0]}" if restored is not None else "genesis"
        sim.trace.note(sim.loop.now_us, f"start {self.node.name} from {origin}")
        peers = [q for q in range(sim.partitions) if q != self.partition]
        for q in peers:
            self._send_peer(q, ewire.encode(ewire.Resend(self.partition, part.next_txn_id)))
        self._announce_reads_floor(peers)
        self._fetch(part.last_epoch + 1, FETCH_ALL)
        self.feed.requested(self.mono_us)
        life = self.node.incarnation
        sim.loop.after(POLL_US, self._poll, life)

    def crash(self) -> None:
        node = self.node
        node.up = False
        node.incarnation += 1
        node.crashed_at_us = self.sim.loop.now_us
        if self._writing is not None:
            self.store.abort(self.sim.rng)
        self._writing = None
        self.part = None
        self.sim.trace.note(self.sim.loop.now_us, f"crash {node.name}")

    def _alive(self, life: int) -> bool:
        return self.node.up and self.node.incarnation == life

    def _poll(self, life: int) -> None:
        if not self._alive(life):
            return
        self.turn()
        self.sim.loop.after(POLL_US, self._poll, life)

    # Inputs ----------------------------------------------------------------------
    def on_pub(self, payload: Payload) -> None:
        assert isinstance(payload, tuple)
        topic, data = payload[0], payload[1]
        publisher = int(payload[2]) if len(payload) > 2 else None  # replicated: the member
        if self.sim.opts.plant == "results-to-old-leader":
            publisher = None  # planted: a batch does not name its leader, heartbeats only
        feed = self.feed
        assert feed is not None
        if self.sim.opts.plant == "partition-accepts-old-term":
            feed.term = 0  # planted: forgets the newest term it followed
        if topic == swire.TOPIC_BATCH:
            feed.offer(data, published=True, publisher=publisher)
        elif topic == swire.TOPIC_HEARTBEAT:
            hb = swire.heartbeat(swire.unpack(data))
            assert hb is not None, "the simulated sequencer sends well-formed heartbeats"
            feed.heartbeat(hb.last_epoch, hb.term, hb.leader)
        if feed.term < self._term_max:
            self.sim.failure(
                f"{self.node.name} follows term {feed.term} (seq{feed.leader}) after term "
                f"{self._term_max}"
            )
        self._term_max = max(self._term_max, feed.term)
        self.turn()

    def on_log_reply(self, payload: Payload) -> None:
        assert isinstance(payload, bytes)
        reply = swire.LogBatches._make(swire.unpack(payload)[1:])
        assert self.feed is not None
        self.feed.log_reply(reply.batches, reply.last_epoch_on_disk)
        self.turn()

    def on_inbox(self, payload: Payload) -> None:
        assert isinstance(payload, bytes) and self.part is not None
        msg, problem = ewire.decode_inbound(payload)
        if msg is None:
            self.sim.failure(f"{self.node.name}: malformed inbound message: {problem}")
            return
        part = self.part
        if isinstance(msg, ewire.Reads):
            part.on_reads(msg.from_partition, msg.entries)
            self._feed().after_reads()
        elif isinstance(msg, ewire.ReadsFloor):
            part.on_reads_floor(msg.from_partition, msg.txn_id)
        elif isinstance(msg, (ewire.QueryReads, ewire.QueryReadsReply, ewire.Watermark)):
            q = self.queries
            if q is not None:
                if isinstance(msg, ewire.QueryReads):
                    q.on_query_reads(msg)
                elif isinstance(msg, ewire.QueryReadsReply):
                    q.on_query_reads_reply(msg)
                else:
                    q.on_watermark(msg)
                self._send_query_replies()
        elif isinstance(msg, ewire.Query):
            for qid, tag, name, args, min_txn_id in msg.calls:
                part.on_query(qid, tag, name, args, min_txn_id)
        elif isinstance(msg, ewire.Resend):
            self._on_resend(msg.from_partition, msg.first_txn_id)
        elif isinstance(msg, ewire.ResendGap):
            self.sim.on_resend_gap(self, msg.from_partition, msg.oldest_retained_txn_id)
        else:
            self._status_requested = True
        self.turn()

    def _announce_reads_floor(self, peers: list[int]) -> None:
        """As PartitionServer: the first txn a restart could replay from, to peers."""
        floor = self.store.reads_floor()
        if floor is not None:
            for q in peers:
                self._send_peer(q, ewire.encode(ewire.ReadsFloor(self.partition, floor)))

    def _on_resend(self, peer: int, first_txn_id: int) -> None:
        assert self.part is not None
        if peer == self.partition or not 0 <= peer < self.sim.partitions:
            return
        self._announce_reads_floor([peer])  # the restarted peer forgot it
        if not self.part.resend(peer, first_txn_id):
            gap = ewire.ResendGap(self.partition, self.part.sent_complete_from)
            self._send_peer(peer, ewire.encode(gap))

    # The loop turn -----------------------------------------------------------------
    def turn(self) -> None:
        if self.part is None:
            return
        # Odd replicas save CPU as a live partition on a host without idle cores (hold
        # batches for peers, results at the batch's end), even ones spend it (run ahead,
        # results mid-batch): both schedules, and their hashes and results must agree.
        self._feed().pace(self.mono_us, contended=not self._spare)
        self._maybe_checkpoint()
        self._maybe_repair()
        self._report_progress()
        self._serve_queries()
        now = self.mono_us
        force = now >= self._next_status or self._status_requested
        if force:
            self._next_status = now + STATUS_EVERY_US
            self._status_requested = False
        self._flush(force)

    # Queries (as PartitionServer: executor/deterministic/query_service.py) ----------
    def on_query_frame(self, identity: bytes, frame: Payload) -> None:
        assert isinstance(frame, bytes)
        if self.part is None or self.queries is None:
            return  # down: the client asks again
        self.queries.on_client_frame(identity, frame)
        self._send_query_replies()

    def _serve_queries(self) -> None:
        q = self.queries
        if q is None:
            return
        q.live = self.live
        q.tick(self.mono_us / 1e6)
        self._send_query_replies()

    def _send_query_replies(self) -> None:
        assert self.queries is not None
        for identity, entries in self.queries.take_replies().items():
            client = self.sim.client_by_identity.get(identity)
            if client is not None:
                data = swire.encode_query_reply(entries)
                self.sim.net.send(self.node, client.node, "qreply", data, client.on_query_reply)

    def _maybe_checkpoint(self) -> None:
        part = self.part
        assert part is not None
        if not part.checkpoint_ready():
            return
        keep = self.sim.opts.checkpoint_keep
        if keep > 0 and self._writing is not None and part.checkpoint_requested:
            return  # as live: a requested boundary waits for the writer (then turn())
        if keep <= 0 or self._writing is not None:
            # As live: a boundary reached while the writer runs is recorded, not written.
            part.checkpoint_taken()
            self.sim.note_boundary(self, *part.boundary)
            self._feed().apply_held()
            return
        epoch = part.checkpoint_due
        assert epoch is not None
        self.store.stage(part)
        self._writing = part.checkpoint_writing = epoch
        part.checkpoint_taken()
        self.sim.note_boundary(self, *part.boundary)
        self._feed().apply_held()
        delay = self.sim.rng.randint(200, self.sim.checkpoint_write_max_us)
        self.sim.loop.after(delay, self._checkpoint_written, self.node.incarnation, epoch)

    def _checkpoint_written(self, life: int, epoch: int) -> None:
        if not self._alive(life):
            return
        assert self.part is not None
        self.store.commit(epoch)
        self._writing = None
        self.part.checkpoint_writing = -1
        self._announce_reads_floor([q for q in range(self.sim.partitions) if q != self.partition])
        self.part.checkpoint_durable(epoch)
        self._status_requested = True
        self.sim.trace.note(self.sim.loop.now_us, f"checkpoint {self.node.name} {epoch}")
        self.turn()

    def _feed(self) -> BatchFeed:
        assert self.feed is not None
        return self.feed

    def _maybe_repair(self) -> None:
        wanted = self._feed().repair(self.mono_us)
        if wanted is not None:
            self._fetch(*wanted)

    def _report_progress(self) -> None:
        part = self.part
        assert part is not None
        if not self.live and self._feed().caught_up():
            self.live = True
            self.sim.trace.note(self.sim.loop.now_us, f"live {self.node.name} {part.last_epoch}")

    def _flush(self, force_status: bool) -> None:
        part = self.part
        assert part is not None
        peer_out, results, queries = part.take_outputs()
        self._send_reads(peer_out)
        if results or queries or force_status:
            status = part.status(catching_up=not self.live)._replace(
                pid=self.sim.pid_of(self)  # a simulated pid
            )
            data = ewire.results_message(self.replica, self.partition, results, queries, status)
            if results:
                self.sim.note_results(self, data)
            assert self.feed is not None
            seq = self.sim.sequencer_of(self.feed.leader)  # whom this partition believes
            self.sim.net.send(self.node, seq.node, "results", data, seq.on_results, park=True)

    # Sending -----------------------------------------------------------------------
    def _interleave(self) -> None:
        """Partition.on_batch's interleave hook, as live: reads queued mid-batch go out
        at once (the simulated network delivers peers' reads as events, between turns),
        and on a replica with cores to spare the results waiting too."""
        assert self.part is not None
        if self.part.results_due():
            self.early_results += 1
            self._flush(False)
        else:
            self._send_reads(self.part.take_peer_out())

    @property
    def _spare(self) -> bool:
        """Whether this partition acts as on a host with cores to spare (live:
        cluster.processes.SpareCores)."""
        return self.replica % 2 == 0

    def _send_reads(self, peer_out: dict[int, list]) -> None:
        for q, entries in peer_out.items():
            entries = self.sim.planted_reads(self, entries)
            if entries:
                self._send_peer(q, ewire.encode(ewire.Reads(self.partition, entries)))

    def _send_peer(self, q: int, data: bytes) -> None:
        peer = self.sim.parts[self.replica][q]
        self.sim.net.send(self.node, peer.node, "peer", data, peer.on_inbox, park=True)

    def _fetch(self, first: int, last: int) -> None:
        self.log_fetches += 1
        seq = self.sim.seq_node
        request = swire.encode(swire.LogFetch(first, last))
        self.sim.net.send(self.node, seq.node, "logreq", request, self._deliver_fetch, park=True)

    def _deliver_fetch(self, payload: Payload) -> None:
        assert isinstance(payload, bytes)
        self.sim.seq_node.on_log_fetch(self, payload)

    # Introspection -------------------------------------------------------------------
    def caught_up(self, last_epoch: int) -> bool:
        part = self.part
        return (
            self.node.up
            and part is not None
            and self.live
            and part.last_epoch == last_epoch
            and part.idle()
            and part.checkpoint_due is None
            and self._writing is None
        )

    def describe(self) -> str:
        part = self.part
        if not self.node.up or part is None:
            return f"{self.node.name} down"
        return (
            f"{self.node.name} epoch {part.last_epoch} (known {self._feed().known_last_epoch}), "
            f"{part.status()[3]} active, held {sorted(self._feed().held)[:5]}, live={self.live}, "
            f"checkpoint_due={part.checkpoint_due}, writing={self._writing}"
        )
