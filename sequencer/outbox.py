"""What the sequencer sends: replies to clients, answers to control requests, queries to
partitions. The role does no I/O; the process loop takes each outbox whole once a turn
and sends it.

Owner of the three outboxes. Every part writes through this object (``reply``, or
``query_out`` looked up at each write), never through a dict it kept: ``take_*`` swaps
in a fresh one, and the caller owns what it took.

Invariant: ``client_epochs[identity]`` has one epoch per entry of
``client_out[identity]``, in the same order (the wire's epochs trailer,
txn_library.wire.sequencer.encode_results_reply).
"""

from __future__ import annotations

from typing import Any

from txn_library.wire.sequencer import ControlReply


class Outbox:
    __slots__ = ("client_epochs", "client_out", "control_out", "query_out")

    def __init__(self) -> None:
        # client identity -> [(req_id, status, value)]
        self.client_out: dict[bytes, list] = {}
        # client identity -> [the epoch each entry's call was sequenced in (0: none)]
        self.client_epochs: dict[bytes, list[int]] = {}
        self.control_out: list[tuple[bytes, ControlReply]] = []
        # (replica, partition) -> [(query id, replica, proc name, args, min txn id)]
        self.query_out: dict[tuple[int, int], list] = {}

    def reply(self, identity: bytes, req_id: Any, status: int, value: Any, epoch: int = 0) -> None:
        """A result for ``identity``; ``epoch``: the batch its call was sequenced in."""
        self.client_out.setdefault(identity, []).append((req_id, status, value))
        self.client_epochs.setdefault(identity, []).append(epoch)

    def take_client_out(self) -> dict[bytes, list]:
        """The results, without their epochs (which are dropped)."""
        return self.take_client_replies()[0]

    def take_client_replies(self) -> tuple[dict[bytes, list], dict[bytes, list[int]]]:
        """The results and, per identity in the same order, their epochs."""
        out, self.client_out = self.client_out, {}
        epochs, self.client_epochs = self.client_epochs, {}
        return out, epochs

    def take_control_out(self) -> list[tuple[bytes, ControlReply]]:
        out, self.control_out = self.control_out, []
        return out

    def take_query_out(self) -> dict[tuple[int, int], list]:
        out, self.query_out = self.query_out, {}
        return out
