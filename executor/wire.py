"""Wire contract of the executor role: messages partitions send and receive.

All messages are positional msgpack arrays (never maps); decoding uses
``use_list=False`` so keys and rows arrive as tuples, ready to be dict keys.

Inbound on a partition's PULL socket (from peers of the same replica, and from the
sequencer):
  [MSG_READS, from_partition, [[txn_id, exact, prefixes], ...]]
      exact    = [[table, key, row_or_None], ...]      local reads of a multi-partition txn
      prefixes = [[table, prefix, [[key, row], ...]], ...]
  [MSG_QUERY, replica, [[query_id, proc_name, args, min_txn_id], ...]]
      unsequenced read-only calls (and reconnaissance reads of dependent txns);
      executed once every txn with id <= min_txn_id that touches this partition is done.
  [MSG_STATUS_REQUEST]
  [MSG_RESEND, from_partition, first_txn_id]
      a restarted peer replays from first_txn_id: send it again every retained read
      it needs (reads sent to its previous incarnation were lost with it)
  [MSG_RESEND_GAP, from_partition, oldest_retained_txn_id]
      the peer no longer retains reads that far back

Outbound to the sequencer's results PULL socket:
  [MSG_RESULTS, replica, partition, results, query_results, status]
      results       = [[txn_id, status, value], ...]   (one partition per replica reports a txn)
      query_results = [[query_id, status, value], ...]
      status        = [last_epoch, txns_applied, state_hash, active_txns, next_txn_id,
                       newest_checkpoint_epoch, boundary_epoch, boundary_hash, catching_up,
                       pid]
      boundary_* is the state hash at the end of the last checkpoint-flagged epoch
      applied: comparable across replicas (the sequencer compares them).

A query whose proc_name is RESULT_LOOKUP with args (txn_id,) asks the reporting
partition for a past txn's result (exactly-once retries after a sequencer restart).
"""

from __future__ import annotations

from typing import Any

import msgpack

MSG_READS = 1
MSG_QUERY = 2
MSG_STATUS_REQUEST = 3
MSG_RESEND = 4
MSG_RESEND_GAP = 5
MSG_RESULTS = 10

RESULT_LOOKUP = "__result__"


def pack(msg: Any) -> bytes:
    return msgpack.packb(msg)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False)
