"""Compile the engine's hot modules with mypyc (called by scripts/setup.sh).

    .venv/bin/python scripts/build_native.py           # build if the stamp is stale
    .venv/bin/python scripts/build_native.py --clean   # remove every compiled file

Builds ``txn_library.native.MODULES`` as one mypyc group: an extension module beside
each source, the group's shared library and the C sources under ``build/native/``,
then writes the stamp (``txn_library.native``: the interpreter and the digest of every
compiled module and of every project module they import). Does nothing when the stamp
already matches. A failed build removes what it left, so the engine runs pure Python
(the processes say so: ``txn_library.native.describe``), and exits non-zero.
"""

from __future__ import annotations

import argparse
import ast
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
    print(f"build_native: compiling {len(native.MODULES)} modules with mypyc ({why})")
    clean()
    try:
        build()
        record = native.stamp_record(ROOT, native.MODULES, stamped_sources())
        native.STAMP.write_text(json.dumps(record, indent=1) + "\n")
    except (subprocess.CalledProcessError, OSError) as e:
        clean()
        print(f"build_native: failed ({e}); the engine runs pure Python", file=sys.stderr)
        return 1
    ok, why = native.choose(ROOT, native.BUILD_DIR, native.MODULES, {})
    print(f"build_native: {why}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
