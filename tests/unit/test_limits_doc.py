"""docs/LIMITS.md is generated from txn_library/limits.py, and stays so.

The page is what scripts/gen_limits_doc.py renders from the module now; every limit
has a docstring and a section, so the page covers every bound.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from txn_library import limits

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_limits_doc", ROOT / "scripts/gen_limits_doc.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_limits_page_is_what_the_generator_renders_from_the_code() -> None:
    page = (ROOT / "docs/LIMITS.md").read_text()
    assert page == _generator().render(), "docs/LIMITS.md is stale: run scripts/gen_limits_doc.py"


def test_every_numeric_limit_is_on_the_page_with_its_value_and_docstring() -> None:
    gen = _generator()
    found = {lim.name: lim for lim in gen.limits_of(gen.SOURCE.read_text())}
    numeric = {
        k for k, v in vars(limits).items() if not k.startswith("_") and type(v) in (int, float)
    }
    assert set(found) == numeric
    for name, lim in found.items():
        assert lim.value == getattr(limits, name)
        assert len(lim.doc) > 20, f"{name}: say what it bounds and what happens past it"


def test_a_limit_without_a_docstring_is_refused() -> None:
    gen = _generator()
    source = "# Section\n\nbound_max = 3\nother_max = 4\n'''Docstring of other_max.'''\n"
    with pytest.raises(ValueError, match="bound_max has no docstring"):
        gen.render(source)


def test_values_are_shown_in_the_unit_their_name_says() -> None:
    show = _generator().show_value
    assert show("request_bytes_max", 1 << 20) == "1 MiB"
    assert show("txn_bytes_max", (1 << 20) + 256) == "1,048,832 B"
    assert show("checkpoint_write_bytes_per_s", 64 << 20) == "64 MiB/s"
    assert show("peer_hold_s_max", 0.1) == "0.1 s"
    assert show("epoch_duration_ms_default", 10) == "10 ms"
    assert show("req_id_max", (1 << 63) - 1) == "2^63 - 1"
    assert show("pending_calls_max", 200_000) == "200,000"
