"""scripts/build_native.py's cache of builds: a build is kept under a key naming
everything it was made from, taken back whole into another tree, and never taken for
other sources."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from txn_library import native

ROOT = Path(__file__).resolve().parents[2]


def _build_native() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_native", ROOT / "scripts" / "build_native.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path, content: bytes) -> None:
    """A tree whose every compiled file holds ``content``."""
    for m in native.MODULES:
        path = native.extension_path(root, m)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    lib = native.group_lib_path(root / "build" / "native")
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(content)


def test_a_cached_build_is_taken_whole_and_only_for_its_own_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bn = _build_native()
    cache = tmp_path / "cache"
    monkeypatch.setenv("ORDO_NATIVE_CACHE", str(cache))
    record = {"format": 1, "interpreter": native.interpreter_tag(), "sources": {"a.py": "1"}}

    built = tmp_path / "built"
    _tree(built, b"compiled")
    monkeypatch.setattr(bn, "ROOT", built)
    monkeypatch.setattr(native, "BUILD_DIR", built / "build" / "native")
    bn.put_in_cache(record)
    assert [p.name for p in cache.iterdir()] == [bn.build_key(record)]  # no partial entry

    fresh = tmp_path / "fresh"  # a source tree: its packages' directories exist
    for m in native.MODULES:
        native.source_path(fresh, m).parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(bn, "ROOT", fresh)
    monkeypatch.setattr(native, "BUILD_DIR", fresh / "build" / "native")
    other = {**record, "sources": {"a.py": "2"}}
    assert bn.build_key(other) != bn.build_key(record)
    assert not bn.take_from_cache(other)
    assert not any(fresh.rglob("*.so"))
    assert bn.take_from_cache(record)
    for m in native.MODULES:
        assert native.extension_path(fresh, m).read_bytes() == b"compiled"
    assert native.group_lib_path(fresh / "build" / "native").read_bytes() == b"compiled"

    monkeypatch.setenv("ORDO_NATIVE_CACHE", "")  # turned off
    assert bn.cache_root() is None and not bn.take_from_cache(record)
