#!/usr/bin/env python3
"""What two processes at once cost each other on this machine: a yardstick for
``ordo replay verify --master local[2]`` against local[1] (docs/BENCHMARKS.md, issue 14).

Runs each kernel once alone, then twice at once in two forked processes, and prints
how much slower each was beside the other (1.00: the cores do not interfere); saves it
as calibrate_cores.json in the scratch directory (scripts/bench_outputs.py), or with
``--publish`` in results/replay/:

- ``cpu``: an integer loop (no memory traffic);
- ``dict``: random lookups in a 1M-entry dict of tuple keys, as a partition's or a
  replay's row lookups are (cache and memory traffic).

    .venv/bin/python scripts/calibrate_cores.py --publish
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from pathlib import Path

from bench_outputs import BenchParser, wrote


def cpu_kernel(n: int) -> float:
    t = time.perf_counter()
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return time.perf_counter() - t


def dict_kernel(n: int) -> float:
    rows = {(1, i % 10, i): (i, "x" * 20, i * 2) for i in range(1_000_000)}
    keys = list(rows)
    random.Random(1).shuffle(keys)
    t = time.perf_counter()
    total = 0
    for _ in range(max(1, n // len(keys))):
        for k in keys:
            total += rows[k][0]
    return time.perf_counter() - t


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__.split("\n\n")[0])
    ap.output("--out", "results/replay/calibrate_cores.json", "JSON")
    return ap


def main() -> None:
    a = parser().parse()
    out: dict[str, dict[str, float]] = {}
    for name, kernel, n in (("cpu", cpu_kernel, 30_000_000), ("dict", dict_kernel, 6_000_000)):
        alone = kernel(n)
        with mp.get_context("fork").Pool(2) as pool:
            pair = pool.map(kernel, [n, n])
        out[name] = {
            "alone_s": round(alone, 3),
            "beside_s": round(max(pair), 3),
            "slowdown": round(max(pair) / alone, 3),
        }
        print(
            f"{name}: alone {alone:.2f} s, two at once {pair[0]:.2f} / {pair[1]:.2f} s: "
            f"each {max(pair) / alone:.2f}x as long",
            flush=True,
        )
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), **out}, indent=2))
    wrote(path)


if __name__ == "__main__":
    main()
