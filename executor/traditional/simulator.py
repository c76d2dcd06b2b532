"""Every partition of a traditional cluster in one process, with a simulated network.

``LocalTraditionalCluster`` runs the live TraditionalPartition code of every
partition. Delivery is FIFO per (sender, receiver) channel, like a TCP connection,
and randomly interleaved across channels and partitions (seeded), with a virtual
clock. Messages and log frames go through msgpack exactly as on the wire
(executor.traditional.messages). A partition's log is a list of frames; ``crash``
drops a partition's memory and in-flight messages and rebuilds it from its log.

Invariants: a run is a function of its seed and its inputs (the virtual clock and
every partition's Random are derived from the seed); a partition's turn appends its
log records before any of its messages or replies leave ("synced" first); every
request is answered at most once.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import msgpack

from executor.core.state_hash import MASK64
from executor.core.storage import Storage
from executor.traditional.messages import decode_batch, encode_batch, pack_records
from executor.traditional.options import HistoryEntry, PrepareFault, TraditionalOptions
from executor.traditional.partition import TraditionalPartition
from txn_library.errors import invariant
from txn_library.placement import call_home


def _through_msgpack(obj: Any) -> Any:
    """``obj`` as the other end of a client connection decodes it."""
    return msgpack.unpackb(msgpack.packb(obj), use_list=False)


class LocalTraditionalCluster:
    """Every partition of a traditional cluster in one process (see the module docstring)."""

    def __init__(
        self,
        partitions: int,
        *,
        seed: int = 0,
        options: TraditionalOptions | None = None,
        faults: dict[int, PrepareFault] | None = None,
        record_history: bool = True,
        deliver_max: int = 4,
        storages: list[Storage] | None = None,
    ) -> None:
        self.partitions = partitions
        self.options = options or TraditionalOptions(status_every_ms=0)
        self.rng = random.Random(seed)
        self.seed = seed
        self.now_us = 1_000_000
        self.history: list[HistoryEntry] | None = [] if record_history else None
        self.faults = dict(faults or {})
        self.logs: list[list[bytes]] = [[] for _ in range(partitions)]
        self._genesis = storages
        self.parts = [self._make(p) for p in range(partitions)]
        self.channels: dict[tuple[int, int], deque[bytes]] = {
            (s, d): deque() for s in range(partitions) for d in range(partitions) if s != d
        }
        self.client_inbox: list[deque[tuple]] = [deque() for _ in range(partitions)]
        self.results: dict[int, tuple[int, Any]] = {}
        self.deliver_max = deliver_max
        self.steps = 0
        self._next_req = 0

    def _make(self, p: int) -> TraditionalPartition:
        storage = None
        if self._genesis is not None:  # a crash restarts from a copy of the genesis state
            storage = Storage()
            storage.load(self._genesis[p].rows())
        return TraditionalPartition(
            p,
            self.partitions,
            storage,
            options=self.options,
            clock=lambda: self.now_us,
            rng=random.Random(self.seed * 7919 + p + 100 * len(self.logs[p])),
            prepare_fault=self.faults.get(p),
            history=self.history,
        )

    # Clients ------------------------------------------------------------------------------
    def submit(self, proc: str, *args: Any, at: int | None = None) -> int:
        self._next_req += 1
        p = call_home(proc, args, self.partitions) if at is None else at
        self.client_inbox[p].append((self._next_req, proc, list(args)))
        return self._next_req

    # Stepping -----------------------------------------------------------------------------
    def _sources(self, p: int) -> list[Any]:
        srcs: list[Any] = [c for c in self.channels if c[1] == p and self.channels[c]]
        if self.client_inbox[p]:
            srcs.append("client")
        return srcs

    def step(self) -> bool:
        """Deliver a few messages to one random partition, run its turn. False if idle."""
        busy = [p for p in range(self.partitions) if self._sources(p)]
        if not busy:
            due = [d for d in (x.next_deadline_us() for x in self.parts) if d is not None]
            if not due:
                return False
            self.now_us = max(self.now_us, min(due))
            for p in range(self.partitions):
                self._turn(p)
            return True
        p = self.rng.choice(busy)
        self.deliver(p, self.rng.randint(1, self.deliver_max))
        self.now_us += self.rng.randint(0, 200)
        self._turn(p)
        return True

    def deliver(self, p: int, count: int) -> None:
        """Hand ``count`` random inputs to partition p (FIFO per channel), no turn end."""
        part = self.parts[p]
        for _ in range(count):
            srcs = self._sources(p)
            if not srcs:
                return
            src = self.rng.choice(srcs)
            if src == "client":
                inbox = self.client_inbox[p]
                k = self.rng.randint(1, max(1, len(inbox)))
                calls = [inbox.popleft() for _ in range(min(k, len(inbox)))]
                part.on_calls(b"sim", b"sim-client", _through_msgpack(calls))
            else:
                sender, msgs = decode_batch(self.channels[src].popleft())
                part.on_peer(sender, msgs)

    def deliver_channel(self, src: int, dst: int) -> None:
        sender, msgs = decode_batch(self.channels[(src, dst)].popleft())
        self.parts[dst].on_peer(sender, msgs)
        self._turn(dst)

    def deliver_clients(self, p: int) -> None:
        inbox = self.client_inbox[p]
        calls = [inbox.popleft() for _ in range(len(inbox))]
        self.parts[p].on_calls(b"sim", b"sim-client", _through_msgpack(calls))
        self._turn(p)

    def _turn(self, p: int) -> None:
        part = self.parts[p]
        part.tick()
        records, peer_out, client_out = part.take_outputs()
        if records:
            self.logs[p].append(pack_records(records))  # "synced" before anything leaves
        for q, msgs in peer_out.items():
            self.channels[(p, q)].append(encode_batch(p, msgs))
        for _identity, replies in client_out.items():
            for req_id, status, value in _through_msgpack(replies):
                invariant(req_id not in self.results, f"request {req_id} answered twice")
                self.results[req_id] = (status, value)
        self.steps += 1

    def run(self, max_steps: int = 1_000_000) -> None:
        """Step until no message, call or transaction is left anywhere."""
        for _ in range(max_steps):
            if self.quiet():
                return
            self.step()
        raise RuntimeError(
            f"not quiet after {max_steps} steps: {len(self.results)}/{self._next_req} answered"
        )

    def quiet(self) -> bool:
        return (
            all(not c for c in self.channels.values())
            and all(not i for i in self.client_inbox)
            and all(x.idle() for x in self.parts)
        )

    # Faults -------------------------------------------------------------------------------
    def crash(self, p: int) -> None:
        """Partition p loses its memory and connections; it restarts from its log."""
        for (s, d), ch in self.channels.items():
            if p in (s, d):
                ch.clear()
        part = self._make(p)
        part.recover(self.logs[p])
        self.parts[p] = part
        self._turn(p)

    # Checks -------------------------------------------------------------------------------
    @property
    def state_hash(self) -> int:
        return sum(x.storage.state_hash for x in self.parts) & MASK64

    def check_invariants(self) -> None:
        for x in self.parts:
            x.check_invariants()
