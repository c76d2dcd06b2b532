"""Wire contract of the executor role: messages partitions send and receive.

All messages are positional msgpack arrays (never maps); decoding uses
``use_list=False`` so keys and rows arrive as tuples, ready to be dict keys. Every
kind has a named type below (the fields after the kind); ``encode`` writes
``[kind, *fields]`` and ``decode_inbound`` returns the named type.

Inbound on a partition's PULL socket (from peers of the same replica, and from the
sequencer):
  [MSG_READS, from_partition, [[txn_id, exact, prefixes], ...]]
      exact    = [[table, key, row_or_None], ...]      local reads of a multi-partition txn
      prefixes = [[table, prefix, [[key, row], ...]], ...]
  [MSG_QUERY, replica, [[query_id, replica_tag, proc_name, args, min_txn_id], ...]]
      unsequenced read-only calls (and reconnaissance reads of dependent txns);
      executed once every txn with id <= min_txn_id that touches this partition is done.
  [MSG_STATUS_REQUEST]
  [MSG_RESEND, from_partition, first_txn_id]
      a restarted peer replays from first_txn_id: send it again every retained read
      it needs (reads sent to its previous incarnation were lost with it)
  [MSG_RESEND_GAP, from_partition, oldest_retained_txn_id]
      the peer no longer retains reads that far back
  [MSG_QUERY_READS, from_partition, query_id, proc_name, args, epoch(, after_epoch)]
      a snapshot query's coordinator asks a participant for its reads of the
      query's footprint at ``epoch`` (-1: its state now, read committed; with
      ``after_epoch``, read committed once that epoch is completed there)
  [MSG_QUERY_READS_REPLY, from_partition, query_id, status, exact, prefixes]
      the answer: status OK with the reads (exact/prefixes as in MSG_READS), or
      ERROR with [code, message] in ``exact``
  [MSG_WATERMARK, from_partition, completed_epoch]
      every local transaction of epochs <= completed_epoch has finished there
      (a snapshot query across partitions reads at the smallest of theirs)
  [MSG_READS_FLOOR, from_partition, txn_id]
      from_partition will never ask for reads of txns before txn_id again: its oldest
      kept checkpoint starts there (sent after each of its checkpoints, and to a peer
      that restarted); reads sent to it for older txns may be forgotten

Outbound to the sequencer's results PULL socket:
  [MSG_RESULTS, replica, partition, results, query_results, status]
      results       = [[txn_id, status, msgpack(value)], ...]   (one partition per replica
                       reports a txn; the value packed once, by the partition)
      query_results = [[query_id, replica_tag, status, value], ...]
      status        = PartitionStatus (below: one record, 15 fields, positional on
                       the wire)
      boundary_* is the state hash at the end of the last checkpoint-flagged epoch
      applied: comparable across replicas (the sequencer compares them).

A query whose proc_name is RESULT_LOOKUP with args (txn_id,) asks the reporting
partition for a past txn's result (exactly-once retries after a sequencer restart).

Invariant: a partition hands an inbound message to its role only after
``decode_inbound`` accepted it: it decodes, its kind is known, and every field has
the shape and type written above (ids are ints, never bools; tables are str; keys
are tuples of scalars, so they can be dict keys). Anything else is dropped whole,
never half-applied; reads for a partition that is not a peer are the role's to
refuse. Row *contents* are not checked: they only reach procedure bodies, whose
failures are results (executor.core.execution).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

from txn_library.wire.messages import Family


class PartitionStatus(NamedTuple):
    """What a partition reports with every results message (and at least every 0.2 s)."""

    last_epoch: int  # the last batch admitted (applied in order)
    txns_applied: int
    state_hash: int
    active_txns: int
    next_txn_id: int
    newest_checkpoint_epoch: int  # durable: renamed and its directory fsynced
    boundary_epoch: int  # the last checkpoint-flagged epoch applied ...
    boundary_hash: int  # ... and the state hash there (compared across replicas)
    catching_up: bool  # recovering from the log, not live yet
    pid: int
    lock_waits: int  # lock requests that had to queue, so far
    txn_waits: int  # admissions that waited for a lock, so far
    blocked: int  # transactions waiting for locks now
    bypassed: int  # transactions run on the uncontended fast path, so far
    checkpoint_writing: int  # the boundary whose file is being written now (-1: none)


MSG_READS = 1
MSG_QUERY = 2
MSG_STATUS_REQUEST = 3
MSG_RESEND = 4
MSG_RESEND_GAP = 5
MSG_READS_FLOOR = 6
MSG_QUERY_READS = 7
MSG_QUERY_READS_REPLY = 8
MSG_WATERMARK = 9
MSG_RESULTS = 10

RESULT_LOOKUP = "__result__"


class Reads(NamedTuple):
    """[MSG_READS, from_partition, [[txn_id, exact, prefixes], ...]]"""

    from_partition: int
    entries: Sequence[Any]


class QueryCall(NamedTuple):
    """One unsequenced read-only call of a MSG_QUERY."""

    query_id: int
    replica_tag: int
    proc: str
    args: tuple
    min_txn_id: int


class Query(NamedTuple):
    """[MSG_QUERY, replica, [QueryCall, ...]]"""

    replica: int
    calls: Sequence[Any]


class StatusRequest(NamedTuple):
    """[MSG_STATUS_REQUEST]"""


class Resend(NamedTuple):
    """[MSG_RESEND, from_partition, first_txn_id]"""

    from_partition: int
    first_txn_id: int


class ResendGap(NamedTuple):
    """[MSG_RESEND_GAP, from_partition, oldest_retained_txn_id]"""

    from_partition: int
    oldest_retained_txn_id: int


class ReadsFloor(NamedTuple):
    """[MSG_READS_FLOOR, from_partition, txn_id]"""

    from_partition: int
    txn_id: int


class QueryReads(NamedTuple):
    """[MSG_QUERY_READS, from_partition, query_id, proc_name, args, epoch(, after_epoch)]
    (``after_epoch``: read committed reads only once this epoch is completed here; 0,
    or absent: now)"""

    from_partition: int
    query_id: int
    proc_name: str
    args: tuple
    epoch: int
    after_epoch: int = 0


class QueryReadsReply(NamedTuple):
    """[MSG_QUERY_READS_REPLY, from_partition, query_id, status, exact, prefixes]"""

    from_partition: int
    query_id: int
    status: int
    exact: Any
    prefixes: Any


class Watermark(NamedTuple):
    """[MSG_WATERMARK, from_partition, completed_epoch]"""

    from_partition: int
    completed_epoch: int


class Results(NamedTuple):
    """[MSG_RESULTS, replica, partition, results, query_results, status]

    ``results``: ``[txn_id, status, msgpack(value)]`` each; the value is packed once, by
    the partition, and the sequencer compares, keeps and forwards those bytes
    (txn_library.wire.sequencer.Packed). ``query_results``: ``[query_id, tag, status, value]``."""

    replica: int
    partition: int
    results: Sequence[Any]
    query_results: Sequence[Any]
    status: PartitionStatus | tuple


Inbound = (
    Reads
    | Query
    | StatusRequest
    | Resend
    | ResendGap
    | ReadsFloor
    | QueryReads
    | QueryReadsReply
    | Watermark
)

MESSAGES = Family(
    {
        Reads: MSG_READS,
        Query: MSG_QUERY,
        StatusRequest: MSG_STATUS_REQUEST,
        Resend: MSG_RESEND,
        ResendGap: MSG_RESEND_GAP,
        ReadsFloor: MSG_READS_FLOOR,
        QueryReads: MSG_QUERY_READS,
        QueryReadsReply: MSG_QUERY_READS_REPLY,
        Watermark: MSG_WATERMARK,
        Results: MSG_RESULTS,
    }
)
encode = MESSAGES.encode


def results_message(
    replica: int,
    partition: int,
    results: Sequence[tuple[int, int, Any, bytes]],
    query_results: Sequence[Any],
    status: PartitionStatus | tuple,
) -> bytes:
    """A partition's Results, encoded, from its ``(txn_id, status, value, packed value)``
    results: each value travels as the bytes run_body packed it to (once, while it was
    in cache), never packed again."""
    packed = [(txn_id, st, data) for txn_id, st, _value, data in results]
    return encode(Results(replica, partition, packed, query_results, status))


def pack(msg: Any) -> bytes:
    return msgpack.packb(msg)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False)


# Inbound validation -------------------------------------------------------------
_KEY_SCALARS = frozenset((int, str, bytes, float, bool, type(None)))


def _is_int(x: Any) -> bool:
    return type(x) is int


def _is_key(x: Any) -> bool:
    """A tuple of scalars: hashable, so usable in the role's dicts."""
    return type(x) is tuple and all(type(p) in _KEY_SCALARS for p in x)


def _is_array(x: Any, width: int) -> bool:
    return type(x) is tuple and len(x) == width


def _exact_problem(exact: Any) -> str | None:
    if type(exact) is not tuple:
        return "exact reads are not an array"
    for r in exact:
        if not (_is_array(r, 3) and type(r[0]) is str and _is_key(r[1])):
            return "an exact read is not [table, key, row]"
    return None


def _prefixes_problem(prefixes: Any) -> str | None:
    if type(prefixes) is not tuple:
        return "prefix reads are not an array"
    for r in prefixes:
        if not (_is_array(r, 3) and type(r[0]) is str and _is_key(r[1])):
            return "a prefix read is not [table, prefix, rows]"
        rows = r[2]
        if type(rows) is not tuple or not all(_is_array(kv, 2) and _is_key(kv[0]) for kv in rows):
            return "a prefix read's rows are not [[key, row], ...]"
    return None


def reads_problem(msg: tuple) -> str | None:
    """[MSG_READS, from_partition, [[txn_id, exact, prefixes], ...]]"""
    if not (len(msg) == 3 and _is_int(msg[1]) and type(msg[2]) is tuple):
        return "reads: not [kind, from_partition, entries]"
    for entry in msg[2]:
        if not (_is_array(entry, 3) and _is_int(entry[0])):
            return "reads: an entry is not [txn_id, exact, prefixes]"
        problem = _exact_problem(entry[1]) or _prefixes_problem(entry[2])
        if problem is not None:
            return f"reads: {problem}"
    return None


def query_problem(msg: tuple) -> str | None:
    """[MSG_QUERY, replica, [[query_id, replica_tag, proc_name, args, min_txn_id], ...]]"""
    if not (len(msg) == 3 and _is_int(msg[1]) and type(msg[2]) is tuple):
        return "query: not [kind, replica, queries]"
    for q in msg[2]:
        if not (
            _is_array(q, 5)
            and _is_int(q[0])
            and _is_int(q[1])
            and type(q[2]) is str
            and type(q[3]) is tuple
            and _is_int(q[4])
        ):
            return "query: not [query_id, replica_tag, proc_name, args, min_txn_id]"
    return None


def resend_problem(msg: tuple) -> str | None:
    """[MSG_RESEND, MSG_RESEND_GAP or MSG_READS_FLOOR, from_partition, txn_id]"""
    if not (len(msg) == 3 and _is_int(msg[1]) and _is_int(msg[2])):
        return "resend: not [kind, from_partition, txn_id]"
    return None


def query_reads_problem(msg: tuple) -> str | None:
    """[MSG_QUERY_READS, from_partition, query_id, proc_name, args, epoch(, after_epoch)]"""
    if not (
        len(msg) in (6, 7)
        and _is_int(msg[1])
        and _is_int(msg[2])
        and type(msg[3]) is str
        and type(msg[4]) is tuple
        and _is_int(msg[5])
        and (len(msg) == 6 or _is_int(msg[6]))
    ):
        return (
            "query reads: not [kind, from_partition, query_id, proc_name, args, epoch"
            "(, after_epoch)]"
        )
    return None


def query_reads_reply_problem(msg: tuple) -> str | None:
    """[MSG_QUERY_READS_REPLY, from_partition, query_id, status, exact, prefixes]"""
    if not (len(msg) == 6 and _is_int(msg[1]) and _is_int(msg[2]) and _is_int(msg[3])):
        return "query reads reply: not [kind, from_partition, query_id, status, exact, prefixes]"
    if msg[3] == 0:  # OK: reads shaped as a MSG_READS entry's
        problem = _exact_problem(msg[4]) or _prefixes_problem(msg[5])
        if problem is not None:
            return f"query reads reply: {problem}"
    elif not (_is_array(msg[4], 2) and type(msg[4][0]) is str and type(msg[4][1]) is str):
        return "query reads reply: an error is [code, message]"
    return None


def watermark_problem(msg: tuple) -> str | None:
    """[MSG_WATERMARK, from_partition, completed_epoch]"""
    if not (len(msg) == 3 and _is_int(msg[1]) and _is_int(msg[2])):
        return "watermark: not [kind, from_partition, completed_epoch]"
    return None


def status_request_problem(msg: tuple) -> str | None:
    """[MSG_STATUS_REQUEST]"""
    return None if len(msg) == 1 else "status request: not [kind]"


_INBOUND_CHECKS = {
    MSG_READS: reads_problem,
    MSG_QUERY: query_problem,
    MSG_STATUS_REQUEST: status_request_problem,
    MSG_RESEND: resend_problem,
    MSG_RESEND_GAP: resend_problem,
    MSG_READS_FLOOR: resend_problem,
    MSG_QUERY_READS: query_reads_problem,
    MSG_QUERY_READS_REPLY: query_reads_reply_problem,
    MSG_WATERMARK: watermark_problem,
}


def decode_inbound(data: bytes) -> tuple[Inbound | None, str | None]:
    """(message, None) if ``data`` is a well-formed inbound message, else (None, why)."""
    try:
        msg = unpack(data)
    except (ValueError, msgpack.UnpackException) as e:  # every msgpack decode failure
        return None, f"not msgpack ({type(e).__name__})"
    if type(msg) is not tuple or not msg or not _is_int(msg[0]):
        return None, "not an array starting with a message kind"
    check = _INBOUND_CHECKS.get(msg[0])
    if check is None:
        return None, f"unknown message kind {msg[0]}"
    problem = check(msg)
    if problem is not None:
        return None, problem
    named: Inbound = MESSAGES.named(msg)
    return named, None
