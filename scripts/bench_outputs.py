"""Where a benchmark writes: a scratch directory, or results/ when asked (``--publish``).

results/ holds the figures the docs cite, the newest run only (STYLE.md, "Docs and
results"). A run with a subset of a benchmark's modes, a quick check or a tuning loop
must not replace them, so every benchmark script builds its command line with
BenchParser: each output option (``--out``, ``--plot``, ``--out-dir``) defaults to a
path in the scratch directory, and to its path under results/ only with ``--publish``.

A published path may name other options in braces (``bench_replay_{workload}.json``),
filled from the parsed arguments. The scratch directory stands in for results/, with
the same layout below it:
``$ORDO_SCRATCH`` if set, else ``<tmp>/ordo-bench`` (tempfile.gettempdir(), so
``/tmp/ordo-bench/streaming/leaderboard.json`` for results/streaming/leaderboard.json).
A run ends by printing where its files are (``wrote``).

Invariants: without ``--publish`` no output is under results/ (an explicit path there
is refused); with it every output is (an explicit path elsewhere is refused). ``""``
(for options that take it: no such file) is left alone either way.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
SCRATCH_ENV = "ORDO_SCRATCH"
PUBLISH_HELP = "write into results/ (the files the docs cite) instead of the scratch directory"


def is_published(path: str | Path) -> bool:
    """Whether ``path`` (relative: to the working directory) is results/ or below it."""
    return Path(path).resolve().is_relative_to(RESULTS)


def scratch_root() -> Path:
    """$ORDO_SCRATCH, or <tmp>/ordo-bench: what stands in for results/ without --publish."""
    root = Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / "ordo-bench")
    if is_published(root):
        raise ValueError(f"${SCRATCH_ENV}={root} is under results/: choose another directory")
    return root.resolve()


def output_path(published: str, publish: bool) -> Path:
    """``published`` (a path under results/, relative to the repository) below the
    repository with ``publish``, else the same path below the scratch directory."""
    path = ROOT / published
    if not is_published(path) or path.resolve() == RESULTS:
        raise ValueError(f"{published!r} is not a path below results/")
    if publish:
        return path
    return scratch_root() / path.resolve().relative_to(RESULTS)


class BenchParser(argparse.ArgumentParser):
    """An ArgumentParser with ``--publish`` and output options that default by it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.published: dict[str, str] = {}  # an output option's dest -> its results/ path
        self.flags: dict[str, str] = {}  # dest -> the option's flag, for errors
        self.add_argument("--publish", action="store_true", help=PUBLISH_HELP)

    def output(self, flag: str, published: str, help: str) -> None:
        """An output option: by default ``published`` (below results/; ``{option}``: that
        option's value) with --publish, else the same path below the scratch directory."""
        output_path(published, publish=True)  # refuses a path outside results/
        dest = flag.lstrip("-").replace("-", "_")
        self.published[dest] = published
        self.flags[dest] = flag
        try:
            scratch = str(output_path(published, publish=False))
        except ValueError:  # $ORDO_SCRATCH under results/: parse() says so
            scratch = f"${SCRATCH_ENV}"
        self.add_argument(
            flag,
            default=None,
            metavar="PATH",
            help=f"{help} (default: {scratch}; with --publish: {published})",
        )

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """parse_args, then each output option that was not given gets its default, and
        one given against the invariants is refused (exit status 2, as argparse's)."""
        args = self.parse_args(argv)
        for dest, published in self.published.items():
            given, flag = getattr(args, dest), self.flags[dest]
            if given is None:
                try:
                    path = output_path(published.format(**vars(args)), args.publish)
                except ValueError as e:
                    self.error(str(e))
                setattr(args, dest, str(path))
            elif given == "":
                continue
            elif is_published(given) and not args.publish:
                self.error(f"{flag} {given} is under results/, what the docs cite: add --publish")
            elif args.publish and not is_published(given):
                self.error(f"--publish writes under results/, and {flag} {given} is not")
        return args


def wrote(*paths: str | Path) -> None:
    """Print where a run's files are (of ``paths``, those that exist; ``""``: none),
    and say so when they are scratch."""
    written = [str(p) for p in paths if str(p) and Path(p).exists()]
    if not written:
        return
    print("wrote " + ", ".join(written), flush=True)
    if not any(is_published(p) for p in written):
        print("(scratch files: --publish writes them into results/ for the docs)", flush=True)
