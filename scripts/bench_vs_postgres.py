#!/usr/bin/env python3
"""TPC-C New Order: Ordo beside PostgreSQL 15 on this machine, in one run.

Runs the PostgreSQL kit in ../shared/anchors/pg_tpcc (PL/pgSQL New Order, serializable,
synchronous commit, --clients connections) and Ordo's ``ordo tpcc run`` (New Order only,
embedded cluster, durable command log, --terminals in flight) back to back, --rounds
times, alternating (PG, Ordo, PG, Ordo, ...), so a change in the machine's load hits
both. Both sides: W=--warehouses, 1% remote order lines, no keying or think times, the
same warm-up and measured seconds. Prints each round and the ratio Ordo / PostgreSQL,
and writes JSON, CSV and a PNG to --out-dir (default: the scratch directory,
scripts/bench_outputs.py; ``--publish``: results/tpcc_vs_postgres/).

    .venv/bin/python scripts/bench_vs_postgres.py --rounds 2 --seconds 30 --warmup 5 --publish

PostgreSQL's cluster, its venv (psycopg, installed by the kit's start_pg.sh) and its
loaded database live under --pg-root (PGTPCC_ROOT; default /tmp/ordo-pgtpcc: the kit's
own directory is not ours to write). The loaded database ``tpcc`` is kept between runs
and cloned to ``tpcc_run`` before every PostgreSQL round, as the kit's run_all.sh does.
The server is stopped at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_outputs import BenchParser, wrote

ROOT = Path(__file__).resolve().parent.parent
KIT = (ROOT.parent / "shared" / "anchors" / "pg_tpcc").resolve()
VENV_BIN = Path(sys.executable).parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def fail(msg: str) -> None:
    print(f"bench_vs_postgres: {msg}", file=sys.stderr)
    raise SystemExit(2)


def pg_env(a: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PGTPCC_ROOT=str(a.pg_root), PGVENV=str(a.pg_venv), PGPORT=str(a.pg_port))
    return env


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a command, return its stdout; its failure stops the benchmark loudly."""
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def pg_sql(a: argparse.Namespace, sql: str) -> str:
    """One statement as the kit's superuser, autocommit (CREATE DATABASE needs it)."""
    code = (
        "import psycopg,sys\n"
        f"c = psycopg.connect(host='127.0.0.1', port={a.pg_port}, user='postgres', "
        "dbname='postgres', autocommit=True)\n"
        "r = c.execute(sys.argv[1])\n"
        "print(r.fetchone()[0] if r.description else '')\n"
    )
    return run([str(a.pg_venv / "bin" / "python"), "-c", code, sql]).strip()


def pg_start_and_load(a: argparse.Namespace) -> None:
    env = pg_env(a)
    print(f"starting PostgreSQL (kit {KIT}, cluster {a.pg_root})", flush=True)
    run(["bash", str(KIT / "start_pg.sh")], env=env, cwd=KIT)
    if pg_sql(a, "SELECT count(*) FROM pg_database WHERE datname = 'tpcc'") != "1":
        print(f"loading W={a.warehouses} into PostgreSQL", flush=True)
        t0 = time.monotonic()
        run(
            [str(a.pg_venv / "bin" / "python"), "load.py", "-w", str(a.warehouses)],
            env=env,
            cwd=KIT,
        )
        print(f"loaded in {time.monotonic() - t0:.1f} s", flush=True)


def pg_stop(a: argparse.Namespace) -> None:
    subprocess.run(["bash", str(KIT / "stop_pg.sh")], env=pg_env(a), cwd=KIT)


def pg_round(a: argparse.Namespace) -> dict[str, Any]:
    pg_sql(a, "DROP DATABASE IF EXISTS tpcc_run WITH (FORCE)")
    pg_sql(a, "CREATE DATABASE tpcc_run TEMPLATE tpcc STRATEGY FILE_COPY")
    out = run(
        [
            str(a.pg_venv / "bin" / "python"),
            "driver.py",
            "--dbname",
            "tpcc_run",
            "--clients",
            str(a.clients),
            "--seconds",
            str(a.seconds),
            "--warmup",
            str(a.warmup),
            "--isolation",
            "serializable",
            "--sync-commit",
            "on",
            "--remote-pct",
            "1",
            "--label",
            "bench_vs_postgres",
        ],
        env=pg_env(a),
        cwd=KIT,
    )
    res = json.loads(out.strip().splitlines()[-1])
    return {
        "system": "postgresql",
        "new_order_per_s": res["committed_tps"],
        "p50_ms": res["latency_ms"]["p50"],
        "p99_ms": res["latency_ms"]["p99"],
        "retries": res["retries"],
        "consistency_ok": bool(res.get("consistency", {}).get("ok", True)),
        "raw": res,
    }


def ordo_round(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ordo-vs-pg-") as tmp:
        out_json = Path(tmp) / "run.json"
        run(
            [
                str(VENV_BIN / "ordo"),
                "tpcc",
                "run",
                "--warehouses",
                str(a.warehouses),
                "--replicas",
                str(a.replicas),
                "--partitions",
                str(a.partitions),
                "--mix",
                "new-order",
                "--remote-pct",
                "1",
                "--terminals",
                str(a.terminals),
                "--duration",
                str(a.seconds),
                "--warmup",
                str(a.warmup),
                "--out",
                str(out_json),
                "--quiet",
            ],
            cwd=ROOT,
        )
        res = json.loads(out_json.read_text())
    s = res["summary"]
    no = s["per_type"]["new_order"]
    cpu = s.get("cpu_us_per_sequenced_txn", {})
    return {
        "system": "ordo",
        # committed New Orders per second (rollbacks excluded, as on the PostgreSQL side)
        "new_order_per_s": s["new_order_per_s"],
        "p50_ms": no["latency_ms"]["p50"],
        "p99_ms": no["latency_ms"]["p99"],
        "cpu_us_per_new_order": round(sum(cpu.values()), 1) if cpu else None,
        "cpu_us_by_process": cpu,
        "consistency_ok": bool(res.get("check", {}).get("ok", True)),
        "raw": {"summary": s, "options": res.get("options")},
    }


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--warehouses", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4, help="PostgreSQL connections")
    ap.add_argument("--terminals", type=int, default=200, help="Ordo calls in flight")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--pg-root", type=Path, default=Path("/tmp/ordo-pgtpcc"))
    ap.add_argument("--pg-venv", type=Path, default=None, help="default: PG_ROOT/venv")
    ap.add_argument("--pg-port", type=int, default=55432)
    ap.output("--out-dir", "results/tpcc_vs_postgres", "JSON, CSV and PNG")
    return ap


def main() -> int:
    a = parser().parse()
    a.out_dir = Path(a.out_dir)
    a.pg_venv = a.pg_venv or a.pg_root / "venv"
    if not (KIT / "driver.py").is_file():
        fail(f"the PostgreSQL kit is not at {KIT} (../shared/anchors/pg_tpcc)")
    if not (PG_BIN / "pg_ctl").exists() and subprocess.run(["which", "pg_ctl"]).returncode:
        fail("PostgreSQL 15 binaries not found (/usr/lib/postgresql/15/bin or pg_ctl on PATH)")
    a.pg_root.mkdir(parents=True, exist_ok=True)
    a.out_dir.mkdir(parents=True, exist_ok=True)

    rounds: list[dict[str, Any]] = []
    try:
        pg_start_and_load(a)
        for i in range(a.rounds):
            for side in (pg_round, ordo_round):
                t0 = time.strftime("%H:%M:%S")
                r = side(a) | {"round": i, "started": t0, "load": list(os.getloadavg())}
                rounds.append(r)
                print(
                    f"[{t0}] round {i} {r['system']:10s} {r['new_order_per_s']:8,.0f} New Order/s"
                    f"  p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms",
                    flush=True,
                )
    finally:
        pg_stop(a)

    def med(system: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds if r["system"] == system)

    table = []
    for i in range(a.rounds):
        pg = next(r for r in rounds if r["round"] == i and r["system"] == "postgresql")
        od = next(r for r in rounds if r["round"] == i and r["system"] == "ordo")
        table.append(
            {
                "round": i,
                "postgresql": pg["new_order_per_s"],
                "ordo": od["new_order_per_s"],
                "ratio": round(od["new_order_per_s"] / pg["new_order_per_s"], 2),
            }
        )
    summary = {
        "postgresql_median": med("postgresql", "new_order_per_s"),
        "ordo_median": med("ordo", "new_order_per_s"),
        "ordo_cpu_us_per_new_order_median": statistics.median(
            r["cpu_us_per_new_order"]
            for r in rounds
            if r["system"] == "ordo" and r["cpu_us_per_new_order"]
        ),
    }
    summary["ratio_of_medians"] = round(summary["ordo_median"] / summary["postgresql_median"], 2)
    print("\nround  PostgreSQL  Ordo  Ordo/PG")
    for row in table:
        pg, od = row["postgresql"], row["ordo"]
        print(f"{row['round']:5d}  {pg:10,.0f}  {od:6,.0f}  {row['ratio']:.2f}")
    print(
        f"median {summary['postgresql_median']:9,.0f}  {summary['ordo_median']:6,.0f}  "
        f"{summary['ratio_of_medians']:.2f}; Ordo CPU per New Order "
        f"{summary['ordo_cpu_us_per_new_order_median']:.0f} us (driver's accounting)"
    )
    out = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "cpus": os.cpu_count(),
        "rounds": rounds,
        "table": table,
        "summary": summary,
    }
    (a.out_dir / "bench_vs_postgres.json").write_text(json.dumps(out, indent=2) + "\n")
    with open(a.out_dir / "bench_vs_postgres.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", "system", "new_order_per_s", "p50_ms", "p99_ms", "started"])
        for r in rounds:
            w.writerow(
                [
                    r["round"],
                    r["system"],
                    r["new_order_per_s"],
                    r["p50_ms"],
                    r["p99_ms"],
                    r["started"],
                ]
            )
    plot(rounds, a.out_dir / "bench_vs_postgres.png")
    wrote(*(a.out_dir / f"bench_vs_postgres.{x}" for x in ("json", "csv", "png")))
    return 0


def plot(rounds: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{r['system']}\nround {r['round']}" for r in rounds]
    colors = ["#336699" if r["system"] == "postgresql" else "#cc6633" for r in rounds]
    axes[0].bar(labels, [r["new_order_per_s"] for r in rounds], color=colors)
    axes[0].set_title("TPC-C New Order/s (committed)")
    axes[1].bar(labels, [r["p99_ms"] for r in rounds], color=colors)
    axes[1].set_title("p99 latency (ms)")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
