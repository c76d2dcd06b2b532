"""Python client for Ordo: blocking ``call`` and asynchronous ``submit`` (futures).

One background I/O thread owns the ZeroMQ DEALER socket (sockets are not
thread-safe); user threads hand it calls through a queue and get
``concurrent.futures.Future`` objects back. Calls submitted close together travel in
one frame, so thousands can be in flight from one client.

Every call carries (client_id, req_id). A call that gets no answer within
``retry_s`` is resent with the *same* ids, so the sequencer executes it at most
once; after ``timeout_s`` the future fails with CallTimeout (the call may still have
committed: that is what a timeout means in any database).

``ClientProtocol`` holds the encoding and bookkeeping without threads or sockets, so
gevent users (locust, with zmq.green) can drive it from their own loop.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import zmq

from cluster import limits
from sequencer import wire
from txn_library.errors import ABORTED, ERROR, OK, CallFailed, CallTimeout, Overloaded


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
    """Encoding and in-flight bookkeeping, no I/O."""

    def __init__(self, client_id: bytes | None = None) -> None:
        self.client_id = client_id or os.urandom(16)
        self._ids = itertools.count(1)

    def next_req_id(self) -> int:
        return next(self._ids)

    def encode_calls(self, calls: Sequence[tuple]) -> bytes:
        """calls: (req_id, proc, args) or (req_id, proc, args, replica_hint)."""
        return wire.pack(
            (
                wire.REQ_CALLS,
                self.client_id,
                [
                    (c[0], c[1], list(c[2]))
                    if len(c) == 3 or c[3] is None
                    else (c[0], c[1], list(c[2]), c[3])
                    for c in calls
                ],
            )
        )

    @staticmethod
    def decode_reply(frame: bytes) -> tuple[int, Any]:
        msg = wire.unpack(frame)
        return msg[0], msg[1]


def to_outcome(status: int, value: Any, latency_s: float) -> Result | Exception:
    if status == ERROR:
        code, message = value
        if code == "overloaded":
            return Overloaded(message)
        return CallFailed(code, message)
    return Result(status, value, latency_s)


@dataclass
class _Pending:
    future: Future
    proc: str
    args: tuple
    replica: int | None
    started: float
    deadline: float
    resend_at: float


class Client:
    """Thread-safe client. Use as a context manager or call close()."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = limits.client_timeout_s_default,
        retry_s: float = 5.0,
        client_id: bytes | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.proto = ClientProtocol(client_id)
        self._ctx: zmq.Context = zmq.Context.instance()
        self._submit_q: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_addr = f"inproc://ordo-client-{os.urandom(8).hex()}"
        self._wake_recv = self._ctx.socket(zmq.PULL)
        self._wake_recv.bind(self._wake_addr)
        self._wake_send_lock = threading.Lock()
        self._wake_send = self._ctx.socket(zmq.PUSH)
        self._wake_send.connect(self._wake_addr)
        self._status_waiters: list[Future] = []
        self._closed = threading.Event()
        self._in_flight = threading.BoundedSemaphore(limits.client_in_flight_max)
        self._thread = threading.Thread(target=self._io_loop, name="ordo-client", daemon=True)
        self._thread.start()

    # Public API ---------------------------------------------------------------
    def submit(self, proc: str, *args: Any, replica: int | None = None) -> Future:
        """Send a call; the future resolves to a Result (ok or aborted) or raises.

        ``replica`` pins a single-partition read-only call to one replica (e.g. to
        check each replica's state); other calls ignore it.
        """
        if self._closed.is_set():
            raise RuntimeError("client is closed")
        fut: Future = Future()
        self._in_flight.acquire()
        fut.add_done_callback(lambda _f: self._in_flight.release())
        self._submit_q.put(("call", fut, proc, (tuple(args), replica)))
        self._wake()
        return fut

    def call(
        self, proc: str, *args: Any, timeout_s: float | None = None, replica: int | None = None
    ) -> Result:
        """Blocking call. Raises CallFailed, Overloaded or CallTimeout."""
        fut = self.submit(proc, *args, replica=replica)
        t = (timeout_s or self.timeout_s) + 1.0
        try:
            return fut.result(timeout=t)
        except TimeoutError:
            raise CallTimeout(f"{proc}: no answer within {t:.1f}s") from None

    def status(self, timeout_s: float = 5.0) -> dict:
        """The sequencer's view: epochs, counters, every partition's status."""
        return self.control((wire.REQ_STATUS,), timeout_s)

    def control(self, request: tuple, timeout_s: float = 5.0) -> Any:
        """A control request (status, checkpoint, prune); returns the reply body.

        Raises CallFailed when the sequencer answers REP_ERROR.
        """
        fut: Future = Future()
        self._submit_q.put(("control", fut, request, None))
        self._wake()
        try:
            kind, body = fut.result(timeout=timeout_s)
        except TimeoutError:
            raise CallTimeout(f"no answer from {self.address} within {timeout_s}s") from None
        if kind == wire.REP_ERROR:
            raise CallFailed("control", body)
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

    # I/O thread ---------------------------------------------------------------
    def _wake(self) -> None:
        with self._wake_send_lock:
            if not self._wake_send.closed:
                try:
                    self._wake_send.send(b"", flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # pipe full: the I/O thread has wake-ups pending already

    def _io_loop(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(self.address)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        pending: dict[int, _Pending] = {}
        next_check = time.monotonic() + 0.1
        try:
            while not self._closed.is_set():
                events = dict(poller.poll(100))
                if self._wake_recv in events:
                    while self._wake_recv.poll(0):
                        self._wake_recv.recv()
                self._send_new(sock, pending)
                while sock.poll(0):
                    self._on_reply(sock.recv(), pending)
                now = time.monotonic()
                if now >= next_check:
                    self._expire(sock, pending, now)
                    next_check = now + 0.1
        finally:
            for p in pending.values():
                if not p.future.done():
                    p.future.set_exception(CallTimeout("client closed"))
            sock.close(linger=0)
            self._wake_recv.close(linger=0)

    def _send_new(self, sock: zmq.Socket, pending: dict[int, _Pending]) -> None:
        calls = []
        now = time.monotonic()
        while True:
            try:
                kind, fut, proc, args = self._submit_q.get_nowait()
            except queue.Empty:
                break
            if kind == "control":
                self._status_waiters.append(fut)
                sock.send(wire.pack(proc))
                continue
            req_id = self.proto.next_req_id()
            args, replica = args
            pending[req_id] = _Pending(
                fut, proc, args, replica, now, now + self.timeout_s, now + self.retry_s
            )
            calls.append((req_id, proc, args, replica))
            if len(calls) >= 2000:
                sock.send(self.proto.encode_calls(calls))
                calls = []
        if calls:
            sock.send(self.proto.encode_calls(calls))

    def _on_reply(self, frame: bytes, pending: dict[int, _Pending]) -> None:
        kind, body = self.proto.decode_reply(frame)
        if kind in (wire.REP_STATUS, wire.REP_OK, wire.REP_ERROR):
            if self._status_waiters:  # control replies come back in request order
                self._status_waiters.pop(0).set_result((kind, body))
            return
        now = time.monotonic()
        for req_id, status, value in body:
            if req_id is None:
                continue  # a frame-level error; our frames are well formed
            p = pending.pop(req_id, None)
            if p is None or p.future.done():
                continue
            out = to_outcome(status, value, now - p.started)
            if isinstance(out, Exception):
                p.future.set_exception(out)
            else:
                p.future.set_result(out)

    def _expire(self, sock: zmq.Socket, pending: dict[int, _Pending], now: float) -> None:
        resend = []
        for req_id, p in list(pending.items()):
            if now >= p.deadline:
                del pending[req_id]
                if not p.future.done():
                    p.future.set_exception(
                        CallTimeout(f"{p.proc}: no answer within {self.timeout_s:.1f}s")
                    )
            elif now >= p.resend_at:
                p.resend_at = now + self.retry_s
                resend.append((req_id, p.proc, p.args, p.replica))
        if resend:
            sock.send(self.proto.encode_calls(resend))
