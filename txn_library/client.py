"""Python client for Ordo: blocking ``call`` and asynchronous ``submit`` (futures).

One background I/O thread owns the ZeroMQ DEALER socket (sockets are not
thread-safe); user threads hand it calls through a queue and get
``concurrent.futures.Future`` objects back. Calls submitted close together travel in
one frame, so thousands can be in flight from one client.

Every call carries (client_id, req_id). A call that gets no answer within
``retry_s`` is resent with the *same* ids, so the sequencer executes it at most
once; after ``timeout_s`` the future fails with CallTimeout (the call may still have
committed: that is what a timeout means in any database).

Invariants:
- A call is encoded once, in ``submit`` on the caller's thread. An argument msgpack
  cannot encode raises BadRequest(ERR_BAD_ARGUMENTS) there, and a call that cannot fit
  in one frame raises BadRequest(ERR_TOO_LARGE); nothing is sent and the client stays
  usable. The I/O thread only concatenates pre-encoded calls (a resend reuses the
  bytes), so it cannot fail on a caller's arguments.
- Every frame sent holds at most ``limits.calls_per_frame_max`` calls and
  ``limits.request_bytes_max`` bytes: the sequencer's intake bounds.
- Nothing a server sends stops the I/O thread: a reply it cannot read is dropped and
  counted in ``malformed_replies``. Should the thread stop anyway (a bug), every
  pending and queued call fails with InvariantViolation naming the cause, and later
  ``submit``/``control`` calls raise it at once: no caller waits forever.

Failover (a replicated ordering layer): a Client given several sequencer addresses
talks to one at a time. A follower answers a call with ERR_NOT_LEADER naming the
leader; the client then moves to that address (or the next one) and resends every
unanswered call with the same ids, so the new leader runs each at most once, and a
call the old leader had committed is answered from the log. A client whose calls get
no frame at all back for ``limits.client_failover_silence_s`` moves on to the next
address the same way. ERR_NOT_LEADER never reaches the caller.

A client with several addresses also watches its connection (a ZeroMQ socket
monitor): when the sequencer's process dies, its kernel closes the connection and the
client moves on at once, without waiting for the silence (only a connection that has
answered counts: one refused at the CURVE handshake drops as well). Until the ordering layer
notices the dead leader (its ZooKeeper session expires), the followers still name it; a
client that left a *dropped* connection does not go back on such a hint: it asks the
follower again every ``limits.client_failover_backoff_s`` until the hint names another
sequencer (the new leader), and believes the old hint only after
``limits.client_failover_stale_hint_s`` (a restarted process is reached again that
way). A leader that is slow, paused or cut off keeps its connection: the client
leaves it only after the silence and goes back at once if the followers name it, so
calls a slow leader will answer are not stranded.

``ClientProtocol`` holds the encoding and bookkeeping without threads or sockets, so
gevent users (locust, with zmq.green) can drive it from their own loop.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from txn_library import limits, wire
from txn_library.curve import ClientCurve
from txn_library.errors import (
    ABORTED,
    ERR_BAD_ARGUMENTS,
    ERR_MALFORMED,
    ERR_NOT_LEADER,
    ERR_TOO_LARGE,
    ERROR,
    OK,
    BadRequest,
    CallFailed,
    CallTimeout,
    InvariantViolation,
    Overloaded,
    invariant,
)

_MONITORS = itertools.count()  # unique inproc endpoints for connection monitors
log = logging.getLogger(__name__)

# The sequencer's wire contract (sequencer/wire.py): client_id is bytes, at most 64.
CLIENT_ID_BYTES_MAX = limits.client_id_bytes_max
_ARRAY_HEADER_BYTES_MAX = 5  # msgpack array32 header; array16 (<= 65535 items) is 3


@dataclass
class Result:
    """A call's outcome: ``ok`` with ``value``, or a logical abort with its reason."""

    status: int
    value: Any
    latency_s: float = 0.0

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
        try:
            msg = wire.unpack(frame)
        except (ValueError, msgpack.UnpackException):
            return None  # msgpack's decoding errors (bad bytes, bad UTF-8, extra data)
        if not isinstance(msg, tuple) or len(msg) < 2 or type(msg[0]) is not int:
            return None
        return msg[0], msg[1]


def _unencodable(proc: str, args: list[Any], replica: int | None, e: Exception) -> str:
    """Which argument msgpack refused, for the caller's error message."""
    for i, arg in enumerate(args):
        try:
            wire.pack(arg)
        except (TypeError, ValueError, OverflowError) as arg_e:
            return f"{proc}: argument {i + 1} ({type(arg).__name__}) cannot be encoded: {arg_e}"
    return f"{proc}: call cannot be encoded (procedure {proc!r}, replica {replica!r}): {e}"


def to_outcome(status: Any, value: Any, latency_s: float) -> Result | Exception:
    """A result entry -> Result (ok or aborted) or the exception the caller gets."""
    if status == ERROR:
        if isinstance(value, tuple) and len(value) == 2:
            code, message = str(value[0]), str(value[1])
        else:
            code, message = ERR_MALFORMED, f"server sent an unreadable error: {value!r:.200}"
        if code == "overloaded":
            return Overloaded(message)
        return CallFailed(code, message)
    if status in (OK, ABORTED) and type(status) is int:
        return Result(status, value, latency_s)
    return CallFailed(ERR_MALFORMED, f"server sent an unknown status {status!r:.50}")


@dataclass
class _Pending:
    """A call from ``submit`` until its answer or deadline; ``call`` is its encoding."""

    req_id: int
    future: Future
    proc: str
    call: bytes
    started: float
    deadline: float
    resend_at: float


@dataclass
class _Control:
    """A control request (status, checkpoint, prune) waiting for its reply."""

    future: Future
    request: wire.StatusRequest | wire.CheckpointRequest | wire.PruneRequest


def _settle(fut: Future, outcome: Any) -> None:
    """Resolve ``fut`` unless its owner cancelled it meanwhile."""
    try:
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
    except InvalidStateError:
        pass  # cancelled by the caller: nobody is waiting for it


class Client:
    """Thread-safe client. Use as a context manager or call close().

    ``client_id``: None (the default) draws a random 128-bit id. Passing one is the
    caller's guarantee that it is unique: request ids restart at 1 in every Client,
    so two clients with the same id reuse (client_id, req_id) pairs, and the sequencer
    rejects a reused pair whose procedure or arguments differ (error code
    "request_id_reused") or answers it with the earlier call's result.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        timeout_s: float = limits.client_timeout_s_default,
        retry_s: float = 5.0,
        client_id: bytes | None = None,
        curve: ClientCurve | Sequence[ClientCurve] | None = None,
    ) -> None:
        """``address``: the sequencer's client address, or every sequencer's (from
        cluster.json) to fail over between. ``curve``: the CURVE keys for each address
        (txn_library.curve.ClientCurve, one per address in the same order; see
        cluster.security.client_curves), or None on a cluster without CURVE."""
        self.addresses = [address] if isinstance(address, str) else list(address)
        if not self.addresses:
            raise ValueError("a client needs at least one sequencer address")
        self.address = self.addresses[0]
        curves = [curve] if isinstance(curve, ClientCurve) else list(curve or ())
        if curves and len(curves) != len(self.addresses):
            raise ValueError("curve: one ClientCurve per address")
        self.curves: dict[str, ClientCurve] = dict(zip(self.addresses, curves, strict=False))
        self.failovers = 0  # times the client moved to another sequencer
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.proto = ClientProtocol(client_id)
        self.malformed_replies = 0  # reply frames or entries dropped as unreadable
        self._ctx: zmq.Context = zmq.Context.instance()
        self._submit_q: queue.SimpleQueue[_Pending | _Control] = queue.SimpleQueue()
        self._wake_addr = f"inproc://ordo-client-{os.urandom(8).hex()}"
        self._wake_recv = self._ctx.socket(zmq.PULL)
        self._wake_recv.bind(self._wake_addr)
        self._wake_send_lock = threading.Lock()
        self._wake_send = self._ctx.socket(zmq.PUSH)
        self._wake_send.connect(self._wake_addr)
        self._control_waiters: list[Future] = []  # I/O thread only
        self._closed = threading.Event()
        # Set by the I/O thread as it stops, *before* it fails what is queued.
        self._io_stopped = threading.Event()
        self._io_failure: BaseException | None = None
        self._in_flight = threading.BoundedSemaphore(limits.client_in_flight_max)
        self._thread = threading.Thread(target=self._io_loop, name="ordo-client", daemon=True)
        self._thread.start()

    # Public API ---------------------------------------------------------------
    def submit(self, proc: str, *args: Any, replica: int | None = None) -> Future:
        """Send a call; the future resolves to a Result (ok or aborted) or raises.

        ``replica`` pins a single-partition read-only call to one replica (e.g. to
        check each replica's state); other calls ignore it.

        Raises BadRequest at once if the call cannot be encoded (ERR_BAD_ARGUMENTS) or
        is too large for one frame (ERR_TOO_LARGE); the client stays usable.
        """
        return self.submit_with_id(proc, *args, replica=replica)[1]

    def submit_with_id(
        self, proc: str, *args: Any, replica: int | None = None
    ) -> tuple[int, Future]:
        """``submit``, also returning the call's request id: with ``proto.client_id``
        it names the call in the log (a client-side ledger keeps both)."""
        self._check_usable()
        req_id = self.proto.next_req_id()
        call = self.proto.encode_call(req_id, proc, args, replica)
        fut: Future = Future()
        self._in_flight.acquire()
        fut.add_done_callback(self._release_slot)
        now = time.monotonic()
        self._enqueue(
            _Pending(req_id, fut, proc, call, now, now + self.timeout_s, now + self.retry_s)
        )
        return req_id, fut

    def call(
        self, proc: str, *args: Any, timeout_s: float | None = None, replica: int | None = None
    ) -> Result:
        """Blocking call. Raises BadRequest, CallFailed, Overloaded or CallTimeout."""
        fut = self.submit(proc, *args, replica=replica)
        t = (timeout_s or self.timeout_s) + 1.0
        try:
            return fut.result(timeout=t)
        except TimeoutError:
            raise CallTimeout(f"{proc}: no answer within {t:.1f}s") from None

    def status(self, timeout_s: float = 5.0) -> dict:
        """The sequencer's view: epochs, counters, every partition's status."""
        return self.control(wire.StatusRequest(), timeout_s)

    def control(
        self,
        request: wire.StatusRequest | wire.CheckpointRequest | wire.PruneRequest,
        timeout_s: float = 5.0,
    ) -> Any:
        """A control request (status, checkpoint, prune); returns the reply body.

        Raises CallFailed when the sequencer answers REP_ERROR.
        """
        self._check_usable()
        fut: Future = Future()
        self._enqueue(_Control(fut, request))
        try:
            kind, body = fut.result(timeout=timeout_s)
        except TimeoutError:
            raise CallTimeout(f"no answer from {self.address} within {timeout_s}s") from None
        if kind == wire.REP_ERROR:
            raise CallFailed("control", str(body))
        return body

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._wake()
            self._thread.join(timeout=5)
            with self._wake_send_lock:
                self._wake_send.close(linger=0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Hand-over to the I/O thread -------------------------------------------------
    def _check_usable(self) -> None:
        if self._io_failure is not None:
            raise self._stopped_error()
        if self._closed.is_set():
            raise RuntimeError("client is closed")

    def _stopped_error(self) -> Exception:
        """What a caller gets once the I/O thread is gone (a fresh instance each time)."""
        if self._io_failure is None:
            return CallTimeout("client closed")
        err = InvariantViolation(f"client I/O thread stopped: {self._io_failure!r}")
        err.__cause__ = self._io_failure
        return err

    def _enqueue(self, item: _Pending | _Control) -> None:
        self._submit_q.put(item)
        if self._io_stopped.is_set():
            # The thread may have drained the queue before our put: fail it ourselves.
            self._fail_queued()
        else:
            self._wake()

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._submit_q.get_nowait()
            except queue.Empty:
                return
            _settle(item.future, self._stopped_error())

    def _release_slot(self, _fut: Future) -> None:
        self._in_flight.release()

    # I/O thread ---------------------------------------------------------------
    def _wake(self) -> None:
        with self._wake_send_lock:
            if not self._wake_send.closed:
                try:
                    self._wake_send.send(b"", flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # pipe full: the I/O thread has wake-ups pending already

    def _connect(self, address: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        curve = self.curves.get(address)
        if curve is not None:
            sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.client_public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, curve.client_secret)
            sock.setsockopt(zmq.CURVE_SERVERKEY, curve.server_public)
        sock.connect(address)
        return sock

    def _io_loop(self) -> None:
        pending: dict[int, _Pending] = {}
        self._sock: zmq.Socket = self._connect(self.address)
        try:
            self._serve(pending)
        except Exception as e:  # a bug: keep it (with its type) for every caller
            log.exception("ordo client I/O thread failed")
            self._io_failure = e
        finally:
            self._io_stopped.set()
            for p in pending.values():
                _settle(p.future, self._stopped_error())
            for fut in self._control_waiters:
                _settle(fut, self._stopped_error())
            self._fail_queued()
            mon = getattr(self, "_mon", None)
            if mon is not None:
                mon.close(linger=0)
            self._sock.close(linger=0)
            self._wake_recv.close(linger=0)

    def _serve(self, pending: dict[int, _Pending]) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        next_check = time.monotonic() + 0.1
        self._heard_at = time.monotonic()  # last frame from the current address
        self._move_to: str | None = None  # set by a "not leader" answer
        self._moved_at = 0.0
        self._left_dropped: tuple[str, float] | None = None  # (address, when): conn. dropped
        self._dropped = False  # the current connection dropped (socket monitor)
        self._served = False  # a reply came on the current connection
        self._mon: zmq.Socket | None = None
        if len(self.addresses) > 1:
            self._watch(poller)
        self._ask_again_at: float | None = None  # resend here: the hint named that address
        while not self._closed.is_set():
            events = dict(poller.poll(100))
            if self._wake_recv in events:
                while self._wake_recv.poll(0):
                    self._wake_recv.recv()
            if self._mon is not None and self._mon in events:
                while self._mon.poll(0):
                    self._mon.recv_multipart()  # only EVENT_DISCONNECTED is monitored
                    # Only a connection that served us counts: one refused at the
                    # handshake (no admitted key) drops too, and must not make the
                    # client hop between addresses.
                    self._dropped = self._served
            sock = self._sock
            self._send_new(sock, pending)
            while sock.poll(0):
                self._heard_at = time.monotonic()
                self._served = True
                self._on_reply(sock.recv(), pending)
            now = time.monotonic()
            if len(self.addresses) > 1:
                self._maybe_fail_over(poller, pending, now)
            if now >= next_check:
                self._expire(self._sock, pending, now)
                next_check = now + 0.1

    def _maybe_fail_over(
        self, poller: zmq.Poller, pending: dict[int, _Pending], now: float
    ) -> None:
        """Move to the leader a follower named, or to the next address when the current
        one is silent with calls out; then resend every unanswered call, same ids."""
        target = self._move_to
        dropped = self._dropped and bool(pending)
        silent = dropped or (
            pending
            and now - max(self._heard_at, self._moved_at) >= limits.client_failover_silence_s
        )
        if target is None and not silent:
            if self._ask_again_at is not None and now >= self._ask_again_at:
                self._ask_again_at = None
                self._resend_all(pending, now)
            return
        if now - self._moved_at < limits.client_failover_backoff_s:
            return
        if target is None or target == "" or target not in self.addresses:
            target = self.addresses[(self.addresses.index(self.address) + 1) % len(self.addresses)]
        if self._move_to is None and dropped:
            self._left_dropped = (self.address, now)
        self._dropped = self._served = False
        self._move_to = None
        self._ask_again_at = None
        self._moved_at = now
        if target != self.address:
            self._unwatch(poller)
            poller.unregister(self._sock)
            self._sock.close(linger=0)
            self.address = target
            self._sock = self._connect(target)
            poller.register(self._sock, zmq.POLLIN)
            self._watch(poller)
            self.failovers += 1
            log.info("ordo client: moved to %s", target)
        self._resend_all(pending, now)

    def _resend_all(self, pending: dict[int, _Pending], now: float) -> None:
        for p in pending.values():
            p.resend_at = now + self.retry_s
        for frame in self.proto.frames([p.call for p in pending.values()]):
            self._sock.send(frame)

    def _watch(self, poller: zmq.Poller) -> None:
        """Monitor the current connection (its drop moves the client at once). The
        endpoint is unique per monitor: pyzmq's default names it by the socket's file
        descriptor, which a quickly closed and reopened socket reuses while the old
        endpoint may still be bound. Without a monitor the silence rule still holds."""
        addr = f"inproc://ordo-client-monitor-{id(self):x}-{next(_MONITORS)}"
        try:
            self._mon = self._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED, addr=addr)
        except zmq.ZMQError as e:
            self._mon = None
            log.warning("ordo client: cannot watch the connection to %s: %s", self.address, e)
            return
        poller.register(self._mon, zmq.POLLIN)

    def _unwatch(self, poller: zmq.Poller) -> None:
        if self._mon is not None:
            poller.unregister(self._mon)
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass  # the socket is about to close anyway
            self._mon.close(linger=0)
            self._mon = None

    def _on_not_leader(self, hint: str, now: float) -> None:
        """Follow a follower's hint, unless it names the address whose connection this
        client has just seen dropped: then ask here again shortly (module docstring)."""
        left = self._left_dropped
        if (
            left is not None
            and hint == left[0]
            and now - left[1] < limits.client_failover_stale_hint_s
        ):
            if self._ask_again_at is None:
                self._ask_again_at = now + limits.client_failover_backoff_s
            return
        self._move_to = hint

    def _send_new(self, sock: zmq.Socket, pending: dict[int, _Pending]) -> None:
        calls: list[bytes] = []
        while True:
            try:
                item = self._submit_q.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Control):
                self._control_waiters.append(item.future)
                sock.send(wire.encode(item.request))
                continue
            pending[item.req_id] = item
            calls.append(item.call)
        for frame in self.proto.frames(calls):
            sock.send(frame)

    def _on_reply(self, frame: bytes, pending: dict[int, _Pending]) -> None:
        reply = self.proto.parse_reply(frame)
        if reply is None:
            self._malformed(f"undecodable reply frame of {len(frame)} bytes")
            return
        kind, body = reply
        if kind in (wire.REP_STATUS, wire.REP_OK, wire.REP_ERROR):
            if self._control_waiters:  # control replies come back in request order
                _settle(self._control_waiters.pop(0), (kind, body))
            return
        if kind != wire.REP_RESULTS or not isinstance(body, tuple):
            self._malformed(f"unexpected reply kind {kind!r}")
            return
        now = time.monotonic()
        for entry in body:
            if not isinstance(entry, tuple) or len(entry) != 3:
                self._malformed(f"unreadable result entry {entry!r:.100}")
                continue
            req_id, status, value = entry
            if req_id is None:  # a frame-level error: our frames are meant to be well formed
                log.warning("ordo client: server rejected a frame: %r", value)
                continue
            if type(req_id) is not int:
                self._malformed(f"result for request id {req_id!r:.50}")
                continue
            if (
                status == ERROR
                and len(self.addresses) > 1
                and isinstance(value, tuple)
                and value
                and value[0] == ERR_NOT_LEADER
            ):  # not sequenced there: keep it pending, move, resend (same ids)
                hint = value[1] if len(value) > 1 and isinstance(value[1], str) else ""
                self._on_not_leader(hint, now)
                continue
            p = pending.pop(req_id, None)
            if p is not None and not p.future.done():
                _settle(p.future, to_outcome(status, value, now - p.started))

    def _malformed(self, what: str) -> None:
        self.malformed_replies += 1
        if self.malformed_replies == 1:  # a misbehaving server must not flood the log
            log.warning("ordo client: dropped %s from %s", what, self.address)

    def _expire(self, sock: zmq.Socket, pending: dict[int, _Pending], now: float) -> None:
        resend: list[bytes] = []
        for req_id, p in list(pending.items()):
            if now >= p.deadline:
                del pending[req_id]
                if not p.future.done():
                    _settle(
                        p.future, CallTimeout(f"{p.proc}: no answer within {self.timeout_s:.1f}s")
                    )
            elif now >= p.resend_at:
                p.resend_at = now + self.retry_s
                resend.append(p.call)
        for frame in self.proto.frames(resend):
            sock.send(frame)
