"""The checkpoint files: their names, the header, rows and footer frames, the header as
read (``CheckpointInfo``) and the error every reader raises (``CheckpointInvalid``).

Files (in the replica's checkpoint directory; one partition's files never depend on
another's):
  ``{epoch:012d}-p{partition}.ckpt``  a checkpoint of the state at the end of epoch:
      base   every row of the partition's *partitioned* tables;
      delta  only the rows of keys written since its parent (the partition's previous
             written checkpoint), a deleted key as a row of None. The state at a delta
             is its base plus every delta of the chain up to it, in order.
  ``static-p{partition}-{static_hash:016x}.ckpt``  the replicated tables (TPC-C ITEM):
      written after genesis never change, so they are written once, named by their
      hash, and referenced by every checkpoint's ``static_hash`` (0: none).

Each file is a sequence of frames in the command log's frame encoding (``<II`` length
+ CRC32C, then payload; see sequencer.log.encode_frame):
  frame 0     header  [MAGIC, VERSION, replica, partition, partitions, epoch,
                       next_txn_id, txns_applied, state_hash, static_hash, created_ms,
                       kind, parent_epoch, parent_state_hash, base_epoch, depth, rows,
                       base_rows, chain_rows, previous_epoch]
              (previous_epoch: the partition's previous written checkpoint, whatever its
              kind, 0 if none, -1 if the writer did not say; a boundary between the two
              was not written by this partition: its writer was busy or failed. Replay
              tooling tells such a gap from a lost file.)
  frames 1..n rows    b"R", then msgpack([table, [n keys], [positions of deleted
                       rows], [n rows as bin]]): each row is exactly the bytes
                       msgpack([table, key, row]), which the state hash digests, so a
                       loader hashes the bytes it read instead of packing rows again, and
                       one unpacking of the frame gives keys and each row's bytes
                       without decoding a row (rows stay pending in the Storage until
                       read). A key is checked against its row wherever the row is
                       decoded (``pending.fault``, a full check's ``_decode_rows``).
                       (Version 2 frames, still read: b"R", u32 n, n x u32 lengths, then
                       a msgpack array of the n rows; no keys: rows are decoded.)
                       At most ROWS_PER_FRAME rows of ONE table, cut once the frame
                       holds limits.checkpoint_frame_bytes_max bytes (a frame stays under
                       log_frame_bytes_max whatever the rows). Tables in name order;
                       a base's rows in the storage's dict order (the same on replicas
                       that executed the same history; a restored one may differ: the
                       rows and the hash are the same, the bytes of the file need not
                       be), the static file's keys sorted; a delta's rows are the bytes
                       its transactions packed (Storage.track_changes), in the order
                       first written since its parent.
  frames      answers b"A", then msgpack([[txn_id, status, value], ...]): the partition's
              most recent answers to its callers (at most limits.checkpoint_answers_max,
              each frame under limits.checkpoint_frame_bytes_max), oldest first, after
              the rows frames (version 4). A partition restarted from this checkpoint
              answers a client's retry of a transaction it ran before the boundary
              whose answer the crash lost (the answer is the logged input's, not
              state: the hash and the row count ignore these frames).
  last frame  footer  [END, rows, state_hash] (the static file: its static hash)

Readers take every version in ``_VERSIONS``; writers write ``VERSION``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from executor.core.checkpoint.plan import ChainTip
from sequencer.log import encode_frame

MAGIC = "ORDO-CKPT"
END = "END"
VERSION = 4
# read; version 2's rows frames carry no keys (its rows are decoded); versions 2 and 3
# carry no answers frames
_VERSIONS = (2, 3, 4)
BASE, DELTA, STATIC = "base", "delta", "static"


_HEADER_FIELDS = 20
_ROWS_TAG = b"R"
_ANSWERS_TAG = b"A"
# An answer a checkpoint carries: (txn_id, status, value) as the partition reported it.
Answer = tuple[int, int, Any]
NAME_RE = re.compile(r"(\d{12})-p(\d+)\.ckpt")  # a checkpoint file: (epoch, partition)
_STATIC_NAME = re.compile(r"static-p(\d+)-([0-9a-f]{16})\.ckpt")
SKIP_NAME_RE = re.compile(r"(\d{12})-p(\d+)\.skipped")  # a skip marker: (epoch, partition)
_digest = xxhash.xxh3_64_intdigest
_ARRAY_HEADER = msgpack.Packer().pack_array_header
_MASK64 = (1 << 64) - 1
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


class CheckpointInvalid(Exception):
    """A checkpoint file is torn, corrupt or inconsistent; skip it.

    ``epoch`` is the epoch of the file at fault (a delta's chain may fail at an older
    file; a static tables file is charged to the base that references it), None if
    unknown.
    """

    def __init__(self, message: str, epoch: int | None = None) -> None:
        super().__init__(message)
        self.epoch = epoch

    def __reduce__(self) -> tuple[type[CheckpointInvalid], tuple[str, int | None]]:
        return (type(self), (str(self), self.epoch))  # Spark pickles task exceptions


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    replica: int
    partition: int
    partitions: int
    epoch: int
    next_txn_id: int
    txns_applied: int
    state_hash: int
    static_hash: int
    created_ms: int
    kind: str = BASE
    parent_epoch: int = 0
    parent_state_hash: int = 0
    base_epoch: int = 0
    depth: int = 0
    rows: int = 0  # rows in this file
    base_rows: int = 0
    chain_rows: int = 0
    previous_epoch: int = -1  # this partition's previous written checkpoint (0: none, -1: ?)
    version: int = VERSION  # the file's format (2: rows frames without keys)

    @property
    def tip(self) -> ChainTip:
        return ChainTip(
            self.epoch,
            self.state_hash,
            self.static_hash,
            self.base_epoch,
            self.depth,
            self.base_rows,
            self.chain_rows,
        )


def checkpoint_name(epoch: int, partition: int) -> str:
    return f"{epoch:012d}-p{partition}.ckpt"


def static_name(partition: int, static_hash: int) -> str:
    return f"static-p{partition}-{static_hash:016x}.ckpt"


def skip_name(epoch: int, partition: int) -> str:
    return f"{epoch:012d}-p{partition}.skipped"


# a writer's temp file: a checkpoint's, a skip marker's or a static file's (its partition)
_TEMP_NAME = re.compile(
    r"(?:\d{12}-p(\d+)\.(?:ckpt|skipped)|static-p(\d+)-[0-9a-f]{16}\.ckpt)\.tmp"
)


def _rows_frame(
    packer: msgpack.Packer, table: str, keys: list[tuple], deleted: list[int], parts: list[bytes]
) -> bytes:
    return encode_frame(_ROWS_TAG + packer.pack((table, keys, deleted, parts)))


def _header_list(
    replica: int,
    partition: int,
    partitions: int,
    epoch: int,
    next_txn_id: int,
    txns_applied: int,
    state_hash: int,
    static_hash: int,
    kind: str,
    parent: ChainTip | None,
    tip: ChainTip | None,
    rows: int,
    previous_epoch: int = -1,
) -> list[Any]:
    """The header frame's fields (a static tables file has neither parent nor tip)."""
    link = (0, 0) if parent is None else (parent.epoch, parent.state_hash)
    chain = (0, 0, 0, 0)
    if tip is not None:
        chain = (tip.base_epoch, tip.depth, tip.base_rows, tip.chain_rows)
    return [
        MAGIC,
        VERSION,
        replica,
        partition,
        partitions,
        epoch,
        next_txn_id,
        txns_applied,
        state_hash,
        static_hash,
        int(time.time() * 1000),
        kind,
        link[0],
        link[1],
        chain[0],
        chain[1],
        rows,
        chain[2],
        chain[3],
        previous_epoch,
    ]
