"""The reads a partition sent its peers, kept for a peer that restarts.

A peer restarted from a checkpoint asks again for the reads of every multi-partition
transaction after it (``Partition.resend``); reads are idempotent on arrival, so
sending them twice is harmless. What is kept: the reads of each txn sent, in txn id
order, until every peer has said it will never ask for them again (its oldest kept
checkpoint starts after them: ``floor``), and at most ``limits.sent_reads_txns_max``
txns of them.

Invariants: ``sent`` is in increasing txn id order; every read of a txn >=
``complete_from`` is in ``sent`` (older ones may be gone); ``complete_from`` and each
peer's floor only grow.
"""

from __future__ import annotations

from collections import OrderedDict

from txn_library import limits


class SentReads:
    __slots__ = ("sent", "complete_from", "_floors", "_peers")

    def __init__(self, peers: int) -> None:
        # txn id -> (destinations, entry), in txn id order
        self.sent: OrderedDict[int, tuple[tuple[int, ...], tuple]] = OrderedDict()
        self.complete_from = 0  # every read of txns >= this is retained
        # Per peer: it will never ask again for reads of txns before this (its oldest
        # kept checkpoint). Reads before the lowest go once every peer has said.
        self._floors: dict[int, int] = {}
        self._peers = peers

    def restart_at(self, next_txn_id: int) -> None:
        """A partition resumed from a checkpoint: nothing before it was sent from here."""
        self.complete_from = next_txn_id

    def add(self, txn_id: int, dests: tuple[int, ...], entry: tuple) -> None:
        sent = self.sent
        sent[txn_id] = (dests, entry)
        if len(sent) > limits.sent_reads_txns_max:
            oldest, _ = sent.popitem(last=False)
            self.complete_from = oldest + 1

    def floor(self, peer: int, txn_id: int) -> None:
        """``peer`` will never ask for reads before ``txn_id`` again (never goes down);
        once every peer has said so, reads before the lowest floor are forgotten."""
        floors = self._floors
        floors[peer] = max(floors.get(peer, 0), txn_id)
        if len(floors) == self._peers:
            lowest = min(floors.values())
            sent = self.sent
            while sent and next(iter(sent)) < lowest:
                sent.popitem(last=False)
            self.complete_from = max(self.complete_from, lowest)

    def for_peer(self, peer: int, first_txn_id: int) -> list[tuple] | None:
        """Every retained read for ``peer`` from ``first_txn_id`` on, in txn order; None
        if reads that far back are no longer retained."""
        if first_txn_id < self.complete_from:
            return None
        return [
            entry
            for txn_id, (dests, entry) in self.sent.items()
            if txn_id >= first_txn_id and peer in dests
        ]
