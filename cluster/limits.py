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

# Epochs and batches
epoch_duration_ms_default = 10
batch_txns_max = 20_000  # a batch is cut early when it reaches this many txns
batch_bytes_max = 8 << 20

# Command log
segment_bytes_max = 64 << 20  # roll to a new segment file past this size
log_frame_bytes_max = 32 << 20  # a frame header claiming more is corruption

# Log service
log_service_epochs_per_reply_max = 256

# Replicas
peer_message_bytes_max = 32 << 20
result_backlog_txns_max = 1_000_000  # results awaiting other replicas' comparison

result_cache_txns_max = 200_000  # per reporting partition, for retries after a crash
sent_reads_txns_max = 1_000_000  # reads a partition keeps to resend to a restarted peer

# Dependent transactions
dependent_restarts_max = 5

# Traditional (2PL + 2PC baseline) mode, per coordinator partition
traditional_calls_max = pending_calls_max  # accepted, not yet answered; above: ERR_OVERLOADED
traditional_dedup_entries_max = pending_calls_max  # (client, request) -> answer, for retries

# Client
client_timeout_s_default = 30.0
client_in_flight_max = 50_000


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise RuntimeError(f"limits inconsistent: {what}")


_check(request_bytes_max < frame_bytes_hard_max, "request_bytes_max < frame_bytes_hard_max")
_check(batch_bytes_max <= log_frame_bytes_max, "a batch must fit in one log frame")
_check(batch_bytes_max <= peer_message_bytes_max, "a batch must fit in one peer message")
_check(log_frame_bytes_max <= segment_bytes_max, "a frame must fit in a segment")
_check(client_in_flight_max <= pending_calls_max, "one client cannot exceed the global bound")
_check(batch_txns_max <= pending_calls_max, "a batch is drawn from pending calls")
