"""The sequencer's metrics: batches, calls by procedure, answers by outcome, latency
from publication to answer, queues, flow control, the leader's view of every
partition, leadership and ZooKeeper commits.

Events are counted where the server already handles them, once per batch
(``on_tick``) and once per flush of answers (``on_replies``), with C-level counting
over what the role already built (the batch's in-flight entries, the answers' status
and epoch lists): no call per transaction, no lock. Everything else is sampled from
the role's status (``sample``, at most every SAMPLE_EVERY_S on the loop's thread).

A new leader's Sequencer starts its counters at zero; ``_carried`` keeps what earlier
terms of this process counted, so the exported counters never go back.

Invariant: a latency is measured only for an answer whose epoch this process published
(``_published_at``, the newest CUT_TIMES_MAX epochs); answers of older epochs, errors
(epoch 0) and a former leader's calls are counted by outcome but not timed.
"""

from __future__ import annotations

import time
from collections import Counter
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

from cluster.metrics.buckets import LATENCY_BOUNDS_S, Buckets
from cluster.metrics.endpoint import RoleMetrics, Sample
from sequencer.status import PARTITION_SILENT_S
from txn_library import limits
from txn_library.errors import ABORTED, ERROR, OK, RESTART

CUT_TIMES_MAX = 4096  # epochs whose publication time is kept (~41 s of 10 ms epochs)
BATCH_TXNS_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
BATCH_BYTES_BOUNDS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
OUTCOMES = {OK: "ok", ABORTED: "aborted", ERROR: "error", RESTART: "restart"}

# SequencerStats counter -> metric (cumulative across this process's terms).
STATS = {
    "epochs": "ordo_batches_total",
    "txns_derived": "ordo_txns_derived_total",
    "calls_accepted": "ordo_calls_accepted_total",
    "calls_rejected": "ordo_calls_rejected_total",
    "calls_overloaded": "ordo_calls_overloaded_total",
    "duplicate_calls": "ordo_calls_duplicate_total",
    "restarts": "ordo_dependent_restarts_total",
    "queries": "ordo_queries_total",
    "determinism_violations": "ordo_determinism_violations_total",
    "bad_partition_messages": "ordo_bad_partition_messages_total",
}

_status_of = itemgetter(1)  # an answer: (req_id, status, value)
_procedure_of = attrgetter("call.proc.name")  # an in-flight entry


class SequencerMetrics(RoleMetrics):
    role = "sequencer"

    def __init__(self, server: Any) -> None:
        """``server``: the cluster.sequencer_server.SequencerServer it reports on."""
        super().__init__(f"sequencer-{server.member}", member=server.member)
        self.server = server
        self.latency = Buckets(LATENCY_BOUNDS_S)
        self.batch_txns = Buckets(BATCH_TXNS_BOUNDS)
        self.batch_bytes = Buckets(BATCH_BYTES_BOUNDS)
        self.histograms.update(
            ordo_txn_latency_seconds=self.latency,
            ordo_batch_txns=self.batch_txns,
            ordo_batch_bytes=self.batch_bytes,
        )
        commits = getattr(server.store, "commit_seconds", None)
        if commits is not None:
            self.histograms["ordo_zookeeper_commit_seconds"] = commits
        self.sequenced: Counter[str] = Counter()  # procedure name -> calls sequenced
        self.answered: Counter[int] = Counter()  # status -> answers sent
        self.flow_waits = 0
        self.flow_wait_s = 0.0
        self._held_since: float | None = None
        self._published_at: dict[int, float] = {}  # epoch -> when published
        self._ticked: Any = None  # the Sequencer of the last batch ...
        self._ticked_txns = 0  # ... and its txns_sequenced and txns_derived then
        self._ticked_derived = 0
        self._carried: Counter[str] = Counter()  # earlier Sequencers' counters
        self._counted: Any = None  # the Sequencer whose counters sample() read last
        self._counted_values: dict[str, int] = {}

    # Events (the loop's thread) ----------------------------------------------------
    def on_tick(self, seq: Any, data: bytes | None) -> None:
        """After ``Sequencer.tick``: ``data`` is the batch published, or None (nothing
        to send, or flow control held it)."""
        now = time.monotonic()
        if data is None:
            if (
                self._held_since is None
                and seq.has_pending()
                and seq.failed is None
                and seq.deposed is None
                and seq.unapplied_bytes() >= limits.unapplied_bytes_max
            ):
                self._held_since = now
                self.flow_waits += 1
            return
        if self._held_since is not None:
            self.flow_wait_s += now - self._held_since
            self._held_since = None
        if seq is not self._ticked:
            self._ticked, self._ticked_txns, self._ticked_derived = seq, 0, 0
        st = seq.stats
        n = st.txns_sequenced - self._ticked_txns
        derived = st.txns_derived - self._ticked_derived
        self._ticked_txns, self._ticked_derived = st.txns_sequenced, st.txns_derived
        if n:  # the batch's calls: txn ids from its first, then what pushes derived
            first = seq.next_txn_id - n - derived
            entries = map(seq.results.inflight.get, range(first, first + n))
            _count(self.sequenced, list(map(_procedure_of, filter(None, entries))))
        self.batch_txns.add(n)
        self.batch_bytes.add(len(data))
        published = self._published_at
        published[seq.epoch] = now
        if len(published) > CUT_TIMES_MAX:
            del published[next(iter(published))]

    def on_replies(self, out: dict[bytes, list], epochs: dict[bytes, list[int]]) -> None:
        """The answers of one flush (Outbox.take_client_replies): by outcome, and each
        one's time since its batch was published."""
        if not out:
            return
        _count(self.answered, list(map(_status_of, chain.from_iterable(out.values()))))
        now = time.monotonic()
        published = self._published_at
        for answered in epochs.values():
            epoch = answered[0]  # one epoch for all, mostly: counted at C speed then
            n = answered.count(epoch)
            runs = ((epoch, n),) if n == len(answered) else Counter(answered).items()
            for e, k in runs:
                t = published.get(e)
                if t is not None:
                    self.latency.add(now - t, k)

    # Sampling (the loop's thread) --------------------------------------------------
    def sample(self) -> Sample:
        s = self.server
        seq = s.seq
        local_last = s.local.last_epoch
        copied = s._copy  # the follower's last copy: what ZooKeeper held then
        v: Sample = {
            "ordo_sequencer_leader": int(seq is not None),
            "ordo_sequencer_term": s.term,
            "ordo_sequencer_log_last_epoch": local_last,
            "ordo_sequencer_follower_lag_epochs": 0
            if seq is not None
            else max(0, copied.store_last_epoch - local_last),
            "ordo_flow_control_waits_total": self.flow_waits,
            "ordo_flow_control_wait_seconds_total": self.flow_wait_s
            + (time.monotonic() - self._held_since if self._held_since is not None else 0.0),
            "ordo_heap_trims_total": s.heap.trims,
            "ordo_heap_trimmed_bytes_total": s.heap.released_bytes,
            "ordo_txns_sequenced_total": {(k,): n for k, n in self.sequenced.items()},
            "ordo_txns_answered_total": {
                (OUTCOMES.get(k, str(k)),): n for k, n in self.answered.items()
            },
        }
        v.update(self._counters(seq))
        if seq is not None:
            v.update(self._leader_values(seq))
        return v

    def _counters(self, seq: Any) -> dict[str, int]:
        """SequencerStats' counters, carried across this process's Sequencers."""
        if seq is not self._counted:  # a new leader's Sequencer, or none: carry the last
            self._carried.update(self._counted_values)
            self._counted, self._counted_values = seq, {}
        if seq is not None:
            st = seq.stats
            self._counted_values = {name: getattr(st, field) for field, name in STATS.items()}
        return {
            name: self._carried.get(name, 0) + self._counted_values.get(name, 0)
            for name in STATS.values()
        }

    def _leader_values(self, seq: Any) -> Sample:
        pending = seq.intake.pending
        heard_at = dict(seq.results.heard_at)
        now = seq.clock()
        up, lag = {}, {}
        for (r, p), st in list(seq.stats.partitions.items()):
            up[(r, p)] = int(now - heard_at.get((r, p), now) <= PARTITION_SILENT_S)
            lag[(r, p)] = max(0, seq.epoch - st.last_epoch)
        return {
            "ordo_sequencer_pending_calls": len(pending),
            "ordo_sequencer_pending_bytes": pending.total_bytes,
            "ordo_sequencer_intake_slices": len(seq.intake.slices),
            "ordo_sequencer_in_flight_txns": len(seq.results.inflight),
            "ordo_sequencer_retry_cache_entries": len(seq.retries),
            "ordo_sequencer_retry_cache_bytes": seq.retries.answered_bytes,
            "ordo_sequencer_unapplied_bytes": seq.unapplied_bytes(),
            "ordo_replica_partition_up": up,
            "ordo_replica_apply_lag_epochs": lag,
        }


def _count(counts: Counter[Any], values: list) -> None:
    """Add ``values`` to ``counts``: a run of one value (one procedure, all answers ok:
    the common case) is counted by ``list.count``, a comparison per item."""
    if values:
        first = values[0]
        n = values.count(first)
        if n == len(values):
            counts[first] += n
        else:
            counts.update(values)
