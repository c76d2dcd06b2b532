"""The Python daemon Spark forks its task workers from, on a local master.

Spark starts its Python daemon as ``python -m <spark.python.daemon.module>`` with the
source zips of PySpark and Py4J (``pyspark/python/lib/*.zip``, inside the installed
pyspark package) first on PYTHONPATH. A zip holds no compiled bytecode, so the daemon,
and every worker it forks, compiled PySpark's modules from source: of a session's
first Python job on local[2] (1.5-1.9 s), the daemon took ~1 s to start and each
worker ~0.5 s more to import ``pyspark.worker`` (docs/BENCHMARKS.md, eleventh
session). This module drops those zips from ``sys.path`` and then runs PySpark's own
daemon, which imports the installed copy of the same distribution, whose bytecode
is cached. ``make_session`` names it on local masters only (``DAEMON_MODULE``),
where the workers run this interpreter.

Invariant: the zips are dropped only when the pyspark and py4j this interpreter then
imports are the installed ones that hold them (the same release); otherwise the
path is left as Spark set it and PySpark's daemon runs exactly as it would.
"""

from __future__ import annotations

import sys
from importlib.machinery import PathFinder
from pathlib import Path

ZIP_DIR = Path("pyspark", "python", "lib")  # where a pip-installed pyspark keeps them


def source_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are zips in an installed pyspark's python/lib."""
    return [p for p in path if p.endswith(".zip") and Path(p).parent.parts[-3:] == ZIP_DIR.parts]


def origin(package: str, path: list[str]) -> Path | None:
    """The directory top-level ``package`` would be imported from on ``path``."""
    spec = PathFinder.find_spec(package, path)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def prefer_installed(path: list[str]) -> list[str]:
    """``path`` without the source zips, if the pyspark found without them is the one
    holding the zips and py4j is found too; else ``path`` unchanged."""
    zips = source_zips(path)
    if not zips:
        return path
    kept = [p for p in path if p not in zips]
    pyspark, py4j = origin("pyspark", kept), origin("py4j", kept)
    holder = Path(zips[0]).parents[2]  # .../site-packages/pyspark
    if pyspark is None or py4j is None or pyspark.resolve() != holder.resolve():
        return path
    return kept


def main() -> None:
    sys.path[:] = prefer_installed(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
