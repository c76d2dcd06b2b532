"""Benchmarks leave the published results alone unless asked (issue 47).

Every benchmark script in scripts/ (a script with a ``__main__`` that is not listed in
NOT_BENCHMARKS) builds its command line with scripts/bench_outputs.py's BenchParser, in
a ``parser()`` function: it accepts ``--publish``; without it every output option
defaults to the scratch directory, never under results/; with it, under results/. No
script names a results/ path except as the published path it hands that helper. Nothing
here runs a benchmark: the scripts are imported and their parsers called.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"

# Scripts with a __main__ that are not benchmarks, and why.
NOT_BENCHMARKS = {
    "build_native": "compiles the hot modules (set-up)",
    "build_spark_archive": "builds Spark's class-data archive (set-up)",
    "demo": "a walk-through; writes nothing",
    "gen_limits_doc": "renders docs/LIMITS.md from the code",
    "gen_metrics_doc": "renders docs/OPERATIONS.md's metric table from the code",
    "simulate": "writes only the --json PATH it is given",
}
# Where a script may name a results/ path: as the published path it hands the helper.
HELPER_CALLS = {"output", "output_path"}


def _entry_points() -> list[str]:
    return sorted(p.stem for p in SCRIPTS.glob("*.py") if "__main__" in p.read_text())


BENCHMARKS = [s for s in _entry_points() if s not in NOT_BENCHMARKS]


@pytest.fixture(scope="module")
def outputs() -> Iterator[ModuleType]:
    """scripts/bench_outputs.py, imported as the scripts import it (sys.path put back)."""
    saved = sys.path[:]
    sys.path.insert(0, str(SCRIPTS))
    try:
        yield importlib.import_module("bench_outputs")
    finally:
        sys.path[:] = saved


def _script(name: str) -> ModuleType:
    saved = sys.path[:]  # scripts put the repository and scripts/ on it when imported
    sys.path.insert(0, str(SCRIPTS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


def _required_argv(p: argparse.ArgumentParser) -> list[str]:
    """A value for each required option (bench_compare's --base), so parsing succeeds."""
    argv = []
    for action in p._actions:
        if action.required and action.option_strings:
            argv += [action.option_strings[0], "x"]
    return argv


def test_the_benchmarks_are_found() -> None:
    assert {"leaderboard", "bench_reader", "paper_experiments", "fuzz_cluster"} <= set(BENCHMARKS)
    assert set(NOT_BENCHMARKS) <= set(_entry_points()), "a script in NOT_BENCHMARKS is gone"


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_writes_to_scratch_unless_published(
    name: str, outputs: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(outputs.SCRATCH_ENV, raising=False)
    p = _script(name).parser()
    assert isinstance(p, outputs.BenchParser), f"{name}.parser() is not a BenchParser"
    assert "--publish" in p._option_string_actions
    assert p.published, f"{name} declares no output option"
    argv = _required_argv(p)
    scratch, published = p.parse(argv), p.parse([*argv, "--publish"])
    for dest in p.published:
        assert not outputs.is_published(getattr(scratch, dest)), (name, dest)
        assert Path(getattr(scratch, dest)).is_relative_to(outputs.scratch_root())
        assert outputs.is_published(getattr(published, dest)), (name, dest)
    monkeypatch.setenv(outputs.SCRATCH_ENV, str(tmp_path))
    elsewhere = p.parse(argv)
    for dest in p.published:
        assert Path(getattr(elsewhere, dest)).is_relative_to(tmp_path), (name, dest)


def _docstrings(tree: ast.Module) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
    return {
        id(n.body[0].value)
        for n in nodes
        if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }


def _results_paths(tree: ast.Module) -> list[str]:
    """Where ``tree`` names a results/ path other than in a docstring or as an argument
    of the helper (``ap.output(..., "results/...")``, ``output_path("results/...")``)."""
    allowed = _docstrings(tree)
    for call in ast.walk(tree):
        if isinstance(call, ast.Call):
            func = call.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in HELPER_CALLS:
                allowed |= {id(a) for a in call.args}
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in allowed:
            if n.value.startswith(("results/", "./results/")):
                found.append(f"line {n.lineno}: {n.value!r}")
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            for side in (n.left, n.right):
                if isinstance(side, ast.Constant) and side.value == "results":
                    found.append(f"line {n.lineno}: ... / 'results'")
    return found


@pytest.mark.parametrize("path", sorted(SCRIPTS.glob("*.py")), ids=lambda p: p.name)
def test_no_script_names_a_results_path_but_through_the_helper(path: Path) -> None:
    if path.name == "bench_outputs.py":
        return
    found = _results_paths(ast.parse(path.read_text()))
    assert not found, f"{path.name} names results/ outside scripts/bench_outputs.py: {found}"


def test_the_static_check_sees_a_results_path() -> None:
    tree = ast.parse(
        'OUT = "results/x/y.json"\n'
        'p = ROOT / "results" / "x"\n'
        'ap.output("--out", "results/x/y.json", "JSON")\n'
        'def f():\n    """Writes results/x/y.json."""\n'
    )
    assert _results_paths(tree) == ["line 1: 'results/x/y.json'", "line 2: ... / 'results'"]


def _parser(outputs: ModuleType) -> argparse.ArgumentParser:
    p = outputs.BenchParser(prog="bench_x.py")
    p.output("--out", "results/x/bench_x.json", "JSON")
    p.output("--plot", "results/x/bench_x.png", 'PNG ("" for none)')
    return p


def test_the_scratch_directory_mirrors_results(
    outputs: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(outputs.SCRATCH_ENV, str(tmp_path))
    a = _parser(outputs).parse([])
    assert (a.out, a.plot) == (str(tmp_path / "x/bench_x.json"), str(tmp_path / "x/bench_x.png"))
    a = _parser(outputs).parse(["--publish"])
    assert a.out == str(ROOT / "results/x/bench_x.json")
    a = _parser(outputs).parse(["--out", str(tmp_path / "mine.json"), "--plot", ""])
    assert (a.out, a.plot) == (str(tmp_path / "mine.json"), "")


def test_a_published_path_may_name_another_option(
    outputs: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(outputs.SCRATCH_ENV, str(tmp_path))
    p = outputs.BenchParser(prog="bench_x.py")
    p.add_argument("--workload", default="bank")
    p.output("--out", "results/x/bench_x_{workload}.json", "JSON")
    assert p.parse([]).out == str(tmp_path / "x/bench_x_bank.json")
    a = p.parse(["--workload", "tpcc", "--publish"])
    assert a.out == str(ROOT / "results/x/bench_x_tpcc.json")


@pytest.mark.parametrize(
    "argv",
    [
        ["--out", "results/x/bench_x.json"],  # a published path without --publish
        ["--out", str(ROOT / "results/x/other.json")],
        ["--publish", "--out", "/tmp/bench_x.json"],  # --publish, and a path elsewhere
    ],
)
def test_an_output_against_the_rule_is_refused(
    outputs: ModuleType, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as e:
        _parser(outputs).parse(argv)
    assert e.value.code == 2


def test_a_scratch_directory_under_results_is_refused(
    outputs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(outputs.SCRATCH_ENV, str(ROOT / "results" / "scratch"))
    with pytest.raises(SystemExit):
        _parser(outputs).parse([])
    with pytest.raises(ValueError, match="not a path below results/"):
        outputs.output_path("docs/x.json", publish=True)
