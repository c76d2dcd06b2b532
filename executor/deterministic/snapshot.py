"""Queries that read a partition's state without the log and without locks (TSpoon's
queryable state; docs/QUERIES.md): the reads of a query at a past epoch, and running
its body over them.

A query is a read-only procedure. Its footprint's reads are split by placement: the
partitions it touches each read their own entries (``local_reads``) at the query's
epoch, from the Storage and its row versions (``Snapshot``), and the coordinator (the
partition the client asked) runs the body once over its own reads and the others'
(``run_query``), exactly as a multi-partition transaction's executor does with its
peers' reads. Nothing here takes a lock or touches the lock manager: a query never
delays a transaction.

Isolation (TSpoon's levels): ``snapshot`` reads every partition at one completed epoch
E (a serial prefix of the history: PL3); ``read_committed`` reads each partition's
state as it is now (committed transactions only, but not one instant: PL2); ``strict``
(PL4) is not served here: it is a call through the sequencer, ordered with the
transactions.

Invariants: a snapshot read at E is served only for ``oldest <= E <= completed`` of
the partition that reads (``epoch_problem``); the body sees exactly the rows its
footprint covers (``TxnContext`` checks), and writes nothing (its write cover is
empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from executor.core.context import TxnContext, cover_set, scan_of_reads
from executor.core.execution import failure_text, run_body
from executor.core.storage import Storage
from txn_library import catalog, limits, placement
from txn_library.catalog import REPLICATED
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_NOT_READY,
    ERR_PROCEDURE_FAILED,
    ERROR,
    BadRequest,
    brief,
)
from txn_library.procedure import Footprint, Procedure, lookup
from txn_library.wire import sequencer as wire

SNAPSHOT, READ_COMMITTED, STRICT = "snapshot", "read_committed", "strict"
ISOLATIONS = (SNAPSHOT, READ_COMMITTED, STRICT)
NO_EPOCH = -1  # on the wire: read committed (the state now)

Exact = list[tuple[str, tuple, Any]]  # [(table, key, row or None)]
Prefixes = list[tuple[str, tuple, list[tuple[tuple, tuple]]]]  # [(table, prefix, rows)]


def query_footprint(proc_name: Any, args: Any) -> tuple[Procedure, Footprint]:
    """The read-only procedure a query calls and its footprint, checked as the
    sequencer checks a call (BadRequest otherwise), placed nowhere: for a reader,
    which holds every partition."""
    proc = _read_only(proc_name)
    proc.validate(args)
    return proc, proc.footprint_of(tuple(args), limits.footprint_entries_max)


def _read_only(proc_name: Any) -> Procedure:
    proc = lookup(proc_name)
    if not proc.read_only:
        raise BadRequest(
            ERR_BAD_ARGUMENTS,
            f"{proc.name} is not read-only: a query calls a read-only procedure (a write "
            f"goes through the sequencer)",
        )
    return proc


def entry_problem(isolation: Any, at: int, after: Any) -> str | None:
    """Why a query entry's isolation and epochs cannot be served (``bad_arguments``),
    or None: the rules every server of queries applies alike (a partition's query
    service, a reader). Strict is the sequencer's; ``after_epoch`` must be an epoch
    (``wire.after_epoch_problem``), and a snapshot named at an epoch before it cannot
    show the writes it asks for."""
    if isolation not in (SNAPSHOT, READ_COMMITTED):
        return (
            f"isolation {brief(isolation)} is not served here: snapshot or read_committed "
            f"(strict goes through the sequencer, ordered with the transactions)"
        )
    problem = wire.after_epoch_problem(after)
    if problem is None and isolation == SNAPSHOT and 0 <= at < after:
        problem = f"at_epoch {at} is before after_epoch {after}: it cannot show those writes"
    return problem


def query_procedure(proc_name: Any, args: Any, partitions: int) -> tuple[Procedure, tuple]:
    """The read-only procedure a query calls and its participants, checked as the
    sequencer checks a call (BadRequest otherwise)."""
    proc = _read_only(proc_name)
    proc.validate(args)
    parts = proc.participants_of(tuple(args), partitions, limits.footprint_entries_max)
    return proc, parts


def epoch_problem(
    epoch: int, oldest: int, completed: int, versions: bool = True
) -> tuple[str, str] | None:
    """Why this partition cannot read at ``epoch`` now: (code, message), or None.
    ``not_ready``: the epoch is ahead of it (it may be, later); ``bad_arguments``: it is
    older than the versions kept, or (``versions`` False) it keeps none: its state may
    hold writes of the epoch after the one it has completed (a batch runs while the
    next one starts), so no epoch can be read as a snapshot here; the cluster's readers
    serve snapshots, and read committed needs no versions."""
    if not versions:
        return (
            ERR_BAD_ARGUMENTS,
            f"epoch {epoch}: this replica keeps no row versions, so it answers no snapshot "
            f"(read committed works); snapshots are the readers' "
            f"(ClusterConfig.query_versions; `ordo up --readers N`)",
        )
    if epoch > completed:
        return ERR_NOT_READY, f"epoch {epoch} is not completed here yet (completed: {completed})"
    if epoch < oldest:
        return (
            ERR_BAD_ARGUMENTS,
            f"epoch {epoch} is older than the versions kept (from epoch {oldest}: "
            f"limits.versions_epochs_max = {limits.versions_epochs_max} epochs, "
            f"versions_bytes_max = {limits.versions_bytes_max} bytes); "
            f"`ordo replay state --epoch` reaches any epoch",
        )
    return None


PROBES_MAX = 8  # reads of a snapshot before it merges the later epochs' maps


class Snapshot:
    """The local state at the end of ``epoch`` (None: now, read committed)."""

    def __init__(self, storage: Storage, epoch: int | None) -> None:
        self.storage = storage
        self.epoch = epoch
        self.versions = storage.versions if epoch is not None else None
        # Past PROBES_MAX reads, one merged map of the epochs after ``epoch``
        # (Versions.undo_after): a read probes each later epoch's map until then.
        self._undo: dict[tuple, Any] | None = None
        self._probes = 0

    def _merged(self) -> dict[tuple, Any]:
        undo = self._undo
        if undo is None:
            assert self.versions is not None and self.epoch is not None
            undo = self._undo = self.versions.undo_after(self.epoch)
        return undo

    def get(self, table: str, key: tuple) -> tuple | None:
        v = self.versions
        if v is None:
            return self.storage.get(table, key)
        assert self.epoch is not None
        if self._undo is None and self._probes < PROBES_MAX:
            self._probes += 1
            return v.row_at(table, key, self.epoch, self.storage.get)
        return v.row_in(self._merged(), table, key, self.storage.get)

    def scan(self, table: str, prefix: tuple) -> list[tuple[tuple, tuple]]:
        v = self.versions
        if v is None:
            return self.storage.scan(table, prefix)
        undo, get = self._merged(), self.storage.get
        keys = [k for k, _ in self.storage.scan(table, prefix)]
        n = len(prefix)
        written = {k for t, k in undo if t == table and k[:n] == prefix}
        if written:
            written.difference_update(keys)
            keys += written
        out = []
        for k in keys:
            row = v.row_in(undo, table, k, get)
            if row is not None:
                out.append((k, row))
        out.sort()
        return out


def _here(table: str, key: tuple, me: int, partitions: int) -> bool:
    p = placement.partition_of(table, key, partitions)
    return p == me or p == REPLICATED


def local_reads(
    proc: Procedure, args: Sequence[Any], snap: Snapshot, me: int, partitions: int
) -> tuple[Exact, Prefixes]:
    """This partition's reads of the query's footprint (its own entries only)."""
    exact: Exact = []
    prefixes: Prefixes = []
    for t, key in proc.footprint(*args).reads:
        if not _here(t, key, me, partitions):
            continue
        if len(key) == catalog.table(t).key_len:
            exact.append((t, key, snap.get(t, key)))
        else:
            prefixes.append((t, key, snap.scan(t, key)))
    return exact, prefixes


def run_query(
    proc: Procedure,
    args: Sequence[Any],
    snap: Snapshot,
    me: int,
    partitions: int,
    remote: Sequence[tuple[Exact, Prefixes]] = (),
    local_read: bool = False,
) -> tuple[int, Any, bytes]:
    """Run the body over the local snapshot and the other participants' reads:
    (status, value, the value packed). ``local_read``: this partition's own reads are
    among ``remote`` too (taken when the query began): the store is not read."""
    exact: dict[tuple[str, tuple], Any] = {}
    prefixes: dict[tuple[str, tuple], list] = {}
    for ex, px in remote:
        for t, key, row in ex:
            exact[(t, key)] = row
        for t, prefix, rows in px:
            prefixes[(t, prefix)] = [(k, r) for k, r in rows]
            for k, r in rows:
                exact[(t, k)] = r

    def get(t: str, key: tuple) -> tuple | None:
        if not local_read and _here(t, key, me, partitions):
            return snap.get(t, key)
        return exact.get((t, key))  # type: ignore[no-any-return]

    def scan(t: str, prefix: tuple) -> list:
        if not local_read and _here(t, prefix, me, partitions):
            return snap.scan(t, prefix)
        return scan_of_reads(exact, prefixes, t, prefix)

    fp = proc.footprint(*args)
    ctx = TxnContext(-1, 0, 0, cover_set(fp.reads), frozenset(), get, scan)
    return run_body(proc, tuple(args), ctx)


def run_current(
    storage: Storage, me: int, partitions: int, proc_name: Any, args: Any
) -> tuple[int, Any]:
    """A read-only procedure whose footprint is all on partition ``me``, run against its
    current state between transactions (the unsequenced single-partition read path
    Partition.run_query serves): (status, value)."""
    try:
        proc: Procedure = lookup(proc_name)
        if not proc.read_only:
            return ERROR, (ERR_PROCEDURE_FAILED, f"{proc.name} is not read-only")
        proc.validate(args)
    except BadRequest as e:
        return ERROR, (e.code, e.message)
    try:
        fp = proc.footprint_of(args)
        homes = [placement.partition_of(t, key, partitions) for t, key in fp.reads]
    except BadRequest as e:
        return ERROR, (e.code, e.message)
    # The procedure's footprint function (and the placement of the keys it made) ran on
    # unsequenced arguments: whatever it raises is the call's failure.
    except Exception as e:
        return ERROR, (ERR_BAD_ARGUMENTS, f"footprint of {proc.name}: {failure_text(e)}")
    for (t, key), p in zip(fp.reads, homes, strict=True):
        if p != me and p != REPLICATED:
            return ERROR, (ERR_PROCEDURE_FAILED, f"{t}{key!r} is not on partition {me}")
    ctx = TxnContext(-1, 0, 0, cover_set(fp.reads), frozenset(), storage.get, storage.scan)
    status, value, _ = run_body(proc, tuple(args), ctx)
    return status, value
