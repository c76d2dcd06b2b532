"""Run the seeded whole-cluster simulator over many seeds, or replay one seed exactly.

Each seed is one simulated run of the real sequencer and partition roles with crashes,
lost messages and torn logs (executor/deterministic/simulator.py), checked against
the serial oracle. The same seed always replays the same run.

    .venv/bin/python scripts/simulate.py --workload bank --seeds 500
    .venv/bin/python scripts/simulate.py --workload tpcc --seeds 5
    .venv/bin/python scripts/simulate.py --seed 323               # replay one, with its story
    .venv/bin/python scripts/simulate.py --seed 323 --trace       # ... and every event
    .venv/bin/python scripts/simulate.py --plant swap --seeds 10  # a planted bug is caught
    .venv/bin/python scripts/simulate.py --readers 2 --seeds 200  # readers, their answers checked

Many seeds: one line per failing seed (the seed and its first failure), then a
summary with seeds per minute; exit status 1 if any seed failed. ``--json PATH``
also writes the summary and every failing seed there. Seeds run in ``--workers``
processes (default: one per core); every seed's run is the same in any process.
Planted bugs (``--plant``): swap, drop-read, lose-synced, no-retry-rebuild,
client-new-ids-on-resend, and with ``--sequencers 3`` publish-before-commit,
results-to-old-leader (with ``--strict-liveness``: its calls are never answered),
no-exactly-once-rebuild, partition-accepts-old-term and fenced-leader-serves-reads;
reader-ahead and reader-skip (with ``--readers``); they live in the simulator, never
in engine code. ``--strict-liveness`` also fails seeds in which a call was never
answered.

``--sequencers 3`` runs the replicated ordering layer with its harder faults too
(``SimOptions.ha_faults``: paused members, one-way cuts, wiped followers, the store
losing a server or slow, clock jumps; ``--no-ha-faults``: leader kills and cut-offs
only). ``--long`` runs seeds until 10,000,000 simulated transactions are done
(``--txns N``: until N), printing progress; exit status 1 on any violation:

    .venv/bin/python scripts/simulate.py --workload bank --sequencers 3 --long

``--readers N`` adds N readers (executor/reader/sim_reader.py, handed to the
simulator): they follow the publication and the log, are killed and restarted, and
answer a share of the clients' read-only calls as queries (``--reader-query-share``);
every answer is checked against the serial oracle at the epoch it names, and every
reader's partition hashes at every epoch it applied against the oracle's and the
replicas'. The summary says how many answers and hashes were checked.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.deterministic.sim_options import SimResult  # noqa: E402
from executor.deterministic.simulator import PLANTS, READER_PLANTS, run_seed  # noqa: E402
from executor.deterministic.workloads import WORKLOADS  # noqa: E402
from executor.reader.sim_reader import ReaderNode  # noqa: E402

LONG_TXNS = 10_000_000
PROGRESS_EVERY_S = 30.0
CHUNK_SEEDS = 4  # seeds a worker takes at a time
BLOCK_SEEDS = 512  # seeds handed to the pool at a time
STORY_WORDS = (
    "fault",
    "crash",
    "fail-stop",
    "start",
    "live ",
    "restore",
    "gap",
    "elect",
    "heal",
    "pause",
    "resume",
    "session",
    "store",
    "wiped",
    "follows",
    "stepped",
    "PLANT",
    "timeout",
    "FAIL",
)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "strict_liveness": args.strict_liveness,
        "query_share": args.query_share,
        "dataflow_recovery": args.dataflow_recovery,
        "reader_node": ReaderNode,
    }
    for name in (
        "replicas",
        "partitions",
        "clients",
        "calls",
        "sequencers",
        "readers",
        "reader_query_share",
    ):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.plant:
        options["plant"] = args.plant
    if args.no_faults:
        options["faults"] = False
    if (args.sequencers or 1) > 1 and not args.no_ha_faults:
        options["ha_faults"] = True
    if args.checkpoint_store:
        options["checkpoint_store"] = args.checkpoint_store
    return options


def replay(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    r = run_seed(args.seed, args.workload, keep_trace=True, **_options(args))
    elapsed = time.perf_counter() - t0
    print(r.summary())
    print(f"trace digest {r.trace_digest} ({len(r.trace)} events traced, {elapsed:.2f} s)")
    print("faults planned:")
    for f in r.faults or ["none"]:
        print(f"  {f}")
    print("counters: " + ", ".join(f"{k}={v}" for k, v in sorted(r.counters.items())))
    if r.counters.get("readers"):
        print(_readers_line(r.counters))
    print("story (sim time in us):")
    for line in r.trace:
        if args.trace or any(w in line for w in STORY_WORDS):
            print(f"  {line}")
    for line in r.log_lines:
        print(f"  engine log: {line}")
    for f in r.failures:
        print(f"FAILURE: {f}")
    for s in r.stalls:
        print(f"never answered: {s}")
    return 0 if r.ok else 1


def _readers_line(c: dict[str, int]) -> str:
    return (
        f"readers: {c['reader_answers']} answers checked against the oracle at their epoch "
        f"({c['reader_at_epoch_queries']} queries named one; {c['reader_refusals']} refusals), "
        f"{c['reader_hashes_checked']} applied epochs' hashes checked "
        f"({c['reader_partition_hashes_checked']} partition hashes against replicas'), "
        f"{c['reader_crashes']} reader crashes"
    )


def _run_one(job: tuple[int, str, dict[str, Any]]) -> SimResult:
    seed, workload, options = job
    return run_seed(seed, workload, **options)


def _results(args: argparse.Namespace, options: dict[str, Any]) -> Iterator[SimResult]:
    """Every seed's result, in seed order, from ``args.workers`` processes: seeds from
    ``--first-seed``, ``--seeds`` of them, or without end with ``--txns`` (the caller
    stops), a block at a time (a pool takes its whole input at once)."""
    first = args.first_seed
    if args.workers <= 1:
        for seed in _seed_range(args, first, None):
            yield run_seed(seed, args.workload, **options)
        return
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        while True:
            block = _seed_range(args, first, BLOCK_SEEDS)
            if not block:
                return
            jobs = [(seed, args.workload, options) for seed in block]
            yield from pool.imap(_run_one, jobs, chunksize=CHUNK_SEEDS)
            first = block[-1] + 1


def _seed_range(args: argparse.Namespace, first: int, most: int | None) -> range:
    """Seeds from ``first``: up to ``most`` (None: all) of those left to run."""
    if args.txns:
        return range(first, first + (most or 1 << 62))
    end = args.first_seed + args.seeds
    return range(first, end if most is None else min(end, first + most))


def sweep(args: argparse.Namespace) -> int:
    options = _options(args)
    failed: list[SimResult] = []
    stalled = 0
    reader_totals: dict[str, int] = {}
    txns = 0
    ran = 0
    t0 = time.perf_counter()
    next_progress = t0 + PROGRESS_EVERY_S
    for r in _results(args, options):
        ran += 1
        txns += r.counters["txns"]
        seed = r.seed
        stalled += bool(r.stalls)
        for k, v in r.counters.items():
            if k.startswith("reader"):
                reader_totals[k] = reader_totals.get(k, 0) + v
        if not r.ok:
            failed.append(r)
            print(f"seed {seed} FAILED: {r.first_failure}", flush=True)
        now = time.perf_counter()
        if args.txns and now >= next_progress:
            next_progress = now + PROGRESS_EVERY_S
            print(
                f"  {ran} seeds, {txns:,} txns, {len(failed)} failed; {now - t0:.0f} s, "
                f"{txns / (now - t0):,.0f} txns/s",
                flush=True,
            )
        if args.txns and txns >= args.txns:
            break
    elapsed = time.perf_counter() - t0
    rate = ran / elapsed * 60 if elapsed else 0.0
    summary = {
        "workload": args.workload,
        "plant": args.plant,
        "first_seed": args.first_seed,
        "seeds": ran,
        "txns": txns,
        "workers": args.workers,
        "failed": len(failed),
        "seeds_with_unanswered_calls": stalled,
        "elapsed_s": round(elapsed, 2),
        "seeds_per_minute": round(rate, 1),
        "failures": {r.seed: r.first_failure for r in failed},
    }
    if reader_totals:
        summary["readers"] = reader_totals
    print(
        f"{args.workload}: {ran} seeds from {args.first_seed}, {len(failed)} failed, "
        f"{stalled} with unanswered calls; {elapsed:.1f} s, {rate:.0f} seeds/minute "
        f"({args.workers} workers, {txns:,} txns)"
    )
    if reader_totals:
        print(_readers_line(reader_totals))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="bank")
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--seed", type=int, help="replay this one seed and tell its story")
    ap.add_argument("--trace", action="store_true", help="with --seed: print every event")
    ap.add_argument(
        "--plant", choices=PLANTS + READER_PLANTS, help="plant a bug the checks must catch"
    )
    ap.add_argument("--replicas", type=int)
    ap.add_argument("--partitions", type=int)
    ap.add_argument("--clients", type=int)
    ap.add_argument("--calls", type=int)
    ap.add_argument(
        "--sequencers",
        type=int,
        help="> 1: a replicated ordering layer (leader kills and cut-offs, failover; and "
        "unless --no-ha-faults, paused members, one-way cuts, wiped followers, store "
        "faults, clock jumps)",
    )
    ap.add_argument(
        "--readers",
        type=int,
        help="readers following the log (killed and restarted too), their answers and "
        "hashes checked against the oracle (default 0: none)",
    )
    ap.add_argument(
        "--reader-query-share",
        type=float,
        help="with --readers: share of read-only calls also sent to a reader as a "
        "snapshot, at_epoch or read-committed query (default 0.5)",
    )
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument(
        "--no-ha-faults",
        action="store_true",
        help="with --sequencers > 1: leader kills and cut-offs only (no pauses, one-way "
        "cuts, wiped followers, store faults or clock jumps)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes running seeds (default: one per core)",
    )
    ap.add_argument(
        "--txns",
        type=int,
        default=0,
        help="run seeds from --first-seed until this many transactions are done",
    )
    ap.add_argument(
        "--long", action="store_true", help=f"--txns {LONG_TXNS:,} (progress every 30 s)"
    )
    ap.add_argument(
        "--checkpoint-store",
        choices=("file", "memory"),
        help="partitions' checkpoints: files, as live (chains of a base and deltas; the "
        "default of every workload), or copies in memory",
    )
    ap.add_argument(
        "--query-share",
        type=float,
        default=0.0,
        help="share of read-only calls sent as snapshot queries straight to partitions, "
        "each answer checked against the oracle at its epoch (docs/QUERIES.md)",
    )
    ap.add_argument(
        "--dataflow-recovery",
        choices=("strong", "weak"),
        help="dataflows' recovery (default: weak for odd seeds, strong for even ones)",
    )
    ap.add_argument("--strict-liveness", action="store_true")
    ap.add_argument("--json", help="write the sweep's summary to this file")
    args = ap.parse_args()
    if args.long:
        args.txns = args.txns or LONG_TXNS
    if args.seed is not None:
        return replay(args)
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
