"""Every bound on a queue, buffer, message or retry loop in Ordo, in one place.

Each limit carries a docstring (the string on the line after it) saying what it bounds
and what a client, or the process, gets past it; a full-line comment after a blank line
opens a section. scripts/gen_limits_doc.py writes docs/LIMITS.md from them, and
tests/unit/test_limits_doc.py checks that the page matches this module.

Invariant: the relations between limits are checked when this module loads, so a
bad edit fails at import rather than at 3 a.m. under load.
"""

from __future__ import annotations

# Client intake

request_bytes_max = 1 << 20
"""One client frame, encoded. A larger frame gets `too_large` (a frame-level error: no
call of it runs)."""
frame_bytes_hard_max = 16 << 20
"""One ZeroMQ message on the client socket (zmq's MAXMSGSIZE). Past it ZeroMQ drops the
connection before Ordo sees a byte."""
calls_per_frame_max = 10_000
"""Calls a client may pack in one frame. More gets `malformed` for the whole frame."""
args_per_call_max = 64
"""Arguments of one call that the fuzzers try just past. The procedure's schema sets
the real count: a call with any other number of arguments gets `bad_arguments`."""
pending_calls_max = 200_000
"""Calls accepted by the sequencer and not yet answered, all clients together (queries
included). Past it a new call gets `overloaded`; retry later."""
req_id_max = (1 << 63) - 1
"""A request id: a non-negative int64. Anything else gets `malformed`."""
client_id_bytes_max = 64
"""A client id: bytes, at most this long. Anything else gets `malformed`."""
footprint_entries_max = 20_000
"""Footprint entries (reads and writes together) of one call or query, checked where
calls are admitted (the sequencer, the 2PL coordinator), not where logged calls run.
More gets `too_large`. It bounds what one call costs the lock manager and the
partitions (~16 us an entry: the built-in bank.open of its 10,000 accounts has
20,000)."""

# Fair intake at the sequencer: work per loop turn is bounded and shared round robin

intake_turn_s_max = 0.004
"""Time one loop turn of the sequencer spends validating queued calls. The rest waits
for the next turn, in order."""
receive_turn_s_max = 0.004
"""Time one loop turn spends reading and decoding client frames. Frames not read wait
in ZeroMQ."""
turn_s_min = 0.0005
"""What each of the two phases above still gets when the epoch's tick is due (both stop
at the tick otherwise), so a flood never starves intake entirely."""
receive_bytes_per_turn_max = 8 << 20
"""Frame bytes read per loop turn, at most. The rest wait in ZeroMQ for the next turn."""
intake_quantum_calls = 64
"""Calls of one client validated per round robin round, so one client's flood costs the
others at most this slice of a turn."""
intake_client_bytes_max = 16 << 20
"""Frames of one client read but not yet validated. Past it that client's further calls
get `overloaded`."""
intake_bytes_max = 32 << 20
"""Frames of all clients read but not yet validated. Past it nothing is refused:
further frames wait unread in ZeroMQ."""
client_pending_calls_max = 50_000
"""Accepted, unsequenced calls of one client connection. Past it (or past
`client_pending_bytes_max`) that client's calls get `overloaded`."""
client_pending_bytes_max = 32 << 20
"""Encoded bytes of one client's accepted, unsequenced calls. Past it that client's
calls get `overloaded`."""
pending_bytes_max = 256 << 20
"""Encoded bytes of all accepted, unsequenced calls. Past it a new call gets
`overloaded`."""

# Epochs and batches

epoch_duration_ms_default = 10
"""The epoch length a cluster gets unless `--epoch-ms` says otherwise."""
batch_txns_max = 20_000
"""Calls in one batch: a batch is cut early when it reaches this many. Nothing is
refused: the calls that do not fit wait for the next epoch, in order."""
batch_bytes_max = 2 << 20
"""Encoded bytes of one batch: a batch is cut when the next call would not fit.
Nothing is refused: that call waits for the next epoch, in order."""
unapplied_bytes_max = 4 << 20
"""Flow control: bytes of published batches that the fastest live replica of some
partition has not applied yet. At or above it the next batch waits; calls stay pending
at the sequencer, where every client gets its fair share of the next batch, instead of
queueing behind a flood in every partition's inbox. Nothing is refused."""
batch_overhead_bytes_max = 128
"""A batch's fields other than its calls, encoded (internal: sizes the room for calls)."""
txn_bytes_max = request_bytes_max + 256
"""One call encoded as the log holds it (the call, its participants and ids). A larger
call gets `too_large`."""
batch_quantum_calls = 256
"""Calls of one client per round robin round when a batch is cut, so one client's
backlog shares each batch with the others."""

# Command log

segment_bytes_max = 64 << 20
"""One log segment file: the log rolls to a new segment past this size."""
log_frame_bytes_max = 32 << 20
"""One log frame. A frame header claiming more is corruption: the sequencer stops with
file, offset and epoch rather than skip it."""

# Log service (batches a partition fetches to repair a gap or recover)

log_service_epochs_per_reply_max = 256
"""Batches in one log-service reply. The partition asks again for the rest."""
log_service_reply_bytes_max = 64 << 20
"""Bytes of one log-service reply (it always holds at least one batch). The partition
asks again for the rest."""
log_service_request_bytes_max = 1024
"""One log-service request (three ints). A larger one is dropped, unanswered."""

# Replicas

peer_message_bytes_max = 32 << 20
"""One message between the partitions of a replica (internal: the relations below keep
a batch and a row within it)."""
result_backlog_txns_max = 1_000_000
"""Sequenced calls whose results the sequencer still waits for or compares across
replicas. Past it the oldest are forgotten: their later replicas' results are not
compared, and a client still waiting gets its answer by retrying (exactly-once)."""
result_cache_txns_max = 200_000
"""Results a reporting partition keeps, so that a retry after a sequencer restart is
answered without running the call again. Past it the oldest are forgotten: such a
retry gets `retry_expired` (outcome unknown, not run again)."""
sent_reads_txns_max = 1_000_000
"""Transactions whose reads a partition keeps to resend to a restarted peer. Past it
the oldest are dropped; a peer that would need them cannot recover from its
checkpoint and needs a copy of another replica's."""

# Exactly-once retries at the sequencer (sequencer/retry_cache.py)

retry_cache_entries_max = 200_000
"""Answered calls remembered for retries. Past it (or past `retry_cache_bytes_max`)
the oldest are evicted; a retry of an evicted call, or of an older request id of its
client, gets `retry_expired` (outcome unknown, not run again)."""
retry_cache_bytes_max = 16 << 20
"""Bytes of the answers the retry cache keeps; the oldest are evicted first (see
`retry_cache_entries_max` for what a retry then gets). Besides its answer, each entry
costs ~290 bytes of bookkeeping, so a full cache of small answers holds ~60 MB."""
retry_watermark_clients_max = 65_536
"""Clients whose evicted request ids are remembered (so that an old retry is told
`retry_expired`). Past it the oldest client's watermark is dropped."""
retry_rebuild_epochs_max = 2_000
"""Log epochs a restarted sequencer scans for logged calls. A retry of a call logged
further back than that is not recognised as logged."""

# Dependent transactions

dependent_restarts_max = 5
"""Times a dependent call (one whose footprint a reconnaissance predicted) is
re-sequenced after its prediction turned out wrong. Past it the call gets
`restarts_exhausted`."""

# Procedures deployed through the log (txn_library/deployed.py, cluster/deploy_check.py)

deploy_source_bytes_max = 512 << 10
"""A deployed module's source. A larger one is refused by `ordo deploy` before it is
sent (and by the sequencer's argument check: `bad_arguments`); it must fit in one
client frame."""
deploy_check_timeout_s = 10.0
"""How long the sequencer's separate checking process gives a module's import. A module
still importing then (a loop at import) is refused (`deploy_refused`); a checking
process still running 30 s after that is killed. The cluster goes on meanwhile."""
deploy_check_memory_bytes_max = 1 << 30
"""Address space of that checking process (RLIMIT_AS). A module that allocates more at
import is refused."""

# Traditional (2PL + 2PC baseline) mode, per coordinator partition

traditional_calls_max = pending_calls_max
"""Calls a coordinator partition of the baseline has accepted and not yet answered.
Past it a new call gets `overloaded`."""

# Client (txn_library/client/core.py)

client_timeout_s_default = 30.0
"""How long `Client.call` waits for an answer. Past it the caller gets `CallTimeout`;
the call may still commit."""
client_in_flight_max = 50_000
"""Calls in flight in one `Client`. Past it `submit` blocks until some finish."""
cluster_info_addresses_max = 4_096
"""Query addresses (every replica's partitions plus the readers) one `cluster.info`
reply may name. A client refuses a larger reply with a clear error."""

# Load generator (cluster/loadgen.py): a client driving many terminals from one thread

loadgen_in_flight_max = client_in_flight_max
"""Calls the load generator keeps outstanding, over all its connections. A larger load
gets `ValueError` when it is built."""
loadgen_connections_max = 64
"""Client identities of one load generator (one DEALER per target each). More gets
`ValueError` when the load is built."""
loadgen_frame_calls_max = 1_000
"""Calls per frame the load generator sends (a frame is also split at the intake's
byte bound)."""
loadgen_latency_samples_max = 5_000_000
"""Latencies kept per kind and window. Past it a uniform sample is kept."""
loadgen_timeline_buckets_max = 100_000
"""Buckets of a run's timeline. More gets `ValueError` when the timeline is built."""


WIRE_INT_EDGES = (
    0, 1, -1, 2, 127, 128, -32, -33, 255, 256, 65535, 65536,
    2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**53 + 1,
    2**63 - 2, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) + 1,
)  # fmt: skip
"""msgpack's integer encoding edges (fixint, int8/16/32, float-exact, int64, uint64)."""


def edge_values() -> tuple[int, ...]:
    """What fuzzers try: msgpack's int edges and every int bound here, -1, 0 and +1
    (a bound added to this module is fuzzed without touching a fuzzer)."""
    bounds = [v for k, v in globals().items() if k.endswith("_max") and type(v) is int]
    near = {b + d for b in bounds for d in (-1, 0, 1)}
    return tuple(sorted(set(WIRE_INT_EDGES) | near))


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise RuntimeError(f"limits inconsistent: {what}")


_check(request_bytes_max < frame_bytes_hard_max, "request_bytes_max < frame_bytes_hard_max")
_check(batch_bytes_max <= log_frame_bytes_max, "a batch must fit in one log frame")
_check(batch_bytes_max <= peer_message_bytes_max, "a batch must fit in one peer message")
_check(log_frame_bytes_max <= segment_bytes_max, "a frame must fit in a segment")
_check(client_in_flight_max <= pending_calls_max, "one client cannot exceed the global bound")
_check(batch_txns_max <= pending_calls_max, "a batch is drawn from pending calls")
_check(
    txn_bytes_max + batch_overhead_bytes_max <= batch_bytes_max,
    "any one accepted call fits in a batch",
)
_check(request_bytes_max <= intake_client_bytes_max, "a client can queue a whole frame")
_check(intake_client_bytes_max <= intake_bytes_max, "one client within the intake bound")
_check(deploy_source_bytes_max + 4096 <= request_bytes_max, "a deploy fits in a client frame")
_check(txn_bytes_max <= client_pending_bytes_max, "a client can have one call pending")
_check(client_pending_bytes_max <= pending_bytes_max, "one client within the pending bound")
_check(client_pending_calls_max <= pending_calls_max, "one client within the pending bound")
_check(client_in_flight_max <= client_pending_calls_max, "a client's own bound fits the server's")
_check(batch_bytes_max <= log_service_reply_bytes_max, "a log service reply holds a batch")
_check(batch_bytes_max <= unapplied_bytes_max, "flow control lets a full batch through")
_check(request_bytes_max <= receive_bytes_per_turn_max, "a turn can receive a whole frame")
_check(
    loadgen_in_flight_max <= client_pending_calls_max,
    "a load generator's calls fit the pending bound of one client, even on one connection",
)
_check(loadgen_frame_calls_max <= calls_per_frame_max, "the load generator's frames fit intake")


# Executor: write validation, inbox

row_bytes_max = 1 << 21
"""One written row, encoded with its table and key. A larger row is rejected: the
transaction aborts on every replica and its caller gets `procedure_failed`."""
result_bytes_max = 1 << 20
"""One procedure result (or abort reason), encoded. A larger one gets
`procedure_failed`."""
overwritten_digests_max = 500_000
"""Digests of rows that transactions overwrote that a Storage keeps, so that the next
overwrite of such a row hashes it out without packing it again (executor.core.storage;
~150 bytes each: TPC-C W=2 New Order keeps ~200k, its stock rows). Past it all are
forgotten at once; nothing else changes."""
early_reads_txns_max = sent_reads_txns_max
"""Transactions whose peer reads arrived before the transaction itself did. Past it
reads for transactions already passed are purged, and then stray reads are dropped
(and counted)."""
queries_pending_max = pending_calls_max
"""Unsequenced queries waiting at one partition. More than the sequencer can have
pending is junk: dropped and counted."""
peer_hold_s_max = 0.1
"""How long a partition on a host without idle cores holds its next batch while a
multi-partition transaction waits for peers' reads
(executor/deterministic/delivery.py), at a time: a peer that is down then stops
nothing else. Past it the batch runs, and batches run ahead for 1 s."""

# Checkpoints

checkpoint_frame_bytes_max = 4 << 20
"""Rows per checkpoint frame are cut at this size."""
checkpoint_answers_max = 20_000
"""Answers a checkpoint carries (a partition's most recent: executor/core/checkpoint/
format.py), so that a retry of a call run before the checkpoint whose answer a crash
lost is answered after a restart from it. Older ones get `result_unknown`."""
checkpoint_answers_bytes_max = 16 << 20
"""Bytes of packed answers a checkpoint carries (the most recent first, up to
checkpoint_answers_max)."""
checkpoint_chain_depth_max = 16
"""Deltas after a base: past it the next checkpoint is a base."""
checkpoint_chain_load_excess_max = 0.25
"""What loading a chain (a base and its deltas, a delta row weighing 1.5 base rows) may
cost beyond loading a base of the same state. Past it the next checkpoint is a base,
so a load costs at most a quarter more than the state's own rows."""
checkpoint_sync_bytes = 8 << 20
"""A checkpoint writer starts write-back after each this many bytes, so that a base's
write-back does not land at once on the command log's fsyncs."""
checkpoint_asks_max = 3
"""Asks of a command that needs a fresh checkpoint (`ordo checkpoint`, `ordo dump`)
when a partition's writer failed. Past it the command fails with an error naming the
partition."""
checkpoint_write_bytes_per_s = 64 << 20
"""A checkpoint file's pace after its first `checkpoint_sync_bytes` (a delta goes at
once; a 100 MB base takes ~1.5 s, not 0.2 s of the disk that the command log's fsyncs
wait behind)."""

_check(row_bytes_max < peer_message_bytes_max, "a row must fit in a peer read message")
_check(result_bytes_max < frame_bytes_hard_max, "a result must fit in a frame zmq accepts")
_check(retry_cache_bytes_max >= 8 * result_bytes_max, "the retry cache keeps large answers")
_check(
    checkpoint_frame_bytes_max + row_bytes_max + 16 <= log_frame_bytes_max,
    "a checkpoint frame (cut after the row that crosses its budget) fits in a log frame",
)
_check(queries_pending_max <= pending_calls_max, "queries are drawn from pending calls")
_check(checkpoint_sync_bytes >= checkpoint_frame_bytes_max, "a checkpoint syncs whole frames")
_check(checkpoint_write_bytes_per_s >= 1 << 20, "a checkpoint writer writes at least 1 MiB/s")
_check(0 < peer_hold_s_max < 1, "a held batch waits less than a second for a peer")
_check(checkpoint_chain_depth_max >= 1, "a chain holds at least one delta")
_check(checkpoint_chain_load_excess_max > 0, "a chain may hold a delta")

# Streams, windows and dataflows (txn_library/streams/)

stream_batch_tuples_max = 10_000
"""Tuples of one batch pushed to a stream (or emitted by a step). A larger push gets
`bad_arguments` and changes nothing; a step emitting more fails its transaction
(`procedure_failed`) on every replica."""
stream_batches_retained = 1_000
"""Batches a stream keeps at least, unless it declares `retain_batches` (R). It trims
in chunks: a batch that comes when the stream holds R + max(1, R // 16) makes the
oldest go (their rows and any tuples left) down to R, so a full stream holds R to
R + max(1, R // 16) batches (1,000 to 1,062 here). Tuples every consumer has taken go
at once. A re-push of a batch id older than what is kept cannot be told from a step
back: it is refused (aborted, nothing changes). A sink resumes from any batch still
kept; a subscriber whose next batch is gone gets `BatchesGone` naming the missing ids
(docs/STREAMS.md, "Sinks")."""
stream_batches_retained_max = 1_000_000
"""The most a stream may declare as `retain_batches` (a larger declaration fails at
import)."""
window_tuples_max = 100_000
"""The size of a tuple-based window, at most (a larger declaration fails at import)."""
window_batches_max = 10_000
"""The size of a batch-based window in batches, at most (likewise)."""
trigger_depth_max = 8
"""EE triggers that insert into targets with triggers of their own, nested at most this
deep. Deeper fails the transaction (`procedure_failed`) on every replica."""
stream_read_batches_max = 1_000
"""Batches one `stream.read` (a sink's poll) returns at most; the subscriber asks again
from the next one."""


# Queryable state: versions and snapshot queries (executor/core/versions.py, docs/QUERIES.md)

versions_epochs_max = 200
"""Epochs of row versions a partition keeps before its completed epoch (2 s at 10 ms
epochs). A query naming an older epoch gets `bad_arguments` naming the retention
(and the oldest epoch still kept); `ordo replay state --epoch` reaches any epoch."""
versions_bytes_max = 64 << 20
"""Bytes of row versions a partition keeps (an estimate: the rows and their
bookkeeping). Past it the oldest epochs go early, so the retention shrinks under a
heavy write load; a query older than what is kept gets `bad_arguments` as above."""
query_watermark_wait_s = 2.0
"""How long a query naming an epoch not completed yet at a partition waits for it.
Past it the query gets `not_ready` (its epoch is ahead of the partition's)."""
query_after_epoch_wait_s = 2.0
"""How long a query naming an epoch its answer must reflect (`after_epoch`:
read-your-writes, the epoch of the caller's last committed call) waits at a reader or
partition until that epoch is applied there. Past it: `not_ready` naming the epoch
applied and the newest known (the client moves the query to the next reader or
replica); so an epoch the cluster never sequenced is refused, never waited for."""
queries_waiting_max = 10_000
"""Snapshot queries one partition holds while they wait (for an epoch, or for their
peers' reads). Past it a new one gets `overloaded`."""
query_reads_bytes_max = 16 << 20
"""Reads one partition sends the coordinator of one query, encoded. A query whose
reads are larger gets `too_large`."""

_check(stream_batches_retained <= stream_batches_retained_max, "the default is allowed")
_check(versions_epochs_max >= 2, "a snapshot can lag a completed epoch or two")
_check(query_reads_bytes_max <= peer_message_bytes_max, "a query's reads fit a peer message")
_check(stream_batch_tuples_max <= calls_per_frame_max, "a batch fits the calls of a frame")
_check(window_batches_max <= window_tuples_max, "windows are bounded alike")

# Readers: replicas that follow the log in one process and answer queries (executor/reader/)

reader_retention_s_default = 5.0
"""How far back a reader serves snapshots (`ClusterConfig.reader_retention_s`),
measured in the batches' logged time, never the reader's clock: an epoch whose batch
is at most this much older than the newest applied one's, within `versions_bytes_max`
bytes of row versions per partition (past them the oldest epochs go early). A query
naming an older epoch gets `bad_arguments` naming the oldest epoch still served."""
reader_retention_s_max = 600.0
"""The most `ClusterConfig.reader_retention_s` may be (a cluster.json asking more does
not load): a reader keeps each epoch's batch time within its retention, and longer
histories are `ordo replay state --epoch`'s."""
reader_hashes_epochs_max = 10_000
"""Epochs whose per-partition state hashes a reader keeps, to compare with the
replicas' (a status naming an older epoch is not compared)."""
reader_held_batches_max = 20_000
"""Published batches a reader holds ahead of a gap while it catches up from the log.
Past it newer ones are dropped: the log service gives them again."""

_check(
    reader_retention_s_default * 1000 >= versions_epochs_max * epoch_duration_ms_default,
    "a reader keeps at least a partition's versions",
)
_check(0 < reader_retention_s_default <= reader_retention_s_max, "the default is allowed")
_check(query_after_epoch_wait_s < client_timeout_s_default, "a client outwaits one target")

# Sinks pushed from readers (executor/reader/sinks.py, txn_library/client/sinks.py)

reader_subscriptions_max = 1_024
"""Sink subscriptions one reader serves at once. Past it a new one gets `overloaded`
(the client tries the next reader)."""
reader_subscriptions_per_client_max = 64
"""Sink subscriptions one client connection holds at one reader, so that no client
takes every place."""
sink_window_batches = 2_000
"""Batches a reader pushes to one subscription beyond what the subscriber has
acknowledged; it pushes more as acknowledgements come."""
sink_renew_s = 1.0
"""How often a subscriber tells its reader where it is (its next batch id), also when
nothing comes: the reader's answer tells it the reader is alive."""
sink_lease_s = 5.0
"""A subscription the reader has not heard of for this long is dropped."""
sink_silence_s = 3.0
"""A subscriber whose reader has not answered for this long moves to the next reader,
from the batch after the last it took."""
sink_resend_s = 1.0
"""A reader whose pushes go unacknowledged for this long pushes again from the
subscriber's next batch id (the subscriber drops what it has seen)."""

_check(sink_silence_s < sink_lease_s, "a subscriber moves on before its lease ends")
_check(sink_renew_s < sink_silence_s, "a live reader answers before the subscriber gives up")
_check(sink_window_batches >= stream_read_batches_max, "a window holds a page")

# ZooKeeper ensemble (cluster/zookeeper.py): what one local server may hold

zk_server_heap_mb_max = 256
"""JVM heap (-Xmx) of one ZooKeeper server."""
zk_snapshots_retained = 3
"""Snapshots (and their transaction logs) ZooKeeper's autopurge keeps."""
zk_client_connections_per_host_max = 60
"""ZooKeeper's maxClientCnxns, per client address. Past it ZooKeeper refuses further
connections from that address."""
zk_server_log_bytes_max = 8 << 20
"""One ZooKeeper server's log file; one older file is kept."""
zk_four_letter_reply_bytes_max = 64 << 10
"""A srvr/ruok/mntr answer as `ordo status` reads it; the rest is not read."""

_check(zk_snapshots_retained >= 3, "ZooKeeper raises autopurge.snapRetainCount below 3 to 3")

# Replicated ordering layer (sequencer.replication, cluster.ordering_zk)

zk_session_timeout_s = 2.0
"""A leader's ZooKeeper session. A leader silent this long loses it: another sequencer
is elected (failover of a paused or cut-off leader; a killed one is told by its closed
connections first). At 1 s, a saturating 10-minute run on this 2-core machine deposed
busy leaders 8 times, at 0.5 s 51 times, at 2 s twice (load average 15-24)."""
zk_commit_timeout_s = 0.8
"""One batch commit to ZooKeeper. Unanswered this long, its outcome is unknown and the
leader steps down: its calls get `not_leader`, and clients resend them to the next
leader."""
zk_connect_timeout_s = 30.0
"""A sequencer's first connection to the ensemble. Past it the sequencer does not
start (kazoo's timeout error ends it)."""
zk_node_bytes_max = 4 << 20
"""One ZooKeeper request (the servers' and clients' jute.maxbuffer). Nothing is
refused: a batch, at most `batch_bytes_max`, always fits."""
zk_tail_epochs_max = 2_000
"""Committed batches ZooKeeper keeps. Older ones come from a peer sequencer's log."""
zk_trim_batch_max = 256
"""Deletes per trimming multi-op."""
sequencer_copy_batches_per_turn = 256
"""Batches a follower sequencer copies per loop turn; it takes the rest next turn."""
sequencer_copy_backstop_s = 0.5
"""A follower takes batches from the leader's publication, and checks ZooKeeper for
what that feed missed at least this often."""
sequencer_local_sync_s = 0.05
"""A replicated sequencer fdatasyncs its local log this often (the ZooKeeper quorum
holds what is committed meanwhile)."""
sequencer_progress_every_s = 0.5
"""A sequencer reports its synced last epoch this often (only when it moved)."""
sequencer_trim_every_s = 1.0
"""The leader trims ZooKeeper's committed tail this often."""
sequencer_election_check_s = 0.05
"""A follower looks at the election when ZooKeeper's watch fires, at most this often."""
sequencer_candidate_catch_up_s_max = 10.0
"""An elected sequencer that cannot copy every committed batch by then resigns, and the
next one leads."""
sequencer_feed_reconnect_ms = 20
"""A sequencer reconnects to a peer's publication this long after the connection
closed. A refused reconnect to the leader's says its process is gone: a follower then
removes it from the election instead of waiting out its ZooKeeper session."""
sequencer_feed_reconnect_max_ms = 500
"""Reconnects to a peer's publication that keep failing back off up to this interval."""

# Client failover (txn_library/client/failover.py)

client_failover_silence_s = 1.0
"""A client with calls out that hears nothing this long moves to the next sequencer
address and resends them, same ids (a dropped connection: at once)."""
client_failover_backoff_s = 0.1
"""After `not_leader` with no leader named, the client waits this long before it asks
again."""
client_failover_stale_hint_s = 3.0
"""A follower's hint naming a sequencer whose connection dropped is believed only
after this long (ZooKeeper expires the dead leader's session and elects another well
within it); until then the client asks again."""

# Processes: supervision and ownership (cluster/launcher.py, cluster/ownership.py)

supervisor_restarts_max = 5
"""Restarts of one process by `ordo up --ha`'s supervisor within `supervisor_window_s`.
Past it `ordo up` stops the cluster and says which process keeps exiting."""
supervisor_window_s = 60.0
"""The window `supervisor_restarts_max` counts restarts in."""
owner_wait_s = 10.0
"""How long a process waits for the previous owner of its state (a cluster directory,
a command log, a partition's checkpoints) to exit, e.g. a role whose launcher was
killed. Past it a second `ordo up` (or role) is refused with the owner's pid, having
touched nothing."""
lifeline_stop_grace_s = 5.0
"""A role whose launcher exited stops as on SIGTERM, and is made to exit after this
long."""

_check(
    batch_bytes_max + (64 << 10) <= zk_node_bytes_max,
    "a batch, with the commit's other operations, fits in one ZooKeeper request",
)
_check(zk_commit_timeout_s < zk_session_timeout_s, "a commit gives up before its session ends")
_check(
    sequencer_feed_reconnect_ms < 1000 * zk_session_timeout_s,
    "a dead leader's refused reconnect comes before its session expires",
)
_check(
    sequencer_feed_reconnect_ms <= sequencer_feed_reconnect_max_ms,
    "reconnects back off from the first interval",
)
_check(
    lifeline_stop_grace_s < owner_wait_s,
    "a claimant outwaits the roles of a launcher that died",
)

# Process memory: freed heap returned to the OS (cluster/heap_trim.py)

heap_check_s = 1.0
"""How often a role process reads its resident set size (RSS) to decide whether to
return freed heap memory to the OS (`malloc_trim`)."""
heap_trim_growth_bytes = 16 << 20
"""RSS growth since the last trim (or the start) that makes a role trim its heap: the
memory a burst (a flood of large or hostile frames) freed but glibc kept."""
heap_trim_interval_s_min = 5.0
"""Trims of one process are at least this far apart (a trim walks the heap: a few
milliseconds for a few hundred MB)."""

_check(heap_check_s <= heap_trim_interval_s_min, "a trim is due no sooner than it is checked")

# CURVE keys (cluster/security/)

curve_allowlist_keys_max = 10_000
"""Client public keys in `keys/clients/`. More: `ordo keys` and a server's start
refuse, naming the count."""
curve_key_file_bytes_max = 4096
"""One key file. A larger file is not a key file: refused, naming the file."""
curve_key_name_chars_max = 64
"""A role or client name, which names its key files. A longer name is refused."""

_check(curve_key_name_chars_max < curve_key_file_bytes_max // 8, "a key file holds its name")

# Hosts for multi-host tests from network namespaces (cluster/netns.py)

netns_hosts_max = 64
"""Hosts of one `Hosts`: 198.18.0.1 .. 198.18.0.64 on one bridge. More gets
`ValueError`."""
netns_processes_max = 1024
"""Live processes one `Hosts` tracks. More gets `RuntimeError`."""
netns_command_timeout_s = 10.0
"""One `ip` command. Slower gets `NetnsError`."""
netns_process_exit_timeout_s = 10.0
"""A SIGKILLed process is reaped within this."""

_check(netns_hosts_max <= 254, "every host's address fits the one /24 of its bridge")
_check(
    client_failover_stale_hint_s > zk_session_timeout_s + 4 * sequencer_election_check_s,
    "a client waits out a dead leader's session and an election before it believes "
    "a follower that still names it",
)
