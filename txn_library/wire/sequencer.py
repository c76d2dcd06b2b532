"""Wire contract of the sequencer: client intake, batches, log service.

Positional msgpack arrays only; every message kind has a named type below (a
NamedTuple whose fields are the array's elements after the kind), built and read by
name at both ends. ``encode(msg)`` writes ``[kind, *fields]``; a batch and its txns
have no kind (they are the log's records) and are packed as they are.

Every client frame is one ZeroMQ frame (after the ROUTER identity); anything else is
malformed and answered with an error.

Client -> sequencer (DEALER -> ROUTER):
  [REQ_CALLS, client_id(bytes<=64), [[req_id, proc_name, args], ...]]
      (client_id, req_id) identifies a call across retries: a call already logged is
      not executed again; its original result is returned. A connection's calls are
      sequenced in the order it sent them.
  [REQ_CALLS_UNORDERED, client_id, [[req_id, proc_name, args], ...]]
      the same, for calls that need no order among themselves or with the
      connection's other calls in flight (independent users multiplexed on one
      connection, as a load generator's terminals): within an epoch the sequencer
      may run them in any order (sequencer.batch_order).
  [REQ_STATUS]
  [REQ_CLUSTER_INFO]   where queries go (any sequencer answers, followers too)
Sequencer -> client:
  [REP_RESULTS, [[req_id, status, value], ...](, [epoch, ...](, term))]
      (req_id None: frame-level error). The trailing array, present when any entry's
      call was sequenced, gives each entry's epoch in the same order: the batch its
      call was committed in (0: not sequenced: an error, a read answered through a
      partition's lock manager). A client keeps the highest as its read-your-writes
      token (``QueryRequest``'s after_epoch). A trailer rather than a fourth field per
      entry, so that a reader of the two-field reply (older clients, scripts) reads
      it unchanged. A replicated cluster's leader adds its term after the epochs
      (then present, 0 where not sequenced): a client learns the current term from
      every answer, not only from followers (``results_term``).
      A call a sequencer does not sequence because it does not lead gets status
      ERROR and the value [ERR_NOT_LEADER, hint, term] (``NotLeaderAnswer``): hint,
      the client address of the sequencer it believes leads ("": none known; a
      deposed leader's answer carries its reason there, naming no address); term,
      the leader term it believes current (absent or -1: none given). A client
      follows the highest term it has seen (txn_library.client.failover).
  [REP_STATUS, {...}]                                  (human-facing, a map)
  [REP_CLUSTER_INFO, {"partitions": [[addr, ...], ...], "readers": [addr, ...],
                      "partition_keys": [[key, ...], ...] | None,
                      "reader_keys": [key, ...] | None,
                      "replica_versions": bool}]
      every partition's query address [replica][partition], every reader's, on a
      CURVE cluster their public keys (Z85; never a secret), and whether the
      replicas keep row versions (optional, default true: without, a replica answers
      a snapshot only at its completed epoch). A client reads it with
      ``cluster_info`` and refuses anything else.

  [REQ_CHECKPOINT]     flag the next batch (sent even if empty): every partition
                       checkpoints after it; reply [REP_OK, epoch]
  [REQ_PRUNE, archive_dir_or_None]   delete (or archive) log segments that every
                       partition's newest checkpoint has made unnecessary;
                       reply [REP_OK, [paths]] or an error

Batch (= one command-log frame = one PUB message body):
  [epoch, prev_epoch, first_txn_id, timestamp_ms, seed, txns, flags, prev_digest, term,
   derived]
  flags: FLAG_CHECKPOINT = partitions checkpoint at the end of this epoch;
      FLAG_CHECKPOINT_REQUESTED (with it) = a client asked for this one (ordo
      checkpoint, ordo dump): a partition whose previous checkpoint is still being
      written finishes that one first, at full speed, instead of skipping this
      boundary, so every partition of every replica writes it; FLAG_DEPLOY = the batch
      holds ``ordo.deploy`` calls: every reader of the batch installs their modules,
      whose procedures run from the next epoch on (txn_library.deployed)
  prev_digest: batch_digest() of the previous batch's bytes as logged (0 for epoch
      1), so every logged batch's bytes are vouched for by its successor: a batch
      changed after the fact, even with a valid frame CRC, is found at its exact
      epoch (executor.replay.batches). Not cryptographic: it catches accidents and careless
      edits, not an adversary who rewrites the successors too. Absent in logs
      written before it existed (readers treat a 7-field batch as unchained).
  term: the leader term of the sequencer that committed the batch (0: a single
      sequencer without ZooKeeper). Terms never decrease along the log; a partition
      ignores a *published* batch of a term older than one it has seen
      (sequencer.replication). Absent (0) in logs written before it existed.
  derived: with FLAG_DERIVED_UNLOGGED (weak recovery of dataflows), how many
      transactions the batch's pushes derive, which are not logged: every reader
      appends them after the logged txns (txn_library.streams.batch_txns), so txn ids
      run to first_txn_id + len(txns) + derived. 0 otherwise (strong recovery logs
      them among txns), and absent (0) in logs written before dataflows existed.
  txn = [proc_name, args, participants, client_id, req_id]
  txn ids are consecutive from first_txn_id; epochs are consecutive from 1.

Publication (PUB -> SUB), two frames: [TOPIC_BATCH, batch] or
  [TOPIC_HEARTBEAT, [last_epoch, term, leader]] so a receiver that missed the tail
  notices, and learns which sequencer leads (results go there).

Log service (DEALER -> ROUTER):
  [LOG_FETCH, first_epoch, last_epoch]
  -> [LOG_BATCHES, [batch_bytes, ...], last_epoch_on_disk]   (at most a bounded chunk)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack
import xxhash

from txn_library import limits
from txn_library.errors import ERR_NOT_LEADER
from txn_library.wire.curve import is_z85_key
from txn_library.wire.messages import Family

REQ_CALLS = 1
REQ_STATUS = 2
REQ_CHECKPOINT = 3
REQ_PRUNE = 4
REQ_CALLS_UNORDERED = 5
REQ_QUERY = 6  # to a partition's query socket (docs/QUERIES.md)
REQ_CLUSTER_INFO = 7
CALLS_KINDS = (REQ_CALLS, REQ_CALLS_UNORDERED)  # request kinds that carry calls
REP_RESULTS = 11
REP_STATUS = 12
REP_OK = 13
REP_ERROR = 14
REP_QUERY = 15
REP_CLUSTER_INFO = 16

FLAG_CHECKPOINT = 1
FLAG_CHECKPOINT_REQUESTED = 2  # always with FLAG_CHECKPOINT: written, never skipped
FLAG_DERIVED_UNLOGGED = 4  # weak recovery: readers derive the dataflow steps (``derived``)
FLAG_DEPLOY = 8  # holds ``ordo.deploy`` calls: readers install them (txn_library.deployed)

TOPIC_BATCH = b"B"
TOPIC_HEARTBEAT = b"H"

LOG_FETCH = 21
LOG_BATCHES = 22


class Txn(NamedTuple):
    """One sequenced call in a batch; its txn id is the batch's first_txn_id + index."""

    proc: str
    args: tuple
    participants: tuple[int, ...]  # partitions it touches, ascending
    client_id: bytes  # b"" for calls the sequencer made itself
    req_id: Any


class Batch(NamedTuple):
    """One epoch: a command-log frame and a PUB message body."""

    epoch: int
    prev_epoch: int
    first_txn_id: int
    timestamp_ms: int
    seed: int
    txns: tuple[Txn, ...]
    flags: int = 0
    prev_digest: int | None = None  # None: not chained (logs written before the chain)
    term: int = 0  # leader term that committed it; 0: single sequencer (or older logs)
    # Weak recovery (FLAG_DERIVED_UNLOGGED): the transactions its pushes derive, which
    # every reader appends (txn_library.streams.batch_txns); else 0.
    derived: int = 0

    @property
    def next_txn_id(self) -> int:
        return self.first_txn_id + len(self.txns) + self.derived


def decode_batch(data: bytes) -> Batch:
    """A logged or published batch, fields and txns by name (trusted bytes: the log's
    CRC vouches for them; replay checks shapes with ``batch_problem`` first)."""
    return named_batch(unpack(data))


def named_batch(raw: tuple) -> Batch:
    """A decoded batch array as a Batch (a 7-field batch of an unchained log has
    prev_digest None, a batch without a term has term 0; txns of 3 fields, from before
    client ids were logged, get none)."""
    txns = tuple(Txn._make(t if len(t) == 5 else (*t[:3], b"", None)) for t in raw[5])
    prev_digest = raw[7] if len(raw) > 7 else None
    term = raw[8] if len(raw) > 8 else 0
    flags = raw[6] if len(raw) > 6 else 0
    derived = raw[9] if len(raw) > 9 else 0
    return Batch(raw[0], raw[1], raw[2], raw[3], raw[4], txns, flags, prev_digest, term, derived)


def batch_problem(raw: Any) -> str | None:
    """Why a decoded array is not a batch ``named_batch`` can take, or None."""
    if not isinstance(raw, tuple) or not 6 <= len(raw) <= 10:
        return "a batch is an array of 6 to 10 fields"
    if len(raw) >= 9 and (type(raw[8]) is not int or raw[8] < 0):
        return "term must be an int >= 0"
    if len(raw) == 10 and (type(raw[9]) is not int or raw[9] < 0):
        return "derived must be an int >= 0"
    if not all(type(v) is int for v in raw[:5]):
        return "epoch, prev, first txn id, timestamp and seed must be ints"
    txns = raw[5]
    if not isinstance(txns, tuple) or not all(
        isinstance(t, tuple) and len(t) in (3, 5) for t in txns
    ):
        return "txns must be arrays [proc, args, participants(, client_id, req_id)]"
    return None


# Client -> a partition's query socket, or a reader's (snapshot and read committed)
class QueryRequest(NamedTuple):
    """[REQ_QUERY, client_id, [[query_id, proc_name, args, isolation, at_epoch
    (, after_epoch)], ...]] (at_epoch -1: the newest the partitions can answer;
    after_epoch, absent or 0: none: the answer reflects at least that epoch, waiting
    at most ``limits.query_after_epoch_wait_s`` until it is applied: read-your-writes
    with the epoch of the caller's last committed call). The reply:
    [REP_QUERY, [[query_id, status, value, epoch], ...]] with the value msgpack-packed
    (``Packed``) and ``epoch`` the completed epoch the answer reflects (read committed:
    the coordinator's completed epoch when it answered)."""

    client_id: bytes
    queries: tuple


EPOCH_MAX = (1 << 63) - 1  # an epoch is a non-negative int64


def after_epoch_problem(value: Any) -> str | None:
    """Why ``value`` is not an epoch a query may wait for, or None."""
    if type(value) is not int or not 0 <= value <= EPOCH_MAX:
        return f"after_epoch must be an epoch (an int in 0..2^63-1), not {value!r:.40}"
    return None


def query_request_problem(msg: Any) -> str | None:
    """Why a decoded frame is not a QueryRequest, or None."""
    if not (
        isinstance(msg, tuple)
        and len(msg) == 3
        and msg[0] == REQ_QUERY
        and type(msg[1]) is bytes
        and type(msg[2]) is tuple
    ):
        return "not [REQ_QUERY, client_id, queries]"
    for q in msg[2]:
        if not (
            isinstance(q, tuple)
            and len(q) in (5, 6)
            and type(q[0]) is int
            and type(q[1]) is str
            and type(q[2]) is tuple
            and type(q[3]) is str
            and type(q[4]) is int
        ):
            return "a query is not [query_id, proc_name, args, isolation, at_epoch(, after_epoch)]"
    return None


def query_entries(msg: tuple) -> list[tuple[int, str, tuple, str, int, Any]]:
    """A checked QueryRequest's queries, each with its after_epoch (0 when absent;
    checked by the receiver, per query, with ``after_epoch_problem``)."""
    return [(*q[:5], q[5] if len(q) == 6 else 0) for q in msg[2]]


# Client -> sequencer
class CallsRequest(NamedTuple):
    """[REQ_CALLS, client_id, [[req_id, proc, args(, replica)], ...]]"""

    client_id: bytes
    calls: tuple


class UnorderedCallsRequest(NamedTuple):
    """[REQ_CALLS_UNORDERED, client_id, [[req_id, proc, args(, replica)], ...]]"""

    client_id: bytes
    calls: tuple


class StatusRequest(NamedTuple):
    """[REQ_STATUS]"""


class ClusterInfoRequest(NamedTuple):
    """[REQ_CLUSTER_INFO]"""


class ClusterInfo(NamedTuple):
    """Where a cluster's queries go, as a ``cluster.info`` reply names it (keys: None
    on a cluster without CURVE)."""

    partitions: tuple[tuple[str, ...], ...]  # [replica][partition] query addresses
    readers: tuple[str, ...]
    partition_keys: tuple[tuple[bytes, ...], ...] | None
    reader_keys: tuple[bytes, ...] | None
    replica_versions: bool = True


_ADDRESS_CHARS_MAX = 256
# What cluster.config writes: tcp://HOST:PORT (a name, IPv4 or bracketed IPv6).
_TCP_ADDRESS = re.compile(r"tcp://(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})")
_INFO_FIELDS = ("partitions", "readers", "partition_keys", "reader_keys")


def cluster_info(body: Any) -> ClusterInfo | str:
    """A ``REP_CLUSTER_INFO`` body read by name, or why it is not one (the reply comes
    from the network: every field's shape and bound is checked)."""
    if body == {}:
        return "the sequencer knows no query address"
    if not isinstance(body, dict) or set(body) - {"replica_versions"} != set(_INFO_FIELDS):
        return f"not a map of {', '.join(_INFO_FIELDS)} (and replica_versions)"
    replica_versions = body.get("replica_versions", True)
    if type(replica_versions) is not bool:
        return "replica_versions: a bool"
    parts, readers = body["partitions"], body["readers"]
    if not isinstance(parts, tuple) or not all(isinstance(r, tuple) and r for r in parts):
        return "partitions: an array of replicas, each a non-empty array of addresses"
    if len({len(r) for r in parts}) > 1:
        return "partitions: every replica has as many partitions"
    if not isinstance(readers, tuple):
        return "readers: an array of addresses"
    addresses = [a for r in parts for a in r] + list(readers)
    if not addresses:
        return "no query address at all"
    if len(addresses) > limits.cluster_info_addresses_max:
        return f"{len(addresses)} addresses (at most {limits.cluster_info_addresses_max})"
    if not all(type(a) is str and 0 < len(a) <= _ADDRESS_CHARS_MAX for a in addresses):
        return f"an address is not a string of 1..{_ADDRESS_CHARS_MAX} characters"
    for a in addresses:
        m = _TCP_ADDRESS.fullmatch(a)
        if m is None or not 0 < int(m.group(1)) < 65536:
            return f"{a!r:.80} is not a tcp://HOST:PORT address"
    pkeys, rkeys = body["partition_keys"], body["reader_keys"]
    if (pkeys is None) != (rkeys is None):
        return "partition_keys and reader_keys: both keys or both None"
    if pkeys is not None:
        if not (
            isinstance(pkeys, tuple)
            and isinstance(rkeys, tuple)
            and [len(r) if isinstance(r, tuple) else -1 for r in pkeys] == [len(r) for r in parts]
            and len(rkeys) == len(readers)
        ):
            return "keys: one per address, shaped as the addresses"
        if not all(is_z85_key(k) for k in [k for r in pkeys for k in r] + list(rkeys)):
            return "a key is not a Z85-encoded CURVE public key"
    return ClusterInfo(parts, readers, pkeys, rkeys, replica_versions)


class CheckpointRequest(NamedTuple):
    """[REQ_CHECKPOINT]"""


class PruneRequest(NamedTuple):
    """[REQ_PRUNE, archive_dir or None]"""

    archive_dir: str | None


# Sequencer -> client
class NotLeaderAnswer(NamedTuple):
    """A call's error value from a sequencer that does not lead: [code, hint, term]
    (module docstring). ``term`` -1: none given (a deposed leader's answer, or a
    sequencer from before terms were sent)."""

    code: str
    hint: str
    term: int = -1


def not_leader_answer(value: Any) -> NotLeaderAnswer | None:
    """A call's error value read as a not_leader answer, or None if it is not one."""
    if not isinstance(value, tuple) or not value or value[0] != ERR_NOT_LEADER:
        return None
    hint = value[1] if len(value) > 1 and isinstance(value[1], str) else ""
    term = value[2] if len(value) > 2 and type(value[2]) is int and value[2] >= 0 else -1
    return NotLeaderAnswer(ERR_NOT_LEADER, hint, term)


class ResultsReply(NamedTuple):
    """[REP_RESULTS, [[req_id, status, value], ...]] (the epochs' trailer, when there is
    one, is written by ``encode_results_reply`` and read by ``results_epochs``)"""

    results: Sequence[Any]


class Packed(bytes):
    """A value already msgpack-encoded: a partition's result, which the sequencer
    compares, keeps and forwards as these bytes without decoding them."""

    __slots__ = ()


_reply_packer = msgpack.Packer(autoreset=True)


def encode_query_reply(replies: Sequence[tuple[int, int, bytes, int]]) -> bytes:
    """[REP_QUERY, [[query_id, status, value, epoch], ...]] with each value's packed
    bytes put in as they are (a query's value is packed once, where it is bounded)."""
    p = _reply_packer
    parts = [p.pack_array_header(2), p.pack(REP_QUERY), p.pack_array_header(len(replies))]
    header = p.pack_array_header(4)
    for qid, status, packed, epoch in replies:
        parts += (header, p.pack(qid), p.pack(status), packed, p.pack(epoch))
    return b"".join(parts)


def encode_results_reply(
    replies: Sequence[tuple[Any, int, Any]], epochs: Sequence[int] | None = None, term: int = 0
) -> bytes:
    """``ResultsReply(replies)`` encoded, the same bytes as ``encode`` gives for the
    decoded values, with each ``Packed`` value's bytes put in as they are; with
    ``epochs`` (one per reply) of which any is not 0, followed by them as the trailer;
    with ``term`` (> 0: a replicated leader's), followed by the epochs (zeros if none)
    and the term."""
    p = _reply_packer
    trailer = epochs is not None and any(epochs)
    if term and not trailer:
        epochs, trailer = [0] * len(replies), True
    parts = [
        p.pack_array_header(4 if term else 3 if trailer else 2),
        p.pack(REP_RESULTS),
        p.pack_array_header(len(replies)),
    ]
    header = p.pack_array_header(3)
    for req_id, status, value in replies:
        parts += (header, p.pack(req_id), p.pack(status))
        parts.append(value if type(value) is Packed else p.pack(value))
    if trailer:
        assert epochs is not None
        parts.append(p.pack(list(epochs)))
    if term:
        parts.append(p.pack(term))
    return b"".join(parts)


def results_term(msg: tuple) -> int:
    """The leader term a decoded REP_RESULTS message names after its epochs; 0 if none
    (a single sequencer's, an older server's) or malformed."""
    term = msg[3] if len(msg) > 3 else 0
    return term if type(term) is int and term > 0 else 0


def results_epochs(msg: tuple, entries: int) -> tuple[int, ...] | None:
    """The epochs' trailer of a decoded REP_RESULTS message, one per entry, or None if
    there is none (or it is malformed: not ``entries`` ints >= 0, the reply's values
    stand and their epochs are unknown)."""
    if len(msg) < 3:
        return None
    epochs = msg[2]
    if (
        type(epochs) is not tuple
        or len(epochs) != entries
        or not all(type(e) is int and 0 <= e <= EPOCH_MAX for e in epochs)
    ):
        return None
    return epochs


class StatusReply(NamedTuple):
    """[REP_STATUS, {...}]"""

    report: dict


class ClusterInfoReply(NamedTuple):
    """[REP_CLUSTER_INFO, {...}] (``cluster_info`` reads the map)"""

    info: dict


class OkReply(NamedTuple):
    """[REP_OK, value]"""

    value: Any


class ErrorReply(NamedTuple):
    """[REP_ERROR, message]"""

    message: str


ControlReply = OkReply | ErrorReply | StatusReply | ClusterInfoReply  # a control request's


# Publication and log service
class Heartbeat(NamedTuple):
    """[last_epoch, term, leader] under TOPIC_HEARTBEAT (leader: the sequencer's index
    in the cluster's list; term 0 and leader 0 for a single sequencer)"""

    last_epoch: int
    term: int = 0
    leader: int = 0


def heartbeat(raw: Any) -> Heartbeat | None:
    """A decoded heartbeat by name, or None if it is not one (1 or 3 ints >= 0)."""
    if (
        not isinstance(raw, tuple)
        or len(raw) not in (1, 3)
        or not all(type(v) is int and v >= 0 for v in raw)
    ):
        return None
    return Heartbeat._make(raw) if len(raw) == 3 else Heartbeat(raw[0])


class LogFetch(NamedTuple):
    """[LOG_FETCH, first_epoch, last_epoch]"""

    first_epoch: int
    last_epoch: int


class LogBatches(NamedTuple):
    """[LOG_BATCHES, [batch_bytes, ...], last_epoch_on_disk]"""

    batches: Sequence[Any]
    last_epoch_on_disk: int


MESSAGES = Family(
    {
        CallsRequest: REQ_CALLS,
        UnorderedCallsRequest: REQ_CALLS_UNORDERED,
        StatusRequest: REQ_STATUS,
        ClusterInfoRequest: REQ_CLUSTER_INFO,
        CheckpointRequest: REQ_CHECKPOINT,
        PruneRequest: REQ_PRUNE,
        ResultsReply: REP_RESULTS,
        StatusReply: REP_STATUS,
        ClusterInfoReply: REP_CLUSTER_INFO,
        OkReply: REP_OK,
        ErrorReply: REP_ERROR,
        LogFetch: LOG_FETCH,
        LogBatches: LOG_BATCHES,
    }
)
message = MESSAGES.array  # [kind, *fields]
encode = MESSAGES.encode
named = MESSAGES.named


def pack(msg: Any) -> bytes:
    return msgpack.packb(msg)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False)


def batch_digest(payload: bytes) -> int:
    """The digest a batch's successor records of the batch's logged bytes."""
    return xxhash.xxh3_64_intdigest(payload)
