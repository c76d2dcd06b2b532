"""The load generator's sockets: where its calls travel, and failover between sequencers.

The generator names a socket by its slot, ``connection * per_connection + target``:
- without failover, one DEALER per (connection, target): the sequencer, or each
  partition of a traditional cluster (the generator's ``route`` picks the target);
- with failover, one slot per connection, whose DEALER talks to one sequencer of a
  replicated ordering layer at a time and moves between them by the rules of
  txn_library/client/failover.py (a follower's "not leader" hint, silence while calls
  are out, a dropped connection, watched by a monitor: txn_library/client/connection.py).
  The generator then resends that slot's unanswered calls with the same ids, so each
  still executes at most once.

Each connection is one client identity: its own ClientProtocol, unordered (every
terminal is an independent user with at most its own calls out, or arrivals are
independent, so nothing relies on the order of calls in flight together:
sequencer.batch_order). CURVE keys, one per target address, are set on every DEALER
before it connects.

Invariants: every frame sent holds at most ``limits.loadgen_frame_calls_max`` calls and
fits the sequencer's intake byte bound (ClientProtocol.frames); ``flush`` never blocks:
it takes from each outbox, in place (the generator holds the same lists), what its socket
queued, and a socket with no connection at all keeps the rest for the next flush (a
blocked send would stop the generator's loop); a slot's socket is registered with
the poller exactly while it is open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import zmq

from txn_library import limits
from txn_library.client.connection import close_watched, connect_dealer, drain_drops, unwatch, watch
from txn_library.client.failover import Failover
from txn_library.client.protocol import ClientProtocol
from txn_library.errors import ERROR
from txn_library.wire.curve import ClientCurve
from txn_library.wire.sequencer import not_leader_answer

log = logging.getLogger(__name__)


class LoadSockets:
    """The DEALER sockets of ``connections`` client identities to ``targets``.

    ``failover`` (needs several targets: the sequencers): one socket per connection,
    moving between them. ``curve``: one ClientCurve per target, or None (no CURVE).
    Not thread-safe: the generator's loop owns it.
    """

    def __init__(
        self,
        targets: Sequence[str],
        connections: int,
        *,
        failover: bool = False,
        curve: Sequence[ClientCurve] | None = None,
    ) -> None:
        self.targets = list(targets)
        if curve is not None and len(curve) != len(self.targets):
            raise ValueError("curve: one ClientCurve per target address")
        self.curves: dict[str, ClientCurve] = dict(zip(self.targets, curve or (), strict=False))
        self.protos = [ClientProtocol(ordered=False) for _ in range(connections)]
        failover = failover and len(self.targets) > 1  # one address: nowhere to move
        self.per_connection = 1 if failover else len(self.targets)
        self._ctx: zmq.Context = zmq.Context.instance()
        self.poller = zmq.Poller()
        self.sockets: list[zmq.Socket] = []
        self.slot_of: dict[zmq.Socket, int] = {}
        for _ in range(connections):
            for addr in self.targets[: self.per_connection]:
                self.sockets.append(self._connect(len(self.sockets), addr))
        self.outbox: list[list[bytes]] = [[] for _ in self.sockets]
        # With failover: each connection's state (from ``start``), and the monitor of
        # its connection.
        self._failover_on = failover
        self.failover: list[Failover] = []
        self.monitors: list[zmq.Socket | None] = [
            self._watch(sock, self.targets[0]) for sock in self.sockets if failover
        ]
        self._monitor_slot = {m: i for i, m in enumerate(self.monitors) if m is not None}

    @property
    def failovers(self) -> int:
        """Moves to another sequencer, all connections together."""
        return sum(f.failovers for f in self.failover)

    def start(self, now: float) -> None:
        """The run starts: with failover, each connection's silence counts from now."""
        if self._failover_on:
            self.failover = [Failover(self.targets, now) for _ in self.protos]

    def slot(self, connection: int, target: int) -> int:
        return connection * self.per_connection + target

    def close(self) -> None:
        monitors = self.monitors or [None] * len(self.sockets)  # none without failover
        for sock, mon in zip(self.sockets, monitors, strict=True):
            close_watched(sock, mon)  # the monitor stopped first (client_socket)

    # Sending ------------------------------------------------------------------------
    def flush(self) -> None:
        """Send every slot's outbox, in frames within the bounds, without blocking."""
        step = limits.loadgen_frame_calls_max
        for i, out in enumerate(self.outbox):
            if not out:
                continue
            proto = self.protos[i // self.per_connection]
            sock = self.sockets[i]
            sent = 0
            try:
                for first in range(0, len(out), step):
                    for frame in proto.frames(out[first : first + step]):
                        sock.send(frame, zmq.NOBLOCK)
                    sent = min(len(out), first + step)
            except zmq.Again:  # no connection to queue on (a send would block): later
                pass
            del out[:sent]  # in place: the generator holds the same lists

    # Failover -----------------------------------------------------------------------
    def dropped(self, monitor: zmq.Socket) -> None:
        """``monitor`` is ready: its connection may have dropped."""
        slot = self._monitor_slot[monitor]
        if drain_drops(monitor):
            self.failover[slot].connection_dropped()

    def heard(self, slot: int, now: float) -> None:
        if self.failover:
            self.failover[slot].heard(now)

    def leader_term(self, slot: int, term: int) -> None:
        """The sequencer answering ``slot`` leads ``term`` (a results reply's trailer):
        hints of older terms are not followed from now on (client.failover)."""
        if self.failover and term:
            self.failover[slot].leader_term(term)

    def not_leader(self, slot: int, entries: Iterable[Any], now: float) -> Iterable[Any]:
        """``entries`` less the ERR_NOT_LEADER ones (their calls stay outstanding, to be
        resent where the hint leads); with failover only."""
        if not self.failover:
            return entries
        kept = []
        for entry in entries:
            try:
                _req_id, status, value = entry
            except (TypeError, ValueError):
                kept.append(entry)  # the generator counts it as malformed
                continue
            answer = not_leader_answer(value) if status == ERROR else None
            if answer is not None:  # not sequenced there: keep it pending, move, resend
                self.failover[slot].not_leader(answer.hint, now, answer.term)
                continue
            kept.append(entry)
        return kept

    def fail_over(self, now: float, calls_out: Sequence[int]) -> list[tuple[int, str | None]]:
        """Move the connections that are due to (client_failover.Failover.due):
        (slot, the address it moved to, or None if it stays) for each slot whose
        unanswered calls are to be resent. ``calls_out``: calls outstanding per slot."""
        due: list[tuple[int, str | None]] = []
        for slot, fo in enumerate(self.failover):
            current = fo.address
            target = fo.due(now, calls_out[slot] > 0)
            if target is None:
                continue
            if target == current:
                due.append((slot, None))
                continue
            self._move(slot, target)
            log.info("ordo load generator: connection %d moved to %s", slot, target)
            due.append((slot, target))
        return due

    def _move(self, slot: int, address: str) -> None:
        old = self.sockets[slot]
        mon = self.monitors[slot]
        if mon is not None:
            del self._monitor_slot[mon]
        unwatch(old, mon, self.poller)
        self.poller.unregister(old)
        del self.slot_of[old]
        old.close(linger=0)
        sock = self._connect(slot, address)
        self.sockets[slot] = sock
        self.monitors[slot] = mon = self._watch(sock, address)
        if mon is not None:
            self._monitor_slot[mon] = slot

    def _connect(self, slot: int, address: str) -> zmq.Socket:
        sock = connect_dealer(self._ctx, address, self.curves.get(address))
        self.poller.register(sock, zmq.POLLIN)
        self.slot_of[sock] = slot
        return sock

    def _watch(self, sock: zmq.Socket, address: str) -> zmq.Socket | None:
        return watch(sock, self.poller, self, address)
