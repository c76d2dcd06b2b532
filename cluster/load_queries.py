"""The load generator's queries: snapshot and read-committed queries straight to a
replica's partitions (TSpoon's queryable state, docs/QUERIES.md), beside the calls that
go to the sequencer.

A ``QueryTargets`` says which calls of a load are queries (those whose ``kind`` is in
``kinds``, or every call), at which isolation (``snapshot``, the default, or
``read_committed``; ``strict`` is an ordinary call through the sequencer: leave its kind
out) and epoch (``at_epoch``: time travel, snapshot only), and where they go: every
partition's query address, [replica][partition] (``ClusterConfig.query_addrs``). A
query goes to one replica (``replica``, else each in turn) and, within it, to the
partition ``route`` names (default: the first partition its footprint touches, as
txn_library/client/queries.py sends it); that partition coordinates the query.

``QuerySockets`` holds one DEALER per (connection, replica, partition), connection c
speaking for the generator's client identity c, and turns queries into frames
``[REQ_QUERY, client_id, [[query_id, proc, args, isolation, at_epoch], ...]]`` and the
partitions' replies ``[REP_QUERY, [[query_id, status, value, epoch], ...]]`` into the
generator's answers ``(query_id, status, value)``. A query's id is the generator's
request id, so a query unanswered after the generator's ``retry_s`` is resent with the
same id (a query changes nothing; a second answer finds nothing pending and is
ignored). An error (``not_ready``, ``overloaded``, a retention the epoch is past, ...)
is an answer like a call's error, counted under its code; nothing is retried elsewhere.

Invariants: every frame holds at most ``limits.loadgen_frame_calls_max`` queries and at
most ``limits.request_bytes_max`` bytes (a query too large for a frame alone is refused
when it is encoded: BadRequest); ``flush`` empties every outbox in place (the generator
holds the same lists); a socket keeps its slot for its life.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

from cluster.load_shapes import CallLike, Router
from txn_library import limits
from txn_library.client.connection import connect_dealer
from txn_library.client.protocol import ClientProtocol
from txn_library.errors import ERR_BAD_ARGUMENTS, ERR_TOO_LARGE, OK, BadRequest
from txn_library.procedure import lookup
from txn_library.wire import sequencer as wire
from txn_library.wire.curve import ClientCurve

QUERY_ISOLATIONS = ("snapshot", "read_committed")  # strict: an ordinary call
_ARRAY_HEADER_BYTES_MAX = 5  # msgpack array32


@dataclass(frozen=True)
class QueryTargets:
    """Which calls of a load go as queries, how, and where (see the module docstring).

    ``addresses``: [replica][partition] query addresses. ``kinds``: the call kinds sent
    as queries (None: every call). ``at_epoch``: a completed epoch to read at (snapshot
    only; None: the newest). ``replica``: the replica every query goes to (None: each in
    turn). ``route(proc, args)``: the partition a query goes to (None: the first its
    footprint touches). ``curves``: CURVE keys by query address (None: no CURVE).
    """

    addresses: Sequence[Sequence[str]]
    isolation: str = "snapshot"
    kinds: Collection[str] | None = None
    at_epoch: int | None = None
    replica: int | None = None
    route: Router | None = None
    curves: Mapping[str, ClientCurve] | None = None

    def check(self) -> None:
        """Raise ValueError unless the targets make sense."""
        if not self.addresses or not self.addresses[0]:
            raise ValueError("query targets need at least one replica with one partition")
        if len({len(r) for r in self.addresses}) != 1:
            raise ValueError("query targets: every replica has the same partitions")
        if self.isolation not in QUERY_ISOLATIONS:
            raise ValueError(
                f"query isolation is one of {QUERY_ISOLATIONS} (strict queries are "
                f"ordinary calls through the sequencer: leave their kind out of kinds)"
            )
        if self.at_epoch is not None and (self.isolation != "snapshot" or self.at_epoch < 0):
            raise ValueError("at_epoch: an epoch (>= 0), snapshot only")
        if self.replica is not None and not 0 <= self.replica < len(self.addresses):
            raise ValueError(f"replica {self.replica}: 0..{len(self.addresses) - 1}")


class QuerySockets:
    """The query DEALERs of a generator's connections, numbered from slot ``base``.

    ``protos``: the generator's connections (their client ids name the queries' sender).
    Sockets are registered with ``poller`` (the generator's). Not thread-safe: the
    generator's loop owns it.
    """

    def __init__(
        self,
        targets: QueryTargets,
        protos: Sequence[ClientProtocol],
        poller: zmq.Poller,
        base: int,
    ) -> None:
        targets.check()
        self.targets = targets
        self.replicas = len(targets.addresses)
        self.partitions = len(targets.addresses[0])
        self.per_connection = self.replicas * self.partitions
        self.base = base
        self.kinds = None if targets.kinds is None else frozenset(targets.kinds)
        self._isolation = targets.isolation
        self._at = -1 if targets.at_epoch is None else targets.at_epoch
        self._route = targets.route
        self._replica_turn = itertools.count()
        self._partition_turn = itertools.count()
        packer = msgpack.Packer()
        self._prefixes = [
            packer.pack_array_header(3) + wire.pack(wire.REQ_QUERY) + wire.pack(p.client_id)
            for p in protos
        ]
        self._entry_bytes_max = (
            limits.request_bytes_max - max(map(len, self._prefixes)) - _ARRAY_HEADER_BYTES_MAX
        )
        ctx: zmq.Context = zmq.Context.instance()
        curves = targets.curves or {}
        self.sockets: list[zmq.Socket] = []
        self.slot_of: dict[zmq.Socket, int] = {}  # the generator's slot numbers
        for _ in protos:
            for row in targets.addresses:
                for addr in row:
                    sock = connect_dealer(ctx, addr, curves.get(addr))
                    poller.register(sock, zmq.POLLIN)
                    self.slot_of[sock] = base + len(self.sockets)
                    self.sockets.append(sock)
        self.outbox: list[list[bytes]] = [[] for _ in self.sockets]
        # Completed epochs the OK answers reflected, lowest and highest (-1: none yet)
        self.epoch_min = -1
        self.epoch_max = -1

    def takes(self, call: CallLike) -> bool:
        """Whether ``call`` goes as a query."""
        return self.kinds is None or call.kind in self.kinds

    def encode(self, req_id: int, call: CallLike, connection: int) -> tuple[bytes, int]:
        """The query's bytes and the generator's slot of the socket it goes to.

        Raises BadRequest: ERR_BAD_ARGUMENTS if msgpack cannot encode an argument,
        ERR_TOO_LARGE if a frame holding only this query would exceed
        ``limits.request_bytes_max``."""
        proc, args = call.proc, call.args
        try:
            data = wire.pack([req_id, proc, list(args), self._isolation, self._at])
        except (TypeError, ValueError, OverflowError) as e:
            raise BadRequest(ERR_BAD_ARGUMENTS, f"{proc}: arguments do not encode: {e}") from e
        if len(data) > self._entry_bytes_max:
            raise BadRequest(
                ERR_TOO_LARGE,
                f"{proc}: query encodes to {len(data)} bytes; a frame holds at most "
                f"{limits.request_bytes_max} bytes",
            )
        r = self.targets.replica
        if r is None:
            r = next(self._replica_turn) % self.replicas
        p = self._partition(proc, args)
        return data, self.base + connection * self.per_connection + r * self.partitions + p

    def _partition(self, proc: str, args: Sequence[Any]) -> int:
        if self._route is not None:
            p = self._route(proc, args)
            if not 0 <= p < self.partitions:
                raise ValueError(f"query route gave partition {p}: 0..{self.partitions - 1}")
            return p
        try:
            return lookup(proc).participants_of(tuple(args), self.partitions)[0]
        except BadRequest:  # unknown here, or bad arguments: the partition asked says why
            return next(self._partition_turn) % self.partitions

    def flush(self) -> None:
        """Send every outbox in frames within the bounds, without blocking; take what
        was sent from them (in place), and keep what a socket with no connection could
        not queue for the next flush."""
        step = limits.loadgen_frame_calls_max
        budget = self._entry_bytes_max
        for i, out in enumerate(self.outbox):
            if not out:
                continue
            prefix = self._prefixes[i // self.per_connection]
            sock = self.sockets[i]
            batch: list[bytes] = []
            size = sent = 0
            try:
                for data in out:
                    if batch and (len(batch) >= step or size + len(data) > budget):
                        sock.send(_frame(prefix, batch), zmq.NOBLOCK)
                        sent += len(batch)
                        batch, size = [], 0
                    batch.append(data)
                    size += len(data)
                sock.send(_frame(prefix, batch), zmq.NOBLOCK)
                sent += len(batch)
            except zmq.Again:  # no connection to queue on (a send would block): later
                pass
            del out[:sent]

    def answers(self, frame: bytes) -> list[Any] | None:
        """The generator's answers ``(query_id, status, value)`` in a reply frame, or None
        if it is not a query reply. An entry of the wrong shape is passed on as it is
        (the generator counts it as malformed)."""
        try:
            msg = wire.unpack(frame)
        except (ValueError, msgpack.UnpackException):
            return None
        if not (
            isinstance(msg, tuple)
            and len(msg) == 2
            and msg[0] == wire.REP_QUERY
            and isinstance(msg[1], tuple)
        ):
            return None
        out: list[Any] = []
        for entry in msg[1]:
            if not (isinstance(entry, tuple) and len(entry) == 4):
                out.append(entry)
                continue
            qid, status, value, epoch = entry
            if status == OK and type(epoch) is int:
                if self.epoch_min < 0 or epoch < self.epoch_min:
                    self.epoch_min = epoch
                if epoch > self.epoch_max:
                    self.epoch_max = epoch
            out.append((qid, status, value))
        return out

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)


def _frame(prefix: bytes, entries: list[bytes]) -> bytes:
    return b"".join([prefix, msgpack.Packer().pack_array_header(len(entries)), *entries])
