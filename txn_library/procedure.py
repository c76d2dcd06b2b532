"""The stored-procedure API: declaration, argument schema, footprint, body, results.

A procedure is deterministic Python: a pure function of its arguments, the rows it
reads and the batch's fixed timestamp and seed (``ctx.timestamp_ms``, ``ctx.rng``).
It declares its footprint (keys read and written, by table and primary key or key
prefix) from its arguments alone, before it runs; the executor refuses any access
outside it (FootprintViolation -> the transaction aborts identically everywhere).

A body returns a plain msgpack-able value (status OK), ``Abort(reason)`` for a
logical abort (no writes are applied), or ``Restart(prediction)`` from a dependent
transaction whose predicted footprint went stale.

Dependent transactions name a ``recon`` procedure: a read-only, single-partition
procedure that takes the same arguments and returns the prediction; the sequencer
runs it first and appends its answer as the last argument of the real call.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from txn_library import catalog
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_TOO_LARGE,
    ERR_UNKNOWN_PROCEDURE,
    BadRequest,
    brief,
)

FootprintEntry = tuple[str, tuple]


class Context(Protocol):
    """What a body sees of the database while it runs (the executor's TxnContext).

    Reads and writes are checked against the declared footprint; time and randomness
    come only from the batch. ``holds(table, key)``: whether this executor holds that
    key's rows (always, but at a participant of a multi-partition transaction other
    than the key's partition): a body asks it before reading under a ``local``
    footprint entry (``Footprint.local``).
    """

    txn_id: int
    timestamp_ms: int

    @property
    def rng(self) -> random.Random: ...

    def get(self, table: str, key: tuple) -> tuple | None: ...

    def scan(self, table: str, prefix: tuple) -> list[tuple[tuple, tuple]]: ...

    def put(self, table: str, key: tuple, row: tuple) -> None: ...

    def delete(self, table: str, key: tuple) -> None: ...

    def hold_locks(self, ms: int) -> None: ...

    def holds(self, table: str, key: tuple) -> bool: ...


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
ARG_TYPES: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "str": str,
    "bytes": bytes,
    "float": float,
    "bool": bool,
    "list": (list, tuple),
    "any": object,
}


@dataclass(frozen=True)
class Footprint:
    """Keys (or key prefixes) a transaction reads and writes.

    ``local``: entries of both ``reads`` and ``writes`` that the body reads only where
    they are held (``Context.holds``), so a multi-partition transaction's read exchange
    never ships them. Their partition is an executor (they are written there), runs
    the body on its own rows and applies what it writes under them; a participant
    that does not hold them must compute nothing from them but writes under them
    (which it drops: they are not its own), or participants would diverge. A read
    under a local entry away from its home sees only what was shipped for the other
    entries. What streams trim (txn_library.streams.context) is the one use: a step's
    cost then does not grow with what its streams retain."""

    reads: tuple[FootprintEntry, ...] = ()
    writes: tuple[FootprintEntry, ...] = ()
    local: tuple[FootprintEntry, ...] = ()


@dataclass(frozen=True)
class Abort:
    """A logical abort: a returned status, applied identically on every replica."""

    reason: str


@dataclass(frozen=True)
class Restart:
    """A dependent transaction's prediction was stale; carries the fresh one."""

    prediction: Any


@dataclass(frozen=True)
class Arg:
    name: str
    type: str  # one of ARG_TYPES
    # For str/bytes/list: maximum length; for int: (min, max) bounds.
    max_len: int | None = None
    min_value: int | None = None
    max_value: int | None = None

    def check(self, value: Any) -> None:
        expected = ARG_TYPES[self.type]
        ok = isinstance(value, expected)
        if self.type == "int" and isinstance(value, bool):
            ok = False  # bool is an int subclass; a flag is not a number
        if self.type == "float" and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise BadRequest(
                ERR_BAD_ARGUMENTS,
                f"argument {self.name!r} must be {self.type}, got {type(value).__name__}",
            )
        if self.type == "int":
            lo = _INT64_MIN if self.min_value is None else self.min_value
            hi = _INT64_MAX if self.max_value is None else self.max_value
            if not lo <= value <= hi:
                raise BadRequest(
                    ERR_BAD_ARGUMENTS, f"argument {self.name!r}={value} outside [{lo}, {hi}]"
                )
        if self.max_len is not None and len(value) > self.max_len:
            raise BadRequest(
                ERR_BAD_ARGUMENTS, f"argument {self.name!r} longer than {self.max_len}"
            )

    def parse(self, text: str) -> Any:
        """Convert a command-line string to this argument's type."""
        if self.type == "int":
            return int(text)
        if self.type == "float":
            return float(text)
        if self.type == "bool":
            if text.lower() in ("1", "true", "yes"):
                return True
            if text.lower() in ("0", "false", "no"):
                return False
            raise ValueError(f"not a bool: {text!r}")
        if self.type == "bytes":
            return text.encode()
        if self.type in ("list", "any"):
            import json

            return json.loads(text)
        return text


_ENTRIES = (tuple, list)  # what a footprint's reads and writes may be


@dataclass(frozen=True)
class Procedure:
    name: str
    args: tuple[Arg, ...]
    footprint: Callable[..., Footprint]
    body: Callable[..., Any]
    read_only: bool = False
    recon: str | None = None  # name of the reconnaissance procedure (dependent txn)
    doc: str = ""
    # For dependent procedures: the prediction travels as an extra, last argument.
    extra: dict[str, Any] = field(default_factory=dict)
    # More checks of the arguments where calls are admitted (after the schema's): raises
    # BadRequest. Logged calls are not checked again (a stream push's tuples, say).
    check: Callable[..., None] | None = None

    @property
    def dependent(self) -> bool:
        return self.recon is not None

    def validate(self, args: Sequence[Any]) -> None:
        """Raise BadRequest unless ``args`` match the declared schema exactly."""
        if not isinstance(args, (list, tuple)):
            raise BadRequest(ERR_BAD_ARGUMENTS, "arguments must be an array")
        if len(args) != len(self.args):
            names = ", ".join(a.name for a in self.args)
            raise BadRequest(
                ERR_BAD_ARGUMENTS,
                f"{self.name} takes {len(self.args)} arguments ({names}), got {len(args)}",
            )
        for spec, value in zip(self.args, args, strict=True):
            spec.check(value)
        if self.check is not None:
            self.check(*args)

    def footprint_of(self, args: Sequence[Any], entries_max: int | None = None) -> Footprint:
        """The declared footprint, with every entry checked against the catalog (and
        its size against ``entries_max``, where a call is admitted)."""
        fp = self.footprint(*args)
        self._checked_places(fp, 1, entries_max)
        return fp

    def participants_of(
        self, args: Sequence[Any], partitions: int, entries_max: int | None = None
    ) -> tuple[int, ...]:
        """The partitions the call's footprint touches, sorted (a footprint of
        replicated tables only: partition 0; the rule of txn_library.placement),
        checked as ``footprint_of`` checks it: both in one pass (this runs for every
        call at the sequencer and again in replay)."""
        places = self._checked_places(self.footprint(*args), partitions, entries_max)
        return tuple(sorted(places)) if places else (0,)

    def _checked_places(
        self, fp: Footprint, partitions: int, entries_max: int | None = None
    ) -> set[int]:
        """Raise BadRequest unless every entry of ``fp`` fits its table (and, given
        ``entries_max``, there are at most that many: ERR_TOO_LARGE); the partitions of
        its non-replicated entries (none are computed for one partition)."""
        reads, writes, local = fp.reads, fp.writes, fp.local
        if type(reads) not in _ENTRIES or type(writes) not in _ENTRIES:
            # Every executor walks them more than once (cover sets, then lock names): a
            # generator would give them entries once, the locks none.
            raise BadRequest(
                ERR_BAD_ARGUMENTS,
                f"{self.name}: footprint reads and writes must be tuples or lists, not "
                f"{type(reads).__name__} and {type(writes).__name__}",
            )
        try:  # partitions make sets and lock names of them: hashable, or refused here
            hash(tuple(reads))
            hash(tuple(writes))
        except TypeError as e:
            raise BadRequest(
                ERR_BAD_ARGUMENTS, f"{self.name}: footprint keys must be hashable ({e})"
            ) from None
        if local:
            self._check_local(reads, writes, local)
        if entries_max is not None and len(reads) + len(writes) > entries_max:
            raise BadRequest(
                ERR_TOO_LARGE,
                f"{self.name}: a footprint of {len(reads) + len(writes)} entries "
                f"(reads and writes) > {entries_max}",
            )
        places: set[int] = set()
        place = places.add if partitions > 1 else None
        read_only = self.read_only
        specs: dict[str, catalog.Table] = {}  # each table looked up once per call
        for is_read, entries in ((True, reads), (False, writes)):
            for t, key in entries:
                spec = specs.get(t)
                if spec is None:
                    spec = specs[t] = catalog.table(t)
                n = spec.place_prefix if read_only else spec.lock_prefix
                k = len(key) if isinstance(key, tuple) else -1
                if not n <= k <= spec.key_len:
                    raise BadRequest(
                        ERR_BAD_ARGUMENTS,
                        f"{self.name}: footprint entry {t}{brief(key)} must be a tuple of "
                        f"length {n}..{spec.key_len}",
                    )
                if is_read:
                    if k < spec.key_len and not spec.ordered and not read_only:
                        raise BadRequest(
                            ERR_BAD_ARGUMENTS,
                            f"{self.name}: prefix read of unordered table {t}{brief(key)} "
                            f"(only ordered tables can be read by prefix in a sequenced call)",
                        )
                elif spec.replicated:
                    raise BadRequest(ERR_BAD_ARGUMENTS, f"{self.name}: writes replicated {t}")
                if place is not None and not spec.replicated:
                    if spec.by_first_int:  # place_by_first_int, inline (a call costs more)
                        first = key[0]
                        if type(first) is not int:
                            raise self._unplaceable(t, key)
                        place((first - 1) % partitions)
                    else:
                        p = spec.placement(key[: spec.place_prefix], partitions)
                        if type(p) is not int or not 0 <= p < partitions:
                            raise self._unplaceable(t, key)
                        place(p)
        return places

    def _check_local(self, reads: Any, writes: Any, local: Any) -> None:
        """Every ``local`` entry is read and written too (``Footprint.local``); its
        shape is then checked with the reads and writes."""
        if type(local) not in _ENTRIES:
            raise BadRequest(
                ERR_BAD_ARGUMENTS,
                f"{self.name}: footprint local must be a tuple or list, not {type(local).__name__}",
            )
        try:
            both = set(reads) & set(writes)
            missing = [e for e in local if e not in both]
        except TypeError as e:
            raise BadRequest(
                ERR_BAD_ARGUMENTS, f"{self.name}: footprint keys must be hashable ({e})"
            ) from None
        if missing:
            raise BadRequest(
                ERR_BAD_ARGUMENTS,
                f"{self.name}: footprint local entry {brief(missing[0])} is not both read and "
                f"written (a local entry is read where it is written)",
            )

    def _unplaceable(self, t: str, key: Any) -> BadRequest:
        """A footprint entry whose key places it on no partition: under
        place_by_first_int a first key part that is not an int (a float gave a
        participant 0.5, a call that no partition took as its own), or a placement
        function's answer outside 0..partitions-1."""
        return BadRequest(
            ERR_BAD_ARGUMENTS,
            f"{self.name}: footprint entry {t}{brief(key)} places on no partition "
            f"(its placement prefix must be what the table's placement takes)",
        )


_REGISTRY: dict[str, Procedure] = {}
# Procedures deployed through the log (txn_library.deployed): a name's versions, each
# [effective_epoch, Procedure or None (retired)], oldest first. Only deployed names
# have an entry, so ``lookup_at`` of any other name costs one dict miss.
_HISTORY: dict[str, list[tuple[int, Procedure | None]]] = {}
# While a deployed module's source runs (txn_library.deployed.load_source), what it
# registers goes here, not into the registry.
_CAPTURE: list[dict[str, Procedure]] = []


def register(proc: Procedure) -> Procedure:
    if _CAPTURE:
        captured = _CAPTURE[-1]
        if proc.name in captured:
            raise ValueError(f"procedure {proc.name!r} registered twice")
        captured[proc.name] = proc
        return proc
    if proc.name in _REGISTRY and _REGISTRY[proc.name] is not proc:
        raise ValueError(f"procedure {proc.name!r} registered twice")
    _REGISTRY[proc.name] = proc
    return proc


def procedure(
    name: str,
    args: Sequence[Arg | tuple[str, str]],
    footprint: Callable[..., Footprint],
    *,
    read_only: bool = False,
    recon: str | None = None,
) -> Callable[[Callable[..., Any]], Procedure]:
    """Decorator: declare and register a stored procedure."""

    def wrap(body: Callable[..., Any]) -> Procedure:
        specs = tuple(a if isinstance(a, Arg) else Arg(*a) for a in args)
        return register(
            Procedure(
                name=name,
                args=specs,
                footprint=footprint,
                body=body,
                read_only=read_only,
                recon=recon,
                doc=(body.__doc__ or "").strip(),
            )
        )

    return wrap


def lookup(name: Any) -> Procedure:
    if not isinstance(name, str):
        raise BadRequest(
            ERR_UNKNOWN_PROCEDURE, f"procedure name must be a string, got {type(name).__name__}"
        )
    try:
        return _REGISTRY[name]
    except KeyError:
        raise BadRequest(ERR_UNKNOWN_PROCEDURE, f"no procedure named {brief(name)}") from None


def lookup_at(name: Any, epoch: int) -> Procedure:
    """The version of ``name`` in force at ``epoch`` (what a transaction of that epoch
    runs): for a name never deployed through the log, ``lookup``'s."""
    history = _HISTORY.get(name) if type(name) is str else None
    if history is None:
        return lookup(name)
    found: Procedure | None = None
    for effective, proc in history:
        if effective > epoch:
            break
        found = proc
    if found is None:
        raise BadRequest(
            ERR_UNKNOWN_PROCEDURE, f"no procedure named {brief(name)} at epoch {epoch}"
        )
    return found


def procedures() -> dict[str, Procedure]:
    return dict(_REGISTRY)


# Modules that moved into txn_library's rooms, by their old names: a cluster.json, a
# ``--module`` or a genesis spec written before the move still loads the same code.
MODULE_ALIASES: dict[str, str] = {
    "txn_library.builtin": "txn_library.workloads.builtin",
    "txn_library.bank_workload": "txn_library.workloads.bank",
    "txn_library.stream_workload": "txn_library.workloads.stream_sim",
    "txn_library.leaderboard": "txn_library.workloads.leaderboard",
    "txn_library.chains": "txn_library.workloads.chains",
    "txn_library.bench_procedures": "txn_library.workloads.bench_procedures",
    "txn_library.query_bench": "txn_library.workloads.query_bench",
    "txn_library.retention_bench": "txn_library.workloads.retention_bench",
}


def module_name(module: str) -> str:
    """The module to import for ``module``: itself, or where it moved (MODULE_ALIASES)."""
    return MODULE_ALIASES.get(module, module)


def load_modules(modules: Sequence[str]) -> None:
    """Import the modules that register procedures and tables (same list everywhere)."""
    import importlib

    for m in modules:
        importlib.import_module(module_name(m))
