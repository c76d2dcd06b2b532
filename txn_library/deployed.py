"""Procedures deployed through the log: code as part of the history.

``ordo deploy MODULE.py`` sends the module's source as a call of the system procedure
``ordo.deploy`` (arguments: module name, source bytes, names to retire). The sequencer
has the module imported and checked in a separate process (cluster.deploy_check) and
only then sequences the call; the batch that holds it (epoch E) carries FLAG_DEPLOY.
Every process that reads batches (partitions, readers, the sequencer itself, replay)
``install``s the module when it meets that batch, and from epoch E + 1 on a
transaction of one of its procedures runs the new version: ``procedure.lookup_at``
gives the version in force at a transaction's epoch, so a transaction of epoch E or
earlier that is still running (waiting for reads) keeps the old one. A deploy may also
retire names (then unknown from E + 1).

What a process has installed is durable where it keeps its state (``CodeStore``: the
sequencer beside its log, a partition beside its checkpoints), so a restart installs
it again before reading later batches; replay installs what the checkpoint directory
it starts from holds and every deploy batch it meets.

Invariants:
- A deployed module registers procedures only (no tables, streams or dataflows), none
  of a name owned by a module named at start-up (``builtin``) or reserved (``ordo.``),
  and every recon it names resolves.
- Installing is idempotent: the same record (digest, effective epoch) installs once;
  versions of a name are numbered 1, 2, ... in effective-epoch order.
- The registry's current entry of a deployed name is its newest version (what the
  sequencer validates new calls against); executors use ``lookup_at``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from txn_library import catalog, limits, procedure
from txn_library.errors import invariant
from txn_library.procedure import Arg, Footprint, Procedure

DEPLOY = "ordo.deploy"
# A batch's bytes hold the deploy call's name, msgpack-packed: a log finds its deploy
# batches with one bytes.find per frame (sequencer.log), decoding only those.
MARKER = msgpack.packb(DEPLOY)
ERR_DEPLOY_REFUSED = "deploy_refused"
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_RESERVED = "ordo."


class DeployRefused(Exception):
    """A module that may not be deployed, and why (the caller's message)."""


@dataclass(frozen=True)
class Deploy:
    """One deploy as logged: the module and the names it retires, effective from
    ``effective_epoch`` (the epoch after the batch that holds it)."""

    module: str
    source: bytes
    retire: tuple[str, ...]
    effective_epoch: int

    @property
    def digest(self) -> str:
        return source_digest(self.source)

    def encode(self) -> bytes:
        return msgpack.packb([self.module, self.source, list(self.retire), self.effective_epoch])

    @staticmethod
    def decode(data: bytes) -> Deploy:
        module, source, retire, effective = msgpack.unpackb(data)
        return Deploy(module, source, tuple(retire), effective)


def source_digest(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


# Loading a module's source -----------------------------------------------------------
_LOADED: dict[str, dict[str, Procedure]] = {}  # digest -> the procedures it registers


def load_source(module: str, source: bytes) -> dict[str, Procedure]:
    """Run a module's source as a fresh module and return the procedures it registers
    (not added to the registry). Raises DeployRefused when it fails to compile or run,
    or registers a table; what it raises is named."""
    if not _MODULE_NAME.fullmatch(module):
        raise DeployRefused(f"module name {module[:80]!r} must be a Python identifier")
    digest = source_digest(source)
    done = _LOADED.get(digest)
    if done is not None:
        return done
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DeployRefused(f"{module}: source is not UTF-8 ({e})") from None
    name = f"ordo_deployed.{module}_{digest[:16]}"
    mod = types.ModuleType(name)
    mod.__file__ = f"<deployed {module} {digest[:12]}>"
    tables = dict(catalog.tables())
    captured: dict[str, Procedure] = {}
    procedure._CAPTURE.append(captured)
    sys.modules[name] = mod  # dataclasses and pickling look a class's module up
    try:
        exec(compile(text, mod.__file__, "exec"), mod.__dict__)
    except BaseException as e:  # noqa: BLE001 - anything the module raises refuses it
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise DeployRefused(f"{module}: importing it raised {type(e).__name__}: {e}") from None
    finally:
        procedure._CAPTURE.pop()
    if catalog.tables() != tables:
        new = sorted(set(catalog.tables()) - set(tables))
        catalog._TABLES.clear()  # as it was: the refused module changes nothing
        catalog._TABLES.update(tables)
        raise DeployRefused(
            f"{module}: registers tables {new}: a deployed module registers procedures "
            "only (tables come from the modules named at start-up)"
        )
    _LOADED[digest] = captured
    return captured


def check(module: str, source: bytes, retire: Sequence[str]) -> dict[str, Procedure]:
    """Everything the sequencer checks before it sequences a deploy (run in a separate
    process by cluster.deploy_check): raises DeployRefused naming the problem."""
    if len(source) > limits.deploy_source_bytes_max:
        raise DeployRefused(
            f"{module}: {len(source)} bytes of source > {limits.deploy_source_bytes_max}"
        )
    procs = load_source(module, source)
    if not procs and not retire:
        raise DeployRefused(f"{module}: registers no procedure and retires none")
    owned = startup_names()
    for name, proc in procs.items():
        if name.startswith(_RESERVED):
            raise DeployRefused(f"{module}: procedure name {name!r} is reserved")
        if name in owned:
            raise DeployRefused(
                f"{module}: procedure {name!r} is owned by a module named at start-up "
                "(a deployed module may define new procedures and new versions of deployed ones)"
            )
        if proc.recon is not None and proc.recon not in procs:
            current = procedure.procedures().get(proc.recon)
            if current is None:
                raise DeployRefused(f"{module}: {name}'s recon {proc.recon!r} does not exist")
    for name in retire:
        if name in procs:
            raise DeployRefused(f"{module}: {name!r} is both defined and retired")
        if name not in procedure._HISTORY or procedure.procedures().get(name) is None:
            raise DeployRefused(f"cannot retire {name!r}: not a deployed procedure in force")
    return procs


def startup_names() -> set[str]:
    """Names registered by the modules named at start-up (never deployed)."""
    return {n for n in procedure.procedures() if n not in procedure._HISTORY}


# Installing --------------------------------------------------------------------------
_INSTALLED: dict[tuple[str, int], Deploy] = {}  # (digest, effective_epoch) -> record


def install(record: Deploy) -> bool:
    """Make ``record``'s procedures the versions in force from its effective epoch on
    (and its retired names unknown); False if it was installed already."""
    key = (record.digest, record.effective_epoch)
    if key in _INSTALLED:
        return False
    procs = load_source(record.module, record.source)
    changes: list[tuple[str, Procedure | None]] = [*procs.items()]
    changes += [(n, None) for n in record.retire]
    for name, proc in changes:
        history = procedure._HISTORY.setdefault(name, [])
        history.append((record.effective_epoch, proc))
        history.sort(key=lambda entry: entry[0])
        newest = history[-1][1]
        if newest is None:
            procedure._REGISTRY.pop(name, None)
        else:
            procedure._REGISTRY[name] = newest
        invariant(
            all(a[0] <= b[0] for a, b in zip(history, history[1:], strict=False)),
            "deployed versions in effective-epoch order",
        )
    _INSTALLED[key] = record
    return True


def installed() -> list[Deploy]:
    """Every installed record, by effective epoch."""
    return sorted(_INSTALLED.values(), key=lambda r: (r.effective_epoch, r.digest))


def records_in_batch(epoch: int, txns: Iterable[Any]) -> list[Deploy]:
    """The deploys a batch of ``epoch`` holds (its txns with proc ``ordo.deploy``),
    effective from epoch + 1."""
    out = []
    for txn in txns:
        if txn.proc == DEPLOY:
            module, source, retire = txn.args[:3]
            out.append(Deploy(module, bytes(source), tuple(retire), epoch + 1))
    return out


def install_batch(epoch: int, txns: Iterable[Any]) -> list[Deploy]:
    """Install the deploys of a FLAG_DEPLOY batch; the records."""
    records = records_in_batch(epoch, txns)
    for r in records:
        install(r)
    return records


def versions() -> list[dict[str, Any]]:
    """Every procedure's version and since when: start-up ones version 0 from epoch 0;
    a deployed one per version, the epoch it took effect (retired: version None)."""
    out: list[dict[str, Any]] = []
    for name in sorted(startup_names()):
        out.append({"name": name, "version": 0, "since_epoch": 0, "module": "", "digest": ""})
    by_digest = {(r.digest, r.effective_epoch): r for r in _INSTALLED.values()}
    for name in sorted(procedure._HISTORY):
        n = 0
        for effective, proc in procedure._HISTORY[name]:
            rec = next(
                (r for (d, e), r in by_digest.items() if e == effective and _holds(r, name)),
                None,
            )
            if proc is not None:
                n += 1
            out.append(
                {
                    "name": name,
                    "version": n if proc is not None else None,
                    "since_epoch": effective,
                    "module": rec.module if rec else "",
                    "digest": rec.digest[:16] if rec else "",
                }
            )
    return out


def _holds(record: Deploy, name: str) -> bool:
    return name in record.retire or name in load_source(record.module, record.source)


def reset() -> None:
    """Forget every deployed procedure (tests that deploy in-process)."""
    for name in list(procedure._HISTORY):
        procedure._REGISTRY.pop(name, None)
    procedure._HISTORY.clear()
    _INSTALLED.clear()


# The system procedure ----------------------------------------------------------------
def _deploy_footprint(module: str, source: bytes, retire: list) -> Footprint:
    return Footprint()


def _deploy_body(ctx: Any, module: str, source: bytes, retire: list) -> dict[str, Any]:
    """What the deploy answers (its batch installed it before any txn ran)."""
    procs = load_source(module, bytes(source))
    return {
        "module": module,
        "digest": source_digest(bytes(source)),
        "procedures": sorted(procs),
        "retired": sorted(retire),
    }


DEPLOY_PROC = procedure.register(
    Procedure(
        name=DEPLOY,
        args=(
            Arg("module", "str", max_len=64),
            Arg("source", "bytes", max_len=limits.deploy_source_bytes_max),
            Arg("retire", "list", max_len=64),
        ),
        footprint=_deploy_footprint,
        body=_deploy_body,
        doc="Deploy a module's procedures through the log (ordo deploy).",
    )
)


# Where a process keeps what it installed ------------------------------------------------
class CodeStore:
    """A directory of installed records, one file each (``<effective:012d>-<digest>``),
    written whole (temp file, fsync, rename, fsync of the directory) before the batch
    that holds it is applied."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, records: Iterable[Deploy]) -> None:
        for r in records:
            target = self.path / f"{r.effective_epoch:012d}-{r.digest[:32]}.deploy"
            if target.exists():
                continue
            self.path.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".{os.getpid()}.tmp")  # partitions share the dir
            with open(tmp, "wb") as f:
                f.write(r.encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def load(self) -> list[Deploy]:
        if not self.path.is_dir():
            return []
        return [Deploy.decode(p.read_bytes()) for p in sorted(self.path.glob("*.deploy"))]

    def install_all(self) -> int:
        """Install every stored record; how many were new."""
        return sum(install(r) for r in self.load())
