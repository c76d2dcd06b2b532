"""Exactly-once retries: what the sequencer remembers of each (client_id, req_id).

A client resends an unanswered call with the same (client_id, req_id). The sequencer
must then never sequence it twice, and never answer it with another call's result.

Entries, by what a retry gets:
  in flight  the call object: the retry is attached to it (answered once it finishes)
  done       (status, value): the same answer again
  logged     in the command log before a sequencer restart: the original result is
             fetched from the reporting partition's result cache
Every entry keeps the *call digest* (procedure and arguments): a retry whose digest
differs is another call reusing the ids, and gets ERR_REQUEST_ID_REUSED, never the
first call's result.

Bounds (txn_library/limits.py): in-flight entries are bounded by the calls in flight
(they are never evicted: evicting one would let its retry run again). Answered and
logged entries form an LRU bounded by count (``retry_cache_entries_max``) and by the
bytes of the values kept (``retry_cache_bytes_max``). When an entry is evicted, its
client's *expiry watermark* rises to that req_id: a later call of that client with a
req_id at or below the watermark that is not in the cache gets ERR_RETRY_EXPIRED
("outcome unknown, not executed again") instead of running a second time. Clients
number their calls upwards, so only retries ever fall below the watermark.
Watermarks themselves are bounded (``retry_watermark_clients_max``, oldest dropped).

Answered entries are stored compactly: a Done as one bytes object (its status,
digest and epoch in a fixed header, then its value msgpack-encoded), a Logged as a
plain tuple of ints (the collector untracks only exact tuples, not NamedTuples). Bytes
are never tracked and such tuples are untracked at the collector's first look, so a
full cache gives a full collection nothing to walk. Kept as objects (a value such as
New Order's list of line tuples), 200,000 answers made each of the sequencer's full
collections pause it for 100-700 ms, longer as the cache filled, stalling every client.

What the cache holds is bounded twice: by entries (``retry_cache_entries_max``; each
costs ``ENTRY_OVERHEAD_BYTES`` of bookkeeping besides its value: its key, the header
and the ordered dict's slot, measured by tests/unit/test_sequencer_intake.py) and by
the bytes of the values kept (``retry_cache_bytes_max``), so many large answers (a
flood of reads of a 0.9 MB value) cannot hold more than that bound.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any, NamedTuple

import msgpack
import xxhash

from txn_library import limits
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_REQUEST_ID_REUSED,
    ERR_RETRY_EXPIRED,
    BadRequest,
    invariant,
)
from txn_library.wire.sequencer import Packed

Key = tuple[bytes, int]
# What msgpack raises for a value it cannot encode (type, int range, nesting depth).
ENCODE_ERRORS = (TypeError, ValueError, OverflowError)


def call_body(name: str, args: tuple) -> bytes:
    """The encoded (procedure, arguments) of a call: its digest, and the start of the
    txn the command log holds (the sequencer encodes each call once)."""
    try:
        return msgpack.packb(name) + msgpack.packb(args)
    except ENCODE_ERRORS as e:
        raise BadRequest(ERR_BAD_ARGUMENTS, f"arguments do not encode: {e}") from None


def call_digest(body: bytes) -> int:
    """What identifies a call across retries, besides its ids."""
    return xxhash.xxh3_64_intdigest(body)


class Done(NamedTuple):
    status: int
    packed: bytes  # the value, msgpack-encoded (see the module docstring)
    digest: int | None  # None: recovered from a log written before digests were kept
    nbytes: int
    epoch: int = 0  # the batch the call was sequenced in (a retry's answer names it too)

    @property
    def value(self) -> Any:
        """The value as the sequencer had it (decoded as partition results are)."""
        return msgpack.unpackb(self.packed, use_list=False)


class Logged(NamedTuple):
    txn_id: int
    digest: int
    epoch: int  # the batch that holds it (the txn is read back from the log if retried)


# A Done's header: status, whether a digest is kept, digest, epoch (then the value).
_DONE_HEADER = struct.Struct("<bBQq")
# What an answered entry costs besides its value's bytes: its key (a tuple, the req_id
# int, the client id as decoded), the stored header and the OrderedDict's slot and
# node. Documentation and tests only: the byte bound counts the values kept.
ENTRY_OVERHEAD_BYTES = 288
Stored = bytes | tuple  # a Done as bytes, a Logged's fields as an exact tuple


def _done(stored: bytes) -> Done:
    status, has_digest, digest, epoch = _DONE_HEADER.unpack_from(stored)
    packed = stored[_DONE_HEADER.size :]
    return Done(status, packed, digest if has_digest else None, len(stored), epoch)


def _entry(stored: Stored) -> Done | Logged:
    return _done(stored) if type(stored) is bytes else Logged._make(stored)


def _cost(stored: Stored | None) -> int:
    """Bytes an answered entry counts against ``retry_cache_bytes_max``: a Done's
    header and value (a Logged keeps no value)."""
    return len(stored) if type(stored) is bytes else 0


class RetryCache:
    def __init__(self) -> None:
        self._inflight: dict[Key, Any] = {}
        self._answered: OrderedDict[Key, Stored] = OrderedDict()
        self._bytes = 0
        self._watermark: OrderedDict[bytes, int] = OrderedDict()
        self.evictions = 0

    @property
    def answered_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._inflight) + len(self._answered)

    def get(self, key: Key) -> Any:
        """The call in flight, a Done, a Logged, or None."""
        call = self._inflight.get(key)
        if call is not None:
            return call
        stored = self._answered.get(key)
        return None if stored is None else _entry(stored)

    def retry_of(self, key: Key, digest: int) -> Any:
        """The entry a call with these ids retries (in-flight call, Done or Logged), or
        None for a new call. Raises BadRequest when the ids were used by a different
        call (ERR_REQUEST_ID_REUSED) or are older than what is still remembered
        (ERR_RETRY_EXPIRED)."""
        seen = self.get(key)
        if seen is not None:
            if seen.digest is not None and seen.digest != digest:
                raise BadRequest(
                    ERR_REQUEST_ID_REUSED,
                    f"request {key[1]} of this client_id was a different call; client ids "
                    f"must be unique (one per client) and request ids never reused",
                )
            return seen
        if self.expired(key):
            raise BadRequest(
                ERR_RETRY_EXPIRED,
                f"request {key[1]} is older than this client's retry window; its outcome "
                f"is unknown and it is not executed again",
            )
        return None

    def expired(self, key: Key) -> bool:
        """True if an entry for this key may have existed and been evicted."""
        mark = self._watermark.get(key[0])
        return mark is not None and key[1] <= mark

    def start(self, key: Key, call: Any) -> None:
        self._drop_answered(key)
        self._inflight[key] = call

    def finish(self, key: Key, status: int, value: Any, digest: int | None, epoch: int = 0) -> None:
        self._inflight.pop(key, None)
        # A partition's value as it packed it, or the sequencer's own (which encodes).
        packed = value if type(value) is Packed else msgpack.packb(value)
        # A Done, stored as the bytes _entry turns back into a Done.
        head = _DONE_HEADER.pack(status, digest is not None, digest or 0, epoch)
        self._put(key, head + packed)

    def log(self, key: Key, entry: Logged) -> None:
        self._put(key, tuple(entry))

    def _put(self, key: Key, stored: Stored) -> None:
        self._drop_answered(key)
        self._answered[key] = stored
        self._bytes += _cost(stored)
        while self._answered and (
            len(self._answered) > limits.retry_cache_entries_max
            or self._bytes > limits.retry_cache_bytes_max
        ):
            old_key, old = self._answered.popitem(last=False)
            self._bytes -= _cost(old)
            self._expire(old_key)
        invariant(self._bytes >= 0, "retry cache byte accounting")

    def _drop_answered(self, key: Key) -> None:
        self._bytes -= _cost(self._answered.pop(key, None))

    def _expire(self, key: Key) -> None:
        self.evictions += 1
        client, req = key
        marks = self._watermark
        if req > marks.get(client, -1):
            marks[client] = req
        marks.move_to_end(client)
        while len(marks) > limits.retry_watermark_clients_max:
            marks.popitem(last=False)
