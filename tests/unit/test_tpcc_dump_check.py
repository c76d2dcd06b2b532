"""`ordo tpcc check --dump`: conditions 1-12 on a database written to files (CSV or
Parquet, as `ordo dump` and `ordo replay state` write them), and clear errors for files
that lack what the check needs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpcc import dump_check
from tpcc import schema as s
from tpcc.cli import tpcc
from tpcc.dump_check import NEEDED, DumpUnreadable, check_dump

# One warehouse, one district, one customer who paid 5.00 and one undelivered order of
# one line: every condition holds but 11, which wants 2100 delivered orders per district.
TINY: dict[str, list[dict[str, int | None]]] = {
    s.WAREHOUSE: [{"w_id": 1, "w_ytd": 500}],
    s.DISTRICT: [{"d_id": 1, "d_w_id": 1, "d_ytd": 500, "d_next_o_id": 2}],
    s.CUSTOMER: [
        {
            "c_id": 1,
            "c_d_id": 1,
            "c_w_id": 1,
            "c_balance": -500,
            "c_ytd_payment": 500,
            "c_delivery_cnt": 0,
        }
    ],
    s.HISTORY: [
        {
            "h_seq": 1,
            "h_c_id": 1,
            "h_c_d_id": 1,
            "h_c_w_id": 1,
            "h_d_id": 1,
            "h_w_id": 1,
            "h_amount": 500,
        }
    ],
    s.NEW_ORDER: [{"no_o_id": 1, "no_d_id": 1, "no_w_id": 1}],
    s.ORDERS: [
        {"o_id": 1, "o_d_id": 1, "o_w_id": 1, "o_c_id": 1, "o_carrier_id": None, "o_ol_cnt": 1}
    ],
    s.ORDER_LINE: [
        {
            "ol_o_id": 1,
            "ol_d_id": 1,
            "ol_w_id": 1,
            "ol_number": 1,
            "ol_delivery_d": None,
            "ol_amount": 0,
        }
    ],
}
ONLY_11 = ["condition 11: district (1, 1): 1 orders - 1 new-orders != 2100 + sum(c_delivery_cnt) 0"]


def _write_csv(root: Path, tables: dict[str, list[dict[str, int | None]]]) -> Path:
    for name, rows in tables.items():
        (root / name).mkdir(parents=True)
        with open(root / name / "part-0000.csv", "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow([*rows[0], "note"])  # a column the check does not read
            out.writerows([*row.values(), "x,y"] for row in rows)
    return root


def test_a_csv_dump_is_checked_for_conditions_1_to_12(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _write_csv(tmp_path / "dump", TINY)
    verdict = check_dump(root)
    assert verdict["violations"] == ONLY_11 and not verdict["ok"]
    # Read two lines at a time: the same verdict over chunks (three payments, two of 0.00).
    free = [{**TINY[s.HISTORY][0], "h_seq": n, "h_amount": 0} for n in (2, 3)]
    more = _write_csv(tmp_path / "more", {**TINY, s.HISTORY: TINY[s.HISTORY] + free})
    monkeypatch.setattr(dump_check, "CSV_CHUNK_LINES", 2)
    chunked = check_dump(more)
    assert chunked["violations"] == ONLY_11 and chunked["rows"][s.HISTORY] == 3
    assert verdict["warehouses"] == [1] and verdict["rows"][s.HISTORY] == 1
    result = CliRunner().invoke(tpcc, ["check", "--dump", str(root)])
    assert result.exit_code == 1
    assert ONLY_11[0] in result.output and "1 violations" in result.output


def test_a_parquet_dataset_partitioned_by_warehouse_is_read_too(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.dataset as pads

    for name, rows in TINY.items():
        table = pa.Table.from_pylist(rows)
        first = s.KEY_COLUMNS[name][0]
        pads.write_dataset(
            table,
            tmp_path / name,
            format="parquet",
            partitioning=[first],
            partitioning_flavor="hive",
        )
    assert check_dump(tmp_path)["violations"] == ONLY_11


def test_files_that_lack_what_the_check_needs_are_errors_not_passes(tmp_path: Path) -> None:
    def broken(change: dict[str, list[dict[str, int | None]]], where: str) -> str:
        root = tmp_path / where
        _write_csv(root, {**TINY, **change})
        with pytest.raises(DumpUnreadable) as e:
            check_dump(root)
        return str(e.value)

    no_ytd = [{k: v for k, v in TINY[s.WAREHOUSE][0].items() if k != "w_ytd"}]
    assert "has no column w_ytd" in broken({s.WAREHOUSE: no_ytd}, "a")
    text = [{**TINY[s.HISTORY][0], "h_amount": "5.00"}]
    assert "column h_amount must be integers" in broken({s.HISTORY: text}, "b")  # type: ignore[dict-item]
    twice = TINY[s.NEW_ORDER] * 2
    assert "key (1, 1, 1) appears twice" in broken({s.NEW_ORDER: twice}, "c")
    keyless = [{**TINY[s.ORDERS][0], "o_id": None}]
    assert "without its key column o_id" in broken({s.ORDERS: keyless}, "d")
    root = _write_csv(tmp_path / "e", {k: v for k, v in TINY.items() if k != s.HISTORY})
    with pytest.raises(DumpUnreadable, match="no CSV or Parquet files for table history"):
        check_dump(root)
    result = CliRunner().invoke(tpcc, ["check", "--dump", str(root), "--json"])
    assert result.exit_code == 1 and "no CSV or Parquet files for table history" in result.output
    with pytest.raises(DumpUnreadable, match="not a directory"):
        check_dump(tmp_path / "missing")
    root = _write_csv(tmp_path / "f", TINY)
    header = ",".join(TINY[s.ORDERS][0]) + "\n"
    (root / s.ORDERS / "part-0000.csv").write_bytes(header.encode() + b"\xff\xfe" + b"x" * 9)
    with pytest.raises(DumpUnreadable, match="part-0000.csv is not readable CSV"):
        check_dump(root)
    (root / s.ORDERS / "part-0000.csv").write_text(header + "x" * 200_000)  # > csv's field limit
    with pytest.raises(DumpUnreadable, match="part-0000.csv is not readable CSV"):
        check_dump(root)


def test_the_check_reads_every_column_the_conditions_use() -> None:
    """NEEDED covers each schema column that tpcc.consistency indexes rows by."""
    import tpcc.consistency as c

    columns = {col for cols in s.COLUMNS.values() for col in cols}
    used = {n.lower() for n in dir(s) if hasattr(c, n) and n.lower() in columns}
    assert {"c_balance", "h_amount", "ol_amount", "w_ytd"} <= used
    assert used <= {col for cols in NEEDED.values() for col in cols}
