"""Queries to partitions: the reads a call needs before (or instead of) a batch.

Three kinds, all sent here and answered through results.py: a dependent call's
reconnaissance read (its prediction), a single-partition read-only call (answered by
one replica, never sequenced), and the lookup of a call's result in the reporting
partition's result cache (a retry of a call logged before a restart).

Owner of the query table (query id -> (call, is_recon)): intake.py sends through
``query`` and ``requery``, results.py takes each answer's entry out of ``table``,
epochs.py empties it (``drain``) when stepping down. The table object is never
replaced (the others hold it).

Invariants:
- Query ids start at a random point in each incarnation: a partition's answer to a
  query of a previous incarnation must never match a new query.
- A call remembers its last query, so a retry of a call whose answer never came asks
  again, the next replica in turn (the partition it went to may have crashed with it);
  an answered query is never sent again.
"""

from __future__ import annotations

from sequencer.calls import PendingCall
from sequencer.outbox import Outbox
from txn_library.errors import invariant


class Queries:
    def __init__(self, replicas: int, outbox: Outbox, first_query_id: int) -> None:
        self.replicas = replicas
        self._outbox = outbox
        self.table: dict[int, tuple[PendingCall, bool]] = {}  # query id -> (call, is_recon)
        self._next_query_id = first_query_id
        self._query_rr = 0

    def next_replica(self) -> int:
        replica = self._query_rr % self.replicas
        self._query_rr += 1
        return replica

    def query(
        self, call: PendingCall, recon: bool, replica: int, partition: int, body: tuple
    ) -> None:
        """Send one query (proc name, args, min txn id) and remember it on the call, so
        that a retry of the call can send it again if the answer never comes."""
        qid = self._next_query_id
        self._next_query_id += 1
        self.table[qid] = (call, recon)
        call.query = (qid, recon, partition, body)
        self._outbox.query_out.setdefault((replica, partition), []).append((qid, replica, *body))

    def requery(self, call: PendingCall) -> None:
        """The client retried a call whose query is unanswered: the partition it went to
        may have crashed with it, so ask again (the next replica in turn)."""
        invariant(call.query is not None, "requery of a call that sent no query")
        assert call.query is not None  # for mypy: invariant() raised otherwise
        qid, recon, partition, body = call.query
        if self.table.pop(qid, None) is None:
            return  # answered meanwhile: the call is past its query
        self.query(call, recon, self.next_replica(), partition, body)

    def drain(self) -> list[PendingCall]:
        """Every call waiting for an answer, forgotten (stepping down: answer them all)."""
        calls = [call for call, _recon in self.table.values()]
        self.table.clear()
        return calls
