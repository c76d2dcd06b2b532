"""The sequencer role: validate calls, fix their order in epochs, log, hand out batches.

No sockets here: ``on_client`` / ``on_results`` take decoded inputs, ``tick`` cuts a
batch, and replies/queries accumulate in outboxes that the process loop sends.

Invariants:
- A call is validated (procedure exists, arguments match its schema, footprint is
  well formed, size bounds) before it is accepted; a rejected call gets an ERROR
  reply and never reaches the log.
- Epochs are consecutive; each batch carries (epoch, prev_epoch) and consecutive txn
  ids. A batch is appended to the command log and synced *before* ``tick`` returns
  it, so nothing is published (hence executed or acknowledged) before it is durable.
- The batch fixes every source of nondeterminism: one timestamp and one seed per
  batch (a txn's own seed is derived from the batch seed and its txn id).
- The first replica's result for a txn goes to the client; every later replica's
  result is compared with it; a mismatch is a determinism violation: counted and
  logged loudly.
- Dependent calls (procedure with ``recon``) first run their reconnaissance read at
  one replica; the prediction becomes the call's last argument. A RESTART result
  re-sequences the call with the fresh prediction, at most ``dependent_restarts_max``
  times.
- Bounded: pending + in-flight calls never exceed ``pending_calls_max``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from cluster import limits
from executor.partition import reporter_of
from executor.wire import RESULT_LOOKUP
from sequencer.log import CommandLog
from sequencer.wire import (
    B_FIRST_TXN,
    B_TXNS,
    FLAG_CHECKPOINT,
    T_ARGS,
    T_CLIENT,
    T_PARTS,
    T_PROC,
    T_REQ,
    batch_digest,
    pack,
    unpack,
)
from txn_library import catalog
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_OVERLOADED,
    ERR_RESTARTS_EXHAUSTED,
    ERR_TOO_LARGE,
    ERR_UNAVAILABLE,
    ERROR,
    OK,
    RESTART,
    BadRequest,
)
from txn_library.procedure import Procedure, lookup

log = logging.getLogger("ordo.sequencer")

# A partition reports at least every 0.2 s; silent this long, it is shown as down.
PARTITION_SILENT_S = 1.5


def participants(proc: Procedure, args: tuple, partitions: int) -> tuple[int, ...]:
    """Partitions a call touches (sorted); replicated-only calls go to partition 0."""
    try:
        fp = proc.footprint_of(args)  # checked: every key is at least its placement prefix
        if partitions == 1:
            return (0,)
        parts = set()
        table = catalog.table
        for entries in (fp.reads, fp.writes):
            for t, key in entries:
                spec = table(t)
                if not spec.replicated:
                    parts.add(spec.placement(key[: spec.place_prefix], partitions))
    except BadRequest:
        raise
    except Exception as e:
        raise BadRequest(ERR_BAD_ARGUMENTS, f"footprint of {proc.name} failed: {e}") from None
    return tuple(sorted(parts)) if parts else (0,)


def make_batch(
    epoch: int,
    first_txn_id: int,
    timestamp_ms: int,
    seed: int,
    calls: list[tuple[str, tuple]],
    partitions: int,
) -> tuple:
    """A batch as the sequencer logs it (for tests and tools that build logs)."""
    txns = [
        (name, tuple(args), participants(lookup(name), tuple(args), partitions), b"", 0)
        for name, args in calls
    ]
    return (epoch, epoch - 1, first_txn_id, timestamp_ms, seed, txns)


@dataclass
class _Call:
    identity: bytes  # ROUTER identity to answer on
    client_id: bytes
    req_id: Any
    proc: Procedure
    args: tuple
    participants: tuple
    restarts: int = 0


@dataclass
class _InFlight:
    call: _Call
    answered: int = 0  # bitmask of replicas that answered (a replaying one may repeat)
    first: tuple | None = None


@dataclass
class SequencerStats:
    calls_accepted: int = 0
    calls_rejected: int = 0
    txns_sequenced: int = 0
    epochs: int = 0
    restarts: int = 0
    queries: int = 0
    determinism_violations: int = 0
    duplicate_calls: int = 0
    partitions: dict = field(default_factory=dict)


class Sequencer:
    def __init__(
        self,
        command_log: CommandLog,
        replicas: int,
        partitions: int,
        *,
        checkpoint_every_epochs: int = 0,
        checkpoint_every_s: float = 0.0,
    ) -> None:
        self.log = command_log
        self.replicas = replicas
        self.partitions = partitions
        self.checkpoint_every_epochs = checkpoint_every_epochs
        self.checkpoint_every_s = checkpoint_every_s
        self._checkpoint_requested = False
        self._last_checkpoint_ms: int | None = None
        # Fail-stop: once the log cannot be written or synced, nothing is accepted.
        self.failed: str | None = None
        # (partition, epoch) -> (replica, hash) at checkpoint boundaries, compared
        # across replicas.
        self._boundaries: OrderedDict[tuple[int, int], tuple[int, int]] = OrderedDict()
        self._logged_txns: dict[int, tuple[bytes, Any]] = {}  # txn id -> (client, req)
        self._heard_at: dict[tuple[int, int], float] = {}  # monotonic time of last status
        self.epoch = command_log.last_epoch
        self.next_txn_id = self._next_txn_id_from_log()
        # batch_digest of the last logged batch: the next batch records it (wire doc)
        self._prev_digest = batch_digest(self.log.read(self.epoch)) if self.epoch else 0
        self.stats = SequencerStats()
        self._pending: list[_Call] = []
        self._inflight: OrderedDict[int, _InFlight] = OrderedDict()
        self._queries: dict[int, tuple[_Call, bool]] = {}  # query id -> (call, is_recon)
        self._next_query_id = 0
        self._query_rr = 0
        # (client_id, req_id) -> txn id (in flight) or ("done", status, value)
        self._dedup: OrderedDict[tuple[bytes, Any], Any] = OrderedDict()
        self.client_out: dict[bytes, list] = {}
        self.query_out: dict[tuple[int, int], list] = {}
        self._rebuild_dedup()

    # Startup ------------------------------------------------------------------
    def _next_txn_id_from_log(self) -> int:
        if self.log.last_epoch == 0:
            return 0
        batch = unpack(self.log.read(self.log.last_epoch))
        return batch[B_FIRST_TXN] + len(batch[B_TXNS])

    def _rebuild_dedup(self) -> None:
        """Remember which (client, request) pairs the log already holds.

        After a restart, a retried call that was logged before the crash must not run
        again: it is answered with the original result (from the replicas' result
        cache, or from the result still on its way here).
        """
        last = self.log.last_epoch
        if not last:
            return
        first = max(self.log.first_epoch, last - 2000)
        for _epoch, data in self.log.read_range(first, last):
            batch = unpack(data)
            txn_id = batch[B_FIRST_TXN]
            for txn in batch[B_TXNS]:
                if txn[T_CLIENT]:
                    key = (txn[T_CLIENT], txn[T_REQ])
                    self._remember(key[0], key[1], ("logged", txn_id, txn))
                    self._logged_txns[txn_id] = key
                txn_id += 1
        while len(self._logged_txns) > limits.pending_calls_max:
            self._logged_txns.pop(next(iter(self._logged_txns)))

    def _remember(self, client_id: bytes, req_id: Any, what: Any) -> None:
        key = (client_id, req_id)
        self._dedup[key] = what
        self._dedup.move_to_end(key)
        while len(self._dedup) > limits.pending_calls_max:
            self._dedup.popitem(last=False)

    # Client intake ------------------------------------------------------------
    def reply(self, identity: bytes, req_id: Any, status: int, value: Any) -> None:
        self.client_out.setdefault(identity, []).append((req_id, status, value))

    def _error(self, identity: bytes, req_id: Any, code: str, message: str) -> None:
        self.stats.calls_rejected += 1
        self.reply(identity, req_id, ERROR, (code, message))

    def on_calls(self, identity: bytes, client_id: Any, calls: Any) -> None:
        """Validate and accept a client's calls (already decoded from one frame)."""
        if not isinstance(client_id, bytes) or len(client_id) > 64:
            self._error(identity, None, ERR_MALFORMED, "client_id must be bytes (<= 64)")
            return
        if not isinstance(calls, tuple) or len(calls) > limits.calls_per_frame_max:
            self._error(identity, None, ERR_MALFORMED, "calls must be an array of calls")
            return
        for call in calls:
            if not isinstance(call, tuple) or len(call) not in (3, 4):
                self._error(
                    identity, None, ERR_MALFORMED, "a call is [req_id, procedure, args(, replica)]"
                )
                continue
            req_id, name, args = call[:3]
            replica = call[3] if len(call) == 4 else None
            if replica is not None and (
                not isinstance(replica, int) or not 0 <= replica < self.replicas
            ):
                self._error(identity, req_id, ERR_BAD_ARGUMENTS, f"no replica {replica!r}")
                continue
            if not isinstance(req_id, int) or isinstance(req_id, bool):
                self._error(identity, None, ERR_MALFORMED, "req_id must be an integer")
                continue
            try:
                self._accept(identity, client_id, req_id, name, args, replica)
            except BadRequest as e:
                self._error(identity, req_id, e.code, e.message)

    def _accept(
        self,
        identity: bytes,
        client_id: bytes,
        req_id: int,
        name: Any,
        args: Any,
        replica: int | None = None,
    ) -> None:
        seen = self._dedup.get((client_id, req_id)) if client_id else None
        if seen is not None:
            self.stats.duplicate_calls += 1
            if seen[0] == "done":
                self.reply(identity, req_id, seen[1], seen[2])
                return
            if seen[0] == "inflight":
                seen[1].identity = identity  # answer the retry's connection
                return
            # Logged before a restart: fetch the original result, never re-execute.
            self._lookup_logged(identity, client_id, req_id, seen[1], seen[2])
            return
        if self.failed is not None:
            raise BadRequest(ERR_UNAVAILABLE, f"sequencer stopped: {self.failed}")
        proc = lookup(name)
        proc.validate(args)
        if (
            len(self._pending) + len(self._inflight) + len(self._queries)
            >= limits.pending_calls_max
        ):
            raise BadRequest(ERR_OVERLOADED, "too many calls in flight; retry later")
        call = _Call(identity, client_id, req_id, proc, tuple(args), ())
        if proc.dependent:
            self._send_query(call, lookup(proc.recon), call.args, recon=True)
        elif proc.read_only:
            parts = self._participants(proc, call.args)
            if len(parts) == 1:
                self._send_query(
                    call, proc, call.args, recon=False, partition=parts[0], replica=replica
                )
            else:
                call.participants = parts
                self._pending.append(call)
        else:
            call.participants = self._participants(proc, call.args)
            self._pending.append(call)
        if client_id:
            self._remember(client_id, req_id, ("inflight", call))
        self.stats.calls_accepted += 1

    def _participants(self, proc: Procedure, args: tuple) -> tuple:
        return participants(proc, args, self.partitions)

    def _send_query(
        self,
        call: _Call,
        proc: Procedure,
        args: tuple,
        *,
        recon: bool,
        partition: int | None = None,
        replica: int | None = None,
    ) -> None:
        if partition is None:
            parts = self._participants(proc, args)
            if len(parts) != 1:
                raise BadRequest(ERR_BAD_ARGUMENTS, f"{proc.name} must touch one partition")
            partition = parts[0]
        qid = self._next_query_id
        self._next_query_id += 1
        if replica is None:
            replica = self._query_rr % self.replicas
            self._query_rr += 1
        self._queries[qid] = (call, recon)
        self.stats.queries += 1
        self.query_out.setdefault((replica, partition), []).append(
            (qid, replica, proc.name, args, self.next_txn_id - 1)
        )

    def _lookup_logged(
        self, identity: bytes, client_id: bytes, req_id: Any, txn_id: int, txn: tuple
    ) -> None:
        proc = lookup(txn[T_PROC])
        args = txn[T_ARGS]
        fp = proc.footprint(*args)
        reporter = reporter_of(fp.reads, fp.writes, txn[T_PARTS], self.partitions)
        call = _Call(identity, client_id, req_id, proc, args, txn[T_PARTS])
        self._remember(client_id, req_id, ("inflight", call))
        qid = self._next_query_id
        self._next_query_id += 1
        replica = self._query_rr % self.replicas
        self._query_rr += 1
        self._queries[qid] = (call, False)
        self.query_out.setdefault((replica, reporter), []).append(
            (qid, replica, RESULT_LOOKUP, (txn_id,), txn_id)
        )

    # Epochs -------------------------------------------------------------------
    def has_pending(self) -> bool:
        return bool(self._pending)

    def request_checkpoint(self) -> int:
        """Flag the next batch (sent even if empty); returns the epoch it will carry."""
        self._checkpoint_requested = True
        return self.epoch + 1

    def _checkpoint_flag(self, epoch: int, now_ms: int) -> int:
        due = self._checkpoint_requested
        if self.checkpoint_every_epochs and epoch % self.checkpoint_every_epochs == 0:
            due = True
        if self.checkpoint_every_s:
            if self._last_checkpoint_ms is None:
                self._last_checkpoint_ms = now_ms
            elif now_ms - self._last_checkpoint_ms >= self.checkpoint_every_s * 1000:
                due = True
        if due:
            self._checkpoint_requested = False
            self._last_checkpoint_ms = now_ms
            return FLAG_CHECKPOINT
        return 0

    def tick(self, now_ms: int) -> bytes | None:
        """Cut one batch from the pending calls, make it durable, return its bytes.

        Returns None when there is nothing to send or the log has failed (fail-stop:
        the calls of a batch that could not be made durable are answered
        ``unavailable``, outcome unknown, and nothing more is accepted).
        """
        if self.failed is not None or not (self._pending or self._checkpoint_requested):
            return None
        calls = self._pending[: limits.batch_txns_max]
        del self._pending[: len(calls)]
        first = self.next_txn_id
        seed = int.from_bytes(os.urandom(8), "little")  # logged: replay sees the same
        txns = []
        for i, c in enumerate(calls):
            txns.append((c.proc.name, c.args, c.participants, c.client_id, c.req_id))
            self._inflight[first + i] = _InFlight(c)
        flags = self._checkpoint_flag(self.epoch + 1, now_ms)
        batch = (self.epoch + 1, self.epoch, first, now_ms, seed, txns, flags, self._prev_digest)
        data = pack(batch)
        try:
            self.log.append(self.epoch + 1, data)
            self.log.sync()
        except Exception as e:
            self._fail(f"command log write/sync failed at epoch {self.epoch + 1}: {e}", first)
            return None
        self.epoch += 1
        self._prev_digest = batch_digest(data)
        self.next_txn_id = first + len(calls)
        self.stats.epochs += 1
        self.stats.txns_sequenced += len(calls)
        while len(self._inflight) > limits.result_backlog_txns_max:
            self._inflight.popitem(last=False)
        return data

    def _fail(self, reason: str, first_txn_id: int) -> None:
        """Stop for good: never acknowledge what might not be durable."""
        self.failed = reason
        log.critical("FAIL-STOP: %s; refusing all calls until restarted", reason)
        doomed = [f.call for t, f in self._inflight.items() if t >= first_txn_id]
        doomed += self._pending
        self._pending = []
        for t in [t for t in self._inflight if t >= first_txn_id]:
            del self._inflight[t]
        for call in doomed:
            self.reply(
                call.identity, call.req_id, ERROR, (ERR_UNAVAILABLE, f"outcome unknown: {reason}")
            )

    # Results ------------------------------------------------------------------
    def on_results(
        self, replica: int, partition: int, results: tuple, query_results: tuple, status: tuple
    ) -> None:
        self.stats.partitions[(replica, partition)] = status
        self._heard_at[(replica, partition)] = time.monotonic()
        if len(status) > 7 and status[6]:
            self._check_boundary(replica, partition, status[6], status[7])
        for txn_id, st, value in results:
            self._on_txn_result(replica, txn_id, st, value)
        for qid, _tag, st, value in query_results:
            self._on_query_result(qid, st, value)

    def _check_boundary(self, replica: int, partition: int, epoch: int, h: int) -> None:
        key = (partition, epoch)
        seen = self._boundaries.get(key)
        if seen is None:
            self._boundaries[key] = (replica, h)
            while len(self._boundaries) > 64 * self.partitions:
                self._boundaries.popitem(last=False)
        elif seen[1] != h and seen[0] != replica:
            self.stats.determinism_violations += 1
            log.error(
                "DETERMINISM VIOLATION: partition %d at epoch %d: replica %d hash %016x, "
                "replica %d hash %016x",
                partition,
                epoch,
                seen[0],
                seen[1],
                replica,
                h,
            )
            self._boundaries[key] = (replica, h)  # report each disagreement once

    def _on_txn_result(self, replica: int, txn_id: int, status: int, value: Any) -> None:
        f = self._inflight.get(txn_id)
        if f is None:
            key = self._logged_txns.pop(txn_id, None)
            if key is not None and status != RESTART:  # logged before our restart
                seen = self._dedup.get(key)
                if seen is not None and seen[0] == "inflight":
                    self._deliver(seen[1], status, value)
                else:
                    self._remember(key[0], key[1], ("done", status, value))
            return  # all replicas answered long ago, or evicted from the backlog
        bit = 1 << replica
        if f.answered & bit:
            return  # this replica answered already (it replayed after a restart)
        f.answered |= bit
        if f.first is None:
            f.first = (status, value, replica)
            self._deliver(f.call, status, value)
        elif (status, value) != f.first[:2]:
            self.stats.determinism_violations += 1
            log.error(
                "DETERMINISM VIOLATION: txn %d (%s) replica %d answered %r, replica %d %r",
                txn_id,
                f.call.proc.name,
                f.first[2],
                f.first[:2],
                replica,
                (status, value),
            )
        if f.answered == (1 << self.replicas) - 1:
            del self._inflight[txn_id]

    def _deliver(self, call: _Call, status: int, value: Any) -> None:
        if status == RESTART:
            self.stats.restarts += 1
            call.restarts += 1
            if call.restarts > limits.dependent_restarts_max:
                status, value = (
                    ERROR,
                    (
                        ERR_RESTARTS_EXHAUSTED,
                        f"{call.proc.name} restarted {call.restarts - 1} times",
                    ),
                )
            else:
                call.args = call.args[:-1] + (value,)
                try:
                    if call.proc.dependent:
                        call.proc.validate(call.args[:-1])
                    call.participants = self._participants(call.proc, call.args)
                except Exception as e:  # a bad prediction is the procedure's bug, not ours
                    status, value = ERROR, (ERR_BAD_ARGUMENTS, f"restart prediction invalid: {e}")
                else:
                    self._pending.append(call)
                    return
        self.reply(call.identity, call.req_id, status, value)
        if call.client_id:
            self._remember(call.client_id, call.req_id, ("done", status, value))

    def _on_query_result(self, qid: int, status: int, value: Any) -> None:
        entry = self._queries.pop(qid, None)
        if entry is None:
            return
        call, recon = entry
        if not recon or status != OK:
            self._deliver(call, status, value)
            return
        call.args = call.args + (value,)
        try:
            call.proc.validate(call.args[:-1])
            call.participants = self._participants(call.proc, call.args)
        except BadRequest as e:
            self._deliver(call, ERROR, (e.code, e.message))
            return
        self._pending.append(call)

    def prune_log(self, archive_dir: str | None) -> list[str]:
        """Drop log segments older than every partition's newest checkpoint."""
        from pathlib import Path

        want = self.replicas * self.partitions
        parts = self.stats.partitions
        if len(parts) < want:
            raise BadRequest(ERR_UNAVAILABLE, f"only {len(parts)} of {want} partitions reported")
        bound = min(st[5] if len(st) > 5 else 0 for st in parts.values())
        if bound <= 0:
            raise BadRequest(ERR_UNAVAILABLE, "some partition has no checkpoint yet")
        archive = Path(archive_dir) if archive_dir else None
        return [str(p) for p in self.log.delete_segments_before(bound + 1, archive)]

    # Frames -------------------------------------------------------------------
    def check_frame_size(self, identity: bytes, frame: bytes) -> bool:
        if len(frame) > limits.request_bytes_max:
            self._error(
                identity,
                None,
                ERR_TOO_LARGE,
                f"frame of {len(frame)} bytes exceeds {limits.request_bytes_max}",
            )
            return False
        return True

    def take_client_out(self) -> dict[bytes, list]:
        out, self.client_out = self.client_out, {}
        return out

    def take_query_out(self) -> dict[tuple[int, int], list]:
        out, self.query_out = self.query_out, {}
        return out

    def status_report(self, now: float | None = None) -> dict:
        """Counters and every partition's last status; ``down`` if it went quiet."""
        now = time.monotonic() if now is None else now
        s = self.stats
        parts = []
        for (r, p), st in sorted(s.partitions.items()):
            last_epoch, applied, h, active = st[:4]
            ckpt = st[5] if len(st) > 5 else 0
            catching_up = bool(st[8]) if len(st) > 8 else False
            parts.append(
                {
                    "down": now - self._heard_at.get((r, p), now) > PARTITION_SILENT_S,
                    "pid": st[9] if len(st) > 9 else None,
                    "newest_checkpoint_epoch": ckpt,
                    "catching_up": catching_up,
                    "replica": r,
                    "partition": p,
                    "last_epoch": last_epoch,
                    "txns_applied": applied,
                    "state_hash": f"{h:016x}",
                    "active": active,
                    # contention: lock requests that waited, txns that waited, blocked now
                    "lock_waits": st[10] if len(st) > 12 else 0,
                    "txn_waits": st[11] if len(st) > 12 else 0,
                    "blocked": st[12] if len(st) > 12 else 0,
                }
            )
        return {
            "epoch": self.epoch,
            "next_txn_id": self.next_txn_id,
            "calls_accepted": s.calls_accepted,
            "calls_rejected": s.calls_rejected,
            "txns_sequenced": s.txns_sequenced,
            "restarts": s.restarts,
            "queries": s.queries,
            "duplicate_calls": s.duplicate_calls,
            "determinism_violations": s.determinism_violations,
            "failed": self.failed,
            "log_first_epoch": self.log.first_epoch,
            "pending": len(self._pending),
            "in_flight": len(self._inflight),
            "partitions": parts,
        }
