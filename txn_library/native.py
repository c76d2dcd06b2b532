"""The engine's hot modules compiled with mypyc, used only while they match their sources.

``scripts/setup.sh`` compiles ``MODULES`` (scripts/build_native.py): an extension
module beside each source, the code of all of them in one shared library
(``GROUP_LIB``, under ``build/native/``), and a stamp of what they were built from.
Compiled and pure modules compute the same thing: mypyc compiles the same source,
and tests/unit/test_native.py runs TPC-C and bank transfers both ways and compares
state hashes and results. Compiling removes interpretation overhead from the
partition's hot path (the procedure bodies, the context, storage, the lock manager).

Python imports an extension module before its source even after the source changed,
so this module decides, once per process, which one runs (``install``, called by each
package that holds a compiled module, before any of them is imported):
- compiled, when the stamp names this interpreter and every stamped source (the
  compiled modules and the project modules they import) hashes as it did at the build;
- otherwise pure Python, for all of them: a compiled module calls the others' compiled
  classes directly, so compiled and pure modules are never mixed. The reason is
  kept (``describe``): not built, stale (which source changed), or ``ORDO_PURE=1``
  (the environment variable: run everything from source; the tests run both ways).

Invariants: ``MODULES`` are imported either all compiled or all from source; a
process never changes its choice; nothing here imports Ordo's other modules.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# The compiled modules: the partition's hot path under TPC-C (docs/BENCHMARKS.md), and a
# reader's (following the log, answering queries).
MODULES = (
    "executor.core.changes",
    "executor.core.context",
    "executor.core.execution",
    "executor.core.ordered_index",
    "executor.core.pending",
    "executor.core.rows",
    "executor.core.state_hash",
    "executor.core.storage",
    "executor.core.versions",
    "executor.deterministic.chain",
    "executor.deterministic.partition",
    "executor.deterministic.sent_reads",
    "executor.deterministic.txn_state",
    "executor.reader.follower",
    "executor.reader.queries",
    "scheduler.lock_manager",
    "tpcc.transactions.check",
    "tpcc.transactions.common",
    "tpcc.transactions.delivery",
    "tpcc.transactions.new_order",
    "tpcc.transactions.order_status",
    "tpcc.transactions.payment",
    "tpcc.transactions.stock_level",
    "txn_library.placement",
)
GROUP = "ordo_native"  # mypyc's group: the shared library is GROUP + "__mypyc"
GROUP_LIB = GROUP + "__mypyc"
PURE_ENV = "ORDO_PURE"
ROOT = Path(__file__).resolve().parent.parent  # the source tree
BUILD_DIR = ROOT / "build" / "native"
STAMP = BUILD_DIR / "stamp.json"
STAMP_FORMAT = 1


def interpreter_tag() -> str:
    """What a compiled module is built for: this interpreter and its extension suffix."""
    return f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}"


def source_path(root: Path, module: str) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def extension_path(root: Path, module: str) -> Path:
    return source_path(root, module).with_suffix(importlib.machinery.EXTENSION_SUFFIXES[0])


def group_lib_path(build_dir: Path) -> Path:
    return build_dir / (GROUP_LIB + importlib.machinery.EXTENSION_SUFFIXES[0])


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamp_record(root: Path, modules: Sequence[str], sources: Sequence[str]) -> dict[str, Any]:
    """What the build writes to the stamp: the interpreter, the compiled modules and
    the digest of every source they depend on (paths relative to ``root``)."""
    return {
        "format": STAMP_FORMAT,
        "interpreter": interpreter_tag(),
        "modules": list(modules),
        "sources": {rel: file_digest(root / rel) for rel in sorted(sources)},
    }


def choose(
    root: Path, build_dir: Path, modules: Sequence[str], environ: dict[str, str]
) -> tuple[bool, str]:
    """(compiled?, why): whether ``modules`` may be imported compiled from this tree."""
    if environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"pure Python ({PURE_ENV}={environ[PURE_ENV]})"
    stamp = build_dir / "stamp.json"
    try:
        record = json.loads(stamp.read_text())
    except FileNotFoundError:
        return False, "pure Python (not compiled: scripts/setup.sh compiles the hot modules)"
    except (OSError, ValueError) as e:
        return False, f"pure Python (unreadable {stamp}: {e})"
    if not isinstance(record, dict) or record.get("format") != STAMP_FORMAT:
        return False, f"pure Python (stamp {stamp} of another format: run scripts/setup.sh)"
    if record.get("interpreter") != interpreter_tag():
        return False, (
            f"pure Python (compiled for {record.get('interpreter')}, "
            f"this is {interpreter_tag()}: run scripts/setup.sh)"
        )
    if record.get("modules") != list(modules):
        return False, "pure Python (compiled another module list: run scripts/setup.sh)"
    missing = [m for m in modules if not extension_path(root, m).exists()]
    if not group_lib_path(build_dir).exists():
        missing.append(GROUP_LIB)
    if missing:
        return False, f"pure Python (compiled files missing: {', '.join(missing)})"
    sources = record.get("sources")
    if not isinstance(sources, dict) or not sources:
        return False, f"pure Python (stamp {stamp} lists no sources: run scripts/setup.sh)"
    for rel, digest in sources.items():
        path = root / rel
        try:
            now = file_digest(path)
        except OSError:
            now = None
        if now != digest:
            why = f"stale: {rel} changed since the build; run scripts/setup.sh"
            return False, f"pure Python ({why})"
    return True, f"compiled (mypyc, {len(modules)} modules)"


class _Finder(importlib.abc.MetaPathFinder):
    """Imports ``MODULES`` from source when pure, and ``GROUP_LIB`` from the build."""

    def __init__(self, compiled: bool) -> None:
        self.compiled = compiled

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == GROUP_LIB and self.compiled:
            return importlib.util.spec_from_file_location(fullname, group_lib_path(BUILD_DIR))
        if fullname in _MODULE_SET and not self.compiled:
            source = source_path(ROOT, fullname)
            if source.is_file():  # not in a zip (code shipped to Spark workers): no .so there
                return importlib.util.spec_from_file_location(fullname, source)
        return None  # everything else, and a compiled module: the normal import


_MODULE_SET = frozenset(MODULES)
_choice: tuple[bool, str] | None = None


def install() -> None:
    """Decide once for this process and put the finder first on ``sys.meta_path``."""
    global _choice
    if _choice is not None:
        return
    _choice = choose(ROOT, BUILD_DIR, MODULES, dict(os.environ))
    sys.meta_path.insert(0, _Finder(_choice[0]))


def compiled() -> bool:
    install()
    assert _choice is not None
    return _choice[0]


def describe() -> str:
    """How this process runs the hot modules, and why (for status lines and results)."""
    install()
    assert _choice is not None
    return _choice[1]


def describe_now() -> str:
    """How a process started now would run them: a benchmark that starts processes
    for minutes checks this at its end (a source edited meanwhile makes the later
    ones run from source)."""
    return choose(ROOT, BUILD_DIR, MODULES, dict(os.environ))[1]
