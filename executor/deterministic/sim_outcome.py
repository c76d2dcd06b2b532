"""The end of a simulated run: what the checks read, the counters, and the outcome noted
in the trace.

When the run stops, the committed history is read back (the command log; with a
replicated ordering layer the store's committed batches, of which every member's own
log must be a prefix, with terms that never decrease), calls no client ever got an
answer to are listed as stalls, and the run's counters are summed from every node.
Then the counters and the outcome (every partition's final state and every answer a
client got; with readers, every hash they kept and answer they gave) go into the
trace, so that its digest fingerprints the run.

Invariant: reading the outcome changes nothing the checks read; it only adds trace
lines, after the run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

from executor.deterministic.checks import RunRecord
from executor.deterministic.sim_client import CallRecord, SimClient
from executor.deterministic.sim_network import EventLoop, NetStats, Trace
from executor.deterministic.sim_partition import PartitionNode
from executor.deterministic.sim_sequencer import SequencerNode
from executor.deterministic.sim_world import ReaderPeer
from sequencer.log import iter_frames
from sequencer.replication import MemoryStore
from sequencer.status import SequencerStats
from txn_library.errors import ERROR
from txn_library.wire import sequencer as wire


def find_stalls(clients: Sequence[SimClient]) -> list[str]:
    """Liveness: every call that timed out without an answer."""
    out = []
    for c in clients:
        for r in c.records:
            if r.timed_out and not r.answers:
                out.append(
                    f"client {c.index} req {r.req_id} {r.proc}{r.args!r:.60} never answered "
                    f"(sent {r.sends} times from {r.sent_us // 1000} ms)"
                )
    return out


def sequencer_stats(seq_nodes: Sequence[SequencerNode]) -> list[SequencerStats]:
    """The stats of every sequencer role the run built: retired ones, then the live."""
    out: list[SequencerStats] = []
    for node in seq_nodes:
        out += list(node.retired) + ([node.seq.stats] if node.seq is not None else [])
    return out


def committed_log(
    log_dir: Path,
    store: MemoryStore | None,
    seq_nodes: Sequence[SequencerNode],
    failure: Callable[[str], None],
) -> list[bytes]:
    """The committed history, batch by batch (replicated: checking the members' logs)."""
    if store is None:
        return [data for _e, data in iter_frames(log_dir)]
    # the committed history; every member's log must be a prefix of it
    log = [store.batches[e] for e in range(1, store.last + 1)]
    check_member_logs(log, seq_nodes, failure)
    return log


def check_member_logs(
    committed: list[bytes], seq_nodes: Sequence[SequencerNode], failure: Callable[[str], None]
) -> None:
    terms = [wire.decode_batch(data).term for data in committed]
    if terms != sorted(terms):
        failure("terms decrease along the committed log")
    for node in seq_nodes:
        if node.log is not None:
            node.log.sync()
        mine = [data for _e, data in iter_frames(node.log_dir)]
        if mine != committed[: len(mine)]:
            failure(f"seq{node.member}'s log is not a prefix of the committed log")


def run_counters(
    sim_counters: dict[str, int],
    record: RunRecord,
    clients: Sequence[SimClient],
    seq_nodes: Sequence[SequencerNode],
    leader: SequencerNode,
    parts: Sequence[Sequence[PartitionNode]],
    readers: Sequence[ReaderPeer],
    net: NetStats,
    loop: EventLoop,
) -> dict[str, int]:
    """The simulator's own counters (faults, recoveries), then what every node and the
    network counted (the readers' only when there are readers)."""
    records = [r for c in clients for r in c.records]
    logged = [wire.decode_batch(data).txns for data in record.log]
    counters = dict(sim_counters)
    counters.update(
        epochs=len(record.log),
        txns=sum(len(txns) for txns in logged),
        multi_partition_txns=sum(len(t.participants) > 1 for txns in logged for t in txns),
        dependent_restarts=sum(st.restarts for st in sequencer_stats(seq_nodes)),
        calls=len(records),
        answered=sum(1 for r in records if r.answers),
        snapshot_queries=sum(len(c.queries) for c in clients),
        snapshot_answers=sum(1 for c in clients for q in c.queries for a in q.answers if a[1] == 0),
        snapshot_not_ready=sum(
            1 for c in clients for q in c.queries for a in q.answers if a[1] != 0
        ),
        timeouts=sum(1 for r in records if r.timed_out),
        client_retries=sum(c.retries for c in clients),
        messages=net.sent,
        pub_drops=net.dropped_pub,
        lost_in_crash=net.lost_crash,
        torn_tails=leader.torn_tails,
        truncated_bytes=leader.truncated_bytes,
        checkpoints=sum(p.store.durable for replica in parts for p in replica),
        checkpoint_deltas=sum(p.store.deltas for replica in parts for p in replica),
        base_rows_copied=sum(p.store.copied_rows for replica in parts for p in replica),
        log_fetches=sum(p.log_fetches for replica in parts for p in replica),
        early_results=sum(p.early_results for replica in parts for p in replica),
        events=loop.events,
        sim_ms=loop.now_us // 1000,
    )
    if readers:
        counters.update(reader_counters(record, readers))
    return counters


def reader_counters(record: RunRecord, readers: Sequence[ReaderPeer]) -> dict[str, int]:
    """What the readers did and what of it the checks compared with the oracle."""
    answers = [a for q in record.reader_queries for a in q.answers]
    nodes = [r.counters() for r in readers]
    return {
        "readers": len(readers),
        "reader_queries": len(record.reader_queries),
        "reader_answers": sum(1 for a in answers if a[1] != ERROR),
        "reader_refusals": sum(1 for a in answers if a[1] == ERROR),
        "reader_queries_timed_out": sum(q.timed_out for q in record.reader_queries),
        "reader_at_epoch_queries": sum(q.at_epoch >= 0 for q in record.reader_queries),
        "reader_hashes_checked": len(record.reader_hashes),
        "reader_partition_hashes_checked": _boundaries_checked(record),
        "reader_batches_applied": sum(n["batches_applied"] for n in nodes),
        "reader_starts": sum(n["starts"] for n in nodes),
        "reader_log_fetches": sum(n["log_fetches"] for n in nodes),
    }


def _boundaries_checked(record: RunRecord) -> int:
    """Reader partition hashes that met a replica's boundary hash of the same epoch."""
    at = {(epoch, p) for _r, p, epoch, _h in record.boundaries}
    return sum(
        1
        for _reader, epoch, hashes in record.reader_hashes
        for p in range(len(hashes))
        if (epoch, p) in at
    )


def note_outcome(
    trace: Trace,
    now_us: int,
    record: RunRecord,
    records: Sequence[CallRecord],
    failures: list[str],
    counters: dict[str, int],
) -> str:
    """The failures, the counters and the outcome, as the trace's last lines; returns
    the digest of every answer the clients' calls got."""
    for f in failures:
        trace.note(now_us, f"check failed: {f}")
    trace.note(now_us, f"counters {sorted(counters.items())}")
    # The outcome, so that the trace digest fingerprints it: every partition's final
    # state and every answer a client got (compiled and pure engines must agree).
    states = [
        (r, i, p.last_epoch, p.storage.state_hash)
        for r, replica in enumerate(record.replicas)
        for i, p in enumerate(replica)
        if p is not None
    ]
    answers = [(r.answers, r.timed_out) for r in records]
    answers_digest = hashlib.sha256(repr(answers).encode()).hexdigest()[:16]
    trace.note(now_us, f"final states {states} answers {answers_digest}")
    if record.reader_hashes or record.reader_queries:
        queries = [(q.answers, q.readers, q.timed_out) for q in record.reader_queries]
        seen = repr((record.reader_hashes, queries)).encode()
        digest = hashlib.sha256(seen).hexdigest()[:16]
        trace.note(now_us, f"readers {record.reader_epochs} answers {digest}")
    return answers_digest


def final_hashes(record: RunRecord) -> list[tuple[int, int, int]]:
    """(replica, partition, state hash) of every partition up at the end."""
    return [
        (r, i, p.storage.state_hash)
        for r, replica in enumerate(record.replicas)
        for i, p in enumerate(replica)
        if p is not None
    ]
