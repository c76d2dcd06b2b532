"""The checks a simulated run must pass, against the serial oracle and the ledgers.

After a run the final command log is replayed from genesis by the serial oracle
(``executor.deterministic.replica.SerialExecutor``), one transaction at a time, keeping the history
of the keys of the workload's ``history_tables``. Then:

- log: epochs consecutive from 1, txn ids consecutive, each batch vouching for its
  predecessor's bytes (prev_digest), batch timestamps never decreasing (whatever the
  leaders' clocks did);
- oracle equivalence: every replica's state hash (sum of its partitions') equals the
  oracle's, every replica applied the whole log and is idle, every partition's
  incremental hash equals a recomputation (small databases), partition hashes agree
  across replicas;
- every result any partition reported equals the oracle's result for that txn id;
- exactly once: no call is logged twice, under one (client_id, req_id) or under the
  several a client sent it with (a dependent call may be
  logged again only after an oracle RESTART), every logged call is one a client made,
  every acknowledged sequenced call is in the log and its answer equals the oracle's,
  every answer to the same sequenced call agrees, and no valid call was rejected (an
  unsequenced read is never logged: a copy of it that reaches a new leader late runs
  again, and each of its answers is checked on its own, below);
- read-only (unsequenced) point reads: the answer equals the key's value after some
  transaction t with lo <= t <= hi, where lo is the newest txn acknowledged to any
  client before the read was sent and hi the newest txn logged before it was answered
  (the partition serves it once every txn up to its min_txn_id is done);
- queries (snapshot queries to a replica's partitions, and every query to a reader):
  each answer equals the answer the same read-only procedure gives on the oracle's
  state at the end of the epoch the answer names (evaluated as the oracle replays the
  log, exactly, not merely plausibly); an answer to a query naming an epoch names that
  epoch; a refusal is only ``not_ready`` (or, for a reader query naming an epoch,
  ``bad_arguments``: older than the versions kept);
- readers: each reader's partition hashes at the end of every epoch it applied sum to
  the oracle's state hash there and equal every replica's boundary hash of that
  partition and epoch (the hash a partition records at a checkpoint drain); every
  reader applied the whole log by the end;
- deposed leaders (with the replicated layer's store faults): no call is answered by a
  leader of term t after the store committed a batch of a newer term (in the one
  order the simulator records commits and answers in);
- the workload's own invariant on the oracle and on every replica;
- the sequencers saw no determinism violation.

Every check returns human-readable failure lines; none raises.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_body
from executor.core.state_hash import MASK64
from executor.core.storage import Storage
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.partition import Partition
from executor.deterministic.sim_client import CallRecord, QueryRecord
from sequencer.calls import participants
from txn_library import limits
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_NOT_READY,
    ERR_PROCEDURE_FAILED,
    ERR_RESTARTS_EXHAUSTED,
    ERR_RETRY_EXPIRED,
    ERR_UNAVAILABLE,
    ERROR,
    RESTART,
)
from txn_library.procedure import lookup
from txn_library.streams import DERIVED_CLIENT, batch_txns
from txn_library.wire import sequencer as wire
from txn_library.workloads.contract import FinalState, LoggedTxn, Workload

# Errors that mean "outcome unknown": the call may or may not be in the log.
OUTCOME_UNKNOWN = frozenset((ERR_UNAVAILABLE, ERR_RETRY_EXPIRED, "result_unknown"))
# Errors that are a call's result (it ran); any other error means it was rejected.
EXECUTED_ERRORS = frozenset((ERR_PROCEDURE_FAILED, ERR_RESTARTS_EXHAUSTED))
RECOMPUTE_ROWS_MAX = 50_000
FAILURES_PER_KIND_MAX = 5  # then one line saying how many more


@dataclass
class RunRecord:
    """Everything the checks look at."""

    log: list[bytes]  # the final command log, epochs 1..last
    genesis: Storage  # a private copy of the whole genesis database
    replicas: list[list[Partition | None]]
    calls: list[CallRecord]
    reported: list[tuple[int, int, int, int, Any]]  # (replica, partition, txn, status, value)
    logged_at: list[tuple[int, int]]  # (time_us, last txn id) as batches were logged
    determinism_violations: int
    partitions: int
    queries: list[QueryRecord]
    reader_queries: list[QueryRecord] = field(default_factory=list)
    # (reader, epoch, every partition's state hash at its end), per applied epoch
    reader_hashes: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    reader_epochs: list[int | None] = field(default_factory=list)  # at the end; None: down
    # (replica, partition, epoch, state hash) at every checkpoint drain
    boundaries: list[tuple[int, int, int, int]] = field(default_factory=list)
    # The store's commits, (order, time_us, epoch, term), and the calls a sequencer
    # answered, (order, time_us, member, its term, client, req ids), in one order
    commits: list[tuple[int, int, int, int]] = field(default_factory=list)
    leader_answers: list[tuple[int, int, int, int, str, tuple[int, ...]]] = field(
        default_factory=list
    )


def normal(value: Any) -> Any:
    """A value as it looks after the wire (lists become tuples)."""
    return wire.unpack(wire.pack(value))


class Oracle:
    """The final log replayed serially, with per-key history for point reads."""

    def __init__(self, genesis: Storage, history_tables: frozenset[str]) -> None:
        self.serial = SerialExecutor(genesis)
        self.history_tables = history_tables
        self.history: dict[tuple[str, tuple], list[tuple[int, Any]]] = {}
        self.initial: dict[tuple[str, tuple], Any] = {}
        self.txns: list[LoggedTxn] = []

    def apply(self, batch: wire.Batch) -> None:
        storage = self.serial.storage
        # every transaction, a weak-recovery batch's dataflow steps too (one partition:
        # the oracle has none), each applied on its own, as logged
        for i, txn in enumerate(batch_txns(batch, 1)):
            txn_id = batch.first_txn_id + i
            keys = self._history_keys(txn) if self.history_tables else ()
            for key in keys:
                if key not in self.initial and key not in self.history:
                    self.initial[key] = _column0(storage.get(*key))
            one = batch._replace(first_txn_id=txn_id, txns=(txn,), flags=0, derived=0)
            self.serial.apply(one)
            if txn.client_id == DERIVED_CLIENT:
                continue  # a dataflow's step: no client, no result to check
            result = normal(self.serial.results[txn_id])
            for key in keys:
                self.history.setdefault(key, []).append((txn_id, _column0(storage.get(*key))))
            self.txns.append(
                LoggedTxn(txn_id, txn.proc, txn.args, txn.client_id, txn.req_id, result)
            )

    def _history_keys(self, txn: wire.Txn) -> list[tuple[str, tuple]]:
        try:
            fp = lookup(txn.proc).footprint(*txn.args)
        except Exception:  # noqa: BLE001 - the body reports the same failure as a result
            return []
        return [(t, k) for t, k in fp.writes if t in self.history_tables]

    def values_between(self, key: tuple[str, tuple], lo: int, hi: int) -> list[Any]:
        """Values ``key`` held after some txn t, lo <= t <= hi (and just before lo+1)."""
        hist = self.history.get(key, [])
        ids = [t for t, _ in hist]
        i = bisect.bisect_right(ids, lo)
        out = [hist[i - 1][1] if i else self.initial.get(key)]
        for t, v in hist[i:]:
            if t > hi:
                break
            out.append(v)
        return out


def _column0(row: tuple | None) -> Any:
    return None if row is None else row[0]


def check_log(log: list[bytes]) -> tuple[list[wire.Batch], list[str]]:
    batches, out = [], []
    next_txn = 0
    last_ms = 0
    for i, data in enumerate(log):
        batch = wire.decode_batch(data)
        epoch = i + 1
        if batch.epoch != epoch or batch.prev_epoch != epoch - 1:
            out.append(f"log: frame {epoch} holds epoch {batch.epoch}")
        if batch.first_txn_id != next_txn:
            out.append(f"log: epoch {epoch} starts at txn {batch.first_txn_id}, not {next_txn}")
        expected = wire.batch_digest(log[i - 1]) if i else 0
        if batch.prev_digest != expected:
            out.append(f"log: epoch {epoch} does not vouch for epoch {epoch - 1}'s bytes")
        if batch.timestamp_ms < last_ms:
            out.append(f"log: epoch {epoch}'s timestamp {batch.timestamp_ms} < {last_ms}")
        last_ms = max(last_ms, batch.timestamp_ms)
        next_txn = batch.next_txn_id
        batches.append(batch)
    return batches, out


def check_replicas(
    oracle: Oracle, replicas: list[list[Partition | None]], last_epoch: int
) -> list[str]:
    out = []
    want = oracle.serial.state_hash
    for r, parts in enumerate(replicas):
        total = 0
        for p, part in enumerate(parts):
            if part is None:
                out.append(f"replica {r} partition {p} is down at the end")
                continue
            if part.last_epoch != last_epoch or not part.idle():
                out.append(
                    f"replica {r} partition {p} stopped at epoch {part.last_epoch} of "
                    f"{last_epoch} with {part.status()[3]} active txns"
                )
            total += part.storage.state_hash
            s = part.storage
            if s.row_count() <= RECOMPUTE_ROWS_MAX and s.recompute_hash() != (
                s.state_hash,
                s.static_hash,
            ):
                out.append(f"replica {r} partition {p}: incremental hash != recomputed")
        if total & MASK64 != want:
            out.append(f"replica {r} state hash {total & MASK64:016x} != oracle {want:016x}")
    for p in range(len(replicas[0])):
        hashes = {part.storage.state_hash for parts in replicas if (part := parts[p]) is not None}
        if len(hashes) > 1:
            out.append(f"partition {p}: replicas disagree on its state hash")
    return out


def check_reported(oracle: Oracle, reported: Iterable[tuple[int, int, int, int, Any]]) -> list[str]:
    results = oracle.serial.results
    out = []
    for r, p, txn_id, status, value in reported:
        want = results.get(txn_id)
        if want is None:
            out.append(f"r{r}p{p} reported txn {txn_id}, which is not in the log")
        elif normal(want) != (status, value):
            out.append(
                f"r{r}p{p} reported txn {txn_id} = {(status, value)!r:.120}, "
                f"oracle {normal(want)!r:.120}"
            )
    return out


def _unsequenced(proc: str, args: tuple, partitions: int) -> bool:
    p = lookup(proc)
    return p.read_only and not p.dependent and len(participants(p, args, partitions)) == 1


def check_exactly_once(oracle: Oracle, calls: list[CallRecord], partitions: int) -> list[str]:
    out: list[str] = []
    by_key: dict[tuple[bytes, Any], list[LoggedTxn]] = {}
    for t in oracle.txns:
        if t.client_id:
            by_key.setdefault((t.client_id, t.req_id), []).append(t)
    made = {(c.client_id, r): c for c in calls for r in (c.req_id, *c.aliases)}
    for key, txns in by_key.items():
        call = made.get(key)
        if call is None:
            out.append(f"log holds txn {txns[0].txn_id} for a call no client made: {key!r}")
            continue
        proc = lookup(call.proc)
        for t in txns:
            args = t.args[:-1] if proc.dependent else t.args
            if t.proc != call.proc or args != call.args:
                out.append(
                    f"txn {t.txn_id} logs {t.proc}{args!r:.80} for {call.proc}{call.args!r:.80}"
                )
    for call in calls:
        txns = by_key.get((call.client_id, call.req_id), [])
        if call.aliases:  # resent under other ids: one call all the same
            txns = sorted(
                (
                    t
                    for r in (call.req_id, *call.aliases)
                    for t in by_key.get((call.client_id, r), [])
                ),
                key=lambda t: t.txn_id,
            )
        out.extend(_check_once(call, txns))
        out.extend(_check_answers(call, txns, partitions))
    return out


def _check_once(call: CallRecord, txns: list[LoggedTxn]) -> list[str]:
    out = []
    key = (call.client_id, call.req_id)
    if len(txns) > 1 and not lookup(call.proc).dependent:
        ids = [t.txn_id for t in txns]
        out.append(f"{call.proc} of client {key[0]!r} req {key[1]} logged {len(txns)} times: {ids}")
    if lookup(call.proc).dependent:
        if len(txns) > limits.dependent_restarts_max + 1:
            out.append(f"dependent call {key!r} logged {len(txns)} times")
        for t in txns[:-1]:
            if t.result[0] != RESTART:
                out.append(f"dependent call {key!r} logged again after txn {t.txn_id} ended")
    return out


def check_deposed_answers(
    commits: list[tuple[int, int, int, int]],
    answers: list[tuple[int, int, int, int, str, tuple[int, ...]]],
) -> list[str]:
    """No call answered by a leader of term t after a batch of a newer term committed."""
    first_of_term: dict[int, int] = {}  # term -> order of its first commit
    for order, _t, _epoch, term in commits:
        first_of_term.setdefault(term, order)
    findings = Findings()
    terms = sorted(first_of_term)
    for order, when_us, member, term, client, req_ids in answers:
        newer = [first_of_term[t] for t in terms if t > term]
        if newer and min(newer) < order:
            findings.add(
                "deposed answers",
                f"seq{member} (term {term}) answered {client} reqs {list(req_ids)[:5]} at "
                f"{when_us} us, after a newer term committed",
            )
    return findings.all()


def _check_answers(call: CallRecord, txns: list[LoggedTxn], partitions: int) -> list[str]:
    out = []
    known = [(s, v) for _t, s, v in call.answers if not _unknown(s, v)]
    what = f"{call.proc}{call.args!r:.60} (client {call.client_id!r} req {call.req_id})"
    unsequenced = _unsequenced(call.proc, call.args, partitions)
    if not unsequenced and any(a != known[0] for a in known[1:]):
        out.append(f"{what} got different answers: {known!r:.200}")
    if not known:
        return out
    status, value = known[0]
    if status == ERROR and isinstance(value, tuple) and value[0] not in EXECUTED_ERRORS:
        out.append(f"{what} was rejected: {value!r:.120}")
        return out
    if unsequenced:
        if txns:
            out.append(f"{what} is read-only on one partition but was logged")
        return out
    if not txns:
        out.append(f"{what} was answered {known[0]!r:.80} but is not in the log")
        return out
    want = txns[-1].result
    if want[0] == RESTART:
        if status == ERROR and value[0] == ERR_RESTARTS_EXHAUSTED:
            return out
        out.append(f"{what}: answered {known[0]!r:.80}, but its last run restarted")
    elif (status, value) != want:
        out.append(
            f"{what}: answered {known[0]!r:.100}, oracle (txn {txns[-1].txn_id}) {want!r:.100}"
        )
    return out


def _acked_at(call: CallRecord) -> int | None:
    for when, status, value in call.answers:
        if not _unknown(status, value):
            return when
    return None


def _unknown(status: int, value: Any) -> bool:
    return status == ERROR and isinstance(value, tuple) and value[0] in OUTCOME_UNKNOWN


def check_point_reads(
    oracle: Oracle,
    workload: Workload,
    calls: list[CallRecord],
    logged_at: list[tuple[int, int]],
    partitions: int,
) -> list[str]:
    txn_of: dict[tuple[bytes, Any], int] = {
        (t.client_id, t.req_id): t.txn_id for t in oracle.txns if t.client_id
    }
    acks = sorted(
        (acked, txn_of[(c.client_id, c.req_id)])
        for c in calls
        if (c.client_id, c.req_id) in txn_of and (acked := _acked_at(c)) is not None
    )
    ack_times = [t for t, _ in acks]
    ack_max: list[int] = []
    for _t, txn_id in acks:
        ack_max.append(max(txn_id, ack_max[-1] if ack_max else -1))
    logged_times = [t for t, _ in logged_at]
    out = []
    for call in calls:
        key = workload.point_read(call.proc, call.args)
        if key is None or not _unsequenced(call.proc, call.args, partitions):
            continue
        for when, status, value in call.answers:
            if status == ERROR:
                continue
            i = bisect.bisect_left(ack_times, call.sent_us)
            lo = ack_max[i - 1] if i else -1
            j = bisect.bisect_right(logged_times, when)
            hi = logged_at[j - 1][1] if j else -1
            allowed = oracle.values_between(key, lo, hi)
            if value not in [normal(v) for v in allowed]:
                out.append(
                    f"{call.proc}{call.args!r} answered {value!r:.60}; between txn {lo} and "
                    f"{hi} {key[0]}{key[1]!r} held only {allowed!r:.100}"
                )
    return out


def answer_on(storage: Storage, proc_name: str, args: tuple) -> tuple[int, Any]:
    """A read-only procedure's answer on ``storage`` as it is, as after the wire."""
    proc = lookup(proc_name)
    fp = proc.footprint(*args)
    ctx = TxnContext(-1, 0, 0, cover_set(fp.reads), frozenset(), storage.get, storage.scan)
    status, value, _ = run_body(proc, tuple(args), ctx)
    return status, normal(value)


class Findings:
    """Failure lines, at most FAILURES_PER_KIND_MAX of a kind (then a count)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._more: dict[str, int] = {}

    def add(self, kind: str, line: str) -> None:
        n = self._more.get(kind, 0)
        self._more[kind] = n + 1
        if n < FAILURES_PER_KIND_MAX:
            self.lines.append(line)

    def all(self) -> list[str]:
        extra = [
            f"... and {n - FAILURES_PER_KIND_MAX} more: {kind}"
            for kind, n in self._more.items()
            if n > FAILURES_PER_KIND_MAX
        ]
        return self.lines + extra


class AtEpochChecks:
    """What is checked on the oracle's state at the end of each epoch while it replays
    the log (``visit``): every query answer naming that epoch, every reader's hashes
    there. Then ``finish``: what named an epoch the log does not have, refusals, and
    where each reader stopped."""

    def __init__(self, run: RunRecord) -> None:
        self.run = run
        self.findings = Findings()
        self.answers: dict[int, list[tuple[str, QueryRecord, int, Any]]] = {}
        for q in run.queries:
            for _t, status, value, epoch in q.answers:
                if status != ERROR:
                    self.answers.setdefault(epoch, []).append(("", q, status, value))
        for q in run.reader_queries:
            for (_t, status, value, epoch), r in zip(q.answers, q.readers, strict=True):
                if status == ERROR:
                    continue
                self.answers.setdefault(epoch, []).append((f"reader {r}: ", q, status, value))
                if q.at_epoch >= 0 and epoch != q.at_epoch:
                    self.findings.add(
                        f"reader {r}: answers at another epoch",
                        f"reader {r}: query {q.proc}{q.args!r:.60} named epoch {q.at_epoch} "
                        f"and was answered at epoch {epoch}",
                    )
        self.hashes: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for r, epoch, hashes in run.reader_hashes:
            self.hashes.setdefault(epoch, []).append((r, hashes))
        self.boundaries: dict[tuple[int, int], list[tuple[int, int]]] = {}
        if run.reader_hashes:
            for replica, p, epoch, h in run.boundaries:
                self.boundaries.setdefault((epoch, p), []).append((replica, h))

    def visit(self, epoch: int, storage: Storage) -> None:
        """The oracle's ``storage`` is the state at the end of ``epoch`` now."""
        for who, q, status, value in self.answers.pop(epoch, ()):
            want = answer_on(storage, q.proc, q.args)
            if want != (status, normal(value)):
                self.findings.add(
                    f"{who}wrong answers",
                    f"{who}query {q.proc}{q.args!r:.60} ({_isolation(q)}) at epoch {epoch}: "
                    f"{(status, value)!r:.80}, oracle {want!r:.80}",
                )
        for r, hashes in self.hashes.pop(epoch, ()):
            self._reader_hashes(r, epoch, hashes, storage.state_hash)

    def _reader_hashes(self, r: int, epoch: int, hashes: tuple[int, ...], want: int) -> None:
        total = sum(hashes) & MASK64
        if total != want:
            self.findings.add(
                f"reader {r} hashes",
                f"reader {r} at epoch {epoch}: state hash {total:016x} != oracle {want:016x}",
            )
        for p, h in enumerate(hashes):
            for replica, theirs in self.boundaries.get((epoch, p), ()):
                if theirs != h:
                    self.findings.add(
                        f"reader {r} partition hashes",
                        f"reader {r} partition {p} at epoch {epoch}: hash {h:016x} != "
                        f"replica {replica}'s {theirs:016x}",
                    )

    def finish(self, last_epoch: int) -> list[str]:
        for epoch, answers in sorted(self.answers.items()):
            for who, q, _status, _value in answers:
                self.findings.add(
                    f"{who}answers at epochs not in the log",
                    f"{who}query {q.proc}{q.args!r:.60} answered at epoch {epoch}, which "
                    f"the log does not have",
                )
        for epoch, readers in sorted(self.hashes.items()):
            for r, _ in readers:
                self.findings.add(
                    f"reader {r} epochs", f"reader {r} applied epoch {epoch}, not in the log"
                )
        self._refusals()
        for r, applied in enumerate(self.run.reader_epochs):
            if applied is None:
                self.findings.add("readers", f"reader {r} is down at the end")
            elif applied != last_epoch:
                self.findings.add(
                    "readers", f"reader {r} stopped at epoch {applied} of {last_epoch}"
                )
        return self.findings.all()

    def _refusals(self) -> None:
        """Refusals: only not_ready, or for a reader query that names an epoch,
        bad_arguments (older than the versions it keeps)."""
        for q in self.run.queries:
            for _t, status, value, _epoch in q.answers:
                if status == ERROR and not _is(value, ERR_NOT_READY):
                    self.findings.add(
                        "refusals", f"query {q.proc}{q.args!r:.60} refused: {value!r:.120}"
                    )
        for q in self.run.reader_queries:
            for (_t, status, value, _epoch), r in zip(q.answers, q.readers, strict=True):
                if status != ERROR or _is(value, ERR_NOT_READY):
                    continue
                if q.at_epoch >= 0 and _is(value, ERR_BAD_ARGUMENTS):
                    continue
                self.findings.add(
                    f"reader {r}: refusals",
                    f"reader {r}: query {q.proc}{q.args!r:.60} ({_isolation(q)}) refused: "
                    f"{value!r:.120}",
                )


def _is(value: Any, code: str) -> bool:
    return isinstance(value, tuple) and value[:1] == (code,)


def _isolation(q: QueryRecord) -> str:
    return f"at_epoch {q.at_epoch}" if q.at_epoch >= 0 else q.isolation


def run_checks(run: RunRecord, workload: Workload) -> list[str]:
    batches, failures = check_log(run.log)
    oracle = Oracle(run.genesis, workload.history_tables)
    at_epoch = AtEpochChecks(run)
    at_epoch.visit(0, oracle.serial.storage)
    for batch in batches:
        oracle.apply(batch)
        at_epoch.visit(batch.epoch, oracle.serial.storage)
    failures += check_replicas(oracle, run.replicas, len(batches))
    failures += check_reported(oracle, run.reported)
    failures += check_exactly_once(oracle, run.calls, run.partitions)
    failures += check_deposed_answers(run.commits, run.leader_answers)
    failures += check_point_reads(oracle, workload, run.calls, run.logged_at, run.partitions)
    failures += at_epoch.finish(len(batches))
    final = FinalState(
        oracle.serial.storage,
        [[p.storage for p in parts if p is not None] for parts in run.replicas],
        oracle.txns,
        run.partitions,
    )
    failures += workload.check(final)
    if run.determinism_violations:
        failures.append(f"sequencer counted {run.determinism_violations} determinism violations")
    return failures
