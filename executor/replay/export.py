"""Export tables to files a person or another tool can read: CSV or Parquet.

A partition's rows (a Storage loaded from its checkpoint) become one file per table
under ``out_dir/<table>/`` (Parquet: ``part-<partition>.parquet``, a directory
Spark/pandas read as one table; CSV: ``part-<partition>.csv`` with a header), rows
sorted by key. Column names come from the catalog (key columns first, without
repeating ones the row already holds; values past the declared columns as
``value_<position>``, executor.replay.tables.table_columns). Tables are written column
by column: the table's columns in memory beside the loaded state, one table at a time.
``ordo dump`` loads and writes its partitions side by side, a worker process each, at
most one per core (``export_checkpoints``).

Types: ints, strings, floats, bools and None are written as they are. In CSV anything
else (lists, bytes, maps) is JSON text (bytes as hex), so no value is lost. A Parquet
column takes its values' Arrow type (``arrow_array``, as ``ordo replay state`` writes
them: bytes as binary, lists as lists); a column whose values do not share one (or an
int past int64) is JSON text, and one with no value at all is int64.
"""

from __future__ import annotations

import csv
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from executor.core import checkpoint
from executor.core.storage import Storage
from executor.replay.tables import table_columns, table_layout, to_json
from txn_library import catalog
from txn_library.heap import gc_paused
from txn_library.procedure import load_modules

MARKER = "_ordo.json"  # in an output directory Ordo wrote (dump, replay), with what wrote it
_SCALARS = frozenset({int, str, float, bool, type(None)})


def _cell(v: Any) -> Any:
    if type(v) in _SCALARS:
        return v
    if isinstance(v, bytes):
        return v.hex()
    return json.dumps(v, default=str)


def _cells(col: list[Any]) -> list[Any]:
    """A column as written: as it is when every value is a scalar (the usual case,
    checked in C), else each non-scalar value as text."""
    return col if _SCALARS.issuperset(map(type, col)) else list(map(_cell, col))


def arrow_array(values: list[Any]) -> Any:
    """A column as Arrow: its natural type, int64 when all null, else JSON text."""
    import pyarrow as pa

    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else to_json(v) for v in values], pa.string())
    if pa.types.is_null(arr.type):
        return arr.cast(pa.int64())  # no value to type it by: nullable ints are the common case
    return arr


def export_storage(storage: Storage, out_dir: Path, partition: int, fmt: str) -> dict[str, int]:
    """Write one partition's tables (those with rows); returns rows written per table.

    Replicated tables are written only for partition 0 (every partition holds them).
    """
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"format must be csv or parquet, not {fmt!r}")
    written = {}
    for name in sorted(storage.whole_tables()):
        if partition != 0 and catalog.table(name).replicated:
            continue  # replicated tables: every partition holds a copy; write one
        names, cols, n = table_columns([storage], table_layout(name))
        if n == 0:
            continue
        d = out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"part-{partition:04d}.{fmt}"
        with gc_paused():  # the columns' values: acyclic, and many
            if fmt == "csv":
                cols = list(map(_cells, cols))
                with open(path, "w", newline="") as fh:
                    out = csv.writer(fh)  # None is written as an empty field
                    out.writerow(names)
                    out.writerows(zip(*cols, strict=True))
            else:
                _write_parquet(path, names, cols)
        written[name] = n
    return written


def export_checkpoints(
    paths: Sequence[Path], out_dir: Path, fmt: str, modules: Sequence[str]
) -> dict[str, int]:
    """Each partition's checkpoint (``paths[p]``: partition p's) loaded and exported
    (``export_storage``), in worker processes side by side, one per core at most; rows
    written per table over all partitions. ``modules``: the procedure modules that
    register the tables (a worker starts fresh: ZeroMQ contexts are never forked).
    Raises what a load or a write raised (CheckpointInvalid, OSError)."""
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"format must be csv or parquet, not {fmt!r}")
    jobs = [(str(path), str(out_dir), p, fmt) for p, path in enumerate(paths)]
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    if workers == 1:
        load_modules(modules)
        written = [_export_checkpoint(*job) for job in jobs]
    else:
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            workers, mp_context=spawn, initializer=load_modules, initargs=(tuple(modules),)
        ) as pool:
            written = list(pool.map(_export_checkpoint, *zip(*jobs, strict=True)))
    totals: dict[str, int] = {}
    for counts in written:
        for t, n in counts.items():
            totals[t] = totals.get(t, 0) + n
    return totals


def _export_checkpoint(path: str, out_dir: str, partition: int, fmt: str) -> dict[str, int]:
    return export_storage(checkpoint.load(Path(path))[1], Path(out_dir), partition, fmt)


def _write_parquet(path: Path, names: list[str], cols: list[list[Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({n: arrow_array(c) for n, c in zip(names, cols, strict=True)}), path)


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
