"""Dataflows of 1 to ``LENGTH_MAX`` steps, for measuring what a chain's length costs
(scripts/leaderboard.py --chains): PE triggers against the client calling each step.

``chain<n>`` (triggers) and ``chainc<n>`` (no triggers: the client chains) each read
the batch from its input stream, add one to every value and append it to the next
stream, and fold the batch's sum into a per-step total, so every step reads, writes
and emits; the last stream is a sink. Each chain has its own home (so its own
partition, with ``home`` placement), as the leaderboard's variants do.
"""

from __future__ import annotations

from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.streams import Dataflow, Step, StreamContext, stream, stream_procedure

LENGTH_MAX = 10
TOTALS = "chain_totals"

register_table(
    Table(
        TOTALS,
        key_len=2,
        lock_len=1,
        place_len=1,
        placement=place_by_first_int,
        ordered=True,
        key_types=(int, str),
        key_columns=("home", "step"),
        columns=("total",),
    )
)


def _step(name: str, home: int, src: str, dst: str) -> Step:
    @stream_procedure(name, input=src, output=dst, writes=[(TOTALS, (home,))])
    def step(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> list[tuple]:
        row = ctx.get(TOTALS, (home, name))
        ctx.put(TOTALS, (home, name), ((row[0] if row else 0) + sum(x for (x,) in tuples),))
        return [(x + 1,) for (x,) in tuples]

    return step


def _chain(prefix: str, n: int, home: int, triggers: bool) -> None:
    names = [f"{prefix}{n}_s{i}" for i in range(n + 1)]
    for s in names:
        stream(s, [("x", "int")], home=home)
    steps = [_step(f"{prefix}{n}.step{i}", home, names[i], names[i + 1]) for i in range(n)]
    Dataflow(f"{prefix}{n}", steps, triggers=triggers)


def home_of(n: int, triggers: bool) -> int:
    return 100 + n + (0 if triggers else 50)


for _n in range(1, LENGTH_MAX + 1):
    _chain("chain", _n, home_of(_n, True), True)
    _chain("chainc", _n, home_of(_n, False), False)
