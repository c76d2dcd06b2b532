"""TPC-C consistency conditions 1-12 on a whole database written to files: the output of
``ordo dump`` (``<table>/part-*.csv`` or ``.parquet``, one file per partition) or of
``ordo replay state`` (a Parquet dataset per table, hive-partitioned by warehouse).

``ordo tpcc check --dump DIR`` runs it. The live check (``ordo tpcc check``) runs
conditions 1-9, 11 and 12 at each partition; 10 needs every partition's HISTORY
(tpcc.consistency), which only a whole copy of the database has.

Only the columns the conditions read are loaded, each as an int or None (an empty CSV
field): keys, the YTD and balance columns, counts, amounts, and the two nullable
columns (O_CARRIER_ID, OL_DELIVERY_D). The other columns of a row are None. A table,
column or value the check needs and the files lack is an error naming it
(``DumpUnreadable``), never a pass.
"""

from __future__ import annotations

import csv
from collections import Counter
from itertools import islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from tpcc import schema
from tpcc.consistency import Tables, check_whole

# Per table, the columns of its rows the conditions read (tpcc.consistency).
NEEDED: dict[str, tuple[str, ...]] = {
    schema.WAREHOUSE: ("w_id", "w_ytd"),
    schema.DISTRICT: ("d_id", "d_w_id", "d_ytd", "d_next_o_id"),
    schema.CUSTOMER: ("c_id", "c_d_id", "c_w_id", "c_balance", "c_ytd_payment", "c_delivery_cnt"),
    schema.HISTORY: ("h_c_id", "h_c_d_id", "h_c_w_id", "h_d_id", "h_w_id", "h_amount"),
    schema.NEW_ORDER: ("no_o_id", "no_d_id", "no_w_id"),
    schema.ORDERS: ("o_id", "o_d_id", "o_w_id", "o_c_id", "o_carrier_id", "o_ol_cnt"),
    schema.ORDER_LINE: ("ol_o_id", "ol_d_id", "ol_w_id", "ol_number", "ol_delivery_d", "ol_amount"),
}


CSV_CHUNK_LINES = 65_536  # CSV lines held as text at a time


class DumpUnreadable(Exception):
    """The files lack a table, column or value the check needs, or cannot be read."""


def check_dump(directory: str | Path, warehouses: list[int] | None = None) -> dict[str, Any]:
    """Conditions 1-12 on the database in ``directory``, for ``warehouses`` (default:
    every warehouse it holds). Returns {"warehouses", "rows", "violations", "ok"}."""
    tables = load_tables(Path(directory))
    held = sorted(k[0] for k in tables[schema.WAREHOUSE])
    if not held:
        raise DumpUnreadable(f"{directory}: the warehouse table has no rows")
    wanted = held if warehouses is None else sorted(warehouses)
    violations = check_whole(tables, wanted)
    return {
        "warehouses": wanted,
        "rows": {t: len(rows) for t, rows in tables.items()},
        "violations": violations,
        "ok": not violations,
    }


def load_tables(directory: Path) -> Tables:
    """The tables the conditions read, each as key -> row in tpcc.schema's layout."""
    if not directory.is_dir():
        raise DumpUnreadable(f"{directory} is not a directory")
    return {name: _load_table(directory / name, name) for name in NEEDED}


def _load_table(path: Path, name: str) -> dict[tuple, tuple]:
    columns, key_columns = schema.COLUMNS[name], schema.KEY_COLUMNS[name]
    wanted = sorted(set(NEEDED[name]) | set(key_columns))
    csvs = sorted(path.glob("*.csv"))
    parquet = sorted(path.rglob("*.parquet"))
    if not csvs and not parquet:
        raise DumpUnreadable(f"no CSV or Parquet files for table {name} under {path}")
    if csvs and parquet:
        raise DumpUnreadable(f"{path} holds both CSV and Parquet files: one dump at a time")
    cols = _csv_columns(csvs, wanted) if csvs else _parquet_columns(path, wanted)
    n = len(cols[wanted[0]])
    for c in key_columns:
        if None in cols[c]:
            raise DumpUnreadable(f"table {name}: a row without its key column {c}")
    keys = list(zip(*(cols[c] for c in key_columns), strict=True))
    rows = zip(*(cols.get(c, repeat(None, n)) for c in columns), strict=True)
    table = dict(zip(keys, rows, strict=True))
    if len(table) != n:
        twice = next(k for k, times in Counter(keys).items() if times > 1)
        raise DumpUnreadable(f"table {name}: key {twice} appears twice")
    return table


def _csv_columns(files: list[Path], wanted: list[str]) -> dict[str, list[int | None]]:
    """The ``wanted`` columns of every file, each as ints (None: an empty field), read
    CSV_CHUNK_LINES at a time (memory: the int columns, not every field as text)."""
    out: dict[str, list[int | None]] = {c: [] for c in wanted}
    for f in files:
        try:
            with open(f, newline="") as fh:
                reader = csv.reader(fh)
                header = next(reader, None)
                if header is None:
                    raise DumpUnreadable(f"{f} is empty (no header)")
                missing = [c for c in wanted if c not in header]
                if missing:
                    raise DumpUnreadable(f"{f} has no column {', '.join(missing)}")
                while records := list(islice(reader, CSV_CHUNK_LINES)):
                    _add_columns(out, f, header, records)
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise DumpUnreadable(f"{f} is not readable CSV: {e}") from None
    return out


def _add_columns(
    out: dict[str, list[int | None]], f: Path, header: list[str], records: list[list[str]]
) -> None:
    if any(len(r) != len(header) for r in records):
        raise DumpUnreadable(f"{f}: a line without {len(header)} fields")
    for c, values in out.items():
        cells = list(map(itemgetter(header.index(c)), records))
        try:
            values.extend(map(_int_or_none, cells) if "" in cells else map(int, cells))
        except ValueError as e:
            raise DumpUnreadable(f"{f}: column {c} must be integers or empty: {e}") from None


def _int_or_none(cell: str) -> int | None:
    return int(cell) if cell else None


def _parquet_columns(path: Path, wanted: list[str]) -> dict[str, list[int | None]]:
    import pyarrow as pa
    import pyarrow.dataset as pads

    try:
        data = pads.dataset(path, format="parquet", partitioning="hive")
        missing = [c for c in wanted if c not in data.schema.names]
        if missing:
            raise DumpUnreadable(f"{path} has no column {', '.join(missing)}")
        table = data.to_table(columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise DumpUnreadable(f"{path}: {e}") from None
    for field in table.schema:
        if not (pa.types.is_integer(field.type) or pa.types.is_null(field.type)):
            raise DumpUnreadable(f"{path}: column {field.name} is {field.type}, not integers")
    return {c: table.column(c).to_pylist() for c in wanted}
