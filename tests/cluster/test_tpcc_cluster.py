"""Integration: TPC-C on a live cluster (sequencer + 2 replicas x 2 partitions, W=2).

Partitions load their warehouses at startup (genesis). ``ordo tpcc run --attach``
drives a short standard-mix run (45/43/4/4/4) against it; ``ordo tpcc check`` then
checks, through ``tpcc.check_warehouse`` at each replica, that consistency conditions
1-9, 11, 12 hold on every warehouse of every replica, and that the replicas' state
hashes are equal per partition once the cluster is quiescent (the check ``run`` makes
at its end unless ``--no-check``: the same function, made here once). ``ordo dump``
exports replica 1 as of a fresh checkpoint: the tables the run does not grow hold
exactly the rows of a W=2 population (clause 4.3.3.1), and ``ordo tpcc check --dump``
finds conditions 1-12 hold on it. (``ordo tpcc check --whole``, the same dump and check
in one command, runs in tests/cluster/test_fresh_checkpoint.py, mid-load: each dump of
this population costs seconds.)

The population (~1.3 M rows) is what costs here (genesis, the first checkpoint, the
checks), not the run: two seconds of 24 terminals already give thousands of
transactions of every type.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from click.testing import CliRunner

from cluster.cli import main
from tpcc import schema
from tpcc.cli import tpcc
from tpcc.driver import PROCEDURE_MODULES
from txn_library.client import Client

WAREHOUSES = 2
GENESIS_ARGS = {"warehouses": WAREHOUSES, "seed": 7, "load_ts_ms": 1_700_000_000_000}
# Rows per table of a W-warehouse population that New-Order, Payment, Delivery and the
# read-only transactions never insert into or delete from (clause 4.3.3.1).
FIXED_ROWS = {
    schema.WAREHOUSE: WAREHOUSES,
    schema.DISTRICT: WAREHOUSES * schema.DISTRICTS_PER_WAREHOUSE,
    schema.CUSTOMER: WAREHOUSES * schema.DISTRICTS_PER_WAREHOUSE * schema.CUSTOMERS_PER_DISTRICT,
    schema.STOCK: WAREHOUSES * schema.STOCK_PER_WAREHOUSE,
    schema.ITEM: schema.ITEMS,  # replicated on every partition, dumped once
}


def test_standard_mix_on_two_replicas_keeps_tpcc_consistent(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(
        replicas=2,
        partitions=2,
        genesis="tpcc.loader:genesis",
        genesis_args=GENESIS_ARGS,
        procedure_modules=PROCEDURE_MODULES,
    )
    data_dir = lc.config.data_dir
    with Client(lc.config.client_addr) as c:
        assert c.call("tpcc.check_warehouse", 1, replica=1).value == ()  # loaded, consistent
    out = tmp_path / "run.json"
    args = ["run", "--attach", data_dir, "--mix", "standard", "--duration", "2"]
    args += ["--warmup", "0", "--terminals", "24", "--no-check", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(tpcc, args)
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())
    summary = run["summary"]
    assert run["cluster"] == {
        "warehouses": 2,
        "partitions": 2,
        "replicas": 2,
        "fsync": True,
        "epoch_ms": 10,
        "query_versions": True,
        "engine": "attached",
    }
    per_type = summary["per_type"]
    assert set(per_type) == {"new_order", "payment", "order_status", "delivery", "stock_level"}
    assert per_type["new_order"]["ok"] > 100 and per_type["payment"]["ok"] > 100
    assert all(k["ok"] > 0 for k in per_type.values()), per_type
    assert all(k["errors"] == 0 for k in per_type.values()), summary["errors"]
    assert summary["multi_partition_share"] > 0.01  # remote lines and remote customers
    assert summary["dependent_restarts"] is not None and summary["dependent_restarts"] >= 0
    assert summary["determinism_violations"] == 0
    assert "check" not in run  # --no-check: the check below is the run's

    checked = CliRunner().invoke(tpcc, ["check", "--data-dir", data_dir, "--json"])
    assert checked.exit_code == 0, checked.output
    check = _verdict(checked.stdout)
    assert check["consistent"] and check["violations"] == {}
    assert check["state_hashes_equal"] and len(check["state_hashes"]) == 2
    assert all(len(set(h.values())) == 1 for h in check["state_hashes"].values())
    assert check["determinism_violations"] == 0 and check["ok"]

    dump_dir = tmp_path / "dump"
    args = ["dump", "--replica", "1", "--out", str(dump_dir), "--format", "parquet"]
    dumped = CliRunner().invoke(main, [*args, "--data-dir", data_dir])
    assert dumped.exit_code == 0, dumped.output
    assert "2/2 partitions durable" in dumped.stderr
    assert _parquet_rows(dump_dir, FIXED_ROWS) == FIXED_ROWS
    listed = {ln.split()[0]: int(ln.split()[1]) for ln in dumped.stdout.splitlines()[1:]}
    assert {t: listed[t] for t in FIXED_ROWS} == FIXED_ROWS
    # Conditions 1-12 on the whole database (8-12 need every partition's rows): the run's
    # payments (some for customers of the other warehouse) and deliveries.
    whole = CliRunner().invoke(tpcc, ["check", "--dump", str(dump_dir), "--json"])
    assert whole.exit_code == 0, whole.output
    verdict = json.loads(whole.output)
    assert verdict["ok"] and verdict["warehouses"] == [1, 2] and verdict["violations"] == []
    assert verdict["rows"][schema.HISTORY] > FIXED_ROWS[schema.CUSTOMER]  # payments ran
    both = CliRunner().invoke(tpcc, ["check", "--whole", "--dump", str(dump_dir)])
    assert both.exit_code == 2 and "give one" in both.output


def _verdict(stdout: str) -> dict:
    """The JSON `ordo tpcc check --json` prints after its one-line summary."""
    return json.loads(stdout[stdout.index("\n{") + 1 :])


def _parquet_rows(dump_dir: Path, tables: dict[str, int]) -> dict[str, int]:
    """Rows per table over every partition's Parquet file (from each file's footer)."""
    counts = {}
    for table in tables:
        files = sorted((dump_dir / table).rglob("*.parquet"))
        assert files, f"no Parquet file for {table}"
        counts[table] = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return counts
