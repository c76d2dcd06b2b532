"""What the sequencer keeps per call, and the checks of what partitions and the log
service are sent: pure functions and records, no state.

Invariants: ``participants`` is txn_library.placement's rule applied to a checked
footprint; ``make_batch`` builds exactly what the sequencer logs; a message that any
check here refuses changes nothing (the caller drops it and counts it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from txn_library import limits
from txn_library.errors import ERR_BAD_ARGUMENTS, RESTART, STATUS_NAMES, BadRequest
from txn_library.procedure import Procedure, lookup
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire
from txn_library.wire.partition import PartitionStatus
from txn_library.wire.sequencer import Batch, LogFetch, Txn, unpack


def participants(proc: Procedure, args: tuple, partitions: int) -> tuple[int, ...]:
    """Partitions a call touches (txn_library.placement), its footprint checked first
    (every key at least its placement prefix, at most ``limits.footprint_entries_max``
    entries: the sequencer admits calls here)."""
    try:
        return proc.participants_of(args, partitions, limits.footprint_entries_max)
    except BadRequest:
        raise
    except Exception as e:  # the procedure's footprint function raised on these args
        raise BadRequest(ERR_BAD_ARGUMENTS, f"footprint of {proc.name} failed: {e}") from None


def make_batch(
    epoch: int,
    first_txn_id: int,
    timestamp_ms: int,
    seed: int,
    calls: list[tuple[str, tuple]],
    partitions: int,
) -> Batch:
    """A batch as the sequencer logs it (for tests and tools that build logs)."""
    txns = tuple(
        Txn(name, tuple(args), participants(lookup(name), tuple(args), partitions), b"", 0)
        for name, args in calls
    )
    return Batch(epoch, epoch - 1, first_txn_id, timestamp_ms, seed, txns)


class LogReader(Protocol):
    """What the log service reads: a CommandLog or a leader's ReplicatedLog."""

    @property
    def last_epoch(self) -> int: ...

    def read_range(self, first: int, last: int) -> list[tuple[int, bytes]]: ...


def serve_log_fetch(log: LogReader, first: int, last: int) -> bytes:
    """The log service's LOG_BATCHES answer to LOG_FETCH(first, last): the batches from
    ``first`` on, at most ``log_service_epochs_per_reply_max`` of them and
    ``log_service_reply_bytes_max`` bytes (at least one), and the last epoch on disk.
    Every sequencer serves it from its own log (leader and followers alike)."""
    last = min(last, first + limits.log_service_epochs_per_reply_max - 1)
    batches: list[bytes] = []
    size = 0
    for _e, data in log.read_range(first, last):
        if batches and size + len(data) > limits.log_service_reply_bytes_max:
            break  # the partition asks again for the rest
        batches.append(data)
        size += len(data)
    return wire.encode(wire.LogBatches(batches, log.last_epoch))


def parse_log_fetch(frame: bytes) -> LogFetch | None:
    """A well-formed LOG_FETCH (bounded, ints, 1 <= first <= last), else None."""
    if len(frame) > limits.log_service_request_bytes_max:
        return None
    try:
        msg = unpack(frame)
    except (ValueError, TypeError):
        return None
    if not (isinstance(msg, tuple) and len(msg) == 3 and msg[0] == wire.LOG_FETCH):
        return None
    request = LogFetch._make(msg[1:])
    first, last = request
    if type(first) is not int or type(last) is not int or not 1 <= first <= last:
        return None
    return request


def os_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


@dataclass(eq=False)
class PendingCall:
    identity: bytes  # ROUTER identity to answer on
    client_id: bytes
    req_id: Any
    proc: Procedure
    args: tuple
    participants: tuple
    digest: int = 0
    ordered: bool = True  # keeps its place among its connection's calls (batch_order)
    restarts: int = 0
    encoded: bytes = b""  # the txn as logged, once it is pending
    # A push to a dataflow's border stream: the transactions it derives, encoded as
    # logged (txn_library.streams.derived_txns), and how many.
    derived: bytes = b""
    derived_txns: int = 0
    lookup: bool = False  # fetching a logged call's result after a restart
    query: tuple | None = None  # (query id, recon, partition, body) of its last query
    epoch: int = 0  # the batch it was (last) sequenced in; 0: not sequenced


@dataclass
class InFlight:
    call: PendingCall
    answered: int = 0  # bitmask of replicas that answered (a replaying one may repeat)
    first: tuple | None = None


def results_problem(msg: Any, replicas: int, partitions: int) -> str | None:
    """Why a decoded MSG_RESULTS is malformed (field by field), or None."""
    if not isinstance(msg, tuple) or len(msg) != 6 or msg[0] != ewire.MSG_RESULTS:
        return "not a results message"
    _, replica, partition, results, qresults, status = msg
    if not (is_index(replica, replicas) and is_index(partition, partitions)):
        return "no such replica or partition"
    if not isinstance(results, tuple) or not all(
        isinstance(r, tuple)
        and len(r) == 3
        and is_int(r[0])
        and is_status(r[1])
        and type(r[2]) is bytes
        and (r[1] != RESTART or _decodes(r[2]))  # a prediction is decoded; values are not
        for r in results
    ):
        return "bad results"
    if not isinstance(qresults, tuple) or not all(
        isinstance(r, tuple) and len(r) == 4 and is_int(r[0]) and is_status(r[2]) for r in qresults
    ):
        return "bad query results"
    if not (
        isinstance(status, tuple)
        and len(status) == len(PartitionStatus._fields)
        and all(is_int(v) or isinstance(v, bool) for v in status)
    ):
        return "bad status"
    return None


_UNDECODABLE: Any = object()


def _unpacked(data: bytes) -> Any:
    try:
        return unpack(data)
    except (ValueError, TypeError):  # every msgpack decode failure
        return _UNDECODABLE


def _decodes(data: bytes) -> bool:
    return _unpacked(data) is not _UNDECODABLE


def is_int(v: Any) -> bool:
    return type(v) is int


def shown_value(packed: bytes) -> Any:
    """A packed result value for a log line: decoded, or its first bytes if it does not
    decode (a partition's bytes are not trusted to)."""
    value = _unpacked(packed)
    return packed[:64] if value is _UNDECODABLE else value


def is_status(v: Any) -> bool:
    return type(v) is int and v in STATUS_NAMES


def is_index(v: Any, n: int) -> bool:
    return type(v) is int and 0 <= v < n


def is_req_id(v: Any) -> bool:
    return type(v) is int and 0 <= v <= limits.req_id_max
