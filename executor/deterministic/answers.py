"""A reporting partition's recent answers to its callers, kept so that a retry is
answered without running the call again (docs/DURABILITY.md, "Exactly-once retries").

The sequencer asks for one (``RESULT_LOOKUP``) when a client retries a call that was
logged before a sequencer restart; a checkpoint carries the most recent ones
(``recent``), which a partition restarted from it takes back (``remember``) before its
log replays.

Invariants: at most ``limits.result_cache_txns_max`` answers, the oldest forgotten
first; an answer is the one the partition reported, never recomputed.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice
from typing import Any

from txn_library import limits
from txn_library.errors import ERROR

Answer = tuple[int, int, Any]  # (txn_id, status, value)


class Answers:
    def __init__(self) -> None:
        self.entries: OrderedDict[int, tuple[int, Any]] = OrderedDict()

    def add(self, txn_id: int, status: int, value: Any) -> None:
        entries = self.entries
        entries[txn_id] = (status, value)
        if len(entries) > limits.result_cache_txns_max:
            entries.popitem(last=False)

    def lookup(self, args: Any) -> tuple[int, Any]:
        """The answer of txn ``args[0]`` (a RESULT_LOOKUP's arguments), or an error."""
        txn_id = args[0] if isinstance(args, tuple) and args else None
        hit = self.entries.get(txn_id) if isinstance(txn_id, int) else None
        if hit is None:
            return ERROR, ("result_unknown", f"result of txn {txn_id} is no longer cached")
        return hit

    def recent(self) -> list[Answer]:
        """The newest ``limits.checkpoint_answers_max`` answers, oldest first (what a
        checkpoint carries: executor/core/checkpoint/format.py)."""
        n = min(len(self.entries), limits.checkpoint_answers_max)
        newest = list(islice(reversed(self.entries.items()), n))
        newest.reverse()
        return [(txn_id, status, value) for txn_id, (status, value) in newest]

    def remember(self, answers: list[Answer]) -> None:
        """Answers a checkpoint carried, taken back before the log replays."""
        for txn_id, status, value in answers:
            self.add(txn_id, status, value)
