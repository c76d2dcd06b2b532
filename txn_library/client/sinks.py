"""The client's sinks: each batch of a stream once, in batch-id order, pushed by the
cluster's readers (executor/reader/sinks.py) or, without readers, polled through the
sequencer (``stream.read``) (docs/STREAMS.md, "Sinks").

``SinkChannel`` is owned by the Client's I/O thread (sockets are not thread-safe): one
DEALER per reader it uses, every subscription's lease renewed and acknowledged
(``limits.sink_renew_s``), a reader silent for ``limits.sink_silence_s`` or refusing
(catching up, overloaded) left for the next one, from the batch after the last this
subscription took. Pages go to the subscriber's thread through a queue; ``batches``
turns pages into batches there, dropping repeats, and is shared with the polling
path, so both keep the same rules: never a batch twice, never one skipped silently
(``BatchesGone`` names the missing ids, or ``on_gap`` is told and the iterator goes
on from the oldest kept).

Invariants: a subscription's pages are taken only from the reader it currently asks
(a late page from one it left is dropped); the next id it acknowledges only grows; a
frame this channel cannot read is dropped and counted, never raised into the I/O
thread; sends never block it.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from txn_library import limits
from txn_library.client.connection import connect_dealer
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_NOT_READY,
    ERR_OVERLOADED,
    BadRequest,
    BatchesGone,
)
from txn_library.wire import reader as rwire
from txn_library.wire import sequencer as wire
from txn_library.wire.curve import ClientCurve

# What the I/O thread hands the subscriber's thread: a page (epoch, page) or a failure.
Item = tuple[int, dict] | BaseException
QUEUED_PAGES_MAX = 8  # pages waiting for the subscriber before acknowledgements pause


@dataclass(eq=False)
class _Sub:
    sub_id: int
    stream: str
    next: int | None  # the next batch id not taken (None: from the oldest kept)
    pages: queue.Queue  # Item, to the subscriber's thread
    reader: int
    heard: float
    renew_at: float = 0.0
    refusals: int = 0  # readers in a row that refused it
    acked: int | None = None  # the last ``next`` sent


class SinkChannel:
    """Pushed sinks over the readers' sockets (the I/O thread's)."""

    def __init__(
        self,
        ctx: zmq.Context,
        readers: Sequence[str],
        curves: dict[str, ClientCurve],
        clock: Callable[[], float],
    ) -> None:
        self.ctx = ctx
        self.readers = list(readers)
        self.curves = curves
        self.clock = clock
        self.sockets: dict[int, zmq.Socket] = {}
        self.subs: dict[int, _Sub] = {}
        self.turn = 0
        self.malformed = 0

    def update(
        self, readers: Sequence[str], curves: dict[str, ClientCurve], poller: zmq.Poller
    ) -> None:
        """New reader addresses (cluster.info): sockets to gone ones closed, every
        subscription asked again where it now goes."""
        if list(readers) == self.readers and curves == self.curves:
            return
        for sock in self.sockets.values():
            poller.unregister(sock)
            sock.close(linger=0)
        self.sockets.clear()
        self.readers, self.curves = list(readers), curves
        now = self.clock()
        for sub in list(self.subs.values()):
            if not self.readers:
                del self.subs[sub.sub_id]
                sub.pages.put(NoReaders())  # no reader any more: it polls
            else:
                self._move(sub, poller, now)

    # From the subscriber's thread, through the I/O thread's queue --------------------
    def open(self, sub: _Sub, poller: zmq.Poller) -> None:
        if not self.readers:
            sub.pages.put(NoReaders())  # it polls through the sequencer
            return
        sub.reader = self.turn % len(self.readers)
        self.turn += 1
        sub.heard = self.clock()
        self.subs[sub.sub_id] = sub
        self._send(sub, poller)

    def close(self, sub_id: int, poller: zmq.Poller) -> None:
        sub = self.subs.pop(sub_id, None)
        if sub is not None:
            self._put(sub.reader, rwire.encode(rwire.UnsubscribeRequest(sub_id)), poller)

    # I/O ------------------------------------------------------------------------------
    def _socket(self, reader: int, poller: zmq.Poller) -> zmq.Socket:
        sock = self.sockets.get(reader)
        if sock is None:
            address = self.readers[reader]
            sock = self.sockets[reader] = connect_dealer(
                self.ctx, address, self.curves.get(address)
            )
            poller.register(sock, zmq.POLLIN)
        return sock

    def _put(self, reader: int, frame: bytes, poller: zmq.Poller) -> None:
        try:
            self._socket(reader, poller).send(frame, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no connection yet or its queue is full: the next renewal goes again

    def _send(self, sub: _Sub, poller: zmq.Poller) -> None:
        sub.renew_at = self.clock() + limits.sink_renew_s
        sub.acked = sub.next
        msg = rwire.SubscribeRequest(sub.sub_id, sub.stream, sub.next)
        self._put(sub.reader, rwire.encode(msg), poller)

    def _move(self, sub: _Sub, poller: zmq.Poller, now: float) -> None:
        """Ask the next reader, from the batch after the last this subscription took."""
        if not self.readers:
            return
        sub.reader = (sub.reader + 1) % len(self.readers)
        sub.heard = now
        self._send(sub, poller)

    def poll_ready(self, events: dict, poller: zmq.Poller) -> None:
        for reader, sock in list(self.sockets.items()):
            if sock in events:
                while sock.poll(0):
                    self.on_frame(reader, sock.recv(), poller)

    def on_frame(self, reader: int, frame: bytes, poller: zmq.Poller) -> None:
        try:
            msg = wire.unpack(frame)
        except Exception:  # noqa: BLE001 - a reader's bad frame is dropped
            self.malformed += 1
            return
        if rwire.sink_push_problem(msg) is not None:
            self.malformed += 1
            return
        _, sub_id, epoch, page, error = msg
        sub = self.subs.get(sub_id)
        if sub is None or sub.reader != reader:
            return  # closed, or a late push from a reader it has left
        now = self.clock()
        sub.heard = now
        if error is not None:
            code, message = error
            if code in (ERR_NOT_READY, ERR_OVERLOADED) and sub.refusals + 1 < len(self.readers):
                sub.refusals += 1
                self._move(sub, poller, now)  # catching up or full: the next reader
            elif code in (ERR_NOT_READY, ERR_OVERLOADED):
                sub.refusals = 0  # every reader refused: try again at the next renewal
            else:
                del self.subs[sub_id]
                sub.pages.put(BadRequest(code, message))
            return
        sub.refusals = 0
        batches = page.get("batches")
        if not isinstance(batches, tuple):
            self.malformed += 1
            return
        dropped = page.get("dropped")
        fresh = [b for b in batches if isinstance(b, tuple) and len(b) == 2 and type(b[0]) is int]
        if len(fresh) != len(batches):
            self.malformed += 1
            return
        if sub.next is not None:
            fresh = [b for b in fresh if b[0] >= sub.next]
        if type(dropped) is int and (sub.next is None or sub.next <= dropped):
            sub.pages.put((epoch, page))  # a gap (or where the oldest kept starts)
            sub.next = max(sub.next or 0, dropped + 1)
        elif fresh:
            sub.pages.put((epoch, {**page, "batches": fresh}))
        if fresh:
            sub.next = fresh[-1][0] + 1
        if sub.next != sub.acked and sub.pages.qsize() < QUEUED_PAGES_MAX:
            self._send(sub, poller)  # acknowledged: the reader pushes on

    def tick(self, poller: zmq.Poller, now: float) -> None:
        for sub in list(self.subs.values()):
            if now - sub.heard >= limits.sink_silence_s:
                self._move(sub, poller, now)  # silent: gone, or cut off
            elif now >= sub.renew_at or (
                sub.next != sub.acked and sub.pages.qsize() < QUEUED_PAGES_MAX
            ):
                self._send(sub, poller)

    def fail_all(self, error: BaseException) -> None:
        for sub in self.subs.values():
            sub.pages.put(error)
        self.subs.clear()

    def close_all(self, poller: zmq.Poller | None = None) -> None:
        for sock in self.sockets.values():
            if poller is not None:
                poller.unregister(sock)
            sock.close(linger=0)
        self.sockets.clear()


class NoReaders(Exception):
    """Handed to a subscriber when no reader can push to it: it polls instead."""


@dataclass
class SinkOp:
    """A subscriber's request to the I/O thread: open or close its subscription."""

    kind: str  # "open" | "close"
    sub: _Sub


def new_sub(sub_id: int, stream: str, from_batch: int | None, now: float) -> _Sub:
    return _Sub(sub_id, stream, from_batch, queue.Queue(), 0, now)


class SinkCursor:
    """Where a subscriber is: pages (as ``stream.read`` returns them) in, batches out,
    each once, in order, from ``from_batch`` (None: the oldest the stream keeps at the
    first page). A page whose ``dropped`` passes the next id due is a gap: BatchesGone,
    or ``on_gap`` told and the cursor goes on from the oldest kept."""

    def __init__(
        self,
        stream: str,
        from_batch: int | None,
        on_gap: Callable[[BatchesGone], None] | None,
    ) -> None:
        self.stream = stream
        self.from_batch = from_batch
        self.on_gap = on_gap
        self.nxt = 0 if from_batch is None else from_batch
        self.first_page = True

    def take(self, page: dict) -> Iterator[tuple[int, list[tuple]]]:
        dropped = page.get("dropped")
        if self.from_batch is None and self.first_page and type(dropped) is int:
            self.nxt = max(self.nxt, dropped + 1)  # "the oldest kept": nothing missing yet
        self.first_page = False
        if type(dropped) is int and self.nxt <= dropped:
            gap = BatchesGone(self.stream, self.nxt, dropped, page.get("first"))
            if self.on_gap is None:
                raise gap
            self.on_gap(gap)
            self.nxt = dropped + 1
        for batch_id, tuples in page.get("batches") or ():
            if batch_id < self.nxt:
                continue  # pushed again: taken already
            self.nxt = batch_id + 1
            yield batch_id, [tuple(t) for t in tuples]


def subscription(
    cursor: SinkCursor,
    sub: _Sub | None,
    request: Callable[[SinkOp], None],
    read: Callable[[int], Any],
    stop: Callable[[], bool] | None,
    poll_s: float,
    poll_max_s: float,
    sleep: Callable[[float], None],
) -> Iterator[tuple[int, list[tuple]]]:
    """A subscriber's batches: pushed through ``sub`` (opened here with ``request``)
    while readers serve it, else (``sub`` None, or NoReaders handed) polled with
    ``read(next_id)``, one ``stream.read`` call through the sequencer, quickly while
    batches come, backing off to ``poll_max_s`` when none do."""
    pushed = sub is not None
    if sub is not None:
        request(SinkOp("open", sub))
    wait = poll_s
    try:
        while stop is None or not stop():
            if pushed:
                assert sub is not None
                try:
                    item = sub.pages.get(timeout=0.05)
                except queue.Empty:
                    continue
                if isinstance(item, NoReaders):
                    pushed = False
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield from cursor.take(item[1])
                continue
            r = read(cursor.nxt)
            if not r.ok:
                raise BadRequest(ERR_BAD_ARGUMENTS, f"stream.read: {r.value}")
            page = r.value
            yield from cursor.take(page)
            if page.get("batches"):
                wait = poll_s
            else:
                sleep(wait)
                wait = min(poll_max_s, wait * 2)
    finally:
        if sub is not None:
            request(SinkOp("close", sub))


__all__ = ["NoReaders", "SinkChannel", "SinkCursor", "SinkOp", "new_sub", "subscription"]
