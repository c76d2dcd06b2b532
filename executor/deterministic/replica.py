"""In-process execution of a whole replica (all partitions, no sockets).

``LocalReplica`` runs the very Partition code that runs live, moving peer reads in
memory (mid-batch too, through each partition's ``interleave``, as live). It is what
recovery replay, Spark replay and the whole-cluster simulation tests use, so they
exercise the live code path.

Its state hash after a log equals the serial oracle's (executor.deterministic.oracle).

Checkpoints in process are written synchronously by ``on_checkpoint``, so a
partition's checkpoint counts as durable as soon as that callback returns.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from executor.core.state_hash import MASK64
from executor.core.storage import Storage
from executor.deterministic.partition import Partition
from txn_library.wire.sequencer import Batch


class LocalReplica:
    def __init__(
        self,
        partitions: int,
        storages: list[Storage] | None = None,
        replica: int = 0,
        shuffle_seed: int | None = None,
    ) -> None:
        self.parts = [
            Partition(replica, p, partitions, storages[p] if storages else None)
            for p in range(partitions)
        ]
        self.results: dict[int, tuple[int, Any]] = {}
        self.query_results: list[tuple] = []  # (query id, tag, status, value) of on_query
        # A seeded shuffle of message delivery order exercises arrival-order independence.
        self._rng = random.Random(shuffle_seed) if shuffle_seed is not None else None

    def apply(
        self, batch: Batch, on_checkpoint: Callable[[int, list[Partition]], None] | None = None
    ) -> None:
        """Apply one batch to every partition and run it to completion.

        At a checkpoint-flagged epoch the partitions are drained (they are, after a
        full pump) and ``on_checkpoint(epoch, partitions)`` may write or compare them.
        """
        for p in self.parts:
            p.on_batch(batch, partial(self._deliver_reads, p))
        self.pump()
        due = self.parts[0].checkpoint_due
        if due is not None:
            if on_checkpoint is not None:
                on_checkpoint(due, self.parts)  # synchronous: durable when it returns
            for p in self.parts:
                p.checkpoint_taken()
                if on_checkpoint is not None:
                    p.checkpoint_durable(due)

    def apply_all(self, batches: Iterable[Batch]) -> None:
        for b in batches:
            self.apply(b)

    def _deliver_reads(self, sender: Partition) -> None:
        """A partition's queued reads, delivered now (its ``interleave``, mid-batch): a
        peer that has not reached their batch keeps them as early reads."""
        if self._rng is not None and self._rng.random() < 0.5:
            return  # shuffled delivery: held until a later call or the pump
        for q, entries in sender.take_peer_out().items():
            self.parts[q].on_reads(sender.partition, tuple(entries))

    def pump(self) -> None:
        """Deliver peer messages until nothing moves."""
        while True:
            msgs = []
            for p in self.parts:
                peer_out, results, queries = p.take_outputs()
                for txn_id, status, value, _ in results:
                    self.results[txn_id] = (status, value)
                self.query_results.extend(queries)
                for q, entries in peer_out.items():
                    msgs.append((q, p.partition, entries))
            if not msgs:
                return
            if self._rng is not None:
                self._rng.shuffle(msgs)
            for q, src, entries in msgs:
                self.parts[q].on_reads(src, tuple(entries))

    @property
    def state_hash(self) -> int:
        return sum(p.storage.state_hash for p in self.parts) & MASK64

    @property
    def last_epoch(self) -> int:
        return self.parts[0].last_epoch

    def idle(self) -> bool:
        return all(p.idle() for p in self.parts)
