"""The history and the database as tables: rows of the log, columns of a rebuilt state.

History as rows: one row per transaction (``HISTORY_COLUMNS``, then one column
per flattened procedure argument, ``history_layout``), streamed from the log epoch
range by epoch range (``split_epochs`` cuts the work). Tables as columns: a rebuilt
replica's table as column lists named by the catalog, with the column to partition
the output by (``table_layout``, ``table_columns``); executor.replay.spark_jobs writes
both as Parquet.

Invariants: no value is lost (a value that does not fit its typed column is None
there and kept whole in ``args_json``); rows come out in the log's global order
(epoch, seq) and table rows sorted by key; replicated tables are written once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from executor.core.storage import Storage
from executor.replay.batches import iter_batches
from executor.replay.spec import ReplaySpec
from txn_library import catalog
from txn_library.heap import gc_paused
from txn_library.procedure import Procedure, procedures
from txn_library.streams import DERIVED_CLIENT, batch_txns

# Fixed columns of the history table; then one column per flattened argument.
HISTORY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("epoch", "int"),
    ("txn_id", "int"),
    ("seq", "int"),  # position within the epoch's batch (0-based): the global order
    ("procedure", "str"),
    ("participants", "int_list"),
    ("multi_partition", "bool"),
    ("batch_ts", "ts"),
    ("batch_ts_ms", "int"),
    ("client_id", "str"),  # hex; empty for calls without one
    ("req_id", "str"),  # JSON
    ("args_json", "str"),  # every argument (incl. a dependent txn's prediction), as JSON
    # a dataflow's step, derived from a push (txn_library.streams): logged (strong
    # recovery) or derived again here (weak), either way a row
    ("derived", "bool"),
)

# Arg.type -> column type ("list": an array of int64 when every element is an int)
_ARG_COLUMN_TYPES = {
    "int": "int",
    "str": "str",
    "bytes": "bytes",
    "float": "float",
    "bool": "bool",
    "list": "int_list",
    "any": "json",
}
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class HistoryLayout:
    """Which column each procedure's arguments go to: ``arg_<name>`` when every
    procedure that has an argument of that name gives it the same type, else
    ``arg_<procedure>_<name>`` (dots as underscores)."""

    arg_columns: tuple[tuple[str, str], ...]  # (column, type)
    by_proc: dict[str, tuple[tuple[int, int, str], ...]]  # proc -> (arg pos, column idx, type)

    @property
    def columns(self) -> tuple[tuple[str, str], ...]:
        return HISTORY_COLUMNS + self.arg_columns


def history_layout(procs: dict[str, Procedure] | None = None) -> HistoryLayout:
    procs = procedures() if procs is None else procs
    types: dict[str, set[str]] = {}
    for p in procs.values():
        for a in p.args:
            types.setdefault(a.name, set()).add(_ARG_COLUMN_TYPES[a.type])
    columns: dict[str, str] = {}
    named: dict[str, list[tuple[int, str, str]]] = {}
    for name in sorted(procs):
        for pos, a in enumerate(procs[name].args):
            kind = _ARG_COLUMN_TYPES[a.type]
            shared = len(types[a.name]) == 1
            col = f"arg_{a.name}" if shared else f"arg_{name.replace('.', '_')}_{a.name}"
            columns.setdefault(col, kind)
            named.setdefault(name, []).append((pos, col, kind))
    ordered = tuple(sorted(columns.items()))
    index = {c: len(HISTORY_COLUMNS) + i for i, (c, _) in enumerate(ordered)}
    by_proc = {p: tuple((pos, index[c], k) for pos, c, k in es) for p, es in named.items()}
    return HistoryLayout(ordered, by_proc)


def to_json(value: Any) -> str:
    """JSON for logged values: bytes as hex, tuples as arrays, anything else as text."""

    def default(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.hex()
        return str(v)

    return json.dumps(value, default=default, separators=(",", ":"))


def _arg_cell(kind: str, v: Any) -> Any:
    """A logged argument as its column's type, or None (args_json keeps every value)."""
    if kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v <= _INT64[1]
        return v if ok else None
    if kind == "int_list":
        if isinstance(v, (list, tuple)) and all(
            isinstance(x, int) and not isinstance(x, bool) and _INT64[0] <= x <= _INT64[1]
            for x in v
        ):
            return list(v)
        return None
    if kind == "json":
        return to_json(v)
    if kind == "float":
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    expected = {"str": str, "bytes": bytes, "bool": bool}[kind]
    return v if isinstance(v, expected) else None


def history_rows(
    spec: ReplaySpec, layout: HistoryLayout, first: int, last: int | None
) -> Iterator[tuple]:
    """One tuple per transaction of epochs first..last (a weak-recovery batch's dataflow
    steps too), in ``layout.columns`` order."""
    width = len(layout.columns)
    for epoch, batch, _ in iter_batches(spec.log_dir, first, last):
        txn_id = batch.first_txn_id
        ts = batch.timestamp_ms
        for seq, txn in enumerate(batch_txns(batch, spec.partitions)):
            name, args, parts = txn.proc, txn.args, txn.participants
            client, req = txn.client_id, txn.req_id
            row: list[Any] = [None] * width
            row[:12] = [
                epoch,
                txn_id + seq,
                seq,
                name,
                list(parts),
                len(parts) > 1,
                ts,
                ts,
                client.hex() if isinstance(client, bytes) else to_json(client),
                to_json(req),
                to_json(args),
                client == DERIVED_CLIENT,
            ]
            for pos, idx, kind in layout.by_proc.get(name, ()):
                if isinstance(args, tuple) and pos < len(args):
                    row[idx] = _arg_cell(kind, args[pos])
            yield tuple(row)


def split_epochs(first: int, last: int, pieces: int) -> list[tuple[int, int]]:
    """first..last cut into at most ``pieces`` contiguous ranges of near-equal length."""
    if last < first:
        return []
    pieces = max(1, min(pieces, last - first + 1))
    size, extra = divmod(last - first + 1, pieces)
    out, lo = [], first
    for i in range(pieces):
        hi = lo + size - 1 + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi + 1
    return out


# Tables as columns (for Parquet) --------------------------------------------------------------
@dataclass(frozen=True)
class TableLayout:
    """How one table is written: column names (catalog), key positions, partition column."""

    name: str
    columns: tuple[str, ...]
    key_positions: tuple[int, ...]  # key parts written (those the row does not repeat)
    row_width: int
    partition_by: str | None  # the first key column, for tables placed by it; else None
    replicated: bool


def table_layout(name: str) -> TableLayout:
    spec = catalog.table(name)
    names, key_pos, width = spec.output_columns()
    partition_by = None
    if spec.placement is catalog.place_by_first_int and not spec.replicated:
        key_names = list(spec.key_columns) or [f"key_{i}" for i in range(spec.key_len)]
        # place_by_first_int derives a row's partition from its first key part alone, so
        # partitioning the output by that column groups rows as the cluster places them.
        partition_by = key_names[0]
    return TableLayout(name, tuple(names), tuple(key_pos), width, partition_by, spec.replicated)


def table_columns(
    storages: Sequence[Storage], layout: TableLayout
) -> tuple[list[str], list[list[Any]], int]:
    """(column names, column lists, rows) of the table's rows across partitions
    (replicated: once), sorted by key. A row shorter than the catalog's columns is padded
    with None; values past them (a row longer than its declared layout, or a table that
    declares none) go to extra columns ``value_<position>``, so no value is lost.

    Column by column in C (``itemgetter`` over the sorted keys and rows), with the
    collector held off: all the tables of a TPC-C state after 60 s of New Order (4.1M
    rows) take ~6 s, and took ~16 s a value at a time, the collector walking the
    millions of new tuples again and again."""
    sources = storages[:1] if layout.replicated else storages
    with gc_paused():  # millions of acyclic tuples and lists (txn_library.heap)
        pairs: list[tuple[tuple, tuple]] = []
        for s in sources:
            t = s.whole_tables().get(layout.name)
            if t:
                pairs.extend(t.items())
        pairs.sort(key=_first)
        keys = list(map(_first, pairs))
        rows = list(map(_second, pairs))
        del pairs
        lengths = set(map(len, rows))
        longest = max(lengths, default=0)
        names = [*layout.columns, *(f"value_{j}" for j in range(layout.row_width, longest))]
        width = max(longest, layout.row_width)
        if lengths - {width}:
            rows = [r if len(r) == width else r + (None,) * (width - len(r)) for r in rows]
        cols = [list(map(itemgetter(pos), keys)) for pos in layout.key_positions]
        cols.extend(list(map(itemgetter(j), rows)) for j in range(width))
    return names, cols, len(keys)


_first, _second = itemgetter(0), itemgetter(1)
