"""The client's half of the wire contract, without I/O: calls encoded once, frames
within the sequencer's intake bounds, replies read, result entries turned into outcomes.

``ClientProtocol`` holds the encoding and bookkeeping without threads or sockets, so the
threaded ``txn_library.client.Client``, the load generator (cluster/loadgen.py), the
simulator's client and gevent users (locust, with zmq.green) drive the same code from
their own loops.

Invariants:
- A call is encoded once (``encode_call``): an argument msgpack cannot encode raises
  BadRequest(ERR_BAD_ARGUMENTS) there, and a call that cannot fit in one frame raises
  BadRequest(ERR_TOO_LARGE); a frame is then only a concatenation of pre-encoded calls
  (a resend reuses the bytes), so building one cannot fail on a caller's arguments.
- Every frame ``frames`` yields holds at most ``limits.calls_per_frame_max`` calls and
  ``limits.request_bytes_max`` bytes: the sequencer's intake bounds.
- A reply frame that is not well formed is None from ``parse_reply``, never an
  exception: nothing a server sends stops a client's loop.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from txn_library import limits
from txn_library.errors import (
    ABORTED,
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_TOO_LARGE,
    ERROR,
    OK,
    BadRequest,
    CallFailed,
    Overloaded,
    invariant,
)
from txn_library.wire import sequencer as wire

# The sequencer's wire contract (sequencer/wire.py): client_id is bytes, at most 64.
CLIENT_ID_BYTES_MAX = limits.client_id_bytes_max
_ARRAY_HEADER_BYTES_MAX = 5  # msgpack array32 header; array16 (<= 65535 items) is 3


@dataclass
class Result:
    """A call's outcome: ``ok`` with ``value``, or a logical abort with its reason.
    ``epoch``: the batch the call was committed in (0: not sequenced, e.g. a read
    answered through a partition's lock manager, or a server that does not say); a
    query naming it (``Client.query(after_epoch=...)``) reflects the call's writes."""

    status: int
    value: Any
    latency_s: float = 0.0
    epoch: int = 0

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def aborted(self) -> bool:
        return self.status == ABORTED


class ClientProtocol:
    """Encoding and in-flight bookkeeping, no I/O.

    A REQ_CALLS frame ``[REQ_CALLS, client_id, [call, ...]]`` is assembled from calls
    encoded one at a time (``encode_call``): the frame's fixed prefix, the msgpack
    array header and the calls' bytes concatenated, byte-identical to packing the
    whole list at once. ``frames`` splits calls into frames within the intake bounds.

    ``ordered`` (default): the sequencer keeps this connection's calls in the order
    they were sent; False sends REQ_CALLS_UNORDERED frames, for calls that are
    independent of one another (a load generator's terminals), which the sequencer
    may then order within an epoch as it runs them best (sequencer.batch_order).

    ``client_id``: None draws a random 128-bit id. An explicit id is the caller's
    promise that no other client uses it, ever: request ids restart at 1 in every
    ClientProtocol, so a second user of the same id would reuse (client_id, req_id)
    pairs. The sequencer answers a reused pair with the first call's result when
    procedure and arguments match, and with error code "request_id_reused" when they
    differ.
    """

    def __init__(self, client_id: bytes | None = None, ordered: bool = True) -> None:
        client_id = client_id or os.urandom(16)
        if not isinstance(client_id, bytes) or len(client_id) > CLIENT_ID_BYTES_MAX:
            raise BadRequest(
                ERR_BAD_ARGUMENTS, f"client_id must be bytes of at most {CLIENT_ID_BYTES_MAX}"
            )
        self.client_id = client_id
        self._ids = itertools.count(1)
        self._frame_prefix = (
            msgpack.Packer().pack_array_header(3)
            + wire.pack(wire.REQ_CALLS if ordered else wire.REQ_CALLS_UNORDERED)
            + wire.pack(client_id)
        )
        # The largest call that fits alone in a frame (a 1-call array header is 1 byte).
        self.call_bytes_max = limits.request_bytes_max - len(self._frame_prefix) - 1

    def next_req_id(self) -> int:
        """The next request id (thread-safe: itertools.count's next is atomic)."""
        return next(self._ids)

    def encode_call(
        self, req_id: int, proc: str, args: Iterable[Any], replica: int | None = None
    ) -> bytes:
        """One call's msgpack bytes, ``[req_id, proc, args]`` (+ ``replica`` if given).

        Raises BadRequest: ERR_BAD_ARGUMENTS if msgpack cannot encode an argument,
        ERR_TOO_LARGE if a frame holding only this call would exceed
        ``limits.request_bytes_max``.
        """
        args = list(args)
        try:
            entry = [req_id, proc, args] if replica is None else [req_id, proc, args, replica]
            data = wire.pack(entry)
        except (TypeError, ValueError, OverflowError) as e:
            raise BadRequest(ERR_BAD_ARGUMENTS, _unencodable(proc, args, replica, e)) from e
        if len(data) > self.call_bytes_max:
            raise BadRequest(
                ERR_TOO_LARGE,
                f"{proc}: call encodes to {len(data)} bytes; a client frame holds at most "
                f"{limits.request_bytes_max} bytes",
            )
        return data

    def encode_frame(self, calls: Sequence[bytes]) -> bytes:
        """One REQ_CALLS frame of pre-encoded calls (no bounds checked: see ``frames``)."""
        header = msgpack.Packer().pack_array_header(len(calls))
        return b"".join([self._frame_prefix, header, *calls])

    def frames(self, calls: Iterable[bytes]) -> Iterator[bytes]:
        """Frames of pre-encoded calls, in order, each within the intake bounds.

        Every call must come from ``encode_call`` (so it fits in a frame alone).
        """
        budget = limits.request_bytes_max - len(self._frame_prefix) - _ARRAY_HEADER_BYTES_MAX
        if (
            isinstance(calls, list)
            and len(calls) <= limits.calls_per_frame_max
            and sum(map(len, calls)) <= budget
        ):  # the common case, one frame, without a Python step per call
            if calls:
                yield self._bounded_frame(calls)
            return
        batch: list[bytes] = []
        size = 0
        for call in calls:
            if batch and (size + len(call) > budget or len(batch) >= limits.calls_per_frame_max):
                yield self._bounded_frame(batch)
                batch, size = [], 0
            batch.append(call)
            size += len(call)
        if batch:
            yield self._bounded_frame(batch)

    def _bounded_frame(self, calls: Sequence[bytes]) -> bytes:
        frame = self.encode_frame(calls)
        invariant(
            len(frame) <= limits.request_bytes_max and len(calls) <= limits.calls_per_frame_max,
            f"client frame of {len(frame)} bytes, {len(calls)} calls exceeds the intake bounds",
        )
        return frame

    def encode_calls(self, calls: Sequence[tuple]) -> bytes:
        """One frame; calls: (req_id, proc, args) or (req_id, proc, args, replica_hint).

        Raises BadRequest like ``encode_call``. The caller keeps the frame within
        ``limits.calls_per_frame_max`` calls and ``limits.request_bytes_max`` bytes.
        """
        return self.encode_frame([self.encode_call(*c) for c in calls])

    @staticmethod
    def decode_reply(frame: bytes) -> tuple[int, Any]:
        """(kind, body) of a reply; raises ValueError if the frame is not one."""
        reply = ClientProtocol.parse_reply(frame)
        if reply is None:
            raise ValueError(f"malformed reply frame ({len(frame)} bytes)")
        return reply

    @staticmethod
    def parse_reply(frame: bytes) -> tuple[int, Any] | None:
        """(kind, body) of a reply, or None if the frame is not a well-formed reply."""
        msg = ClientProtocol.read_reply(frame)
        return None if msg is None else (msg[0], msg[1])

    @staticmethod
    def read_reply(frame: bytes) -> tuple | None:
        """A reply's whole array, ``[kind, body, ...]`` (a REP_RESULTS may carry its
        epochs after the body: wire.results_epochs), or None if not well formed."""
        try:
            msg = wire.unpack(frame)
        except (ValueError, msgpack.UnpackException):
            return None  # msgpack's decoding errors (bad bytes, bad UTF-8, extra data)
        if not isinstance(msg, tuple) or len(msg) < 2 or type(msg[0]) is not int:
            return None
        return msg


def _unencodable(proc: str, args: list[Any], replica: int | None, e: Exception) -> str:
    """Which argument msgpack refused, for the caller's error message."""
    for i, arg in enumerate(args):
        try:
            wire.pack(arg)
        except (TypeError, ValueError, OverflowError) as arg_e:
            return f"{proc}: argument {i + 1} ({type(arg).__name__}) cannot be encoded: {arg_e}"
    return f"{proc}: call cannot be encoded (procedure {proc!r}, replica {replica!r}): {e}"


def to_outcome(status: Any, value: Any, latency_s: float, epoch: int = 0) -> Result | Exception:
    """A result entry -> Result (ok or aborted) or the exception the caller gets."""
    if status == ERROR:
        not_leader = wire.not_leader_answer(value)
        if not_leader is not None:  # a single address that is not the leader: say so
            code, message = not_leader.code, not_leader.hint or "no leader known yet"
        elif isinstance(value, tuple) and len(value) == 2:
            code, message = str(value[0]), str(value[1])
        else:
            code, message = ERR_MALFORMED, f"server sent an unreadable error: {value!r:.200}"
        if code == "overloaded":
            return Overloaded(message)
        return CallFailed(code, message)
    if status in (OK, ABORTED) and type(status) is int:
        return Result(status, value, latency_s, epoch)
    return CallFailed(ERR_MALFORMED, f"server sent an unknown status {status!r:.50}")
