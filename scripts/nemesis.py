"""Nemesis: N minutes of seeded random faults against the HA cluster on namespace hosts.

Builds hosts h1, h2, h3 and client from Linux network namespaces (cluster.netns; needs
root), runs the replicated cluster of cluster.netns_cluster on them under a ledgered
bank-transfer load, and applies the schedule ``cluster.nemesis.make_schedule(seed,
minutes)``: kill -9 and restarts of sequencers (leader or follower) and partitions,
SIGSTOP/SIGCONT, link cuts and heals, ZooKeeper server kills and restarts, never more
at once than the cluster survives (the rules are in cluster/nemesis.py). Then it heals
everything, lets the cluster settle and checks: every acknowledged transfer in the log
exactly once and answered as the serial replay says, money conserved, balances equal
to the ledger, replica hashes equal, the serial replay of the log equal to the
replicas, the sequencers' logs agreeing. Each event is printed as it is applied, then
a summary; the schedule and results go to a JSON file in the scratch directory
(scripts/bench_outputs.py), or with ``--publish`` to results/nemesis/. Exit status 1 if
any check fails; the cluster's data and logs are then kept (their path is printed).

    sudo .venv/bin/python scripts/nemesis.py --minutes 30 --seed 1
    sudo .venv/bin/python scripts/nemesis.py --minutes 2 --seed 3 --keep
    .venv/bin/python scripts/nemesis.py --minutes 30 --seed 1 --schedule-only
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_outputs import BenchParser, wrote  # noqa: E402

from cluster.nemesis import events_of, make_schedule, run_nemesis, summary_lines  # noqa: E402
from cluster.netns import Hosts, check_available  # noqa: E402
from cluster.netns_cluster import HOSTS  # noqa: E402


class Interrupted(Exception):
    """SIGTERM or SIGINT: unwind so every process and namespace is removed."""


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(f"signal {signum}")


def parser() -> BenchParser:
    ap = BenchParser(prog="scripts/nemesis.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0, help="minutes of faults")
    ap.add_argument("--seed", type=int, default=1, help="the schedule's seed")
    ap.add_argument("--work-dir", default=None, help="cluster data (default: a temporary dir)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's data when it passes")
    ap.add_argument(
        "--schedule-only", action="store_true", help="print the schedule and exit (no root)"
    )
    ap.output("--out", "results/nemesis/nemesis.json", "the schedule and results as JSON")
    return ap


def main() -> int:
    a = parser().parse()
    duration_s = a.minutes * 60
    if a.schedule_only:
        events = events_of(make_schedule(a.seed, duration_s))
        for e in events:
            print(f"{e.at_s:8.2f}s {e.action:<10} {e.target}")
        counts = Counter(e.action for e in events)
        print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return 0
    reason = check_available()
    if reason is not None:
        print(f"nemesis needs network namespaces: {reason}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="ordo-nemesis-"))
    work.mkdir(parents=True, exist_ok=True)
    with Hosts(HOSTS) as net:
        result = run_nemesis(net, work, duration_s, a.seed)
    for line in summary_lines(result):
        print(line, flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    wrote(out)
    if result.get("ok") and not a.keep and a.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"cluster data and logs kept in {work}", flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
