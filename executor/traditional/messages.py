"""Wire contract of the traditional baseline: peer messages and 2PC log records.

Every peer message kind and every log record kind has a named type below (a
NamedTuple whose fields are the array's elements after the kind), built and read by
name at both ends; on the wire and in the log they stay positional msgpack arrays
``[kind, *fields]``, decoded with use_list=False (keys and rows arrive as tuples).

Peer messages. A turn's messages to one partition travel as one batch
``[from_partition, [msg, ...]]`` (``encode_batch`` / ``decode_batch``):
  [K_LOCK, aid, prio, n, op, table, key, mode]   LockRequest: lock (and for GET/SCAN
        read) at the owner; n counts the coordinator's requests to that participant
        from 0, so a participant that lost a branch (restart) refuses n > 0 instead of
        serving a branch that silently lost its earlier locks
  [K_LOCK_REPLY, aid, n, granted, data]           LockReply; data: row (GET),
        [[key,row],...] (SCAN)
  [K_PREPARE, aid, [[table, key, row|None], ...]] PrepareRequest, only to partitions
        with writes
  [K_VOTE, aid, vote]                             VoteReply: VOTE_YES / VOTE_NO
  [K_COMMIT, aid]    -> [K_ACK, aid]              CommitDecision -> CommitAck
  [K_ABORT, aid]     AbortDecision; also the release of a read-only branch (no reply)
  [K_QUERY, aid]     OutcomeQuery: an in-doubt participant asks its coordinator for
        the outcome
  [K_STATUS, status] StatusGossip (a PartitionStatus), so that every partition can
        answer ``ordo status``
  aid = (coordinator, seq), unique per attempt; prio = (start_us, coordinator, seq0).

Log records (presumed abort; one CommandLog frame per turn holds a list of them,
``pack_records`` / ``unpack_records``):
  [R_COMMIT,  aid, writes, client_id, req_id, value, digest]   CommitRecord: one
        writing site: commit
  [R_DECIDE,  aid, participants, writes, client_id, req_id, value, digest]
        DecideRecord: coordinator's commit decision, forced before COMMIT is sent;
        aborts are never logged
  [R_END,     aid]                               EndRecord: every participant
        acknowledged
  [R_PREPARE, aid, coordinator, prio, writes]    PrepareRecord: forced before voting YES
  [R_OUTCOME, aid, committed]                    OutcomeRecord: a prepared branch's
        outcome
  digest is absent in logs written before it existed (decoded as None).

Invariants: a message or record is either decoded whole into its named type or
refused whole (``decode_batch`` raises one of DECODE_ERRORS; the process server drops
such a batch); every record's first field is the aid of the attempt it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

from txn_library.errors import invariant
from txn_library.wire.messages import Family

Aid = tuple  # (coordinator, seq)
Prio = tuple  # (start_us, coordinator, seq of the first attempt)
Write = tuple  # (table, key, row | None)

# Peer message kinds
K_LOCK, K_LOCK_REPLY, K_PREPARE, K_VOTE, K_COMMIT, K_ABORT, K_ACK, K_QUERY, K_STATUS = range(1, 10)
OP_GET, OP_SCAN, OP_LOCK = 0, 1, 2
VOTE_YES, VOTE_NO = 0, 1
# Log record kinds
R_COMMIT, R_DECIDE, R_END, R_PREPARE, R_OUTCOME = range(1, 6)

# What decoding a peer batch can raise: msgpack's errors (bad bytes, extra data,
# depth) are ValueErrors or UnpackExceptions, an unhashable key or a wrong arity a
# TypeError; a shape or kind we do not know is a ValueError.
DECODE_ERRORS = (ValueError, TypeError, msgpack.UnpackException)


class PartitionStatus(NamedTuple):
    """One partition's row of ``ordo status``, gossiped to its peers (K_STATUS)."""

    partition: int
    committed: int
    state_hash: int
    active: int  # calls accepted, not yet answered (running or waiting for admission)
    branches: int  # branches of other coordinators' transactions held here
    aborted: int
    failed: int
    deaths: int
    in_doubt: int
    pid: int | None
    lock_waits: int = 0  # absent in rows of older versions
    blocked: int = 0


# Peer messages ---------------------------------------------------------------------------
class LockRequest(NamedTuple):
    """[K_LOCK, aid, prio, n, op, table, key, mode]"""

    aid: Aid
    prio: Prio
    n: int
    op: int
    table: str
    key: tuple
    mode: int


class LockReply(NamedTuple):
    """[K_LOCK_REPLY, aid, n, granted, data]"""

    aid: Aid
    n: int
    granted: bool
    data: Any


class PrepareRequest(NamedTuple):
    """[K_PREPARE, aid, writes]"""

    aid: Aid
    writes: Sequence[Write]


class VoteReply(NamedTuple):
    """[K_VOTE, aid, vote]"""

    aid: Aid
    vote: int


class CommitDecision(NamedTuple):
    """[K_COMMIT, aid]"""

    aid: Aid


class AbortDecision(NamedTuple):
    """[K_ABORT, aid]"""

    aid: Aid


class CommitAck(NamedTuple):
    """[K_ACK, aid]"""

    aid: Aid


class OutcomeQuery(NamedTuple):
    """[K_QUERY, aid]"""

    aid: Aid


class StatusGossip(NamedTuple):
    """[K_STATUS, status]"""

    status: PartitionStatus


PeerMessage = (
    LockRequest
    | LockReply
    | PrepareRequest
    | VoteReply
    | CommitDecision
    | AbortDecision
    | CommitAck
    | OutcomeQuery
    | StatusGossip
)

PEER = Family(
    {
        LockRequest: K_LOCK,
        LockReply: K_LOCK_REPLY,
        PrepareRequest: K_PREPARE,
        VoteReply: K_VOTE,
        CommitDecision: K_COMMIT,
        AbortDecision: K_ABORT,
        CommitAck: K_ACK,
        OutcomeQuery: K_QUERY,
        StatusGossip: K_STATUS,
    }
)


# Log records -----------------------------------------------------------------------------
class CommitRecord(NamedTuple):
    """[R_COMMIT, aid, writes, client_id, req_id, value, digest]"""

    aid: Aid
    writes: tuple[Write, ...]
    client_id: bytes
    req_id: int
    value: Any
    digest: int | None = None


class DecideRecord(NamedTuple):
    """[R_DECIDE, aid, participants, writes, client_id, req_id, value, digest]"""

    aid: Aid
    participants: tuple[int, ...]
    writes: tuple[Write, ...]
    client_id: bytes
    req_id: int
    value: Any
    digest: int | None = None


class EndRecord(NamedTuple):
    """[R_END, aid]"""

    aid: Aid


class PrepareRecord(NamedTuple):
    """[R_PREPARE, aid, coordinator, prio, writes]"""

    aid: Aid
    coordinator: int
    prio: Prio
    writes: Sequence[Write]


class OutcomeRecord(NamedTuple):
    """[R_OUTCOME, aid, committed]"""

    aid: Aid
    committed: bool


LogRecord = CommitRecord | DecideRecord | EndRecord | PrepareRecord | OutcomeRecord

RECORDS = Family(
    {
        CommitRecord: R_COMMIT,
        DecideRecord: R_DECIDE,
        EndRecord: R_END,
        PrepareRecord: R_PREPARE,
        OutcomeRecord: R_OUTCOME,
    }
)


# Encoding --------------------------------------------------------------------------------
def message(msg: PeerMessage) -> tuple:
    """``[kind, *fields]``: the positional array a named peer message travels as."""
    return PEER.array(msg)


def decode_message(m: Any) -> PeerMessage:
    """The named type of one positional peer message; raises one of DECODE_ERRORS."""
    msg: PeerMessage = PEER.named(m)
    if isinstance(msg, StatusGossip):
        if not isinstance(msg.status, tuple):
            raise ValueError("a status is [K_STATUS, [field, ...]]")
        return StatusGossip(PartitionStatus(*msg.status))  # a wrong arity is a TypeError
    return msg


def encode_batch(src: int, msgs: Sequence[PeerMessage]) -> bytes:
    """One turn's messages to one partition: ``[from_partition, [msg, ...]]``."""
    return msgpack.packb((src, [message(m) for m in msgs]))


def decode_batch(data: bytes) -> tuple[int, list[PeerMessage]]:
    """(from_partition, messages) of a batch; raises one of DECODE_ERRORS."""
    batch = msgpack.unpackb(data, use_list=False)
    if not (isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], tuple)):
        raise ValueError("a batch is [from_partition, [message, ...]]")
    src, msgs = batch
    if type(src) is not int:
        raise ValueError(f"from unknown partition {src!r}")
    return src, [decode_message(m) for m in msgs]


def record(rec: LogRecord) -> tuple:
    """``[kind, *fields]``: the positional array a named log record is stored as."""
    return RECORDS.array(rec)


def pack_records(records: Sequence[LogRecord]) -> bytes:
    """One turn's log records as one CommandLog frame."""
    return msgpack.packb([record(r) for r in records])


def unpack_records(frame: bytes) -> list[LogRecord]:
    """The records of one frame (trusted bytes: the log's CRC vouches for them)."""
    out: list[LogRecord] = []
    for r in msgpack.unpackb(frame, use_list=False):
        try:
            out.append(RECORDS.named(r))
        except ValueError as e:
            invariant(False, f"unreadable log record: {e}")
    return out
