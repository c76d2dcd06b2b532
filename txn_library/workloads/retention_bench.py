"""Dataflows whose one step keeps its state on another partition than its streams and
writes a sink that keeps many batches (scripts/bench_stream_retention.py, issue 44).

``rb<R>`` for R in ``RETENTIONS``: the border stream ``rb<R>_in`` and the sink
``rb<R>_out`` (``retain_batches=R``) live at ``STREAM_HOME``; the step ``rb<R>.step``
folds each batch's sum into its row of ``STATE`` at ``STATE_HOME`` and emits every value
plus one. On two or more partitions the homes are partitions 0 and 1, so every step is
a multi-partition transaction: the streams' partition sends the step what it reads of
them, the state's partition the state row. What it sends must not grow with R (the sink
holds up to R batches; the step touches one).
"""

from __future__ import annotations

from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.streams import Dataflow, Step, StreamContext, stream, stream_procedure

RETENTIONS = (50, 5_000, 200_000)
STREAM_HOME = 1  # partition 0 under place_by_first_int
STATE_HOME = 2  # partition 1 (of two or more)
STATE = "rb_state"

register_table(
    Table(
        STATE,
        key_len=2,
        place_len=1,
        placement=place_by_first_int,
        ordered=True,
        key_types=(int, str),
        key_columns=("home", "flow"),
        columns=("batches", "total"),
    )
)


def names(retention: int) -> tuple[str, str, str]:
    """(dataflow, border stream, sink) of the flow whose sink keeps ``retention``."""
    return f"rb{retention}", f"rb{retention}_in", f"rb{retention}_out"


def _flow(retention: int) -> None:
    flow, src, sink = names(retention)
    stream(src, [("x", "int")], home=STREAM_HOME)
    stream(sink, [("x", "int")], home=STREAM_HOME, retain_batches=retention)
    key = (STATE_HOME, flow)

    @stream_procedure(f"{flow}.step", input=src, output=sink, writes=[(STATE, key)])
    def step(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> list[tuple]:
        row = ctx.get(STATE, key)
        n, total = row if row is not None else (0, 0)
        ctx.put(STATE, key, (n + 1, total + sum(x for (x,) in tuples)))
        return [(x + 1,) for (x,) in tuples]

    steps: list[Step] = [step]
    Dataflow(flow, steps)


for _r in RETENTIONS:
    _flow(_r)
