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
- A queued call is never left waiting for a wake-up: a submitter wakes the I/O
  thread unless a wake-up is already on its way, and the thread clears that mark
  after taking the wake-ups sent and before it drains the queue (one wake-up per
  burst of submits, not one per call).
- Every frame sent holds at most ``limits.calls_per_frame_max`` calls and
  ``limits.request_bytes_max`` bytes: the sequencer's intake bounds.
- Nothing a server sends stops the I/O thread: a reply it cannot read is dropped and
  counted in ``malformed_replies``. Should the thread stop anyway (a bug), every
  pending and queued call fails with InvariantViolation naming the cause, and later
  ``submit``/``control`` calls raise it at once: no caller waits forever.

Failover (a replicated ordering layer): a Client given several sequencer addresses
talks to one at a time and moves between them by the rules of
txn_library/client/failover.py (a follower's "not leader" hint, silence, a dropped
connection: txn_library/client/connection.py watches it), resending every unanswered call
with the same ids. ERR_NOT_LEADER never reaches the caller.

Query addresses: a Client given none (``query_addresses``, ``reader_addresses``) asks
the sequencer it talks to (``cluster.info``, txn_library.wire.sequencer) the first time a
snapshot or read-committed query needs them; queries wait for the answer, bounded by
their own deadline. It asks again after a move to another sequencer and when a query
found no answer at any target it knows. A reply it cannot use (malformed, hostile, a
CURVE cluster and no key pair here) fails the waiting queries with CallFailed naming
why; the next query asks again.

Read-your-writes: a Result names the epoch its call was committed in (``epoch``; the
sequencer's reply carries it); the client keeps the highest of its own calls'
(``last_epoch``, raised before the call's future resolves, never lowered), and
``query(read_your_writes=True)`` (or ``after_epoch=E``) asks the reader or partition
to answer only once it has applied that epoch (docs/QUERIES.md).

The encoding and reply reading are txn_library/client/protocol.py (``ClientProtocol``,
``Result``, ``to_outcome``, importable from here too: they are the client's public API).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import zmq

from txn_library import limits
from txn_library.client.connection import close_watched, connect_dealer, drain_drops, unwatch, watch
from txn_library.client.failover import Failover
from txn_library.client.protocol import CLIENT_ID_BYTES_MAX, ClientProtocol, Result, to_outcome
from txn_library.client.queries import ISOLATIONS, QueryAnswer, QueryChannel, QueryItem, settle
from txn_library.client.sinks import (
    NoReaders,
    SinkChannel,
    SinkCursor,
    SinkOp,
    new_sub,
    subscription,
)
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERROR,
    BadRequest,
    BatchesGone,
    CallFailed,
    CallTimeout,
    InvariantViolation,
)
from txn_library.wire import sequencer as wire
from txn_library.wire.curve import ClientCurve

__all__ = [
    "CLIENT_ID_BYTES_MAX",
    "Client",
    "ClientProtocol",
    "QueryAnswer",
    "Result",
    "to_outcome",
]

PUSH = "stream.push"  # txn_library.streams.PUSH (not imported: clients need no registry)

log = logging.getLogger(__name__)


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


def _send(sock: zmq.Socket, frame: bytes) -> bool:
    """Send ``frame`` without blocking; False if the socket has no connection to queue
    it on. A DEALER blocks a send while it has no peer at all (a server that refused our
    CURVE keys ends the connection), and an I/O thread blocked there serves no one and
    never sees ``close``; a call left unsent is sent again when its retry is due."""
    try:
        sock.send(frame, zmq.NOBLOCK)
    except zmq.Again:
        return False
    return True


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
        query_addresses: Sequence[Sequence[str]] | None = None,
        query_curves: dict[str, ClientCurve] | None = None,
        reader_addresses: Sequence[str] = (),
    ) -> None:
        """``address``: the sequencer's client address, or every sequencer's (from
        cluster.json) to fail over between. ``curve``: the CURVE keys for each address
        (txn_library.wire.curve.ClientCurve, one per address in the same order; see
        cluster.security.client_curves), or None on a cluster without CURVE.
        ``query_addresses``: every partition's query address, [replica][partition]
        (``ClusterConfig.query_addrs``; ``cluster.launcher.cluster_client`` passes them),
        for ``query`` at snapshot or read-committed isolation; ``query_curves`` their
        CURVE keys by address (the readers' too). ``reader_addresses``: the cluster's
        readers (``ClusterConfig.reader_addrs``): such queries go to them first (with
        readers alone, to them only). Given neither, the client asks the sequencer for
        both (``cluster.info``) when a query first needs them; on a CURVE cluster it
        talks to them with ``curve``'s key pair."""
        self.addresses = [address] if isinstance(address, str) else list(address)
        if not self.addresses:
            raise ValueError("a client needs at least one sequencer address")
        curves = [curve] if isinstance(curve, ClientCurve) else list(curve or ())
        if curves and len(curves) != len(self.addresses):
            raise ValueError("curve: one ClientCurve per address")
        self.curves: dict[str, ClientCurve] = dict(zip(self.addresses, curves, strict=False))
        # Which sequencer the I/O thread talks to (it alone moves it): failover.py.
        self._failover = Failover(self.addresses, time.monotonic())
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.proto = ClientProtocol(client_id)
        self.malformed_replies = 0  # reply frames or entries dropped as unreadable
        # The highest epoch any of this client's calls was committed in (Result.epoch):
        # raised by the I/O thread before the call's future resolves, never lowered.
        # ``query(read_your_writes=True)`` waits for it.
        self.last_epoch = 0
        self._ctx: zmq.Context = zmq.Context.instance()
        self._submit_q: queue.SimpleQueue[_Pending | _Control | QueryItem | SinkOp] = (
            queue.SimpleQueue()
        )
        # Without query addresses given, they come from the sequencer (cluster.info).
        self._query_fetch = not (query_addresses or reader_addresses)
        self._queries = QueryChannel(
            self._ctx,
            query_addresses or [],
            self.proto.client_id,
            retry_s,
            query_curves or {},
            reader_addresses,
        )
        self._info_waiting: list[QueryItem] = []  # I/O thread: queries awaiting cluster.info
        # Sinks pushed by readers (I/O thread), and subscriptions awaiting cluster.info.
        self._sinks = SinkChannel(self._ctx, reader_addresses, query_curves or {}, time.monotonic)
        self._sinks_waiting: list[SinkOp] = []
        self._sub_ids = itertools.count(1)
        self._info_asked_at: float | None = None  # I/O thread: an ask out since then
        self._info_refresh = False  # I/O thread: ask again though targets are known
        self._info_answered_at = -math.inf  # I/O thread: the last answer (refreshes wait)
        self._next_query_id = 0
        self._wake_addr = f"inproc://ordo-client-{os.urandom(8).hex()}"
        self._wake_recv = self._ctx.socket(zmq.PULL)
        self._wake_recv.bind(self._wake_addr)
        self._wake_send_lock = threading.Lock()
        # A wake-up is on its way to the I/O thread: set by a submitter that sends one,
        # cleared by the I/O thread before it drains the queue, so a burst of submits
        # costs one wake-up, not one each (see _wake).
        self._wake_due = False
        self._wake_send = self._ctx.socket(zmq.PUSH)
        self._wake_send.connect(self._wake_addr)
        # Made here, not in the I/O thread: a socket that cannot be made (the process's
        # ZeroMQ context is at its socket limit, ``zmq.MAX_SOCKETS``) is an error the
        # caller gets now. Made there, it killed the thread before it served anything,
        # and every later call timed out as if the cluster were silent. The thread start
        # below is the memory barrier that hands the socket over.
        try:
            self._sock: zmq.Socket = self._connect(self.address)
        except zmq.ZMQError:
            self._wake_recv.close(linger=0)
            self._wake_send.close(linger=0)
            self._queries.close()
            raise
        self._control_waiters: list[Future] = []  # I/O thread only
        self._closed = threading.Event()
        # Set by the I/O thread as it stops, *before* it fails what is queued.
        self._io_stopped = threading.Event()
        self._io_failure: BaseException | None = None
        self._in_flight = threading.BoundedSemaphore(limits.client_in_flight_max)
        self._thread = threading.Thread(target=self._io_loop, name="ordo-client", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """The sequencer address the client talks to now."""
        return self._failover.address

    @property
    def failovers(self) -> int:
        """Times the client moved to another sequencer."""
        return self._failover.failovers

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

    # Queries (docs/QUERIES.md) -------------------------------------------------------
    def query(
        self,
        proc: str,
        *args: Any,
        isolation: str = "snapshot",
        at_epoch: int | None = None,
        replica: int | None = None,
        timeout_s: float | None = None,
        reader: int | None = None,
        after_epoch: int | None = None,
        read_your_writes: bool = False,
    ) -> QueryAnswer:
        """Call a read-only procedure as a query: ``snapshot`` (the default: a
        consistent serial prefix, every partition at one completed epoch, maybe a few
        epochs old), ``read_committed`` (each partition's committed state now, not one
        instant) or ``strict`` (through the sequencer, ordered with the transactions).
        ``at_epoch``: a past completed epoch within retention (snapshot only).
        ``after_epoch``: the answer reflects at least this epoch (a Result's
        ``epoch``: that call's writes are seen); the reader or partition waits for it,
        at most ``limits.query_after_epoch_wait_s``, else ``not_ready`` saying how far
        it got (and the query moves on to the next reader or replica, as any
        ``not_ready``). ``read_your_writes``: after this client's own last committed
        call (``last_epoch``, or ``after_epoch`` if that is later). ``strict`` sees
        every call sequenced before it anyway.
        ``replica``: which replica answers (default: the readers, each in turn, if the
        cluster has some, else each replica in turn); ``reader``: which reader
        answers (its refusal is the answer). The answer has
        ``.value`` and ``.epoch`` (the epoch it reflects; None for strict). Raises
        BadRequest, CallFailed (the query's error: ``not_ready``, a retention the epoch
        is past, ...) or CallTimeout."""
        t = (timeout_s or self.timeout_s) + 1.0
        try:
            return self.submit_query(
                proc,
                *args,
                isolation=isolation,
                at_epoch=at_epoch,
                replica=replica,
                reader=reader,
                after_epoch=after_epoch,
                read_your_writes=read_your_writes,
            ).result(timeout=t)
        except TimeoutError:
            raise CallTimeout(f"{proc}: no answer within {t:.1f}s") from None

    def submit_query(
        self,
        proc: str,
        *args: Any,
        isolation: str = "snapshot",
        at_epoch: int | None = None,
        replica: int | None = None,
        reader: int | None = None,
        after_epoch: int | None = None,
        read_your_writes: bool = False,
    ) -> Future:
        """``query`` without waiting: a future of its QueryAnswer."""
        if isolation not in ISOLATIONS:
            raise BadRequest(ERR_BAD_ARGUMENTS, f"isolation is one of {ISOLATIONS}")
        if at_epoch is not None and (
            isolation != "snapshot" or type(at_epoch) is not int or at_epoch < 0
        ):
            raise BadRequest(ERR_BAD_ARGUMENTS, "at_epoch: an epoch (int >= 0), snapshot only")
        after = self._after_epoch(after_epoch, read_your_writes)
        if at_epoch is not None and at_epoch < after:
            raise BadRequest(
                ERR_BAD_ARGUMENTS,
                f"at_epoch {at_epoch} is before after_epoch {after}: it cannot show those writes",
            )
        if isolation == "strict":
            out: Future = Future()
            inner = self.submit(proc, *args, replica=replica)

            def done(f: Future) -> None:
                try:
                    r = f.result()
                    settle(out, QueryAnswer(r.status, r.value, None, r.latency_s))
                except BaseException as e:  # noqa: BLE001 - handed to the caller as is
                    settle(out, e)

            inner.add_done_callback(done)
            return out
        for name, place in (("replica", replica), ("reader", reader)):
            if place is not None and (type(place) is not int or place < 0):
                raise BadRequest(ERR_BAD_ARGUMENTS, f"{name}: an int >= 0")
        self._check_usable()
        self._next_query_id += 1
        now = time.monotonic()
        fut: Future = Future()
        item = QueryItem(
            self._next_query_id,
            fut,
            proc,
            tuple(args),
            isolation,
            -1 if at_epoch is None else at_epoch,
            replica,
            now,
            now + self.timeout_s,
            reader=reader,
            after_epoch=after,
        )
        if not self._query_fetch:  # targets known now (fetched ones: the I/O thread checks)
            problem = self._queries.target_problem(item)
            if problem is not None:
                raise BadRequest(ERR_BAD_ARGUMENTS, problem)
        self._queries.encode(item)  # raises BadRequest here, on the caller's thread
        self._enqueue(item)
        return fut

    def _after_epoch(self, after_epoch: int | None, read_your_writes: bool) -> int:
        """The epoch a query waits for (0: none); BadRequest if it is not an epoch."""
        if type(read_your_writes) is not bool:
            raise BadRequest(ERR_BAD_ARGUMENTS, "read_your_writes: True or False")
        after = 0
        if after_epoch is not None:
            problem = wire.after_epoch_problem(after_epoch)
            if problem is not None:
                raise BadRequest(ERR_BAD_ARGUMENTS, problem)
            after = after_epoch
        return max(after, self.last_epoch) if read_your_writes else after

    # Streams (txn_library.streams, docs/STREAMS.md) --------------------------------
    def push(
        self,
        stream: str,
        batch_id: int,
        tuples: Sequence[Sequence[Any]],
        timeout_s: float | None = None,
    ) -> Result:
        """Push one atomic batch to ``stream`` (its dataflow's border transaction) and
        wait for it: the Result's value is ``[batch_id, tuples]``. A batch id pushed
        again with the same tuples gets the first push's answer (exactly once). Raises
        BadRequest if the stream refuses it (an id that does not increase, an id reused
        with other tuples; nothing changed) or as ``call`` does. A caller that keeps a
        ledger of request ids uses ``submit_push_with_id``: it has the id before the
        answer, which is when a ledger must write it down."""
        r = self.call(PUSH, stream, batch_id, list(tuples), timeout_s=timeout_s)
        if r.aborted:
            raise BadRequest(ERR_BAD_ARGUMENTS, str(r.value))
        return r

    def submit_push(self, stream: str, batch_id: int, tuples: Sequence[Sequence[Any]]) -> Future:
        """``push`` without waiting: the future resolves to its Result (aborted if the
        stream refused it). A connection's pushes keep their order."""
        return self.submit_push_with_id(stream, batch_id, tuples)[1]

    def submit_push_with_id(
        self, stream: str, batch_id: int, tuples: Sequence[Sequence[Any]]
    ) -> tuple[int, Future]:
        """``submit_push``, also returning the push's request id (as
        ``submit_with_id``): with ``proto.client_id`` it names the push in the log."""
        return self.submit_with_id(PUSH, stream, batch_id, list(tuples))

    def subscribe(
        self,
        stream: str,
        from_batch: int | None = None,
        *,
        poll_s: float = 0.002,
        poll_max_s: float = 0.05,
        stop: Callable[[], bool] | None = None,
        on_gap: Callable[[BatchesGone], None] | None = None,
        pushed: bool = True,
    ) -> Iterator[tuple[int, list[tuple]]]:
        """Each batch of ``stream`` once, in batch-id order, from ``from_batch`` on
        (None: the oldest the stream keeps when the first page is read):
        ``(batch_id, tuples)``, until ``stop()`` is true.

        Where the cluster has readers (named by its directory, or learned from the
        sequencer: ``cluster.info``), they push each new batch as they apply the epoch
        that made it (txn_library.client.sinks): a reader that dies or falls silent is
        left for the next, from the batch after the last one taken. Without readers (or
        ``pushed=False``) it polls ``stream.read`` through the sequencer, quickly while
        batches come, backing off to ``poll_max_s`` when none do. To resume after a
        restart of this process, subscribe again from the batch after the last one seen.

        Never skips a batch silently: when the stream no longer keeps the next batch
        this subscriber is due (named in ``from_batch``, or dropped by the stream's
        retention while the subscriber fell behind), the iterator raises BatchesGone
        (a BadRequest) naming the missing ids and the oldest kept. With ``on_gap``, it
        calls ``on_gap(gap)`` instead, each time, and goes on from the oldest kept
        (``on_gap`` may raise to stop)."""
        self._check_usable()
        sub = new_sub(next(self._sub_ids), stream, from_batch, time.monotonic()) if pushed else None
        return subscription(
            SinkCursor(stream, from_batch, on_gap),
            sub,
            self._enqueue,
            lambda nxt: self.call("stream.read", stream, nxt, limits.stream_read_batches_max),
            stop,
            poll_s,
            poll_max_s,
            time.sleep,
        )

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

    def _enqueue(self, item: _Pending | _Control | QueryItem | SinkOp) -> None:
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
            if isinstance(item, SinkOp):
                item.sub.pages.put(self._stopped_error())
            else:
                settle(item.future, self._stopped_error())

    def _release_slot(self, _fut: Future) -> None:
        self._in_flight.release()

    # I/O thread ---------------------------------------------------------------
    def _wake(self) -> None:
        """Wake the I/O thread, unless a wake-up is on its way already: the thread
        clears ``_wake_due`` before it drains the queue, so whatever was queued before
        a submitter saw it set is drained after that wake-up is taken."""
        if self._wake_due:
            return
        self._wake_due = True
        with self._wake_send_lock:
            if not self._wake_send.closed:
                try:
                    self._wake_send.send(b"", flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # pipe full: the I/O thread has wake-ups pending already

    def _connect(self, address: str) -> zmq.Socket:
        return connect_dealer(self._ctx, address, self.curves.get(address))

    def _io_loop(self) -> None:
        pending: dict[int, _Pending] = {}
        try:
            self._serve(pending)
        except Exception as e:  # a bug: keep it (with its type) for every caller
            log.exception("ordo client I/O thread failed")
            self._io_failure = e
        finally:
            self._io_stopped.set()
            for p in pending.values():
                settle(p.future, self._stopped_error())
            for fut in self._control_waiters:
                settle(fut, self._stopped_error())
            for item in self._info_waiting:
                settle(item.future, self._stopped_error())
            self._queries.fail_all(self._stopped_error())
            self._queries.close()
            for op in self._sinks_waiting:
                op.sub.pages.put(self._stopped_error())
            self._sinks.fail_all(self._stopped_error())
            self._sinks.close_all()
            self._fail_queued()
            close_watched(self._sock, getattr(self, "_mon", None))
            self._wake_recv.close(linger=0)

    def _serve(self, pending: dict[int, _Pending]) -> None:
        self._poller = poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        next_check = time.monotonic() + 0.1
        failover = self._failover
        self._mon: zmq.Socket | None = None
        self._watch(poller)
        single = len(self.addresses) == 1
        while not self._closed.is_set():
            events = dict(poller.poll(100))
            if self._wake_recv in events:
                while self._wake_recv.poll(0):
                    self._wake_recv.recv()
                # Cleared after the wake-ups are taken and before _send_new drains the
                # queue (see _wake): a submitter that sets it from here on sends a
                # wake-up this loop has not taken, so the mark is never left set with
                # no wake-up on its way (which would leave calls to the poll timeout).
                self._wake_due = False
            if self._mon is not None and self._mon in events and drain_drops(self._mon):
                if single:
                    # The sequencer went away (a restart): what it had not answered may
                    # be lost with it, and what we sent since waits in ZeroMQ's queue for
                    # the next one. A fresh socket drops that queue, and every unanswered
                    # call goes again in the order it was first sent (same ids), so a
                    # connection's calls keep their order across the restart.
                    self._reconnect(poller, self.address)
                    self._resend_all(pending, time.monotonic())
                    self._info_moved()
                else:
                    failover.connection_dropped()
            sock = self._sock
            self._send_new(sock, pending, poller)
            while sock.poll(0):
                failover.heard(time.monotonic())
                self._on_reply(sock.recv(), pending)
            self._queries.poll_ready(events, poller)
            self._sinks.poll_ready(events, poller)
            now = time.monotonic()
            if len(self.addresses) > 1:
                self._maybe_fail_over(poller, pending, now)
            if now >= next_check:
                self._expire(self._sock, pending, now)
                self._queries.expire(poller, now)
                self._sinks.tick(poller, now)
                self._info_tick(now)
                next_check = now + 0.1

    def _maybe_fail_over(
        self, poller: zmq.Poller, pending: dict[int, _Pending], now: float
    ) -> None:
        """Move to the leader a follower named, or to the next address when the current
        one is silent with calls out (failover.py); then resend every unanswered
        call, same ids."""
        current = self._failover.address
        target = self._failover.due(now, bool(pending))
        if target is None:
            return
        if target != current:
            self._reconnect(poller, target)
            log.info("ordo client: moved to %s", target)
            self._info_moved()
        self._resend_all(pending, now)

    def _reconnect(self, poller: zmq.Poller, address: str) -> None:
        """A fresh socket to ``address`` (what the old one still queued is dropped)."""
        self._unwatch(poller)
        poller.unregister(self._sock)
        self._sock.close(linger=0)
        self._sock = self._connect(address)
        poller.register(self._sock, zmq.POLLIN)
        self._watch(poller)

    def _resend_all(self, pending: dict[int, _Pending], now: float) -> None:
        for p in pending.values():
            p.resend_at = now + self.retry_s
        for frame in self.proto.frames([p.call for p in pending.values()]):
            _send(self._sock, frame)

    def _watch(self, poller: zmq.Poller) -> None:
        """Monitor the current connection (connection.watch)."""
        self._mon = watch(self._sock, poller, self, self.address)

    def _unwatch(self, poller: zmq.Poller) -> None:
        unwatch(self._sock, self._mon, poller)
        self._mon = None

    def _send_new(self, sock: zmq.Socket, pending: dict[int, _Pending], poller: zmq.Poller) -> None:
        calls: list[bytes] = []
        while True:
            try:
                item = self._submit_q.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, QueryItem):
                self._dispatch_query(item, time.monotonic())
                continue
            if isinstance(item, SinkOp):
                self._dispatch_sink(item, time.monotonic())
                continue
            if isinstance(item, _Control):
                if _send(sock, wire.encode(item.request)):
                    self._control_waiters.append(item.future)  # replies come in order
                else:
                    settle(item.future, CallTimeout(f"no connection to {self.address}"))
                continue
            pending[item.req_id] = item
            calls.append(item.call)
        for frame in self.proto.frames(calls):
            _send(sock, frame)  # not sent: its calls go again when their retry is due

    def _on_reply(self, frame: bytes, pending: dict[int, _Pending]) -> None:
        reply = self.proto.read_reply(frame)
        if reply is None:
            self._malformed(f"undecodable reply frame of {len(frame)} bytes")
            return
        kind, body = reply[0], reply[1]
        if kind == wire.REP_CLUSTER_INFO:  # not a control waiter's: asked by this thread
            self._on_cluster_info(body)
            return
        if kind in (wire.REP_STATUS, wire.REP_OK, wire.REP_ERROR):
            if self._control_waiters:  # control replies come back in request order
                settle(self._control_waiters.pop(0), (kind, body))
            return
        if kind != wire.REP_RESULTS or not isinstance(body, tuple):
            self._malformed(f"unexpected reply kind {kind!r}")
            return
        now = time.monotonic()
        epochs = wire.results_epochs(reply, len(body))
        if epochs is None and len(reply) > 2:
            self._malformed("a results reply's epochs")  # the values stand, epochs unknown
        self._failover.leader_term(wire.results_term(reply))
        for i, entry in enumerate(body):
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
            answer = wire.not_leader_answer(value) if status == ERROR else None
            if answer is not None and len(self.addresses) > 1:
                # not sequenced there: keep it pending, move, resend (same ids)
                self._failover.not_leader(answer.hint, now, answer.term)
                continue
            p = pending.pop(req_id, None)
            if p is None:
                continue  # answered already (a retry's second answer), or expired
            epoch = epochs[i] if epochs is not None else 0
            outcome = to_outcome(status, value, now - p.started, epoch)
            if epoch > self.last_epoch and isinstance(outcome, Result):
                self.last_epoch = epoch  # before the caller sees the result
            if not p.future.done():
                settle(p.future, outcome)

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
                    settle(
                        p.future, CallTimeout(f"{p.proc}: no answer within {self.timeout_s:.1f}s")
                    )
            elif now >= p.resend_at:
                p.resend_at = now + self.retry_s
                resend.append(p.call)
        for frame in self.proto.frames(resend):
            _send(sock, frame)

    # Query addresses from the sequencer (cluster.info) -------------------------
    def _dispatch_query(self, item: QueryItem, now: float) -> None:
        """Send a query to its target, or hold it until cluster.info names targets."""
        q = self._queries
        if not q.has_targets:
            self._info_waiting.append(item)
            self._ask_info(now)
            return
        problem = q.target_problem(item)
        if problem is not None:
            settle(item.future, BadRequest(ERR_BAD_ARGUMENTS, problem))
            return
        q.send(item, self._poller, now)

    def _dispatch_sink(self, op: SinkOp, now: float) -> None:
        """Open or close a pushed subscription; one opened before cluster.info named the
        readers waits for it (without readers, its subscriber polls: NoReaders)."""
        if op.kind == "close":
            self._sinks_waiting = [w for w in self._sinks_waiting if w.sub is not op.sub]
            self._sinks.close(op.sub.sub_id, self._poller)
        elif not self._sinks.readers and self._query_fetch and not self._queries.has_targets:
            self._sinks_waiting.append(op)
            self._ask_info(now)
        else:
            self._sinks.open(op.sub, self._poller)

    def _ask_info(self, now: float) -> None:
        """Send REQ_CLUSTER_INFO, unless an ask is out and not yet due again."""
        if self._info_asked_at is not None and now < self._info_asked_at + self.retry_s:
            return
        self._info_asked_at = now
        _send(self._sock, wire.encode(wire.ClusterInfoRequest()))  # unsent: asked again

    def _info_moved(self) -> None:
        """Another sequencer (or the same one restarted): ask it where queries go."""
        self._info_asked_at = None  # an ask to the one before is not answered here
        if self._query_fetch and self._queries.has_targets:
            self._info_refresh = True

    def _info_tick(self, now: float) -> None:
        """Expire queries that waited too long for cluster.info; ask (again) if due."""
        q = self._queries
        if q.exhausted and now >= self._info_answered_at + self.retry_s:
            q.exhausted = False  # at most one refresh a retry_s: a target may just be slow
            if self._query_fetch:
                self._info_refresh = True  # every target it knows failed a query
        if self._info_waiting:
            keep = []
            for item in self._info_waiting:
                if now < item.deadline:
                    keep.append(item)
                else:
                    settle(
                        item.future,
                        CallTimeout(f"{item.proc}: no cluster.info answer from {self.address}"),
                    )
            self._info_waiting = keep
        if self._sinks_waiting and now >= self._sinks_waiting[0].sub.heard + self.timeout_s:
            self._fail_info_waiting(CallTimeout(f"no cluster.info answer from {self.address}"))
        if self._info_waiting or self._info_refresh or self._sinks_waiting:
            self._ask_info(now)

    def _on_cluster_info(self, body: Any) -> None:
        """A REP_CLUSTER_INFO reply: new targets, or the waiting queries fail saying why."""
        if self._info_asked_at is None or not self._query_fetch:
            self._malformed("a cluster.info reply nobody asked for")
            return
        self._info_asked_at = None
        self._info_refresh = False
        self._info_answered_at = time.monotonic()
        info = wire.cluster_info(body)
        curves = self._info_curves(info) if isinstance(info, wire.ClusterInfo) else info
        if isinstance(curves, str):
            self._malformed(f"a cluster.info reply ({curves})")
            self._fail_info_waiting(
                CallFailed("cluster_info", f"{self.address} answered cluster.info: {curves}")
            )
            return
        assert isinstance(info, wire.ClusterInfo)
        self._queries.update(info.partitions, info.readers, curves, self._poller)
        self._sinks.update(info.readers, curves, self._poller)
        for op in self._sinks_waiting:
            self._sinks.open(op.sub, self._poller)
        self._sinks_waiting = []
        waiting, self._info_waiting = self._info_waiting, []
        now = time.monotonic()
        for item in waiting:
            self._dispatch_query(item, now)

    def _info_curves(self, info: wire.ClusterInfo) -> dict[str, ClientCurve] | str:
        """This client's key pair toward each query target, or why it has none."""
        if info.partition_keys is None or info.reader_keys is None:
            return {}
        own = self.curves.get(self.address)
        if own is None:
            return (
                "the cluster runs CURVE: build the Client with this client's admitted "
                "key pair (curve=ClientCurve(...))"
            )
        pairs = [
            (a, k)
            for addrs, keys in zip(info.partitions, info.partition_keys, strict=True)
            for a, k in zip(addrs, keys, strict=True)
        ]
        pairs += list(zip(info.readers, info.reader_keys, strict=True))
        return {a: own.to_server(k) for a, k in pairs}

    def _fail_info_waiting(self, error: BaseException) -> None:
        for op in self._sinks_waiting:
            op.sub.pages.put(NoReaders())  # no readers learned: its subscriber polls
        self._sinks_waiting = []
        waiting, self._info_waiting = self._info_waiting, []
        for item in waiting:
            settle(item.future, error)
