"""One partition of one replica: ordered locking, read exchange, execution.

The Partition is a role object with no sockets: it takes inputs (``on_batch``,
``on_reads``, ``on_query``) and leaves outputs in ``peer_out`` (reads for other
partitions of the same replica), ``results_out`` and ``query_out``. The process loop
in cluster.partition_server moves those over ZeroMQ; executor.deterministic.replica
moves them in memory (tests, recovery replay, Spark replay). Same code either way.

Invariants:
- Batches are applied strictly in epoch order (epoch == last_epoch + 1).
- Transactions of a batch are admitted in sequence order and each requests all of
  its local locks before the next one requests any (so grants follow global order).
- A multi-partition transaction runs its body only at its *executors* (participants
  with local writes; the lowest participant if none writes), after every participant
  with local reads has sent them. A participant sends its reads as soon as the txn
  holds its local locks (at admission if they are free then), and runs whatever is
  ready at once: a txn waits for nothing but its locks and its reads. The owner's
  ``interleave`` hook (``on_batch``), called between admissions while reads are
  outstanding, moves reads both ways in the middle of a batch, so fewer transactions
  queue behind a multi-partition one (when is timing only: order and values are the
  same). Each executor applies only its local writes. No votes, no two-phase commit:
  every executor reaches the same outcome because it runs the same deterministic body
  on the same reads.
- What a participant sends is what it holds under the footprint's read entries: the
  row of each exact key, every row under each prefix, except under ``local`` entries
  (txn_library.procedure.Footprint), which are never sent: only their own partition
  reads them (the body asks ``ctx.holds``), so a stream step sends what its batch
  touches, however many batches its streams keep.
- Exactly one partition per replica reports a transaction's result: the lowest
  executor.
- A partition keeps the reads it sent until every peer has said it will never ask for
  them again (``on_reads_floor``: a peer's oldest kept checkpoint starts after them),
  so a peer restarted from any checkpoint it keeps can ask for them again
  (``resend``), however many checkpoint boundaries it skipped; at most
  ``limits.sent_reads_txns_max`` txns' reads are kept. Reads are idempotent on
  arrival: a duplicate, or a read for a txn that already finished here, is dropped.
  So are reads claiming to come from a partition that is not a peer. Reads that
  arrive before their txn wait in ``_early``: at most one entry per (txn, peer), for
  at most ``limits.early_reads_txns_max`` txns.
- Unsequenced queries waiting here are at most ``limits.queries_pending_max``, and
  are served in ``min_txn_id`` order (one that must wait never blocks a ready one).
  Refused inputs are counted in ``inputs_dropped`` (the server logs them, rate-limited).
- A body's whole write set is validated (executor.core.execution.run_txn) before any of
  it is applied; a rejected set is applied by no executor (every executor validates
  the same set, including the writes that belong to other partitions).
- ``newest_checkpoint_epoch`` only grows, and only when the owner reports the
  snapshot durable (``checkpoint_durable``); the boundary is recorded at the drain.
- Read-only queries run between transactions, once every local transaction sequenced
  at or before the query's ``min_txn_id`` has finished. The set of finished local
  transactions is always closed under conflict order, so the partition's state is
  the state after a serial prefix, and the query is serializable (and sees every
  write acknowledged before it was sent).
- A single-partition transaction none of whose lock names is queued runs at once, at
  admission, without entering the lock table (``LockManager.bypass``): it conflicts
  with no unfinished earlier transaction, so the result is the same serial order.
- A body that called ``ctx.hold_locks(ms)`` (benchmark hook) keeps its locks and its
  result for ms after it ran, when ``hold_clock`` is set (the live server); the loop
  goes on meanwhile and its owner calls ``release_holds``. Without a clock (replay,
  in-process engines) holds end at once. A hold changes only timing, never a value.
- A run of consecutive derived steps whose only participant is this partition (a
  push's chain, or several) is admitted as one unit: the union of its lock names under
  its first txn id, each step still its own transaction, their writes applied once
  (executor.deterministic.chain). Its steps' holds end at once.
- A transaction runs the version of its procedure in force at its epoch
  (``procedure.lookup_at``): a FLAG_DEPLOY batch's modules are installed (and handed
  to ``on_deploy`` first) before its transactions are admitted, effective from the next
  epoch (txn_library.deployed).
"""

from __future__ import annotations

import heapq
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_txn
from executor.core.storage import Storage
from executor.core.versions import Versions
from executor.deterministic.answers import Answers
from executor.deterministic.chain import ChainLocks, chain_end, run_chain
from executor.deterministic.sent_reads import SentReads
from executor.deterministic.snapshot import run_current
from executor.deterministic.txn_state import TxnState, chain_state
from scheduler.lock_manager import LockManager
from txn_library import limits, placement
from txn_library.deployed import Deploy, install, records_in_batch
from txn_library.errors import (
    ERROR,
    invariant,
)
from txn_library.procedure import lookup, lookup_at
from txn_library.streams import DERIVED_CLIENT, batch_txns
from txn_library.wire.partition import RESULT_LOOKUP, PartitionStatus
from txn_library.wire.sequencer import (
    FLAG_CHECKPOINT,
    FLAG_CHECKPOINT_REQUESTED,
    FLAG_DEPLOY,
    Batch,
)

# on_batch calls its interleave hook at most once per this many admissions: reads go out
# in messages of several txns, and the inbox is polled once per that many. (A hook per
# admission cost bank transfers, whose bodies are short, ~10%, every 8th ~5%; every 32nd
# none, and TPC-C keeps its gain; 2026-11-26, docs/BENCHMARKS.md.)
INTERLEAVE_EVERY = 32
# While its owner sets ``results_early`` (its host has cores to spare), a partition's
# interleave hook is also called when results wait, and sends them once this many do
# (their clients need not wait for the batch's end; at 1 replica x 2 partitions on 2
# cores +9% New Order/s, 2026-11-26, docs/BENCHMARKS.md).
EARLY_RESULTS_MIN = 16


class Partition:
    def __init__(
        self,
        replica: int,
        partition: int,
        partitions: int,
        storage: Storage | None = None,
    ) -> None:
        self.replica = replica
        self.partition = partition
        self.partitions = partitions
        self.storage = storage if storage is not None else Storage()
        self.locks = LockManager()
        self._chain_locks = ChainLocks()
        self.last_epoch = 0
        self.next_txn_id = 0  # one past the last txn id of the last applied batch
        self.txns_applied = 0
        self._active: dict[int, TxnState] = {}
        self._multi_active = 0  # how many of them are multi-partition
        self._ready: deque[TxnState] = deque()
        # Reads that arrived before their txn: txn id -> {from partition: (exact, prefixes)}.
        self._early: dict[int, dict[int, tuple[Sequence[Any], Sequence[Any]]]] = {}
        self._early_purged_at = -1  # next_txn_id at the last purge of stale early reads
        self.inputs_dropped = 0  # reads and queries refused (not a peer, over a bound)
        # Dataflow steps (derived txns) that failed with ERROR here (their reporter):
        # nobody waits for their result, so the owner logs these.
        self.derived_failures = 0
        self.derived_failure_last = ""
        # Called with a FLAG_DEPLOY batch's deploys before it is applied (the process
        # makes them durable: txn_library.deployed.CodeStore); None: kept in memory.
        self.on_deploy: Callable[[list[Deploy]], None] | None = None
        # The slowest peer's completed epoch (the query service sets it): versions are
        # kept back to it, so a snapshot across partitions can be read there.
        self.versions_floor: int | None = None
        # Waiting queries, a heap on min_txn_id: (min_txn_id, arrival, id, tag, proc, args).
        # Served in min_txn_id order, so one that waits long never holds up the rest.
        self._queries: list[tuple[int, int, int, int, Any, Any]] = []
        self._queries_seen = 0
        self.peer_out: dict[int, list] = {}
        self.interleave_every = INTERLEAVE_EVERY  # see on_batch (the simulator: fewer)
        self.results_early = False  # the owner's: call the hook for waiting results too
        self.early_results_min = EARLY_RESULTS_MIN  # see results_due (the simulator: fewer)
        self.results_out: list[tuple[int, int, Any, bytes]] = []
        self.query_out: list[tuple[int, int, int, Any]] = []
        # Checkpoints: set when a flagged batch arrives; the owner drains, snapshots,
        # then calls checkpoint_taken(). No later batch is applied meanwhile. Once the
        # snapshot is durable the owner calls checkpoint_durable().
        self.checkpoint_due: int | None = None
        # The due boundary was asked for by a client (FLAG_CHECKPOINT_REQUESTED): the
        # owner writes it even if its previous writer is still busy (it finishes that
        # one first), never skips it.
        self.checkpoint_requested = False
        # The boundary whose file the owner is writing now (-1: none); status only.
        self.checkpoint_writing = -1
        self.newest_checkpoint_epoch = 0
        self.boundary: tuple[int, int] = (0, 0)  # (epoch, state hash) at last flagged epoch
        self.answers = Answers()
        self.sent_reads = SentReads(partitions - 1)  # for restarted peers
        # Held transactions (ctx.hold_locks): heap of (due, txn id, txn, status, value,
        # the value packed).
        self.hold_clock: Callable[[], float] | None = None
        self._holds: list[tuple[float, int, TxnState, int, Any, bytes]] = []

    def restore(self, epoch: int, next_txn_id: int, txns_applied: int) -> None:
        """Resume from a checkpoint taken at the end of ``epoch`` (storage already loaded)."""
        invariant(self.last_epoch == 0 and not self._active, "restore into a used partition")
        self.last_epoch = epoch
        self.next_txn_id = next_txn_id
        self.txns_applied = txns_applied
        self.newest_checkpoint_epoch = epoch
        self.boundary = (epoch, self.storage.state_hash)
        self.sent_reads.restart_at(next_txn_id)

    # Inputs -------------------------------------------------------------------
    def on_batch(self, batch: Batch, interleave: Callable[[], None] | None = None) -> None:
        """Admit a batch's transactions in order and run what is ready.

        ``interleave``: the owner's hook, called every ``interleave_every`` admissions
        while reads are outstanding (queued in ``peer_out``, or awaited by an active
        multi-partition txn), or results wait while ``results_early``; it sends
        ``peer_out`` (and then the results) and feeds arrived reads to ``on_reads``.
        None: reads move when the owner next takes the outputs."""
        epoch, prev_epoch, first_txn_id, ts, seed = batch[:5]  # one unpacking
        txns = batch_txns(batch, self.partitions)  # its weak dataflows' steps appended
        invariant(self.checkpoint_due is None, "batch applied before a due checkpoint")
        invariant(
            epoch == self.last_epoch + 1 and prev_epoch == self.last_epoch,
            f"partition {self.partition}: batch {epoch} (prev {prev_epoch}) "
            f"after {self.last_epoch}",
        )
        invariant(first_txn_id >= self.next_txn_id, "txn ids went backwards")
        if batch.flags & FLAG_DEPLOY:  # its modules' procedures run from epoch + 1
            records = records_in_batch(epoch, txns)
            if self.on_deploy is not None:
                self.on_deploy(records)  # durable before the batch is applied
            for record in records:
                install(record)
        me = self.partition
        txn_id = first_txn_id
        due = every = self.interleave_every
        chain_locks = self._chain_locks
        i, n = 0, len(txns)
        while i < n:
            txn = txns[i]
            taken = 1
            if me in txn.participants:
                derived = txn.client_id == DERIVED_CLIENT
                end = chain_end(txns, i, me, chain_locks, every) if derived else i
                if end > i:  # a run of derived steps, one unit of work (chain.py)
                    taken = end - i
                    self._admit_chain(txn_id, txns[i:end], ts, seed, epoch)
                else:
                    self._admit(
                        txn_id, txn.proc, txn.args, txn.participants, ts, seed, derived, epoch
                    )
                due -= taken
                if due <= 0:
                    due = every
                    if interleave is not None and (
                        self.peer_out
                        or self._multi_active
                        or (self.results_early and self.results_out)
                    ):
                        interleave()
            txn_id += taken
            i += taken
        self.last_epoch = epoch
        self.next_txn_id = txn_id
        if batch.flags & FLAG_CHECKPOINT:
            self.checkpoint_due = epoch
            self.checkpoint_requested = bool(batch.flags & FLAG_CHECKPOINT_REQUESTED)
        self._run()
        if self.storage.versions is not None:
            self.bound_versions()

    def results_due(self) -> bool:
        """Whether the interleave hook should send the results waiting now:
        ``results_early`` is set and at least ``early_results_min`` wait."""
        return self.results_early and len(self.results_out) >= self.early_results_min

    def checkpoint_ready(self) -> bool:
        """A flagged epoch is fully applied here: state is exactly that boundary's."""
        return self.checkpoint_due is not None and self.idle()

    def checkpoint_taken(self) -> None:
        """Record the boundary (hash comparable across replicas) and resume batches.

        The snapshot may still be being written: it counts (``newest_checkpoint_epoch``)
        only once its owner reports it durable (``checkpoint_durable``).
        """
        invariant(self.checkpoint_ready(), "checkpoint taken before the drain finished")
        epoch = self.checkpoint_due
        assert epoch is not None
        self.boundary = (epoch, self.storage.state_hash)
        self.checkpoint_due = None
        self.checkpoint_requested = False

    def checkpoint_durable(self, epoch: int) -> None:
        """The snapshot of boundary ``epoch`` is on disk (renamed, directory fsynced)."""
        invariant(
            self.newest_checkpoint_epoch < epoch <= self.boundary[0],
            f"checkpoint {epoch} durable out of order (newest {self.newest_checkpoint_epoch}, "
            f"boundary {self.boundary[0]})",
        )
        self.newest_checkpoint_epoch = epoch

    def on_reads_floor(self, from_partition: int, txn_id: int) -> None:
        """Peer ``from_partition`` will never ask for reads of txns before ``txn_id``
        again (MSG_READS_FLOOR); once every peer has said so, reads sent before the
        lowest floor are forgotten. A floor never goes down."""
        if from_partition == self.partition or not 0 <= from_partition < self.partitions:
            self.inputs_dropped += 1
            return
        self.sent_reads.floor(from_partition, txn_id)

    def resend(self, to_partition: int, first_txn_id: int) -> bool:
        """Queue again every retained read for ``to_partition`` from ``first_txn_id`` on.

        False if reads that far back are no longer retained (the peer then cannot
        recover alone from that checkpoint).
        """
        entries = self.sent_reads.for_peer(to_partition, first_txn_id)
        if entries is None:
            return False
        self.peer_out.setdefault(to_partition, []).extend(entries)
        return True

    @property
    def sent_complete_from(self) -> int:
        return self.sent_reads.complete_from

    def on_reads(self, from_partition: int, entries: Sequence[Any]) -> None:
        """Reads a peer sent (shape checked by the caller: wire.partition.reads_problem)."""
        if from_partition == self.partition or not 0 <= from_partition < self.partitions:
            self.inputs_dropped += 1  # not a peer: nothing it says can be ours to use
            return
        early = self._early
        for txn_id, exact, prefixes in entries:
            st = self._active.get(txn_id)
            if st is None:
                if txn_id < self.next_txn_id:
                    continue  # finished here already: a peer replaying after a restart
                waiting = early.get(txn_id)
                if waiting is None:
                    if len(early) >= limits.early_reads_txns_max and not self._purge_early():
                        self.inputs_dropped += 1
                        continue
                    waiting = early[txn_id] = {}
                waiting[from_partition] = (exact, prefixes)  # a resend replaces its twin
                continue
            st.merge(from_partition, exact, prefixes)
            if st.locked and not st.need:
                self._execute(st)
        self._run()

    def _purge_early(self) -> bool:
        """Drop early reads whose txn has passed without being admitted here (no peer
        sends those: they are stray). True if that freed room. O(n), only when full."""
        if self._early_purged_at == self.next_txn_id:
            return False
        self._early_purged_at = self.next_txn_id
        stale = [txn_id for txn_id in self._early if txn_id < self.next_txn_id]
        for txn_id in stale:
            del self._early[txn_id]
        self.inputs_dropped += len(stale)
        return bool(stale)

    def on_query(
        self, query_id: int, replica_tag: int, proc_name: Any, args: Any, min_txn_id: int
    ) -> None:
        """An unsequenced read (shape checked by the caller: wire.partition.query_problem)."""
        if len(self._queries) >= limits.queries_pending_max:
            self.inputs_dropped += 1  # more than the sequencer can have pending: junk
            return
        self._queries_seen += 1
        entry = (min_txn_id, self._queries_seen, query_id, replica_tag, proc_name, args)
        heapq.heappush(self._queries, entry)
        self._serve_queries()

    # Admission ----------------------------------------------------------------
    def _admit(
        self,
        txn_id: int,
        proc_name: str,
        args: Any,
        participants: tuple,
        ts: int,
        seed: int,
        derived: bool = False,
        epoch: int = 0,
    ) -> None:
        proc = lookup_at(proc_name, epoch)  # the version in force at its epoch
        fp = proc.footprint(*args)
        st = TxnState()
        st.txn_id, st.proc, st.args, st.ts, st.seed = txn_id, proc, args, ts, seed
        st.reads = cover_set(fp.reads)
        st.writes = cover_set(fp.writes)
        st.locked = False
        st.exact = {}
        st.prefixes = {}
        st.bypass = None
        st.derived = derived
        st.epoch = epoch
        st.chain = None
        # Lock names, executors, reporter and read exchange: txn_library.placement, the
        # one rule every engine uses (computed in one pass over the footprint).
        if len(participants) == 1:
            st.single = True
            st.local_reads = ()
            st.send_to = ()
            st.need = set()
            st.executor = st.reporter = True
            shared, exclusive = placement.single_partition_locks(fp.reads, fp.writes)
            if self.locks.bypass(txn_id, shared, exclusive):
                # Uncontended: no earlier unfinished transaction shares a lock name
                # with it, so running it now is the serial order (scheduler.lock_manager).
                self._early.pop(txn_id, None)  # a single-partition txn takes no reads
                st.bypass = (shared, exclusive)
                st.locked = True
                self._execute(st)
                return
        else:
            st.single = False
            self._multi_active += 1
            share = placement.LocalShare(
                fp.reads, fp.writes, participants, self.partition, self.partitions, fp.local
            )
            shared, exclusive = share.shared, share.exclusive
            st.executor, st.reporter = share.executor, share.reporter
            st.local_reads, st.send_to, st.need = share.local_reads, share.send_to, share.need
            st.placed = share.placed
        self._active[txn_id] = st
        early = self._early.pop(txn_id, None)
        if early:
            for q, (exact, prefixes) in early.items():
                st.merge(q, exact, prefixes)
        if self.locks.request(txn_id, shared, exclusive):
            self._ready.append(st)
            self._run()  # now, not at the batch's end: its reads go out, it may run

    def _admit_chain(
        self, first_txn_id: int, txns: Sequence[Any], ts: int, seed: int, epoch: int
    ) -> None:
        """Admit a run of derived single-partition steps as one unit: the union of their
        lock names under the first txn id (executor.deterministic.chain)."""
        steps = [(first_txn_id + k, t.proc, t.args) for k, t in enumerate(txns)]
        procs = tuple(sorted({t.proc for t in txns}))
        shared, exclusive = self._chain_locks.run(procs)
        early = self._early
        if early:  # single-partition transactions take no reads
            for txn_id, _, _ in steps:
                early.pop(txn_id, None)
        if self.locks.bypass(first_txn_id, shared, exclusive):
            self._run_chain(steps, ts, seed, epoch)  # uncontended: now is the serial order
            return
        st = chain_state(steps, lookup(txns[0].proc), ts, seed, epoch)
        self._active[first_txn_id] = st
        if self.locks.request(first_txn_id, shared, exclusive):
            self._ready.append(st)
            self._run()

    def _run_chain(self, steps: list[tuple[int, str, Any]], ts: int, seed: int, epoch: int) -> None:
        for failure in run_chain(self.storage, steps, ts, seed, epoch):
            self.derived_failures += 1
            self.derived_failure_last = failure
        self.txns_applied += len(steps)

    # Execution ----------------------------------------------------------------
    def _run(self) -> None:
        ready = self._ready
        while ready:
            st = ready.popleft()
            st.locked = True
            if st.send_to:
                self._send_reads(st)
            if not st.executor:
                self._finish(st)
            elif not st.need:
                self._execute(st)
        if self._queries:
            self._serve_queries()

    def _send_reads(self, st: TxnState) -> None:
        entry = st.reads_entry(self.storage)
        for q in st.send_to:
            self.peer_out.setdefault(q, []).append(entry)
        self.sent_reads.add(st.txn_id, st.send_to, entry)

    def _execute(self, st: TxnState) -> None:
        if st.chain is not None:
            self._run_chain(st.chain, st.ts, st.seed, st.epoch)
            self._release(st)
            return
        storage = self.storage
        if st.single:
            get, scan = storage.get, storage.scan
            ctx = TxnContext(st.txn_id, st.ts, st.seed, st.reads, st.writes, get, scan)
        else:
            get, scan, holds = st.remote_view(storage, self.partition, self.partitions)
            ctx = TxnContext(st.txn_id, st.ts, st.seed, st.reads, st.writes, get, scan, None, holds)
        # The whole write set (remote writes too) is validated before any is applied:
        # every executor reaches the same outcome, or partitions would diverge.
        status, value, data, writes = run_txn(st.proc, st.args, ctx, storage)
        if writes:
            versions = storage.versions
            if versions is not None:
                versions.epoch = st.epoch  # the rows it overwrites were those before it
            if st.single:
                storage.apply(writes)
            else:
                me, partitions = self.partition, self.partitions
                storage.apply(w for w in writes if st.is_here(w[0], w[1], me, partitions))
        if ctx.hold_ms and self.hold_clock is not None:
            if st.bypass is not None:  # it keeps its locks after all: enter them now
                self.locks.request_free(st.txn_id, *st.bypass)
                self._active[st.txn_id] = st
                st.bypass = None
            due = self.hold_clock() + ctx.hold_ms / 1000.0
            heapq.heappush(self._holds, (due, st.txn_id, st, status, value, data))
            return
        self._complete(st, status, value, data)

    def _complete(self, st: TxnState, status: int, value: Any, data: bytes) -> None:
        if st.reporter and st.derived:  # nobody waits: failures are counted, not sent
            if status == ERROR:
                self.derived_failures += 1
                self.derived_failure_last = f"txn {st.txn_id} {st.proc.name}: {value!r}"[:300]
        elif st.reporter:
            self.results_out.append((st.txn_id, status, value, data))
            self.answers.add(st.txn_id, status, value)
        self._finish(st)

    def next_hold_due(self) -> float | None:
        """When the earliest held transaction may release its locks (hold_clock time)."""
        return self._holds[0][0] if self._holds else None

    def release_holds(self, now: float) -> None:
        """Finish every held transaction whose hold is over at ``now``."""
        holds = self._holds
        if not holds or holds[0][0] > now:
            return
        while holds and holds[0][0] <= now:
            _, _, st, status, value, data = heapq.heappop(holds)
            self._complete(st, status, value, data)
        self._run()

    def _finish(self, st: TxnState) -> None:
        self.txns_applied += 1
        self._release(st)

    def _release(self, st: TxnState) -> None:
        if st.bypass is not None:
            return  # ran on the fast path: never active, no locks to release
        del self._active[st.txn_id]
        if not st.single:
            self._multi_active -= 1
        for txn_id in self.locks.release(st.txn_id):
            self._ready.append(self._active[txn_id])

    # Snapshots ----------------------------------------------------------------
    def keep_versions(self) -> None:
        """Keep recent versions of rows from now on (snapshot queries at completed
        epochs back to this one: executor.core.versions)."""
        if self.storage.versions is None:
            self.storage.versions = Versions(self.last_epoch)

    def completed_epoch(self) -> int:
        """Every local transaction of epochs <= this one has finished (its writes are
        applied): the state at its end is a serial prefix, answerable from versions."""
        for st in self._active.values():  # the oldest first: admitted in txn id order
            return st.epoch - 1
        return self.last_epoch

    def bound_versions(self) -> None:
        """Forget versions older than the retention (``limits.versions_*``), counted
        from this partition's completed epoch or, when a peer lags, from that peer's
        (``versions_floor``: a snapshot across partitions is read at the smallest)."""
        versions = self.storage.versions
        if versions is not None:
            completed = self.completed_epoch()
            floor = self.versions_floor
            versions.bound(completed if floor is None else min(completed, floor))

    # Queries ------------------------------------------------------------------
    def _oldest_active(self) -> int | None:
        for txn_id in self._active:
            return txn_id
        return None

    def _serve_queries(self) -> None:
        oldest = self._oldest_active()
        queries = self._queries
        while queries:
            min_txn_id = queries[0][0]
            if min_txn_id >= self.next_txn_id or (oldest is not None and oldest <= min_txn_id):
                return  # not yet (nor any later one): an earlier txn here is pending
            _, _, query_id, tag, proc_name, args = heapq.heappop(queries)
            if proc_name == RESULT_LOOKUP:
                out = self.answers.lookup(args)
            else:
                out = self.run_query(proc_name, args)
            self.query_out.append((query_id, tag) + out)

    def run_query(self, proc_name: Any, args: Any) -> tuple[int, Any]:
        """Run a read-only procedure against this partition's current state."""
        return run_current(self.storage, self.partition, self.partitions, proc_name, args)

    # Introspection ------------------------------------------------------------
    def status(self, catching_up: bool = False) -> PartitionStatus:
        return PartitionStatus(
            self.last_epoch,
            self.txns_applied,
            self.storage.state_hash,
            len(self._active),
            self.next_txn_id,
            self.newest_checkpoint_epoch,
            self.boundary[0],
            self.boundary[1],
            catching_up,
            os.getpid(),
            self.locks.lock_waits,
            self.locks.txn_waits,
            self.locks.blocked,
            self.locks.bypassed,
            self.checkpoint_writing,
        )

    def idle(self) -> bool:
        return not self._active and not self._ready

    @property
    def multi_waiting(self) -> bool:
        """A multi-partition txn admitted here has not finished (it waits for its
        locks or for peers' reads)."""
        return self._multi_active > 0

    def take_peer_out(self) -> dict[int, list]:
        out, self.peer_out = self.peer_out, {}
        return out

    def take_outputs(self) -> tuple[dict[int, list], list, list]:
        out = (self.peer_out, self.results_out, self.query_out)
        self.peer_out, self.results_out, self.query_out = {}, [], []
        return out
