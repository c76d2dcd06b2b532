"""Every bound on a queue, buffer, message or retry loop in Ordo, in one place.

Invariant: the relations between limits are checked when this module loads, so a
bad edit fails at import rather than at 3 a.m. under load.
"""

from __future__ import annotations

# Client intake
request_bytes_max = 1 << 20  # one client frame; larger gets ERR_TOO_LARGE
frame_bytes_hard_max = 16 << 20  # zmq MAXMSGSIZE: above this zmq drops the peer
calls_per_frame_max = 10_000  # calls a client may pack in one frame
args_per_call_max = 64
pending_calls_max = 200_000  # accepted but not yet answered; above: ERR_OVERLOADED
req_id_max = (1 << 63) - 1  # request ids are non-negative int64
client_id_bytes_max = 64
# Footprint entries (reads + writes) of one call or query, checked where calls are admitted
# (the sequencer, the 2PL coordinator), not where logged calls run: more gets ERR_TOO_LARGE.
# Bounds what one call costs the lock manager and the partitions (~16 us an entry: the
# built-in bank.open of its 10,000 accounts has 20,000).
footprint_entries_max = 20_000

# Fair intake (sequencer): work per loop turn is bounded, and shared round robin
intake_turn_s_max = 0.004  # validating queued calls, per turn
receive_turn_s_max = 0.004  # reading and decoding client frames, per turn
turn_s_min = 0.0005  # each of the two when the epoch's tick is due (both stop at it)
receive_bytes_per_turn_max = 8 << 20  # and at most this many frame bytes per turn
intake_quantum_calls = 64  # calls of one client per round robin round
intake_client_bytes_max = 16 << 20  # frames of one client awaiting validation; above:
# ERR_OVERLOADED for that client's further calls
intake_bytes_max = 32 << 20  # ... of all clients; above: frames wait unread in ZeroMQ
client_pending_calls_max = 50_000  # accepted, unsequenced calls of one client
client_pending_bytes_max = 32 << 20  # their encoded bytes; above either: ERR_OVERLOADED
pending_bytes_max = 256 << 20  # encoded bytes of all accepted, unsequenced calls

# Epochs and batches
epoch_duration_ms_default = 10
batch_txns_max = 20_000  # a batch is cut early when it reaches this many txns
batch_bytes_max = 2 << 20  # an epoch's batch is cut when the next call would not fit
# Flow control: bytes of published batches the fastest live replica of some partition
# has not applied yet; at or above it, the next batch waits (calls stay pending, where
# every client gets its fair share of the next batch instead of queueing behind a flood)
unapplied_bytes_max = 4 << 20
batch_overhead_bytes_max = 128  # a batch's fields other than its txns, encoded
txn_bytes_max = request_bytes_max + 256  # one encoded txn (a call plus participants, ids)
batch_quantum_calls = 256  # calls of one client per round when a batch is cut

# Command log
segment_bytes_max = 64 << 20  # roll to a new segment file past this size
log_frame_bytes_max = 32 << 20  # a frame header claiming more is corruption

# Log service
log_service_epochs_per_reply_max = 256
log_service_reply_bytes_max = 64 << 20  # a reply holds at least one batch, then up to this
log_service_request_bytes_max = 1024  # a LOG_FETCH frame is three ints

# Replicas
peer_message_bytes_max = 32 << 20
result_backlog_txns_max = 1_000_000  # results awaiting other replicas' comparison

result_cache_txns_max = 200_000  # per reporting partition, for retries after a crash

# Exactly-once retries at the sequencer (sequencer/retry_cache.py)
retry_cache_entries_max = 200_000  # answered calls remembered for retries
retry_cache_bytes_max = 64 << 20  # bytes of the answers kept; oldest evicted first
retry_watermark_clients_max = 65_536  # clients whose evicted request ids are remembered
retry_rebuild_epochs_max = 2_000  # log epochs scanned for logged calls at restart
sent_reads_txns_max = 1_000_000  # reads a partition keeps to resend to a restarted peer

# Dependent transactions
dependent_restarts_max = 5

# Traditional (2PL + 2PC baseline) mode, per coordinator partition
traditional_calls_max = pending_calls_max  # accepted, not yet answered; above: ERR_OVERLOADED

# Client
client_timeout_s_default = 30.0
client_in_flight_max = 50_000

# Load generator (cluster/loadgen.py): a client driving many terminals from one thread
loadgen_in_flight_max = client_in_flight_max  # calls outstanding, all its connections
loadgen_connections_max = 64  # client identities (one DEALER per target each)
loadgen_frame_calls_max = 1_000  # calls per frame it sends
loadgen_latency_samples_max = 5_000_000  # latencies kept per kind and window; then sampled
loadgen_timeline_buckets_max = 100_000  # buckets of a run's timeline


# msgpack's integer encoding edges (fixint, int8/16/32, float-exact, int64, uint64)
WIRE_INT_EDGES = (
    0, 1, -1, 2, 127, 128, -32, -33, 255, 256, 65535, 65536,
    2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**53 + 1,
    2**63 - 2, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) + 1,
)  # fmt: skip


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
_check(txn_bytes_max <= client_pending_bytes_max, "a client can have one call pending")
_check(client_pending_bytes_max <= pending_bytes_max, "one client within the pending bound")
_check(client_pending_calls_max <= pending_calls_max, "one client within the pending bound")
_check(client_in_flight_max <= client_pending_calls_max, "a client's own bound fits the server's")
_check(batch_bytes_max <= log_service_reply_bytes_max, "a log service reply holds a batch")
_check(batch_bytes_max <= unapplied_bytes_max, "flow control lets a full batch through")
_check(request_bytes_max <= receive_bytes_per_turn_max, "a turn can receive a whole frame")
_check(retry_cache_bytes_max >= 16 * txn_bytes_max, "the retry cache keeps several answers")
_check(
    loadgen_in_flight_max <= client_pending_calls_max,
    "a load generator's calls fit the pending bound of one client, even on one connection",
)
_check(loadgen_frame_calls_max <= calls_per_frame_max, "the load generator's frames fit intake")


# Executor (write validation, inbox)
row_bytes_max = 1 << 21  # one written row, encoded with its table and key; larger: ERROR
result_bytes_max = 1 << 20  # one procedure result (or abort reason), encoded; larger: ERROR
# digests of rows transactions overwrote that a Storage keeps, so that the next overwrite of
# such a row hashes it out without packing it again (executor.core.storage); past it, all
# are forgotten (~150 bytes each: TPC-C W=2 New Order keeps ~200k, its stock rows)
overwritten_digests_max = 500_000
early_reads_txns_max = sent_reads_txns_max  # txns whose peer reads arrived before the txn
queries_pending_max = pending_calls_max  # unsequenced queries waiting at one partition
# A partition on a host without cores to spare holds its next batch while a multi-partition txn
# waits for peers' reads (executor.deterministic.delivery), at most this long at a time:
# a peer that is down then stops nothing else.
peer_hold_s_max = 0.1
checkpoint_frame_bytes_max = 4 << 20  # rows per checkpoint frame are cut at this size
checkpoint_chain_depth_max = 16  # deltas after a base before the next checkpoint is a base
checkpoint_chain_load_excess_max = 0.25  # a chain may cost a load this much more than a base
checkpoint_sync_bytes = 8 << 20  # a checkpoint writer fdatasyncs after each this many
# bytes, so a base's write-back does not land at once on the command log's fsyncs
# a command that needs a fresh checkpoint (ordo checkpoint, ordo dump) asks again when a
# partition's writer failed, at most this many asks in all; then its error names the partition
checkpoint_asks_max = 3
checkpoint_write_bytes_per_s = 64 << 20  # a checkpoint file's pace after its first
# checkpoint_sync_bytes (a delta goes at once; a 100 MB base takes ~1.5 s, not 0.2 s
# of the disk that the command log's fsyncs wait behind)

_check(row_bytes_max < peer_message_bytes_max, "a row must fit in a peer read message")
_check(result_bytes_max < frame_bytes_hard_max, "a result must fit in a frame zmq accepts")
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

# ZooKeeper ensemble (cluster/zookeeper.py): what one local server may hold
zk_server_heap_mb_max = 256  # JVM -Xmx of one server
zk_snapshots_retained = 3  # autopurge keeps this many snapshots and their txn logs
zk_client_connections_per_host_max = 60  # ZooKeeper's maxClientCnxns, per client address
zk_server_log_bytes_max = 8 << 20  # one server's log4j file; one older file is kept
zk_four_letter_reply_bytes_max = 64 << 10  # a srvr/ruok/mntr answer, as Ensemble reads it

_check(zk_snapshots_retained >= 3, "ZooKeeper raises autopurge.snapRetainCount below 3 to 3")

# Replicated ordering layer (sequencer.replication, cluster.ordering_zk)
zk_session_timeout_s = 1.0  # a leader silent this long loses its session: failover
zk_commit_timeout_s = 0.8  # a batch commit unanswered this long: outcome unknown, step down
zk_connect_timeout_s = 30.0  # a sequencer's first connection to the ensemble
zk_node_bytes_max = 4 << 20  # ZooKeeper's jute.maxbuffer, set on servers and clients
zk_tail_epochs_max = 2_000  # committed batches ZooKeeper keeps; older come from peers
zk_trim_batch_max = 256  # deletes per trimming multi-op
sequencer_copy_batches_per_turn = 256  # a follower copies at most this many per loop turn
sequencer_copy_backstop_s = 0.5  # a follower checks ZooKeeper for what its feed missed
sequencer_local_sync_s = 0.05  # a replicated sequencer fdatasyncs its local log this often
sequencer_progress_every_s = 0.5  # a sequencer reports its synced last epoch (if moved) this often
sequencer_trim_every_s = 1.0  # the leader trims the committed tail this often
sequencer_election_check_s = 0.05  # a follower looks at the election on a watch, at most this often
sequencer_candidate_catch_up_s_max = 10.0  # an elected sequencer not caught up by then resigns
client_failover_silence_s = 1.0  # a client with calls out hears nothing this long: next
client_failover_backoff_s = 0.1  # after "not leader" with no leader named, wait this long
# a hint naming a sequencer whose connection dropped is believed only after this long
# (ZooKeeper expires the dead leader's session and elects another well within it)
client_failover_stale_hint_s = 3.0
# `ordo up --ha` restarts a process that exits, at most this many times per window
supervisor_restarts_max = 5
supervisor_window_s = 60.0
# A process waits this long for the previous owner of its state (cluster.ownership) to
# exit, e.g. a role whose launcher was killed, before it refuses to start
owner_wait_s = 10.0
# a role whose launcher exited, stopping as on SIGTERM, is made to exit after this long
lifeline_stop_grace_s = 5.0

_check(
    batch_bytes_max + (64 << 10) <= zk_node_bytes_max,
    "a batch, with the commit's other operations, fits in one ZooKeeper request",
)
_check(zk_commit_timeout_s < zk_session_timeout_s, "a commit gives up before its session ends")
_check(
    lifeline_stop_grace_s < owner_wait_s,
    "a claimant outwaits the roles of a launcher that died",
)

# CURVE keys (cluster/security.py)
curve_allowlist_keys_max = 10_000  # client public keys in keys/clients/; more: refused
curve_key_file_bytes_max = 4096  # one key file; larger is not a key file: refused
curve_key_name_chars_max = 64  # a role or client name, which names its key files

_check(curve_key_name_chars_max < curve_key_file_bytes_max // 8, "a key file holds its name")

# Hosts for multi-host tests from network namespaces (cluster/netns.py)
netns_hosts_max = 64  # hosts of one Hosts: 198.18.0.1 .. 198.18.0.64 on one bridge
netns_processes_max = 1024  # live processes one Hosts tracks; more: RuntimeError
netns_command_timeout_s = 10.0  # one `ip` command; slower: NetnsError
netns_process_exit_timeout_s = 10.0  # a SIGKILLed process is reaped within this

_check(netns_hosts_max <= 254, "every host's address fits the one /24 of its bridge")
_check(
    client_failover_stale_hint_s > zk_session_timeout_s + 4 * sequencer_election_check_s,
    "a client waits out a dead leader's session and an election before it believes "
    "a follower that still names it",
)
