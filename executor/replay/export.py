"""Export tables to files a person or another tool can read: CSV or Parquet.

Rows stream in (from checkpoint files or a replayed Storage) as (table, key, row);
each table becomes one file per source partition under ``out_dir/<table>/``
(Parquet: ``part-<partition>.parquet``, a directory Spark/pandas read as one table;
CSV: ``part-<partition>.csv`` with a header). Column names come from the catalog
(key columns first, without repeating ones the row already holds). Memory is bounded
by one chunk of rows per table.

Types: ints, strings, floats, bools and None map to Parquet columns directly (the
type of a column is taken from its first non-null value); anything else (lists,
bytes, maps) is written as JSON text so no value is lost.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from txn_library import catalog

CHUNK_ROWS = 50_000
MARKER = "_ordo.json"  # in an output directory Ordo wrote (dump, replay), with what wrote it
_SCALARS = (int, str, float, bool)


def _cell(v: Any) -> Any:
    if v is None or isinstance(v, _SCALARS):
        return v
    if isinstance(v, bytes):
        return v.hex()
    return json.dumps(v, default=str)


class _TableWriter:
    def __init__(self, out_dir: Path, table: str, part: int, fmt: str) -> None:
        spec = catalog.table(table)
        self.names, self.key_pos, self.width = spec.output_columns()
        d = out_dir / table
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"part-{part:04d}.{fmt}"
        self.fmt = fmt
        self.rows: list[list[Any]] = []
        self.count = 0
        self._csv = None
        self._pq: Any = None
        self._schema: Any = None
        if fmt == "csv":
            self._file = open(self.path, "w", newline="")
            self._csv = csv.writer(self._file)
            self._csv.writerow(self.names)

    def add(self, key: tuple, row: tuple) -> None:
        cells = [_cell(key[i]) for i in self.key_pos]
        cells.extend(_cell(v) for v in row[: self.width])
        cells.extend([None] * (len(self.names) - len(cells)))
        self.rows.append(cells)
        if len(self.rows) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        self.count += len(self.rows)
        if self._csv is not None:
            self._csv.writerows(["" if c is None else c for c in r] for r in self.rows)
        else:
            self._write_parquet()
        self.rows = []

    def _write_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = list(zip(*self.rows, strict=True))
        if self._schema is None:
            fields = []
            for name, col in zip(self.names, cols, strict=True):
                first = next((v for v in col if v is not None), "")
                t = {bool: pa.bool_(), int: pa.int64(), float: pa.float64()}.get(
                    type(first), pa.string()
                )
                fields.append(pa.field(name, t))
            self._schema = pa.schema(fields)
            self._pq = pq.ParquetWriter(self.path, self._schema)
        arrays = []
        for f, col in zip(self._schema, cols, strict=True):
            values: Any = col
            if pa.types.is_string(f.type):
                values = [None if v is None else str(v) for v in col]
            arrays.append(pa.array(values, type=f.type))
        self._pq.write_table(pa.Table.from_arrays(arrays, schema=self._schema))

    def close(self) -> None:
        self.flush()
        if self._csv is not None:
            self._file.close()
        if self._pq is not None:
            self._pq.close()


def export_rows(
    rows: Iterable[tuple[str, tuple, tuple]], out_dir: Path, partition: int, fmt: str = "parquet"
) -> dict[str, int]:
    """Write one partition's rows; returns rows written per table.

    Replicated tables are written only for partition 0 (every partition holds them).
    """
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"format must be csv or parquet, not {fmt!r}")
    writers: dict[str, _TableWriter] = {}
    try:
        for table, key, row in rows:
            if partition != 0 and catalog.table(table).replicated:
                continue  # replicated tables: every partition holds a copy; write one
            w = writers.get(table)
            if w is None:
                w = writers[table] = _TableWriter(out_dir, table, partition, fmt)
            w.add(key, row)
    finally:
        for w in writers.values():
            w.close()
    return {t: w.count for t, w in writers.items()}


# Output directories -----------------------------------------------------------------------
def prepare_output(out: str | Path, command: str, keep: bool = False) -> Path:
    """Make ``out`` writable for ``command``: an empty or missing directory, or one Ordo
    wrote before (its MARKER: emptied first, so no file of an older output is left to be
    read with the new one); anything else is refused, never replaced. ``keep``: check
    only, the earlier output stays until ``publish_output`` replaces it whole."""
    path = Path(out)
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        if any(path.iterdir()) and not (path / MARKER).exists():
            raise FileExistsError(
                f"{path} is not empty and was not written by `ordo dump` or `ordo replay`; "
                f"choose another --out for {command}"
            )
        if not keep:
            shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def staging_dir(out: Path) -> Path:
    """Where a job writes until its output is complete: a hidden sibling of ``out``,
    emptied first (of what a failed run left there). ``publish_output`` moves it onto
    ``out``, so a job that fails half way leaves ``out`` as it was, and its retry runs."""
    out = out.resolve()
    stage = out.with_name(f".{out.name}.ordo-partial")
    shutil.rmtree(stage, ignore_errors=True)
    return stage


def publish_output(stage: Path, out: Path, command: str, info: Mapping[str, Any]) -> None:
    """Mark the complete ``stage`` as ``command``'s and move it onto ``out`` (which
    ``prepare_output`` found empty, missing or Ordo's), replacing it whole."""
    write_marker(stage, command, info)
    if out.exists():
        shutil.rmtree(out)
    stage.rename(out)


def write_marker(out: Path, command: str, info: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    body = {"command": command, "written_at": time.strftime("%Y-%m-%d %H:%M:%S"), **info}
    (out / MARKER).write_text(json.dumps(body, indent=2, default=str) + "\n")
