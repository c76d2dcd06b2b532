"""S-Store's Leaderboard Maintenance benchmark as Ordo dataflows (scripts/leaderboard.py).

Viewers vote for contestants by phone. Each input batch holds votes ``(phone,
contestant)``. A vote is valid if its contestant is still in the show and its phone
has voted fewer than ``VOTES_PER_PHONE_MAX`` times; valid votes are recorded (the
contestant's total, the phone's count, the vote itself); after every ``REMOVE_EVERY``
recorded votes the contestant with the fewest votes leaves the show (ties: the
highest id). After every batch the board shows the top-3 and bottom-3 of the
contestants still in, by votes (ties: lower id first), and trending-3: the three
contestants with the most votes among the last ``TRENDING_WINDOW`` recorded votes
(a tuple-based window sliding one vote at a time; ties: lower id first).

One set of streams, tables and steps per variant (all homed on one partition, as
S-Store ran the benchmark on one core), so the ways to run it can share a cluster:

  variant  steps                                    how the chain runs
  lb       validate >> record >> (board, trending)  PE triggers (derived transactions)
  lbe      validate >> record >> board              PE triggers; the window is fed and
                                                    trending-3 kept by EE triggers
                                                    inside record's transaction
  lbn      the same four, nested=True               one transaction per batch
  lbc      the same four, triggers=False            the client calls each step
                                                    (chained, or unordered async)

Weak or strong recovery is the cluster's (``dataflow_recovery``), not a variant's.

``model`` computes what the board, trending-3 and totals must be from the votes alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.streams import (
    Dataflow,
    StreamContext,
    nested,
    on_insert,
    on_slide,
    stream,
    stream_procedure,
    window,
)

CONTESTANTS = 25
VOTES_PER_PHONE_MAX = 10
REMOVE_EVERY = 1000  # recorded votes between two removals
TRENDING_WINDOW = 100  # votes
BOARD = 3  # top-3, bottom-3, trending-3
VARIANTS = ("lb", "lbe", "lbn", "lbc")
HOMES = {v: i + 1 for i, v in enumerate(VARIANTS)}


def _table(
    name: str, key: tuple[type, ...], key_columns: tuple[str, ...], columns: tuple[str, ...]
) -> str:
    register_table(
        Table(
            name,
            key_len=len(key),
            lock_len=1,
            place_len=1,
            placement=place_by_first_int,
            ordered=True,
            key_types=key,
            key_columns=key_columns,
            columns=columns,
        )
    )
    return name


@dataclass
class Variant:
    """One variant's names (streams, tables, steps) under its prefix."""

    prefix: str
    home: int
    contestants: str = ""
    phones: str = ""
    votes: str = ""
    totals: str = ""
    trend: str = ""
    wcount: str = ""
    names: dict[str, str] = field(default_factory=dict)


def _build(
    prefix: str,
    *,
    ee: bool = False,
    nested_all: bool = False,
    triggers: bool = True,
) -> Variant:
    h = HOMES[prefix]
    v = Variant(prefix, h)
    v.contestants = _table(
        f"{prefix}_contestants", (int, int), ("home", "contestant"), ("votes", "active")
    )
    v.phones = _table(f"{prefix}_phones", (int, int), ("home", "phone"), ("votes",))
    v.votes = _table(
        f"{prefix}_votes", (int, int), ("home", "vote"), ("phone", "contestant", "batch_id")
    )
    v.totals = _table(f"{prefix}_totals", (int, str), ("home", "name"), ("value",))
    v.trend = _table(f"{prefix}_trend", (int, int), ("home", "rank"), ("contestant", "votes"))
    # votes per contestant among the window's (kept as votes enter and leave it)
    v.wcount = _table(f"{prefix}_wcount", (int, int), ("home", "contestant"), ("votes",))
    s_in = stream(f"{prefix}_votes_in", [("phone", "int"), ("contestant", "int")], home=h)
    s_valid = stream(f"{prefix}_valid", [("phone", "int"), ("contestant", "int")], home=h)
    s_rec = stream(
        f"{prefix}_recorded", [("phone", "int"), ("contestant", "int"), ("vote", "int")], home=h
    )
    s_board = stream(
        f"{prefix}_board",
        [("kind", "str"), ("rank", "int"), ("contestant", "int"), ("votes", "int")],
        home=h,
    )
    s_trending = stream(
        f"{prefix}_trending", [("rank", "int"), ("contestant", "int"), ("votes", "int")], home=h
    )
    v.names = {"input": s_in.name, "board": s_board.name, "trending": s_trending.name}
    owner = f"{prefix}.record" if ee else f"{prefix}.trending"
    win = window(
        f"{prefix}_window",
        [("contestant", "int")],
        size=TRENDING_WINDOW,
        slide=1,
        owner=owner,
        home=h,
    )
    C, P, V, T, TR, WC = v.contestants, v.phones, v.votes, v.totals, v.trend, v.wcount
    all_of = lambda *ts: [(t, (h,)) for t in ts]  # noqa: E731

    @stream_procedure(
        f"{prefix}.validate", input=s_in.name, output=s_valid.name, reads=all_of(C, P)
    )
    def validate(ctx: StreamContext, batch_id: int, votes: list[tuple]) -> list[tuple]:
        """Valid votes: the contestant is in the show, the phone under its limit (votes
        of one batch count against the limit as they go)."""
        out, used = [], Counter[int]()
        for phone, c in votes:
            row = ctx.get(C, (h, c))
            if row is None or not row[1]:
                continue
            prow = ctx.get(P, (h, phone))
            if (prow[0] if prow else 0) + used[phone] >= VOTES_PER_PHONE_MAX:
                continue
            used[phone] += 1
            out.append((phone, c))
        return out

    record_writes = all_of(C, P, V, T)
    if ee:
        record_writes += all_of(TR, WC)

    @stream_procedure(
        f"{prefix}.record",
        input=s_valid.name,
        output=s_rec.name,
        reads=all_of(C, P, V, T),
        writes=record_writes,
        windows=(win.name,) if ee else (),
    )
    def record(ctx: StreamContext, batch_id: int, votes: list[tuple]) -> list[tuple]:
        """Record each vote; every REMOVE_EVERY votes the last contestant leaves."""
        total_row = ctx.get(T, (h, "votes"))
        total = total_row[0] if total_row else 0
        out = []
        for phone, c in votes:
            row = ctx.get(C, (h, c))
            if row is None or not row[1]:
                continue  # removed earlier in this batch
            ctx.put(C, (h, c), (row[0] + 1, 1))
            prow = ctx.get(P, (h, phone))
            ctx.put(P, (h, phone), ((prow[0] if prow else 0) + 1,))
            total += 1
            ctx.put(V, (h, total), (phone, c, batch_id))
            out.append((phone, c, total))
            if total % REMOVE_EVERY == 0:
                _remove_last(ctx, C, h)
        ctx.put(T, (h, "votes"), (total,))
        return out

    @stream_procedure(f"{prefix}.board", input=s_rec.name, output=s_board.name, reads=all_of(C))
    def board(ctx: StreamContext, batch_id: int, recorded: list[tuple]) -> list[tuple]:
        """Top-3 and bottom-3 of the contestants still in."""
        live = [(row[0], key[1]) for key, row in ctx.scan(C, (h,)) if row[1]]
        return board_rows(live)

    steps: list[Any] = [validate, record, board]
    if ee:

        @on_insert(s_rec.name, writes=[*all_of(win.name, TR, WC), ("ordo_window", (h, win.name))])
        def feed_window(ctx: StreamContext, key: tuple, row: tuple) -> None:
            """EE trigger: each recorded vote enters the trending window."""
            ctx.window(win.name).insert((row[1],))

        @on_insert(win.name, writes=all_of(WC))
        def count_in(ctx: StreamContext, key: tuple, row: tuple) -> None:
            """EE trigger: a vote entering the window counts for its contestant."""
            _add(ctx, WC, h, row[1], 1)

        @on_slide(win.name, writes=all_of(TR, WC))
        def keep_trend(ctx: StreamContext, view: Any) -> None:
            """EE trigger: votes leaving the window stop counting; trending-3 again."""
            for row in view.expired:
                _add(ctx, WC, h, row[1], -1)
            _write_trend(ctx, TR, WC, h)
    else:

        @stream_procedure(
            f"{prefix}.trending",
            input=s_rec.name,
            output=s_trending.name,
            windows=(win.name,),
            writes=all_of(TR, WC),
        )
        def trending(ctx: StreamContext, batch_id: int, recorded: list[tuple]) -> list[tuple]:
            """The window of the last votes, and trending-3 over it."""
            w = ctx.window(win.name)
            for _, c, _ in recorded:
                w.insert((c,))
                _add(ctx, WC, h, c, 1)
                for row in w.expired:
                    _add(ctx, WC, h, row[1], -1)
                w.expired = []
            return _write_trend(ctx, TR, WC, h)

        steps.append(trending)
    if nested_all:
        Dataflow(prefix, [nested(*steps)])
    else:
        Dataflow(prefix, steps, triggers=triggers)
    return v


def _remove_last(ctx: StreamContext, C: str, h: int) -> None:
    live = [(row[0], key[1]) for key, row in ctx.scan(C, (h,)) if row[1]]
    if len(live) > 1:
        votes, c = min(live, key=lambda vc: (vc[0], -vc[1]))
        ctx.put(C, (h, c), (votes, 0))


def board_rows(live: Sequence[tuple[int, int]]) -> list[tuple]:
    """(kind, rank, contestant, votes) of the top-3 and bottom-3 of ``live`` (votes,
    contestant) pairs."""
    by_votes = sorted(live, key=lambda vc: (-vc[0], vc[1]))
    bottom = sorted(live, key=lambda vc: (vc[0], vc[1]))
    rows = [("top", i + 1, c, n) for i, (n, c) in enumerate(by_votes[:BOARD])]
    rows += [("bottom", i + 1, c, n) for i, (n, c) in enumerate(bottom[:BOARD])]
    return rows


def trend_rows(window_contestants: Iterable[Any]) -> list[tuple]:
    counts = Counter(r[0] if isinstance(r, tuple) else r for r in window_contestants)
    ranked = sorted(counts.items(), key=lambda cn: (-cn[1], cn[0]))[:BOARD]
    return [(i + 1, c, n) for i, (c, n) in enumerate(ranked)]


def _add(ctx: StreamContext, WC: str, h: int, c: int, n: int) -> None:
    row = ctx.get(WC, (h, c))
    left = (row[0] if row else 0) + n
    if left:
        ctx.put(WC, (h, c), (left,))
    elif row is not None:
        ctx.delete(WC, (h, c))


def _write_trend(ctx: StreamContext, TR: str, WC: str, h: int) -> list[tuple]:
    """Trending-3 from the window's counts per contestant, into TR (and returned)."""
    counts = [(row[0], key[1]) for key, row in ctx.scan(WC, (h,))]
    ranked = sorted(counts, key=lambda nc: (-nc[0], nc[1]))[:BOARD]
    top = [(i + 1, c, n) for i, (n, c) in enumerate(ranked)]
    for rank, c, n in top:
        ctx.put(TR, (h, rank), (c, n))
    for rank in range(len(top) + 1, BOARD + 1):
        ctx.delete(TR, (h, rank))
    return top


VARIANT = {
    "lb": _build("lb"),
    "lbe": _build("lbe", ee=True),
    "lbn": _build("lbn", nested_all=True),
    "lbc": _build("lbc", triggers=False),
}


def setup_calls(prefix: str, contestants: int = CONTESTANTS) -> list[tuple[str, tuple]]:
    """The calls that put the contestants in the show."""
    return [("leaderboard.setup", (prefix, contestants))]


# The model ---------------------------------------------------------------------------
@dataclass
class Model:
    """What the dataflow must compute, from the votes alone (plain Python)."""

    contestants: int = CONTESTANTS
    votes: dict[int, int] = field(default_factory=dict)  # contestant -> votes
    active: dict[int, bool] = field(default_factory=dict)
    phones: Counter[int] = field(default_factory=Counter)
    recorded: list[tuple[int, int]] = field(default_factory=list)
    board: list[tuple] = field(default_factory=list)
    trending: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        for c in range(1, self.contestants + 1):
            self.votes[c] = 0
            self.active[c] = True

    def batch(self, votes: Iterable[tuple[int, int]]) -> None:
        valid, used = [], Counter[int]()
        for phone, c in votes:
            if not self.active.get(c):
                continue
            if self.phones[phone] + used[phone] >= VOTES_PER_PHONE_MAX:
                continue
            used[phone] += 1
            valid.append((phone, c))
        for phone, c in valid:
            if not self.active[c]:
                continue
            self.votes[c] += 1
            self.phones[phone] += 1
            self.recorded.append((phone, c))
            if len(self.recorded) % REMOVE_EVERY == 0:
                live = [(self.votes[x], x) for x in self.votes if self.active[x]]
                if len(live) > 1:
                    _, out = min(live, key=lambda vc: (vc[0], -vc[1]))
                    self.active[out] = False
        self.board = board_rows([(self.votes[x], x) for x in self.votes if self.active[x]])
        self.trending = trend_rows(c for _, c in self.recorded[-TRENDING_WINDOW:])


def _setup_footprint(prefix: str, contestants: int) -> Any:
    from txn_library.procedure import Footprint

    v = VARIANT[prefix]
    entry = ((v.contestants, (v.home,)),)
    return Footprint(reads=entry, writes=entry)


def _setup(ctx: Any, prefix: str, contestants: int) -> int:
    v = VARIANT[prefix]
    for c in range(1, contestants + 1):
        if ctx.get(v.contestants, (v.home, c)) is None:
            ctx.put(v.contestants, (v.home, c), (0, 1))
    return contestants


def _register_setup() -> None:
    from txn_library.procedure import Arg, Procedure, register

    register(
        Procedure(
            name="leaderboard.setup",
            args=(
                Arg("variant", "str", max_len=8),
                Arg("contestants", "int", min_value=1, max_value=1000),
            ),
            footprint=lambda prefix, n: _setup_footprint(_variant(prefix), n),
            body=_setup,
            doc="Put contestants 1..n in the show of one variant (lb, lbe, lbn, lbc).",
        )
    )


def _variant(prefix: Any) -> str:
    if prefix not in VARIANT:
        from txn_library.errors import ERR_BAD_ARGUMENTS, BadRequest

        raise BadRequest(ERR_BAD_ARGUMENTS, f"no leaderboard variant {prefix!r}: {list(VARIANT)}")
    return str(prefix)


_register_setup()
