"""The client's query channel: snapshot and read-committed queries straight to the
cluster's readers, or a replica's partitions, without the sequencer (docs/QUERIES.md).

Owned by the Client's I/O thread (sockets are not thread-safe). With readers
(executor/reader/: every partition in one process), a query the caller did not pin to
a replica goes to one reader, the next in turn (the one it names, if it names one);
one a reader refuses ``not_ready`` or leaves silent moves to the next reader, and
past the last to the replicas, as without readers. Without readers, a query goes to
one replica: the one the caller names, else the next in turn. Within it, to the first
partition its footprint touches when this process knows the procedure (its module is
imported), else to the next partition in turn: that partition coordinates. A query
with no answer within ``retry_s`` is sent again (queries change nothing, so a repeat
is harmless); after ``timeout_s`` its future fails with CallTimeout. A ``not_ready``
answer (the replica's partition is recovering, or has not completed the epoch named),
an ``unavailable`` one (a partition it needs is down) and silence move a query whose
replica the caller did not name to the next replica. Sends never block the I/O thread:
a socket that cannot take a frame (its peer refused our keys, or is gone) leaves the
query pending until its next resend.

A query may name an epoch its answer must reflect (``after_epoch``: read-your-writes
with the epoch of the caller's last committed call); the reader or partition waits for
it, bounded, and a ``not_ready`` past the wait moves the query on as any other.

A client given no query addresses learns them from a sequencer (``cluster.info``,
txn_library.client) and hands them to ``update``; ``exhausted`` tells it when a query
found no answer at any target it knows (every one silent or refusing), so it asks again.

Invariants: every frame sent is at most ``limits.request_bytes_max`` bytes; a reply
this channel cannot read is dropped and counted, never raised into the I/O thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from txn_library import limits
from txn_library.client.connection import connect_dealer
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_NOT_READY,
    ERR_TOO_LARGE,
    ERR_UNAVAILABLE,
    ERROR,
    OK,
    BadRequest,
    CallFailed,
    CallTimeout,
)
from txn_library.wire import sequencer as wire
from txn_library.wire.curve import ClientCurve

ISOLATIONS = ("snapshot", "read_committed", "strict")


@dataclass(frozen=True)
class QueryAnswer:
    """A query's answer: ``value`` as of ``epoch`` (the completed epoch it reflects;
    None for ``strict``, which reflects every transaction sequenced before it)."""

    status: int
    value: Any
    epoch: int | None
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class QueryItem:
    qid: int
    future: Future
    proc: str
    args: tuple
    isolation: str
    at_epoch: int
    replica: int | None  # named by the caller
    started: float
    deadline: float
    resend_at: float = 0.0
    target: tuple[int, int] = (0, 0)  # (replica, partition), or (READER, reader)
    first: int = -1  # the replica asked first (not named by the caller: each in turn)
    tried: int = 0  # readers, then replicas, moved on from (not ready, or silent)
    reader: int | None = None  # named by the caller
    first_reader: int = -1  # the reader asked first (each in turn)
    after_epoch: int = 0  # the answer reflects at least this epoch (0: any)


READER = -1  # a target's first element: a reader, not a replica


def settle(fut: Future, outcome: Any) -> None:
    """Resolve ``fut`` unless its owner cancelled it meanwhile (calls and queries)."""
    try:
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
    except InvalidStateError:
        pass  # cancelled by the caller: nobody is waiting for it


class QueryChannel:
    def __init__(
        self,
        ctx: zmq.Context,
        addresses: Sequence[Sequence[str]],
        client_id: bytes,
        retry_s: float,
        curves: dict[str, ClientCurve],
        readers: Sequence[str] = (),
    ) -> None:
        self.addresses = [list(r) for r in addresses]
        self.replicas = len(self.addresses)
        self.readers = list(readers)
        self.ctx = ctx
        self.client_id = client_id
        self.retry_s = retry_s
        self.curves = curves
        self.sockets: dict[tuple[int, int], zmq.Socket] = {}
        self.pending: dict[int, QueryItem] = {}
        self.malformed = 0
        self.exhausted = False  # a query went through every target without an answer
        self._turn = 0

    @property
    def has_targets(self) -> bool:
        return bool(self.readers or self.replicas)

    def target_problem(self, item: QueryItem) -> str | None:
        """Why the replica or reader ``item`` names is not one of this cluster's, or None."""
        if item.replica is not None and not 0 <= item.replica < self.replicas:
            return f"replica {item.replica}: 0..{self.replicas - 1}"
        readers = len(self.readers)
        if item.reader is not None and (item.replica is not None or not 0 <= item.reader < readers):
            if not readers:
                return "this client knows no reader (the cluster has none)"
            return f"reader {item.reader}: 0..{readers - 1}, and not with a replica"
        return None

    def update(
        self,
        addresses: Sequence[Sequence[str]],
        readers: Sequence[str],
        curves: dict[str, ClientCurve],
        poller: zmq.Poller,
    ) -> None:
        """New targets (a ``cluster.info`` answer): sockets to targets that changed are
        closed, and every pending query starts over among the new ones (a query naming
        a replica or reader the cluster no longer has fails with BadRequest)."""
        new_addresses = [list(r) for r in addresses]
        new_readers = list(readers)
        if (new_addresses, new_readers, curves) == (self.addresses, self.readers, self.curves):
            return
        for sock in self.sockets.values():
            poller.unregister(sock)
            sock.close(linger=0)
        self.sockets.clear()
        self.addresses, self.replicas = new_addresses, len(new_addresses)
        self.readers, self.curves = new_readers, dict(curves)
        now = time.monotonic()
        for qid, item in list(self.pending.items()):
            problem = self.target_problem(item)
            if problem is not None:
                del self.pending[qid]
                settle(item.future, BadRequest(ERR_BAD_ARGUMENTS, problem))
                continue
            item.tried, item.first, item.first_reader = 0, -1, -1
            self.send(item, poller, now)

    def encode(self, item: QueryItem) -> bytes:
        """The query's frame (raises BadRequest if it cannot be sent)."""
        entry = [item.qid, item.proc, list(item.args), item.isolation, item.at_epoch]
        if item.after_epoch:  # absent when 0: what a server before after_epoch reads
            entry.append(item.after_epoch)
        try:
            frame = msgpack.packb([wire.REQ_QUERY, self.client_id, [entry]])
        except (TypeError, ValueError, OverflowError) as e:
            raise BadRequest("bad_arguments", f"arguments do not encode: {e}") from None
        if len(frame) > limits.request_bytes_max:
            raise BadRequest(ERR_TOO_LARGE, f"query of {len(frame)} bytes")
        return frame

    def choices(self, item: QueryItem) -> int:
        """How many places an unanswered query may move through: the readers, then
        the replicas (one, if the caller named it); a named reader only."""
        if item.reader is not None:
            return 1
        if item.replica is not None:
            return 1
        return len(self.readers) + self.replicas

    def _route(self, item: QueryItem) -> tuple[int, int]:
        self._turn += 1
        if item.reader is not None:
            return READER, item.reader
        n = len(self.readers)
        if item.replica is None and item.tried < n:
            if item.first_reader < 0:
                item.first_reader = self._turn % n
            return READER, (item.first_reader + item.tried) % n
        if item.replica is not None:
            r = item.replica
        else:
            if item.first < 0:
                item.first = self._turn % self.replicas
            r = (item.first + item.tried - n) % self.replicas
        parts = len(self.addresses[r])
        p = self._turn % parts
        try:
            from txn_library.procedure import procedures

            proc = procedures().get(item.proc)
            if proc is not None:
                p = proc.participants_of(item.args, parts)[0]
        except BadRequest:
            pass  # the partition asked refuses it with the reason
        return r, p

    def socket(self, target: tuple[int, int], poller: zmq.Poller) -> zmq.Socket:
        sock = self.sockets.get(target)
        if sock is None:
            if target[0] == READER:
                address = self.readers[target[1]]
            else:
                address = self.addresses[target[0]][target[1]]
            sock = connect_dealer(self.ctx, address, self.curves.get(address))
            poller.register(sock, zmq.POLLIN)
            self.sockets[target] = sock
        return sock

    def send(self, item: QueryItem, poller: zmq.Poller, now: float) -> None:
        item.target = self._route(item)
        item.resend_at = now + self.retry_s
        self.pending[item.qid] = item
        self._put(item, poller)

    def _put(self, item: QueryItem, poller: zmq.Poller) -> None:
        """Send without blocking: a socket that cannot take it now (its peer refused us,
        or is gone) leaves the query pending, sent again at its next resend."""
        try:
            sock = self.socket(item.target, poller)
        except zmq.ZMQError as e:  # an address zmq refuses, or no socket left to make
            self.pending.pop(item.qid, None)
            settle(item.future, CallFailed(ERR_UNAVAILABLE, f"cannot connect: {e}"))
            return
        try:
            sock.send(self.encode(item), zmq.NOBLOCK)
        except zmq.Again:
            pass

    def on_frame(
        self, frame: bytes, poller: zmq.Poller, source: tuple[int, int] | None = None
    ) -> None:
        """A reply frame; ``source``: the target whose socket it came on. A refusal
        from a target the query has moved on from (it was silent, then answered late)
        is ignored: the query's current target answers it."""
        try:
            msg = msgpack.unpackb(frame, use_list=False)
        except Exception:  # noqa: BLE001 - a reply we cannot read: dropped, counted
            self.malformed += 1
            return
        if not (isinstance(msg, tuple) and len(msg) == 2 and msg[0] == wire.REP_QUERY):
            self.malformed += 1
            return
        now = time.monotonic()
        for entry in msg[1] if isinstance(msg[1], tuple) else ():
            if not (isinstance(entry, tuple) and len(entry) == 4 and type(entry[0]) is int):
                self.malformed += 1
                continue
            qid, status, value, epoch = entry
            item = self.pending.get(qid)
            if item is None:
                continue  # a repeat's second answer
            if status == ERROR:
                code, message = (
                    value if isinstance(value, tuple) and len(value) == 2 else ("?", value)
                )
                not_here = code in (ERR_NOT_READY, ERR_UNAVAILABLE)
                if not_here and source is not None and source != item.target:
                    continue  # a late refusal from where it was asked before
                if not_here and item.tried + 1 < self.choices(item):
                    item.tried += 1  # that reader or replica is recovering, behind or
                    self.send(item, poller, now)  # short of a partition: the next one
                    continue
                if not_here:
                    self.exhausted = True  # every target refused it
                del self.pending[qid]
                settle(item.future, CallFailed(str(code), str(message)))
                continue
            del self.pending[qid]
            settle(item.future, QueryAnswer(status, value, epoch, now - item.started))

    def expire(self, poller: zmq.Poller, now: float) -> None:
        for qid, item in list(self.pending.items()):
            if now >= item.deadline:
                del self.pending[qid]
                settle(item.future, CallTimeout(f"{item.proc}: no answer within the timeout"))
            elif now >= item.resend_at:
                if self.choices(item) > 1:
                    item.tried = (item.tried + 1) % self.choices(item)  # silent: the next
                    item.target = self._route(item)
                if item.tried == 0:
                    self.exhausted = True  # silent everywhere it could go
                item.resend_at = now + self.retry_s
                self._put(item, poller)

    def poll_ready(self, events: dict, poller: zmq.Poller) -> None:
        for target, sock in list(self.sockets.items()):
            if sock in events:
                while sock.poll(0):
                    self.on_frame(sock.recv(), poller, target)

    def fail_all(self, error: BaseException) -> None:
        for item in self.pending.values():
            settle(item.future, error)
        self.pending.clear()

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)
        self.sockets.clear()
