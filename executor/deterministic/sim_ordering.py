"""The simulated replicated ordering layer: one member's view of the shared store.

With ``SimOptions.sequencers`` > 1 the simulator runs N sequencer nodes over one
``sequencer.replication.MemoryStore`` (ZooKeeper's part: a quorum that is always up).
Each member (a ``sequencer.member.OrderingMember``, as live) reaches the store through
a ``MemberStore``; cutting a member off the network (``cut``) makes every store call
of that member raise CommitUnknown, as a ZooKeeper client whose connection is lost
does. The leader commits through
``ReplicatedLog`` over that view, so a cut-off leader can never commit again: its next
tick steps it down, and once its "session" has expired (the simulator's election
timer) another member claims a newer term, which fences it for good.

``PublishFirstLog`` is the planted bug ``publish-before-commit``: it hands the batch to
the partitions before the store commit. A leader cut off at that moment has published a
batch that is never committed; the end checks must catch what follows (replicas
executing a history the committed log does not hold).

``SimStore`` is the store itself with the faults of a ZooKeeper ensemble (with
``SimOptions.ha_faults``): it records every commit with its term (``on_commit``, the
history the checks compare answers with), and while it is *slow* (``slow_us`` > 0: it
lost a server, or its disks are slow) every commit costs the committing member that
latency (the simulator stalls it: ``on_commit``), and a share of commits
(``timeout_pct``) time out after they were applied: the leader gets CommitUnknown for
a batch that *is* committed, never publishes it, and steps down; the next leader
finds it in the store. Its unreachable windows are every member's view cut.

Invariants: a member's view adds nothing to the store's semantics but reachability;
the store holds exactly one committed batch per epoch; a commit that times out was
applied (the store's semantics hold; only the answer is lost).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from sequencer.log import CommandLog
from sequencer.replication import CommitUnknown, MemoryStore, OrderingStore, ReplicatedLog


class MemberStore:
    """One member's connection to the shared store (see module docstring)."""

    def __init__(self, store: MemoryStore, member: int) -> None:
        self.store = store
        self.member = member
        self.cut = False  # cut off the network: every call fails, outcome unknown

    def _check(self) -> None:
        if self.cut:
            raise CommitUnknown(f"member {self.member} is cut off from the ordering store")

    def claim_term(self) -> int:
        self._check()
        return self.store.claim_term()

    def commit(self, term: int, epoch: int, data: bytes) -> None:
        self._check()
        self.store.commit(term, epoch, data)

    def last_epoch(self) -> int:
        self._check()
        return self.store.last_epoch()

    def read(self, epoch: int) -> bytes | None:
        self._check()
        return self.store.read(epoch)

    def tail_first_epoch(self) -> int:
        self._check()
        return self.store.tail_first_epoch()

    def report_progress(self, member: int, last_epoch: int) -> None:
        self._check()
        self.store.report_progress(member, last_epoch)

    def progress(self) -> dict[int, int]:
        self._check()
        return self.store.progress()

    def trim_through(self, epoch: int) -> int:
        self._check()
        return self.store.trim_through(epoch)


class SimStore(MemoryStore):
    """The simulated ensemble: a MemoryStore that records commits and can be slow
    (see module docstring)."""

    def __init__(self, rng: random.Random, on_commit: Callable[[int, int], None]) -> None:
        super().__init__()
        self.rng = rng
        self.on_commit = on_commit  # (term, epoch) of every commit, as it lands
        self.slow_us = 0  # > 0: every commit costs the committer this long
        self.timeout_pct = 0.0  # while slow: share of commits applied, then timed out
        self.timeouts = 0

    def commit(self, term: int, epoch: int, data: bytes) -> None:
        super().commit(term, epoch, data)
        self.on_commit(term, epoch)
        if self.slow_us and self.timeout_pct and self.rng.random() * 100 < self.timeout_pct:
            self.timeouts += 1
            raise CommitUnknown(f"commit of epoch {epoch} timed out (it was applied)")


class PublishFirstLog(ReplicatedLog):
    """Planted bug ``publish-before-commit``: publish, then commit (see module doc)."""

    def __init__(
        self,
        local: CommandLog,
        store: OrderingStore,
        term: int,
        publish: Callable[[bytes], None],
    ) -> None:
        super().__init__(local, store, term)
        self.publish = publish

    def append(self, epoch: int, data: bytes) -> None:
        self.publish(data)
        super().append(epoch, data)
