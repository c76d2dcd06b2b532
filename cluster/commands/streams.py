"""``ordo stream``: feed a stream from a file, follow a sink (docs/STREAMS.md).

  ordo stream push NAME --from FILE.csv   push the file's rows as batches, in order,
                                          with a progress bar; --batch-rows N rows a
                                          batch (or the file's batch_id column)
  ordo stream tail NAME                   print each batch of a stream once, in order,
                                          as it comes (--from-batch B to resume); a
                                          batch dropped before it was printed is an
                                          error naming it (--skip-gaps: said on
                                          stderr, and the tail goes on)
  ordo stream list                        the streams and dataflows of the cluster
                                          (nested steps joined with "+")

A push is the border transaction of the stream's dataflow: ids must increase per
stream, and a batch id pushed again with the same tuples is answered from the first
push (so re-running a push of the same file is harmless). Bad rows are refused before
anything is sent, naming the line.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from cluster.commands.common import (
    data_dir_option,
    leader_address,
    load_config,
    load_procedure_modules,
)

PUSH_WINDOW = 256  # pushes in flight at once (a connection's pushes keep their order)


@click.group()
def stream() -> None:
    """Streams: push batches, follow a sink (docs/STREAMS.md)."""


def _convert(value: str, kind: str, where: str) -> Any:
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "bool":
            if value.lower() in ("1", "true", "yes"):
                return True
            if value.lower() in ("0", "false", "no"):
                return False
            raise ValueError(value)
        if kind == "bytes":
            return value.encode()
        return value
    except ValueError:
        raise click.ClickException(f"{where}: {value!r} is not {kind}") from None


def read_batches(
    path: Path, columns: tuple[str, ...], types: tuple[str, ...], batch_rows: int, first_batch: int
) -> Iterator[tuple[int, list[tuple]]]:
    """The file's batches: by its ``batch_id`` column if it has one (rows of one id
    together, ids increasing), else ``batch_rows`` rows a batch numbered from
    ``first_batch``. Columns by name from the header; every row checked."""
    try:
        f = path.open(newline="")
    except OSError as e:
        raise click.ClickException(f"cannot read {path}: {e}") from None
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return
        missing = [c for c in columns if c not in header]
        if missing:
            raise click.ClickException(
                f"{path}: the header lacks column(s) {', '.join(missing)} (has {', '.join(header)})"
            )
        pos = [header.index(c) for c in columns]
        by_id = "batch_id" in header
        id_pos = header.index("batch_id") if by_id else -1
        batch: list[tuple] = []
        current = first_batch
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            where = f"{path}:{line}"
            if len(row) != len(header):
                raise click.ClickException(
                    f"{where}: {len(row)} fields, the header has {len(header)}"
                )
            values = tuple(_convert(row[i], t, where) for i, t in zip(pos, types, strict=True))
            if by_id:
                b = int(_convert(row[id_pos], "int", where))
                if batch and b != current:
                    if b < current:
                        raise click.ClickException(f"{where}: batch_id {b} after {current}")
                    yield current, batch
                    batch = []
                current = b
                batch.append(values)
            else:
                batch.append(values)
                if len(batch) >= batch_rows:
                    yield current, batch
                    batch, current = [], current + 1
        if batch:
            yield current, batch


@stream.command("push")
@click.argument("name")
@click.option("--from", "source", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--batch-rows", default=1, show_default=True, help="Rows a batch (no batch_id column)."
)
@click.option(
    "--first-batch", default=None, type=int, help="First batch id (default: after the last pushed)."
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@data_dir_option
def push(
    name: str, source: Path, batch_rows: int, first_batch: int | None, quiet: bool, data_dir: str
) -> None:
    """Push FILE's rows to stream NAME as atomic batches, in order."""
    from tqdm import tqdm

    from cluster.launcher import cluster_client
    from txn_library.errors import BadRequest, OrdoError
    from txn_library.streams import stream_named

    cfg = load_config(data_dir)
    load_procedure_modules(cfg)
    if batch_rows < 1:
        raise click.UsageError("--batch-rows must be >= 1")
    try:
        s = stream_named(name)
    except BadRequest as e:
        raise click.ClickException(e.message) from None
    with cluster_client(cfg, leader_address(cfg)) as c:
        if first_batch is None:
            page = c.call("stream.read", name, 0, 1).value
            first_batch = (page["last"] + 1) if page.get("last") is not None else 1
        # A first pass checks every row (and counts them): a bad row anywhere is refused
        # with its line before anything is sent.
        total = sum(
            len(rows)
            for _, rows in read_batches(source, s.columns, s.types, batch_rows, first_batch)
        )
        batches = read_batches(source, s.columns, s.types, batch_rows, first_batch)
        bar = tqdm(total=total, unit="row", disable=True if quiet else None, file=sys.stderr)
        futures: list[tuple[int, Any]] = []
        pushed = tuples = 0
        try:
            for batch_id, rows in batches:
                futures.append((batch_id, c.submit_push(name, batch_id, rows)))
                bar.update(len(rows))
                if len(futures) >= PUSH_WINDOW:
                    pushed, tuples = _settle(futures[: PUSH_WINDOW // 2], pushed, tuples)
                    del futures[: PUSH_WINDOW // 2]
            pushed, tuples = _settle(futures, pushed, tuples)
        except OrdoError as e:
            raise click.ClickException(str(e)) from None
        finally:
            bar.close()
    click.echo(f"pushed {pushed} batches ({tuples} tuples) to {name}")


def _settle(futures: list[tuple[int, Any]], pushed: int, tuples: int) -> tuple[int, int]:
    for batch_id, fut in futures:
        r = fut.result()
        if r.aborted:
            raise click.ClickException(f"batch {batch_id}: {r.value}")
        pushed += 1
        tuples += r.value[1]
    return pushed, tuples


@stream.command("tail")
@click.argument("name")
@click.option(
    "--from-batch", default=None, type=int, help="First batch to print (default: the oldest kept)."
)
@click.option(
    "--count", default=0, show_default=True, help="Stop after this many batches (0: never)."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object a batch.")
@click.option(
    "--skip-gaps",
    is_flag=True,
    help="When the stream dropped batches before they were printed, say which on stderr "
    "and go on (default: stop with an error naming them).",
)
@data_dir_option
def tail(
    name: str, from_batch: int | None, count: int, as_json: bool, skip_gaps: bool, data_dir: str
) -> None:
    """Print each batch of stream NAME once, in order, as it comes (Ctrl-C stops).

    A batch the stream no longer keeps before it is printed (a tail that fell behind
    the stream's retention, or --from-batch older than it keeps) is never skipped
    silently: an error names the missing batches, or with --skip-gaps a line on stderr
    does and the tail goes on from the oldest kept."""
    from cluster.launcher import cluster_client
    from txn_library.errors import BatchesGone, OrdoError

    def report(gap: BatchesGone) -> None:
        click.echo(f"gap: {gap.message}; going on", err=True)

    cfg = load_config(data_dir)
    seen = 0
    try:
        with cluster_client(cfg, leader_address(cfg)) as c:
            batches = c.subscribe(name, from_batch, on_gap=report if skip_gaps else None)
            for batch_id, tuples in batches:
                if as_json:
                    click.echo(json.dumps({"batch_id": batch_id, "tuples": tuples}, default=str))
                else:
                    click.echo(
                        f"{batch_id}\t"
                        + "\t".join(json.dumps(list(t), default=str) for t in tuples)
                    )
                seen += 1
                if count and seen >= count:
                    return
    except BatchesGone as e:
        raise click.ClickException(f"{e.message} (--skip-gaps reports gaps and goes on)") from None
    except OrdoError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        pass


@stream.command("list")
@data_dir_option
def list_streams(data_dir: str) -> None:
    """The cluster's streams (columns, home, retention) and dataflows (border stream,
    then the steps in the order they run; steps nested into one transaction are joined
    with "+": in "a -> b+c", b and c run as one transaction)."""
    from txn_library.streams import dataflows, streams

    load_procedure_modules(load_config(data_dir))
    for s in sorted(streams().values(), key=lambda s: s.name):
        cols = ", ".join(f"{c}:{t}" for c, t in zip(s.columns, s.types, strict=True))
        click.echo(f"stream {s.name}({cols})  home {s.home}  keeps {s.retain_batches} batches")
    if dataflows():
        click.echo("dataflows: border -> steps in order (a+b: nested, one transaction)")
    for d in sorted(dataflows().values(), key=lambda d: d.name):
        units = " -> ".join("+".join(st.name for st in u.steps) for u in d.units)
        kind = "" if d.triggers else "  (no triggers: clients call the steps)"
        click.echo(f"dataflow {d.name}: {d.border.name} -> {units}{kind}")
