"""TPC-C population (clause 4.3.3.1), its random generators and consistency checks.

W=1 is generated once per module; one test loads W=2 for multi-warehouse checks.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpcc import schema as s
from tpcc.consistency import PER_ROW_SHOWN, check_consistency, check_local, check_whole
from tpcc.loader import generate, generate_items, generate_warehouse, load_c
from tpcc.tpcc_random import (
    ALPHANUMERIC,
    LAST_NAMES,
    NURandC,
    TpccRandom,
    derive_seed,
    last_name,
    valid_c_last_run,
)
from txn_library import catalog, placement

SEED = 20240601
LOAD_TS_MS = 1_700_000_000_000
REPO = Path(__file__).resolve().parents[2]

Tables = dict[str, dict[tuple, tuple]]
LoadRows = list[tuple[str, tuple, tuple]]


def _tables(rows: Iterable[tuple[str, tuple, tuple]]) -> Tables:
    tables: Tables = {name: {} for name in s.TABLES}
    count: Counter[str] = Counter()
    for name, key, row in rows:
        tables[name][key] = row
        count[name] += 1
    for name, n in count.items():
        assert len(tables[name]) == n, f"duplicate keys in {name}"
    return tables


@pytest.fixture(scope="module")
def rows_w1() -> LoadRows:
    return list(generate(1, SEED, LOAD_TS_MS))


@pytest.fixture(scope="module")
def w1(rows_w1: LoadRows) -> Tables:
    return _tables(rows_w1)


# --- cardinalities and shapes ------------------------------------------------------


def test_cardinalities(w1: Tables) -> None:
    districts = s.DISTRICTS_PER_WAREHOUSE
    assert len(w1[s.ITEM]) == s.ITEMS == 100_000
    assert len(w1[s.WAREHOUSE]) == 1
    assert len(w1[s.STOCK]) == s.STOCK_PER_WAREHOUSE == 100_000
    assert len(w1[s.DISTRICT]) == districts == 10
    assert len(w1[s.CUSTOMER]) == districts * s.CUSTOMERS_PER_DISTRICT == 30_000
    assert len(w1[s.CUSTOMER_BY_NAME]) == 30_000
    assert len(w1[s.HISTORY]) == 30_000
    assert len(w1[s.ORDERS]) == districts * s.ORDERS_PER_DISTRICT == 30_000
    assert len(w1[s.ORDER_BY_CUSTOMER]) == 30_000
    assert len(w1[s.NEW_ORDER]) == districts * s.NEW_ORDERS_PER_DISTRICT == 9000


def test_order_lines_match_o_ol_cnt(w1: Tables) -> None:
    lines_per_order = Counter(key[:3] for key in w1[s.ORDER_LINE])
    assert set(lines_per_order) == set(w1[s.ORDERS])
    for key, row in w1[s.ORDERS].items():
        assert 5 <= row[s.O_OL_CNT] <= 15
        assert lines_per_order[key] == row[s.O_OL_CNT]
    assert len(w1[s.ORDER_LINE]) == sum(r[s.O_OL_CNT] for r in w1[s.ORDERS].values())
    assert all(1 <= k[3] <= w1[s.ORDERS][k[:3]][s.O_OL_CNT] for k in w1[s.ORDER_LINE])


def test_rows_fit_their_tables(w1: Tables) -> None:
    for name, rows in w1.items():
        table = catalog.table(name)
        assert table is s.TABLES[name]
        for key, row in itertools.islice(rows.items(), 2000):
            assert len(key) == table.key_len, name
            assert len(row) == len(table.columns), name
            if not table.replicated:
                assert key[0] == 1  # warehouse first: place_by_first_int
                assert placement.partition_of(name, key, 4) == 0
    assert s.col("customer", "c_balance") == s.C_BALANCE
    assert s.COL_STOCK["s_dist_10"] == s.S_DIST_FIRST + 9
    with pytest.raises(KeyError, match="c_nope"):
        s.col("customer", "c_nope")


def test_lock_granularity() -> None:
    expected = {
        s.WAREHOUSE: 1, s.DISTRICT: 2, s.CUSTOMER: 3, s.CUSTOMER_BY_NAME: 3, s.HISTORY: 2,
        s.NEW_ORDER: 2, s.ORDERS: 2, s.ORDER_BY_CUSTOMER: 2, s.ORDER_LINE: 2, s.STOCK: 2,
    }  # fmt: skip
    for name, lock_len in expected.items():
        table = catalog.table(name)
        assert table.lock_prefix == lock_len, name
        assert table.place_prefix == 1 and table.placement is catalog.place_by_first_int
    assert catalog.table(s.ITEM).replicated
    ordered = {name for name, t in s.TABLES.items() if t.ordered}
    assert ordered == {
        s.CUSTOMER_BY_NAME, s.HISTORY, s.NEW_ORDER, s.ORDERS, s.ORDER_BY_CUSTOMER, s.ORDER_LINE,
    }  # fmt: skip


# --- values (clause 4.3.3.1) -------------------------------------------------------


def _share(values: Iterable[bool]) -> float:
    flags = list(values)
    return sum(flags) / len(flags)


def test_item_and_stock_values(w1: Tables) -> None:
    items = w1[s.ITEM].values()
    assert all(100 <= r[s.I_PRICE] <= 10_000 for r in items)
    assert all(1 <= r[s.I_IM_ID] <= 10_000 for r in items)
    assert all(14 <= len(r[s.I_NAME]) <= 24 for r in items)
    assert all(26 <= len(r[s.I_DATA]) <= 50 for r in items)
    assert 0.09 < _share("ORIGINAL" in r[s.I_DATA] for r in items) < 0.11
    stock = w1[s.STOCK].values()
    assert all(10 <= r[s.S_QUANTITY] <= 100 for r in stock)
    assert all(26 <= len(r[s.S_DATA]) <= 50 for r in stock)
    assert 0.09 < _share("ORIGINAL" in r[s.S_DATA] for r in stock) < 0.11
    assert all(len(r[s.S_DIST_FIRST + d]) == 24 for r in stock for d in range(10))
    assert all(r[s.S_YTD] == r[s.S_ORDER_CNT] == r[s.S_REMOTE_CNT] == 0 for r in stock)
    alnum = re.compile(f"[{re.escape(ALPHANUMERIC)}]+")
    assert all(alnum.fullmatch(r[s.S_DIST_05] + r[s.S_DATA]) for r in stock)


def test_warehouse_and_district_values(w1: Tables) -> None:
    (w_row,) = w1[s.WAREHOUSE].values()
    assert 0 <= w_row[s.W_TAX] <= 2000
    assert w_row[s.W_YTD] == 30_000_000
    assert re.fullmatch(r"\d{4}11111", w_row[s.W_ZIP])
    assert len(w_row[s.W_STATE]) == 2 and 6 <= len(w_row[s.W_NAME]) <= 10
    for (w_id, d_id), row in w1[s.DISTRICT].items():
        assert (row[s.D_W_ID], row[s.D_ID]) == (w_id, d_id)
        assert 0 <= row[s.D_TAX] <= 2000
        assert row[s.D_YTD] == 3_000_000
        assert row[s.D_NEXT_O_ID] == 3001


def test_customer_values(w1: Tables) -> None:
    customers = w1[s.CUSTOMER]
    for (w_id, d_id, c_id), r in customers.items():
        assert (r[s.C_W_ID], r[s.C_D_ID], r[s.C_ID]) == (w_id, d_id, c_id)
        assert 0 <= r[s.C_DISCOUNT] <= 5000
        assert r[s.C_CREDIT] in ("GC", "BC")
        assert r[s.C_CREDIT_LIM] == 5_000_000
        assert r[s.C_BALANCE] == -1000 and r[s.C_YTD_PAYMENT] == 1000
        assert r[s.C_PAYMENT_CNT] == 1 and r[s.C_DELIVERY_CNT] == 0
        assert r[s.C_MIDDLE] == "OE" and r[s.C_SINCE] == LOAD_TS_MS
        assert 8 <= len(r[s.C_FIRST]) <= 16 and 300 <= len(r[s.C_DATA]) <= 500
        assert re.fullmatch(r"\d{16}", r[s.C_PHONE])
    assert 0.09 < _share(r[s.C_CREDIT] == "BC" for r in customers.values()) < 0.11


def test_last_names(w1: Tables) -> None:
    assert last_name(0) == "BARBARBAR"
    assert last_name(371) == "PRICALLYOUGHT"  # the example of clause 4.3.2.3
    assert last_name(999) == "EINGEINGEING"
    syllables = "BAR|OUGHT|ABLE|PRI|PRES|ESE|ANTI|CALLY|ATION|EING"
    three = re.compile(f"(?:{syllables}){{3}}")
    known = set(LAST_NAMES)
    nurand_names: Counter[str] = Counter()
    for (_w, _d, c_id), r in w1[s.CUSTOMER].items():
        assert three.fullmatch(r[s.C_LAST])
        if c_id <= 1000:
            assert r[s.C_LAST] == last_name(c_id - 1)
        else:
            assert r[s.C_LAST] in known
            nurand_names[r[s.C_LAST]] += 1
    # NURand is non-uniform: the most frequent names are far above the 1/1000 mean.
    assert nurand_names.most_common(1)[0][1] > 3 * 20_000 / 1000


def test_customer_by_name_index(w1: Tables) -> None:
    expected = {(w, d, r[s.C_LAST], r[s.C_FIRST], c): () for (w, d, c), r in w1[s.CUSTOMER].items()}
    assert w1[s.CUSTOMER_BY_NAME] == expected


def test_history_values(w1: Tables) -> None:
    for (w_id, d_id, seq), r in w1[s.HISTORY].items():
        assert seq == r[s.H_C_ID] and 1 <= seq <= s.HISTORY_SEQ_LOADED_MAX
        assert (r[s.H_W_ID], r[s.H_D_ID], r[s.H_C_W_ID], r[s.H_C_D_ID]) == (
            w_id, d_id, w_id, d_id,
        )  # fmt: skip
        assert r[s.H_AMOUNT] == 1000 and r[s.H_DATE] == LOAD_TS_MS
        assert 12 <= len(r[s.H_DATA]) <= 24


def test_orders_and_new_orders(w1: Tables) -> None:
    new_orders = w1[s.NEW_ORDER]
    assert {k[2] for k in new_orders} == set(range(2101, 3001))
    for key, r in new_orders.items():
        assert r == (key[2], key[1], key[0])
    customers_by_district: dict[tuple, list[int]] = {}
    for key, r in w1[s.ORDERS].items():
        assert (r[s.O_W_ID], r[s.O_D_ID], r[s.O_ID]) == key
        assert (r[s.O_CARRIER_ID] is None) == (key in new_orders)
        if r[s.O_CARRIER_ID] is not None:
            assert 1 <= r[s.O_CARRIER_ID] <= 10
        assert r[s.O_ENTRY_D] == LOAD_TS_MS and r[s.O_ALL_LOCAL] == 1
        customers_by_district.setdefault(key[:2], []).append(r[s.O_C_ID])
    for c_ids in customers_by_district.values():
        assert sorted(c_ids) == list(range(1, 3001))  # a permutation of the customers
    expected_index = {(w, d, r[s.O_C_ID], o): () for (w, d, o), r in w1[s.ORDERS].items()}
    assert w1[s.ORDER_BY_CUSTOMER] == expected_index


def test_order_line_values(w1: Tables) -> None:
    new_orders = w1[s.NEW_ORDER]
    for key, r in w1[s.ORDER_LINE].items():
        assert (r[s.OL_W_ID], r[s.OL_D_ID], r[s.OL_O_ID], r[s.OL_NUMBER]) == key
        assert 1 <= r[s.OL_I_ID] <= s.ITEMS
        assert r[s.OL_SUPPLY_W_ID] == key[0] and r[s.OL_QUANTITY] == 5
        assert len(r[s.OL_DIST_INFO]) == 24
        if key[:3] in new_orders:
            assert r[s.OL_DELIVERY_D] is None
            assert 1 <= r[s.OL_AMOUNT] <= 999_999
        else:
            assert r[s.OL_DELIVERY_D] == LOAD_TS_MS
            assert r[s.OL_AMOUNT] == 0


# --- random generators (clauses 2.1.6, 4.3.2.2) ------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**64),
    a=st.sampled_from([255, 1023, 8191]),
    x=st.integers(min_value=0, max_value=100_000),
    span=st.integers(min_value=0, max_value=100_000),
)
def test_nurand_stays_in_range(seed: int, a: int, x: int, span: int) -> None:
    rng = TpccRandom(seed)
    assert 0 <= rng.c.for_a(a) <= a
    for _ in range(50):
        assert x <= rng.nurand(a, x, x + span) <= x + span
        assert x <= rng.uniform(x, x + span) <= x + span


def test_nurand_rejects_unknown_a() -> None:
    with pytest.raises(ValueError, match="NURand A"):
        TpccRandom(1).nurand(256, 0, 999)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**64))
def test_c_run_satisfies_delta_rule(seed: int) -> None:
    rng = TpccRandom(seed)
    load = NURandC.for_load(rng)
    run = NURandC.for_run(load, rng)
    delta = abs(run.c_last - load.c_last)
    assert 0 <= run.c_last <= 255
    assert 65 <= delta <= 119 and delta not in (96, 112)
    assert 0 <= run.c_id <= 1023 and 0 <= run.ol_i_id <= 8191


def test_c_run_rule_edges() -> None:
    assert valid_c_last_run(0, 65) and valid_c_last_run(200, 81)
    assert not valid_c_last_run(0, 64) and not valid_c_last_run(0, 120)
    assert not valid_c_last_run(0, 96) and not valid_c_last_run(150, 38)
    assert not valid_c_last_run(200, 265)  # outside [0..255]
    # Every load value admits a run value.
    for c_load in range(256):
        assert any(valid_c_last_run(c_load, c) for c in range(256))


def test_strings_have_spec_lengths_and_alphabets() -> None:
    rng = TpccRandom(7)
    a_strings = [rng.a_string(8, 16) for _ in range(20_000)]
    assert {len(v) for v in a_strings} == set(range(8, 17))
    assert 11.8 < sum(map(len, a_strings)) / len(a_strings) < 12.2  # mean (x+y)/2
    assert set("".join(a_strings)) == set(ALPHANUMERIC)
    n_strings = [rng.n_string(1, 5) for _ in range(5000)]
    assert {len(v) for v in n_strings} == set(range(1, 6))
    assert all(v.isdigit() for v in n_strings)
    assert all(re.fullmatch(r"\d{4}11111", rng.zip()) for _ in range(100))
    assert sorted(rng.permutation(50)) == list(range(1, 51))
    big = rng.a_string(300_000, 300_000)  # longer than one pool refill
    assert len(big) == 300_000 and set(big) == set(ALPHANUMERIC)


# --- determinism -------------------------------------------------------------------


def _digest(rows: Iterable[tuple[str, tuple, tuple]]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(repr(row).encode())
    return h.hexdigest()


def test_same_seed_same_rows(rows_w1: LoadRows) -> None:
    again = list(generate_warehouse(1, SEED, LOAD_TS_MS))
    assert again == rows_w1[s.ITEMS :]
    items = list(itertools.islice(generate_items(SEED), 5000))
    assert items == rows_w1[:5000]
    assert load_c(SEED) == load_c(SEED)


def test_different_seed_different_rows(rows_w1: LoadRows) -> None:
    other = list(itertools.islice(generate(1, SEED + 1, LOAD_TS_MS), s.ITEMS + 2000))
    assert other[:1000] != rows_w1[:1000]
    assert other[s.ITEMS : s.ITEMS + 2000] != rows_w1[s.ITEMS : s.ITEMS + 2000]
    assert derive_seed(SEED, "warehouse", 1) != derive_seed(SEED, "warehouse", 2)


def test_rows_do_not_depend_on_process_hash_seed() -> None:
    code = (
        "import hashlib, itertools\n"
        "from tpcc.loader import generate_warehouse\n"
        f"rows = itertools.islice(generate_warehouse(3, {SEED}, {LOAD_TS_MS}), 20000)\n"
        "h = hashlib.sha256()\n"
        "for row in rows: h.update(repr(row).encode())\n"
        "print(h.hexdigest())\n"
    )
    here = _digest(itertools.islice(generate_warehouse(3, SEED, LOAD_TS_MS), 20_000))
    for hash_seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=REPO, check=True,
            capture_output=True, text=True,
        )  # fmt: skip
        assert out.stdout.strip() == here


# --- consistency conditions 1-7 (clause 3.3.2) -------------------------------------


def test_loaded_database_is_consistent(w1: Tables) -> None:
    assert check_consistency(w1, [1]) == []


def test_two_warehouses(capsys: pytest.CaptureFixture[str]) -> None:
    rows = list(generate(2, SEED, LOAD_TS_MS, progress=True))
    assert "tpcc load" not in capsys.readouterr().err  # a bar only on a terminal, not a log
    tables = _tables(rows)
    assert check_consistency(tables, [1, 2]) == []
    per_warehouse = Counter((name, key[0]) for name, key, _ in rows if name != s.ITEM)
    for w_id in (1, 2):
        assert per_warehouse[s.STOCK, w_id] == 100_000
        assert per_warehouse[s.CUSTOMER, w_id] == 30_000
        assert per_warehouse[s.NEW_ORDER, w_id] == 9000
    assert len(tables[s.ITEM]) == s.ITEMS
    assert [name for name, _, _ in rows[: s.ITEMS]] == [s.ITEM] * s.ITEMS
    # Warehouse 2's rows are the same whether loaded alone or with warehouse 1.
    alone = itertools.islice(generate_warehouse(2, SEED, LOAD_TS_MS), 5000)
    first_w2 = next(i for i, (name, key, _) in enumerate(rows) if key[0] == 2 and name != s.ITEM)
    assert list(alone) == rows[first_w2 : first_w2 + 5000]


def _with(tables: Tables, name: str, rows: dict[tuple, tuple]) -> Tables:
    return {**tables, name: rows}


def _replace(row: tuple, index: int, value: object) -> tuple:
    return row[:index] + (value,) + row[index + 1 :]


def test_doctored_d_ytd_violates_condition_1(w1: Tables) -> None:
    district = dict(w1[s.DISTRICT])
    district[1, 3] = _replace(district[1, 3], s.D_YTD, district[1, 3][s.D_YTD] + 1)
    violations = check_consistency(_with(w1, s.DISTRICT, district), [1])
    assert len(violations) == 1 and violations[0].startswith("condition 1: warehouse 1")


def test_doctored_d_next_o_id_violates_condition_2(w1: Tables) -> None:
    district = dict(w1[s.DISTRICT])
    district[1, 4] = _replace(district[1, 4], s.D_NEXT_O_ID, 3002)
    violations = check_consistency(_with(w1, s.DISTRICT, district), [1])
    assert [v.split(":")[0] for v in violations] == ["condition 2", "condition 2"]
    assert all("(1, 4)" in v for v in violations)


def test_missing_new_order_violates_condition_3(w1: Tables) -> None:
    new_order = dict(w1[s.NEW_ORDER])
    del new_order[1, 7, 2500]
    violations = check_consistency(_with(w1, s.NEW_ORDER, new_order), [1])
    assert violations == [
        "condition 3: district (1, 7): max(no_o_id) - min(no_o_id) + 1 = 900 != 899 new-order rows",
        "condition 5: order (1, 7, 2500): o_carrier_id None, no new-order row",
    ]


def test_missing_order_line_violates_condition_4(w1: Tables) -> None:
    order_line = dict(w1[s.ORDER_LINE])
    del order_line[1, 9, 42, 1]
    violations = check_consistency(_with(w1, s.ORDER_LINE, order_line), [1])
    assert len(violations) == 2 and violations[0].startswith("condition 4: district (1, 9)")
    assert violations[1] == "condition 6: order (1, 9, 42): o_ol_cnt 5 != 4 order-line rows"


def test_a_carrier_on_an_undelivered_order_violates_conditions_5_and_7(w1: Tables) -> None:
    orders = dict(w1[s.ORDERS])
    orders[1, 2, 2999] = _replace(orders[1, 2, 2999], s.O_CARRIER_ID, 4)  # still a new order
    violations = check_consistency(_with(w1, s.ORDERS, orders), [1])
    assert violations[0] == "condition 5: order (1, 2, 2999): o_carrier_id 4, a new-order row"
    lines = orders[1, 2, 2999][s.O_OL_CNT]  # each of its lines is still undelivered
    shown = min(lines, PER_ROW_SHOWN)
    assert violations[1 : 1 + shown] == [
        f"condition 7: order line (1, 2, 2999, {n}): ol_delivery_d None, o_carrier_id 4"
        for n in range(1, shown + 1)
    ]
    assert violations[1 + shown :] == (
        [f"condition 7: {lines - shown} more"] if lines > shown else []
    )


def test_a_delivery_date_on_an_undelivered_line_violates_condition_7(w1: Tables) -> None:
    order_line = dict(w1[s.ORDER_LINE])
    order_line[1, 5, 2700, 1] = _replace(order_line[1, 5, 2700, 1], s.OL_DELIVERY_D, LOAD_TS_MS)
    violations = check_consistency(_with(w1, s.ORDER_LINE, order_line), [1])
    assert violations == [
        f"condition 7: order line (1, 5, 2700, 1): ol_delivery_d {LOAD_TS_MS}, o_carrier_id None"
    ]


def test_per_order_violations_are_listed_up_to_a_bound_then_counted(w1: Tables) -> None:
    """A result must stay small: a systematic error lists PER_ROW_SHOWN orders and how
    many more (here: every delivered order of district 3 loses its carrier)."""
    orders = {
        k: _replace(r, s.O_CARRIER_ID, None) if k[1] == 3 else r for k, r in w1[s.ORDERS].items()
    }
    violations = check_consistency(_with(w1, s.ORDERS, orders), [1])
    five = [v for v in violations if v.startswith("condition 5")]
    assert len(five) == PER_ROW_SHOWN + 1 and five[-1] == "condition 5: 2090 more"


def test_missing_warehouse_is_reported(w1: Tables) -> None:
    assert check_consistency(w1, [1, 5]) == ["condition 1: warehouse 5 is missing"]


# --- conditions 8-12, on a whole database (clause 3.3.2) ---------------------------


def test_loaded_database_meets_conditions_1_to_12(w1: Tables) -> None:
    assert check_whole(w1, [1]) == []


def test_payments_and_deliveries_keep_conditions_8_to_12(w1: Tables) -> None:
    """A payment made at warehouse 2 for a customer of warehouse 1 (its history row is
    warehouse 2's: condition 10 needs it), and a delivery of order (1, 4, 2101) with a
    line of 7.00, as the procedures make them."""
    tables = {name: dict(rows) for name, rows in w1.items()}
    customer = tables[s.CUSTOMER]
    c = customer[1, 3, 7]
    customer[1, 3, 7] = _replace(
        _replace(c, s.C_BALANCE, c[s.C_BALANCE] - 250), s.C_YTD_PAYMENT, c[s.C_YTD_PAYMENT] + 250
    )
    h_row = (7, 3, 1, 1, 2, LOAD_TS_MS, 250, "remote")  # h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id
    tables[s.HISTORY][2, 1, 9_000] = h_row
    order = tables[s.ORDERS][1, 4, 2101]
    tables[s.ORDERS][1, 4, 2101] = _replace(order, s.O_CARRIER_ID, 3)
    del tables[s.NEW_ORDER][1, 4, 2101]
    lines = [k for k in tables[s.ORDER_LINE] if k[:3] == (1, 4, 2101)]
    for n, k in enumerate(lines):
        ol = _replace(tables[s.ORDER_LINE][k], s.OL_DELIVERY_D, LOAD_TS_MS)
        tables[s.ORDER_LINE][k] = _replace(ol, s.OL_AMOUNT, 700 if n == 0 else 0)
    owner = (1, 4, order[s.O_C_ID])
    c = customer[owner]
    c = _replace(c, s.C_BALANCE, c[s.C_BALANCE] + 700)
    customer[owner] = _replace(c, s.C_DELIVERY_CNT, c[s.C_DELIVERY_CNT] + 1)
    assert check_whole(tables, [1]) == []
    # Warehouse 2 is not in these tables: condition 1 says so, once (8 leaves it to 1).
    assert [v.split(":")[0] for v in check_whole(tables, [1, 2])] == ["condition 1"]


def test_each_of_conditions_8_to_12_finds_its_violation(w1: Tables) -> None:
    history = dict(w1[s.HISTORY])
    key = next(iter(history))
    history[key] = _replace(history[key], s.H_AMOUNT, history[key][s.H_AMOUNT] + 5)
    h_c = (history[key][s.H_C_W_ID], history[key][s.H_C_D_ID], history[key][s.H_C_ID])
    found = check_whole(_with(w1, s.HISTORY, history), [1])
    assert [v.split(":")[0] for v in found] == ["condition 8", "condition 9", "condition 10"]
    assert f"customer {h_c}" in found[2]

    def customer(column: int, delta: int) -> list[str]:
        rows = dict(w1[s.CUSTOMER])
        rows[1, 6, 11] = _replace(rows[1, 6, 11], column, rows[1, 6, 11][column] + delta)
        return check_whole(_with(w1, s.CUSTOMER, rows), [1])

    assert customer(s.C_DELIVERY_CNT, 1) == [
        "condition 11: district (1, 6): 3000 orders - 900 new-orders != 2100 + "
        "sum(c_delivery_cnt) 1"
    ]
    assert customer(s.C_YTD_PAYMENT, 1) == [
        "condition 12: customer (1, 6, 11): c_balance -1000 + c_ytd_payment 1001 != delivered 0"
    ]
    assert [v.split(":")[0] for v in customer(s.C_BALANCE, -1)] == ["condition 10", "condition 12"]


def test_a_partition_checks_every_condition_of_its_own_rows_but_10(w1: Tables) -> None:
    """check_local (tpcc.check_warehouse): 8, 9, 11 and 12 read rows that live with the
    warehouse; 10 would miss payments made for its customers at other warehouses."""
    history = dict(w1[s.HISTORY])
    key = next(iter(history))
    history[key] = _replace(history[key], s.H_AMOUNT, history[key][s.H_AMOUNT] + 5)
    found = check_local(_with(w1, s.HISTORY, history), [1])
    assert [v.split(":")[0] for v in found] == ["condition 8", "condition 9"]
    customers = dict(w1[s.CUSTOMER])
    c = customers[1, 2, 3]
    customers[1, 2, 3] = _replace(c, s.C_BALANCE, c[s.C_BALANCE] - 1)
    found = check_local(_with(w1, s.CUSTOMER, customers), [1])
    assert [v.split(":")[0] for v in found] == ["condition 12"]
    assert check_local(w1, [1]) == []
