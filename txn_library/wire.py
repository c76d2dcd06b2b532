"""Wire contract of the sequencer: client intake, batches, log service.

Positional msgpack arrays only. Every client frame is one ZeroMQ frame (after the
ROUTER identity); anything else is malformed and answered with an error.

Client -> sequencer (DEALER -> ROUTER):
  [REQ_CALLS, client_id(bytes<=64), [[req_id, proc_name, args], ...]]
      (client_id, req_id) identifies a call across retries: a call already logged is
      not executed again; its original result is returned.
  [REQ_STATUS]
Sequencer -> client:
  [REP_RESULTS, [[req_id, status, value], ...]]       (req_id None: frame-level error)
  [REP_STATUS, {...}]                                  (human-facing, a map)

  [REQ_CHECKPOINT]     flag the next batch (sent even if empty): every partition
                       checkpoints after it; reply [REP_OK, epoch]
  [REQ_PRUNE, archive_dir_or_None]   delete (or archive) log segments that every
                       partition's newest checkpoint has made unnecessary;
                       reply [REP_OK, [paths]] or an error

Batch (= one command-log frame = one PUB message body):
  [epoch, prev_epoch, first_txn_id, timestamp_ms, seed, txns, flags, prev_digest]
  flags: FLAG_CHECKPOINT = partitions checkpoint at the end of this epoch
  prev_digest: batch_digest() of the previous batch's bytes as logged (0 for epoch
      1), so every logged batch's bytes are vouched for by its successor: a batch
      changed after the fact, even with a valid frame CRC, is found at its exact
      epoch (executor.replay.history). Not cryptographic: it catches accidents and careless
      edits, not an adversary who rewrites the successors too. Absent in logs
      written before it existed (readers treat a 7-field batch as unchained).
  txn = [proc_name, args, participants, client_id, req_id]
  txn ids are consecutive from first_txn_id; epochs are consecutive from 1.

Publication (PUB -> SUB), two frames: [TOPIC_BATCH, batch] or
  [TOPIC_HEARTBEAT, [last_epoch]] so a receiver that missed the tail notices.

Log service (DEALER -> ROUTER):
  [LOG_FETCH, first_epoch, last_epoch]
  -> [LOG_BATCHES, [batch_bytes, ...], last_epoch_on_disk]   (at most a bounded chunk)
"""

from __future__ import annotations

from typing import Any

import msgpack
import xxhash

REQ_CALLS = 1
REQ_STATUS = 2
REQ_CHECKPOINT = 3
REQ_PRUNE = 4
REP_RESULTS = 11
REP_STATUS = 12
REP_OK = 13
REP_ERROR = 14

FLAG_CHECKPOINT = 1

TOPIC_BATCH = b"B"
TOPIC_HEARTBEAT = b"H"

LOG_FETCH = 21
LOG_BATCHES = 22

# Batch field positions
B_EPOCH, B_PREV, B_FIRST_TXN, B_TS, B_SEED, B_TXNS, B_FLAGS, B_PREV_DIGEST = range(8)
# Txn field positions
T_PROC, T_ARGS, T_PARTS, T_CLIENT, T_REQ = range(5)


def pack(msg: Any) -> bytes:
    return msgpack.packb(msg)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False)


def batch_digest(payload: bytes) -> int:
    """The digest a batch's successor records of the batch's logged bytes."""
    return xxhash.xxh3_64_intdigest(payload)
