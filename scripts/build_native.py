"""Compile the engine's hot modules with mypyc (called by scripts/setup.sh).

    .venv/bin/python scripts/build_native.py           # build if the stamp is stale
    .venv/bin/python scripts/build_native.py --clean   # remove every compiled file

Builds ``txn_library.native.MODULES`` as one mypyc group: an extension module beside
each source, the group's shared library and the C sources under ``build/native/``,
then writes the stamp (``txn_library.native``: the interpreter and the digest of every
compiled module and of every project module they import). Does nothing when the stamp
already matches. A failed build removes what it left, so the engine runs pure Python
(the processes say so: ``txn_library.native.describe``), and exits non-zero.

Builds are kept in a cache outside the tree (``$ORDO_NATIVE_CACHE``, default
``~/.cache/ordo/native``; ``ORDO_NATIVE_CACHE=`` turns it off), one directory per
build key: the stamp record (interpreter, module list, every stamped source's digest)
with the Python and mypy versions. A fresh clone of sources already built on this
machine takes the files from there (~1 s instead of ~35 s of CPU), as pip takes a
wheel from its cache; the stamp it writes is the one a build would write, and
``native.choose`` checks the files as after a build. A cache entry is written whole
(a temporary directory renamed into place), so a reader never sees half of one.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from txn_library import native  # noqa: E402  (the tree's own, not an installed copy)

PACKAGES = ("cluster", "executor", "scheduler", "sequencer", "tpcc", "txn_library")


def project_imports(module: str) -> set[str]:
    """The project modules that ``module``'s source imports (directly), as module names."""
    tree = ast.parse(native.source_path(ROOT, module).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] in PACKAGES and native.source_path(ROOT, name).exists():
                found.add(name)
    return found


def stamped_sources() -> list[str]:
    """The compiled modules, the project modules they import, and this module's own
    list: what a compiled module's code may depend on (mypyc inlines Final constants)."""
    modules = set(native.MODULES)
    for m in native.MODULES:
        modules |= project_imports(m)
    modules.add("txn_library.native")
    return sorted(str(native.source_path(ROOT, m).relative_to(ROOT)) for m in modules)


def compiled_files() -> list[Path]:
    return [native.extension_path(ROOT, m) for m in native.MODULES]


def cache_root() -> Path | None:
    """Where builds are kept across clones (None: no cache)."""
    env = os.environ.get("ORDO_NATIVE_CACHE")
    if env is not None:
        return Path(env) if env else None
    return Path.home() / ".cache" / "ordo" / "native"


def build_key(record: dict) -> str:
    """A build's identity: what the stamp records plus the compiler and the exact
    interpreter (the stamp's interpreter tag names only the ABI)."""
    import mypy.version

    ident = {"stamp": record, "python": sys.version, "mypy": mypy.version.__version__}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def _cached_files(entry: Path) -> list[tuple[Path, Path]]:
    """(in the cache entry, in the tree) for every file a build installs."""
    pairs = [(native.group_lib_path(entry), native.group_lib_path(native.BUILD_DIR))]
    for m in native.MODULES:
        tree = native.extension_path(ROOT, m)
        pairs.append((entry / (m + tree.name[tree.name.index(".") :]), tree))
    return pairs


def take_from_cache(record: dict) -> bool:
    """Install the build ``record`` names from the cache, if it is there whole."""
    root = cache_root()
    if root is None:
        return False
    entry = root / build_key(record)
    pairs = _cached_files(entry)
    if not all(src.is_file() for src, _ in pairs):
        return False
    native.BUILD_DIR.mkdir(parents=True, exist_ok=True)
    for src, dest in pairs:
        _install(src, dest)
    return True


def put_in_cache(record: dict) -> None:
    """Keep the tree's freshly built files under the build's key (best effort: a
    cache that cannot be written only costs the next clone a build)."""
    root = cache_root()
    if root is None:
        return
    entry = root / build_key(record)
    if entry.exists():
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".part-", dir=root))
        for dest, src in _cached_files(tmp):
            shutil.copy2(src, dest)
        os.replace(tmp, entry)
    except OSError as e:
        print(f"build_native: not cached ({e})", file=sys.stderr)


def clean() -> None:
    for path in compiled_files():
        path.unlink(missing_ok=True)
    shutil.rmtree(native.BUILD_DIR, ignore_errors=True)


def build() -> None:
    """Compile into a temporary directory, then move the results into place."""
    sources = [str(native.source_path(ROOT, m).relative_to(ROOT)) for m in native.MODULES]
    with tempfile.TemporaryDirectory(prefix="ordo-mypyc-") as tmp:
        t = Path(tmp)
        (t / "setup.py").write_text(
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='ordo_native', ext_modules=mypycify({sources!r}, "
            f"group_name={native.GROUP!r}, opt_level='3', target_dir={str(t / 'c')!r}))\n"
        )
        lib = t / "lib"
        cmd = [
            sys.executable,
            str(t / "setup.py"),
            "build_ext",
            "--build-lib",
            str(lib),
            "--build-temp",
            str(t / "tmp"),
        ]
        subprocess.run(cmd, cwd=ROOT, check=True)
        native.BUILD_DIR.mkdir(parents=True, exist_ok=True)
        group = native.group_lib_path(lib)
        _install(group, native.group_lib_path(native.BUILD_DIR))
        for m in native.MODULES:
            _install(native.extension_path(lib, m), native.extension_path(ROOT, m))


def _install(built: Path, dest: Path) -> None:
    """Put a built library at ``dest`` as a new file (a copy beside it, renamed over it):
    a process that has the old one loaded keeps its mapping, where writing over the file
    in place would crash it."""
    part = dest.with_name(f".{dest.name}.part")
    shutil.copy2(built, part)
    os.replace(part, dest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clean", action="store_true", help="remove every compiled file")
    ap.add_argument("--force", action="store_true", help="build even if the stamp matches")
    args = ap.parse_args()
    if args.clean:
        clean()
        return 0
    ok, why = native.choose(ROOT, native.BUILD_DIR, native.MODULES, {})
    if ok and not args.force:
        return 0
    record = native.stamp_record(ROOT, native.MODULES, stamped_sources())
    clean()
    if not args.force and take_from_cache(record):
        native.STAMP.write_text(json.dumps(record, indent=1) + "\n")
        ok, why = native.choose(ROOT, native.BUILD_DIR, native.MODULES, {})
        if ok:
            print(f"build_native: from the cache ({cache_root()}): {why}")
            return 0
        clean()  # a cache entry that does not pass: build instead
    print(f"build_native: compiling {len(native.MODULES)} modules with mypyc ({why})")
    try:
        build()
        native.STAMP.write_text(json.dumps(record, indent=1) + "\n")
        put_in_cache(record)
    except (subprocess.CalledProcessError, OSError) as e:
        clean()
        print(f"build_native: failed ({e}); the engine runs pure Python", file=sys.stderr)
        return 1
    ok, why = native.choose(ROOT, native.BUILD_DIR, native.MODULES, {})
    print(f"build_native: {why}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
