"""results/ holds what the docs cite, and the docs cite only what results/ holds.

A citation is any ``results/...`` path in README.md or docs/*.md (links and images
included, ``../results/...`` too). Brace lists expand (``run_{1,2}.json`` cites
``run_1.json`` and ``run_2.json``), a glob (``results/paper/*.json``) cites what it
matches and must match something, and a path ending in ``/`` cites its whole folder.
A PNG is cited like any other file: each section embeds its plot by path, so a plot
nobody shows is found like a stale JSON.

The files checked are those git tracks under results/ (a benchmark run locally and not
committed is not the docs' business); outside a git checkout, every file on disk.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"(?<![\w/.-])(?:\.\./)?(results/[\w./{},*-]*)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def expand(path: str) -> list[str]:
    """``a_{1,2}.json`` -> ``a_1.json``, ``a_2.json`` (several brace lists multiply)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def citations(text: str) -> set[str]:
    found = set()
    for m in CITATION.finditer(text):
        path = m.group(1).rstrip(".,:;")
        if path != "results/":
            found.update(expand(path))
    return found


def results_files() -> set[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "results"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        return {p for p in out.split("\0") if p}
    except (OSError, subprocess.CalledProcessError):
        return {str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*") if p.is_file()}


def cited_files(path: str, files: set[str]) -> set[str]:
    """The files of results/ that one citation covers."""
    if path.endswith("/"):
        return {f for f in files if f.startswith(path)}
    if "*" in path:
        return {str(p.relative_to(ROOT)) for p in ROOT.glob(path)} & files
    return {path} & files


def test_every_results_path_the_docs_cite_exists() -> None:
    missing = []
    for doc in doc_files():
        for path in sorted(citations(doc.read_text())):
            exists = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
            if not exists:
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, "cited but not in results/:\n" + "\n".join(missing)


def test_every_file_in_results_is_cited_by_some_doc() -> None:
    files = results_files()
    assert files, "results/ is empty"
    cited: set[str] = set()
    for doc in doc_files():
        for path in citations(doc.read_text()):
            cited |= cited_files(path, files)
    uncited = sorted(files - cited)
    assert not uncited, "in results/ but cited by no doc:\n" + "\n".join(uncited)


def test_citations_are_read_as_paths() -> None:
    text = (
        "see results/tpcc/run_{1,2}.json, the plot ![a](../results/paper/a.png) and "
        "results/paper/ (all of it); `--out results/x.json`. Not myresults/y.json."
    )
    assert citations(text) == {
        "results/tpcc/run_1.json",
        "results/tpcc/run_2.json",
        "results/paper/a.png",
        "results/paper/",
        "results/x.json",
    }
