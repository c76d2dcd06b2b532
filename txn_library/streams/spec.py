"""Streams and windows are tables: what a declaration registers, and the system tables
that record batches, window state and dataflow progress.

A stream ``S`` declared with ``stream("S", columns, home=h)`` is the ordered table
``S`` keyed ``(home, batch_id, seq)`` (one row per tuple, its values as the row), plus
one row per batch in the system table ``ordo_stream_batch`` keyed ``(home, S,
batch_id)``: ``(n_tuples, digest, result)`` (the digest of a pushed batch's tuples and
the push's answer, for retries), and, for a stream clients push to or a sink, its row
in ``ordo_stream`` keyed ``(home, S)``: ``(first_batch, last_batch, batches,
dropped)`` (``dropped``: the newest batch no longer kept). Such a stream keeps its last
``retain_batches`` batches: once it holds ``retain_batches / 16`` more (at least one),
the oldest go at once, their rows and any tuples left (one scan for many batches). A
stream between two steps keeps a batch only until its last consumer has taken it.

A window ``W`` is the ordered table ``W`` keyed ``(home, seq)``, rows ``(batch_id,
*values)``, plus its state row in ``ordo_window`` keyed ``(home, W)``:
``(next_seq, visible_from, visible_to, staged_batches, batches)`` where ``batches``
is ``[[batch_id, first_seq], ...]`` of the batches a batch-based window holds.
Rows ``visible_from <= seq < visible_to`` are what the window shows; rows at and
after ``visible_to`` are staged (invisible until the window slides).

Dataflow progress: ``ordo_dataflow_progress`` keyed ``(home, dataflow, step)``:
``(last_batch, batches, tuples_in, tuples_out)``.

Invariants:
- Every table of a stream, window or dataflow is placed by its ``home`` (the first
  key part, ``place_by_first_int``) and locked as a whole per home: a footprint names
  ``(table, (home,))``, so a dataflow whose streams, windows and state share a home
  runs on one partition without a lock per tuple.
- Names are unique across tables, streams and windows (the catalog refuses a second
  shape under one name); column types are ``COLUMN_TYPES``.
- Nothing here runs at import but registration: declarations are pure data, the same
  in every process that loads the same modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from txn_library import limits
from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.errors import ERR_BAD_ARGUMENTS, BadRequest, brief

# A column's type: what a pushed tuple's value must be (bool is not an int here either).
COLUMN_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "str": (str,),
    "bytes": (bytes,),
    "bool": (bool,),
    "any": (object,),
}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

STREAM_BATCHES = "ordo_stream_batch"
STREAMS = "ordo_stream"
WINDOWS = "ordo_window"
PROGRESS = "ordo_dataflow_progress"

register_table(
    Table(
        STREAM_BATCHES,
        key_len=3,
        lock_len=2,
        place_len=1,
        placement=place_by_first_int,
        ordered=True,
        key_types=(int, str, int),
        key_columns=("home", "stream", "batch_id"),
        columns=("n_tuples", "digest", "result"),
    )
)
register_table(
    Table(
        STREAMS,
        key_len=2,
        place_len=1,
        placement=place_by_first_int,
        ordered=True,
        key_types=(int, str),
        key_columns=("home", "stream"),
        columns=("first_batch", "last_batch", "batches", "dropped"),
    )
)
register_table(
    Table(
        WINDOWS,
        key_len=2,
        place_len=1,
        placement=place_by_first_int,
        ordered=True,
        key_types=(int, str),
        key_columns=("home", "window"),
        columns=("next_seq", "visible_from", "visible_to", "staged_batches", "batches"),
    )
)
register_table(
    Table(
        PROGRESS,
        key_len=3,
        lock_len=2,
        place_len=1,
        placement=place_by_first_int,
        ordered=True,
        key_types=(int, str, str),
        key_columns=("home", "dataflow", "step"),
        columns=("last_batch", "batches", "tuples_in", "tuples_out"),
    )
)


def _columns(name: str, columns: Sequence[Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, types) of ``columns``: each "name" (type any) or ("name", "type")."""
    names, types = [], []
    for c in columns:
        n, t = (c, "any") if isinstance(c, str) else tuple(c)
        if t not in COLUMN_TYPES:
            raise ValueError(
                f"{name}: column {n!r} has type {t!r}, not one of {list(COLUMN_TYPES)}"
            )
        names.append(n)
        types.append(t)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{name}: columns must be named, each once")
    return tuple(names), tuple(types)


def _fits(v: Any, t: str) -> bool:
    tp = type(v)
    if t == "int":
        return tp is int and _INT64_MIN <= v <= _INT64_MAX
    if t == "str":
        return tp is str
    if t == "float":
        return tp is float or (tp is int and _INT64_MIN <= v <= _INT64_MAX)
    if t == "bytes":
        return tp is bytes
    if t == "bool":
        return tp is bool
    return True  # any


def fitted(values: Any, types: tuple[str, ...]) -> tuple | str:
    """``values`` as a tuple that fits ``types``, or why it does not (no message is
    built unless it does not: this runs for every tuple pushed or emitted)."""
    if type(values) is not tuple:
        if not isinstance(values, list):
            return f"a tuple of {len(types)} values, got {brief(values)}"
        values = tuple(values)
    if len(values) != len(types):
        return f"a tuple of {len(types)} values, got {brief(values)}"
    for i, t in enumerate(types):
        if not _fits(values[i], t):
            return f"value {i} must be {t}, got {brief(values[i], 40)}"
    return values


def check_values(what: str, values: Any, types: tuple[str, ...]) -> tuple:
    """``values`` as a tuple that fits ``types`` (BadRequest naming ``what`` if not)."""
    got = fitted(values, types)
    if type(got) is str:
        raise BadRequest(ERR_BAD_ARGUMENTS, f"{what}: {got}")
    return got  # type: ignore[return-value]


@dataclass(frozen=True)
class Stream:
    """A stream: an ordered table of tuples, each carrying its batch id."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    home: int
    retain_batches: int

    def key_prefix(self) -> tuple:
        return (self.home,)

    def check_tuples(self, tuples: Any) -> tuple[tuple, ...]:
        """The batch's tuples, checked against the columns (BadRequest if not)."""
        if not isinstance(tuples, (list, tuple)):
            raise BadRequest(
                ERR_BAD_ARGUMENTS, f"stream {self.name}: tuples must be a list of tuples"
            )
        if len(tuples) > limits.stream_batch_tuples_max:
            raise BadRequest(
                ERR_BAD_ARGUMENTS,
                f"stream {self.name}: a batch of {len(tuples)} tuples > "
                f"{limits.stream_batch_tuples_max} (limits.stream_batch_tuples_max)",
            )
        types = self.types
        out: list[tuple] = []
        for t in tuples:
            got = fitted(t, types)
            if type(got) is str:
                raise BadRequest(ERR_BAD_ARGUMENTS, f"stream {self.name} tuple {len(out)}: {got}")
            out.append(got)  # type: ignore[arg-type]  # a tuple: not a str
        return tuple(out)


@dataclass(frozen=True)
class Window:
    """A window over tuples: ``size`` and ``slide`` in tuples (``kind="tuples"``) or in
    batches (``kind="batches"``), owned by one step of one dataflow."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    home: int
    size: int
    slide: int
    kind: str
    owner: str  # the step (procedure name) that may read and change it


_STREAMS: dict[str, Stream] = {}
_WINDOWS: dict[str, Window] = {}


def stream(
    name: str, columns: Sequence[Any], *, home: int = 1, retain_batches: int | None = None
) -> Stream:
    """Declare (and register) a stream; ``columns``: names, or (name, type) pairs."""
    names, types = _columns(name, columns)
    keep = limits.stream_batches_retained if retain_batches is None else retain_batches
    if not 1 <= keep <= limits.stream_batches_retained_max:
        raise ValueError(
            f"stream {name}: retain_batches {keep} outside 1..{limits.stream_batches_retained_max}"
        )
    if type(home) is not int or not 1 <= home <= _INT64_MAX:
        raise ValueError(f"stream {name}: home must be a positive int")
    s = Stream(name, names, types, home, keep)
    if _STREAMS.get(name, s) != s:
        raise ValueError(f"stream {name!r} declared twice with different shapes")
    register_table(
        Table(
            name,
            key_len=3,
            lock_len=1,
            place_len=1,
            placement=place_by_first_int,
            ordered=True,
            key_types=(int, int, int),
            index_len=1,  # one group a stream: batches arrive in id order, go oldest first
            key_columns=("home", "batch_id", "seq"),
            columns=names,
        )
    )
    _STREAMS[name] = s
    return s


def window(
    name: str,
    columns: Sequence[Any],
    *,
    size: int,
    slide: int,
    kind: str = "tuples",
    owner: str,
    home: int = 1,
) -> Window:
    """Declare (and register) a window owned by the step named ``owner``."""
    names, types = _columns(name, columns)
    if kind not in ("tuples", "batches"):
        raise ValueError(f"window {name}: kind is 'tuples' or 'batches', not {kind!r}")
    bound = limits.window_tuples_max if kind == "tuples" else limits.window_batches_max
    if not (1 <= slide <= size <= bound):
        raise ValueError(f"window {name}: need 1 <= slide <= size <= {bound} ({kind})")
    w = Window(name, names, types, home, size, slide, kind, owner)
    if _WINDOWS.get(name, w) != w:
        raise ValueError(f"window {name!r} declared twice with different shapes")
    register_table(
        Table(
            name,
            key_len=2,
            lock_len=1,
            place_len=1,
            placement=place_by_first_int,
            ordered=True,
            key_types=(int, int),
            key_columns=("home", "seq"),
            columns=("batch_id", *names),
        )
    )
    _WINDOWS[name] = w
    return w


def stream_named(name: Any) -> Stream:
    """The stream called ``name`` (BadRequest if there is none)."""
    s = _STREAMS.get(name) if type(name) is str else None
    if s is None:
        raise BadRequest(ERR_BAD_ARGUMENTS, f"no stream named {brief(name)}")
    return s


def window_named(name: str) -> Window:
    w = _WINDOWS.get(name)
    if w is None:
        raise KeyError(f"no window named {name!r}")
    return w


def streams() -> dict[str, Stream]:
    return dict(_STREAMS)


def windows() -> dict[str, Window]:
    return dict(_WINDOWS)
