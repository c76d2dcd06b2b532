"""Failover across the sequencers of a replicated ordering layer: which one a client
connection talks to, and when it moves. Logic only; the caller owns the socket.

A connection given several sequencer addresses talks to one at a time. A follower
answers a call with ERR_NOT_LEADER naming the leader and the term it believes current;
the connection then moves to that address (or the next one) and resends every
unanswered call with the same ids, so the
new leader runs each at most once, and a call the old leader had committed is answered
from the log. A connection whose calls get no frame at all back for
``limits.client_failover_silence_s`` moves on to the next address the same way.
ERR_NOT_LEADER never reaches the caller.

A connection whose sequencer's process dies is dropped by that process's kernel; the
caller watches for that (txn_library.client.connection) and the connection moves on at
once, without waiting for the silence (only a connection that has answered counts: one
refused at the CURVE handshake drops as well). Until the ordering layer notices the dead
leader (its ZooKeeper session expires), the followers still name it; a connection that
left a *dropped* connection does not go back on such a hint: it asks the follower again
every ``limits.client_failover_backoff_s`` until the hint names another sequencer (the
new leader), and believes the old hint only after ``limits.client_failover_stale_hint_s``
(a restarted process is reached again that way, or at once by a newer term's hint). A
leader that is slow, paused or cut off keeps its connection: the connection leaves it
only after the silence and goes back at once if the followers name it. (Avoiding it
for a while instead, as 54a0fcf did, is not what stranded calls with a paused leader:
those were results sent to the deposed leader, fixed in 7981127; the simulator's
planted bug ``results-to-old-leader`` reproduces it.)

Terms: the connection keeps the highest term a ``not_leader`` answer or the leader's
own answers (``leader_term``) named, and never follows a hint of a lower one (a
follower that has not seen the newest election names an older leader): it moves to the
next address instead. A hint of a higher term than the one a dropped connection was
left at names a new leadership, and is followed even to that address at once (a
restarted sequencer elected again).

Used by ``txn_library.client.Client`` (one per client) and the load generator
(cluster/load_sockets.py, one per connection).

Invariants: ``address`` is always one of ``addresses``; two moves are at least
``limits.client_failover_backoff_s`` apart; ``failovers`` counts the moves to another
address and only grows; ``term`` only grows, and no hint of a term below it is followed.
"""

from __future__ import annotations

from collections.abc import Sequence

from txn_library import limits


class Failover:
    """The failover state of one connection. Not thread-safe: one loop owns it.

    The loop reports what it sees (``heard``, ``connection_dropped``, ``not_leader``)
    and asks ``due`` every turn what to do.
    """

    def __init__(self, addresses: Sequence[str], now: float) -> None:
        self.addresses = list(addresses)
        if not self.addresses:
            raise ValueError("failover needs at least one sequencer address")
        self.address = self.addresses[0]
        self.failovers = 0  # times the connection moved to another sequencer
        self.heard_at = now  # last frame from the current address
        self.move_to: str | None = None  # set by a "not leader" answer
        self.moved_at = 0.0
        self.term = -1  # the highest leader term a not_leader answer named (-1: none yet)
        self.stale_hints = 0  # hints ignored for naming a term below ``term``
        # (address, when, term then): the connection there dropped
        self.left_dropped: tuple[str, float, int] | None = None
        self.dropped = False  # the current connection dropped (socket monitor)
        self.served = False  # a reply came on the current connection
        self.ask_again_at: float | None = None  # resend here: the hint named that address

    def heard(self, now: float) -> None:
        """A frame came on the current connection."""
        self.heard_at = now
        self.served = True

    def connection_dropped(self) -> None:
        """The current connection dropped (its monitor said so)."""
        # Only a connection that served us counts: one refused at the handshake (no
        # admitted key) drops too, and must not make the client hop between addresses.
        self.dropped = self.served

    def leader_term(self, term: int) -> None:
        """The sequencer answering on the current connection leads ``term`` (0: it gave
        none): hints of older terms are not followed from now on."""
        self.term = max(self.term, term)

    def not_leader(self, hint: str, now: float, term: int = -1) -> None:
        """Follow a follower's hint, unless it names a term below the highest seen
        (then try the next address), or names the address whose connection this client
        has just seen dropped, at no newer term: then ask here again shortly (module
        docstring). ``term`` -1: the answer gave none."""
        if 0 <= term < self.term:
            self.stale_hints += 1
            self.move_to = ""  # no usable hint: the next address
            return
        self.term = max(self.term, term)
        left = self.left_dropped
        if (
            left is not None
            and hint == left[0]
            and now - left[1] < limits.client_failover_stale_hint_s
            and not term > left[2]
        ):
            if self.ask_again_at is None:
                self.ask_again_at = now + limits.client_failover_backoff_s
            return
        self.move_to = hint

    def due(self, now: float, calls_out: bool) -> str | None:
        """What to do now: None, nothing; else the address to resend every unanswered
        call to, same ids. That is the current address (asked again, or a hint naming
        it) or another one, which ``address`` already names: the caller reconnects there
        first. ``calls_out``: the connection has calls unanswered."""
        target = self.move_to
        dropped = self.dropped and calls_out
        silent = dropped or (
            calls_out
            and now - max(self.heard_at, self.moved_at) >= limits.client_failover_silence_s
        )
        if target is None and not silent:
            if self.ask_again_at is not None and now >= self.ask_again_at:
                self.ask_again_at = None
                return self.address
            return None
        if now - self.moved_at < limits.client_failover_backoff_s:
            return None
        if target is None or target == "" or target not in self.addresses:
            target = self.addresses[(self.addresses.index(self.address) + 1) % len(self.addresses)]
        if self.move_to is None and dropped:
            self.left_dropped = (self.address, now, self.term)
        self.dropped = self.served = False
        self.move_to = None
        self.ask_again_at = None
        self.moved_at = now
        if target != self.address:
            self.address = target
            self.failovers += 1
        return target
