"""Every metric Ordo's processes serve: name, type, labels and meaning, by role.

The one list: each role's collector (cluster.metrics.roles) renders exactly the metrics
listed here for its role, and docs/OPERATIONS.md's metric table is generated from it
(``scripts/gen_metrics_doc.py`` rewrites it; tests/unit/test_metrics.py checks that
the page matches). A metric a collector has no value for yet (a follower's
batches, a histogram nothing was added to) is simply absent from a scrape.

Invariants: names are unique across roles and follow Prometheus's conventions
(``ordo_`` prefix, base units, ``_total`` on counters); a role's constant labels
(ROLE_LABELS) come before a metric's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from txn_library.errors import invariant

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

# The labels every metric of a role carries: which process of the cluster it is.
ROLE_LABELS: dict[str, tuple[str, ...]] = {
    "any": ("role", "process"),
    "launcher": (),
    "sequencer": ("member",),
    "partition": ("replica", "partition"),
    "reader": ("reader",),
    "traditional": ("partition",),
}


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()


def _m(name: str, kind: str, help: str, *labels: str) -> Metric:
    return Metric(name, kind, help, labels)


COMMON = (_m("ordo_process_info", GAUGE, "1 for each Ordo process; its role and name (r0p1, ...)"),)

SEQUENCER = (
    _m("ordo_sequencer_leader", GAUGE, "1 while this sequencer leads (the embedded one always)"),
    _m("ordo_sequencer_term", GAUGE, "the leader term this sequencer knows (0: not replicated)"),
    _m("ordo_sequencer_log_last_epoch", GAUGE, "the last epoch in this sequencer's command log"),
    _m(
        "ordo_sequencer_follower_lag_epochs",
        GAUGE,
        "epochs committed (as last seen in ZooKeeper) that this follower's log lacks; "
        "0 on the leader",
    ),
    _m("ordo_batches_total", COUNTER, "batches cut, made durable and published (the leader)"),
    _m("ordo_txns_sequenced_total", COUNTER, "calls sequenced into batches", "procedure"),
    _m("ordo_txns_derived_total", COUNTER, "dataflow steps derived from pushes into batches"),
    _m(
        "ordo_txns_answered_total",
        COUNTER,
        "answers sent to clients: ok, aborted (a logical abort) or error",
        "outcome",
    ),
    _m("ordo_calls_accepted_total", COUNTER, "calls that passed validation"),
    _m("ordo_calls_rejected_total", COUNTER, "calls answered with an error at intake"),
    _m("ordo_calls_overloaded_total", COUNTER, "of those, refused as overloaded"),
    _m("ordo_calls_duplicate_total", COUNTER, "retries recognised by their ids (exactly once)"),
    _m("ordo_dependent_restarts_total", COUNTER, "dependent calls re-sequenced (stale prediction)"),
    _m("ordo_queries_total", COUNTER, "queries and reconnaissance reads sent to partitions"),
    _m(
        "ordo_determinism_violations_total",
        COUNTER,
        "replicas whose answers or checkpoint hashes differ (must stay 0)",
    ),
    _m("ordo_bad_partition_messages_total", COUNTER, "malformed reports from partitions"),
    _m(
        "ordo_txn_latency_seconds",
        HISTOGRAM,
        "from a call's batch being published (durable) to its answer going to the client",
    ),
    _m("ordo_batch_txns", HISTOGRAM, "calls per batch"),
    _m("ordo_batch_bytes", HISTOGRAM, "bytes per batch"),
    _m("ordo_sequencer_pending_calls", GAUGE, "validated calls waiting for a batch"),
    _m("ordo_sequencer_pending_bytes", GAUGE, "their bytes"),
    _m("ordo_sequencer_intake_slices", GAUGE, "client frames waiting for validation"),
    _m("ordo_sequencer_in_flight_txns", GAUGE, "sequenced calls not yet answered by every replica"),
    _m("ordo_sequencer_retry_cache_entries", GAUGE, "answers kept for retries"),
    _m("ordo_sequencer_retry_cache_bytes", GAUGE, "their bytes"),
    _m(
        "ordo_sequencer_unapplied_bytes",
        GAUGE,
        "published batch bytes the fastest replica has not applied (flow control's measure)",
    ),
    _m(
        "ordo_flow_control_waits_total",
        COUNTER,
        "times the next batch was held because the replicas were unapplied_bytes_max behind",
    ),
    _m("ordo_flow_control_wait_seconds_total", COUNTER, "time batches were held so"),
    _m(
        "ordo_heap_trims_total",
        COUNTER,
        "times freed heap memory was given back to the OS (malloc_trim; cluster/heap_trim.py)",
    ),
    _m("ordo_heap_trimmed_bytes_total", COUNTER, "resident memory those trims gave back"),
    _m(
        "ordo_replica_partition_up",
        GAUGE,
        "the leader's view: 1 if the partition reported within 1.5 s",
        "replica",
        "partition",
    ),
    _m(
        "ordo_replica_apply_lag_epochs",
        GAUGE,
        "the leader's view: its epoch minus the partition's last applied epoch",
        "replica",
        "partition",
    ),
    _m(
        "ordo_zookeeper_commit_seconds",
        HISTOGRAM,
        "a batch's commit to the ZooKeeper quorum (replicated leader)",
    ),
)

PARTITION = (
    _m("ordo_partition_last_epoch", GAUGE, "the last epoch applied"),
    _m("ordo_partition_known_epoch", GAUGE, "the newest epoch this partition knows exists"),
    _m("ordo_partition_apply_lag_epochs", GAUGE, "known minus applied epochs"),
    _m("ordo_partition_live", GAUGE, "1 once caught up after start (0: recovering)"),
    _m("ordo_partition_txns_applied_total", COUNTER, "transactions applied"),
    _m("ordo_partition_active_txns", GAUGE, "transactions admitted, not finished"),
    _m("ordo_partition_blocked_txns", GAUGE, "transactions waiting for locks"),
    _m("ordo_partition_held_batches", GAUGE, "batches that arrived ahead of a gap"),
    _m("ordo_partition_lock_waits_total", COUNTER, "lock requests that had to queue"),
    _m("ordo_partition_txn_waits_total", COUNTER, "admissions that waited for a lock"),
    _m("ordo_partition_fast_path_txns_total", COUNTER, "transactions run without contention"),
    _m(
        "ordo_partition_peer_holds_expired_total",
        COUNTER,
        "batches that waited peer_hold_s_max for peers' reads",
    ),
    _m("ordo_partition_inputs_dropped_total", COUNTER, "malformed or stray inbound messages"),
    _m("ordo_partition_dataflow_failures_total", COUNTER, "dataflow steps that failed here"),
    _m(
        "ordo_partition_startup_seconds",
        GAUGE,
        "loading its newest checkpoint (or the genesis) at start",
    ),
    _m(
        "ordo_partition_recovery_seconds",
        GAUGE,
        "replaying the log after start until live (absent until live)",
    ),
    _m("ordo_partition_newest_checkpoint_epoch", GAUGE, "the newest durable checkpoint"),
    _m(
        "ordo_checkpoint_seconds",
        HISTOGRAM,
        "a checkpoint from its boundary to its file durable",
    ),
    _m(
        "ordo_checkpoint_pause_seconds",
        HISTOGRAM,
        "batches stopped for a checkpoint: the drain and the capture",
    ),
    _m("ordo_checkpoints_skipped_total", COUNTER, "boundaries not written: a writer was busy"),
    _m("ordo_checkpoints_failed_total", COUNTER, "checkpoint files that failed to write"),
)

READER = (
    _m("ordo_reader_applied_epoch", GAUGE, "the last epoch the reader applied"),
    _m("ordo_reader_known_epoch", GAUGE, "the newest epoch it knows exists"),
    _m("ordo_reader_lag_epochs", GAUGE, "known minus applied epochs"),
    _m("ordo_reader_live", GAUGE, "1 once caught up after start"),
    _m("ordo_reader_txns_applied_total", COUNTER, "transactions re-executed"),
    _m("ordo_reader_hashes_checked_total", COUNTER, "replica state hashes compared"),
    _m(
        "ordo_reader_determinism_violations_total",
        COUNTER,
        "replica hashes that differ from the reader's (must stay 0)",
    ),
    _m("ordo_reader_queries_total", COUNTER, "queries answered or refused", "result"),
    _m("ordo_reader_queries_waiting", GAUGE, "queries waiting for an epoch"),
    _m("ordo_reader_subscriptions", GAUGE, "sink subscriptions"),
    _m("ordo_reader_sink_batches_total", COUNTER, "sink batches pushed"),
)

TRADITIONAL = (
    _m("ordo_traditional_committed_total", COUNTER, "transactions committed (2PL + 2PC)"),
    _m("ordo_traditional_aborted_total", COUNTER, "logical aborts"),
    _m("ordo_traditional_failed_total", COUNTER, "calls that failed"),
    _m("ordo_traditional_restarts_total", COUNTER, "wait-die deaths, restarted"),
    _m("ordo_traditional_active_txns", GAUGE, "calls and branches in flight"),
    _m("ordo_traditional_in_doubt", GAUGE, "prepared branches awaiting a decision"),
    _m("ordo_traditional_lock_waits_total", COUNTER, "lock requests that had to queue"),
    _m("ordo_traditional_blocked", GAUGE, "owners waiting for a lock"),
)

LAUNCHER = (
    _m("ordo_process_up", GAUGE, "1 while the child process runs", "process"),
    _m("ordo_process_restarts_total", COUNTER, "restarts by the supervisor (--ha)", "process"),
)

# prometheus_client's process collector, in every process (Linux /proc).
PROCESS = (
    _m("process_resident_memory_bytes", GAUGE, "resident set size (RSS)"),
    _m("process_virtual_memory_bytes", GAUGE, "virtual memory size"),
    _m("process_cpu_seconds_total", COUNTER, "user and system CPU time"),
    _m("process_open_fds", GAUGE, "open file descriptors"),
    _m("process_max_fds", GAUGE, "the file descriptor limit"),
    _m("process_start_time_seconds", GAUGE, "start time, seconds since the epoch"),
)

BY_ROLE: dict[str, tuple[Metric, ...]] = {
    "any": COMMON,
    "sequencer": SEQUENCER,
    "partition": PARTITION,
    "reader": READER,
    "traditional": TRADITIONAL,
    "launcher": LAUNCHER,
}


def _check() -> None:
    names = [m.name for ms in (*BY_ROLE.values(), PROCESS) for m in ms]
    invariant(len(names) == len(set(names)), "metric names must be unique")
    for ms in BY_ROLE.values():
        for m in ms:
            invariant(m.name.startswith("ordo_"), f"{m.name}: ordo_ prefix")
            invariant(m.kind in (COUNTER, GAUGE, HISTOGRAM), f"{m.name}: kind {m.kind}")
            invariant((m.kind == COUNTER) == m.name.endswith("_total"), f"{m.name}: _total")


_check()

DOC = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
BEGIN, END = "<!-- metrics table: begin -->", "<!-- metrics table: end -->"
_ROLE_TITLES = {
    "any": "every Ordo process",
    "sequencer": "sequencers",
    "partition": "partitions",
    "reader": "readers",
    "traditional": "the traditional mode's partitions",
    "launcher": "the launcher (`ordo up`)",
}


def markdown_table() -> str:
    """The metric table of docs/OPERATIONS.md (between BEGIN and END)."""
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    groups = [(role, ms, ROLE_LABELS[role]) for role, ms in BY_ROLE.items()]
    groups.append(("process", PROCESS, ()))
    for role, ms, role_labels in groups:
        title = _ROLE_TITLES.get(role, "every process (prometheus_client's process collector)")
        lines.append(f"| **{title}** | | {', '.join(role_labels)} | |")
        for m in ms:
            lines.append(f"| `{m.name}` | {m.kind} | {', '.join(m.labels)} | {m.help} |")
    return "\n".join(lines)


def rewrite_doc(path: Path = DOC) -> bool:
    """Rewrite the table in ``path``; True if it changed."""
    text = path.read_text()
    new = re.sub(
        re.escape(BEGIN) + ".*?" + re.escape(END),
        lambda _: f"{BEGIN}\n{markdown_table()}\n{END}",
        text,
        flags=re.S,
    )
    if new != text:
        path.write_text(new)
    return new != text
