"""TPC-C consistency conditions 1-12 (clauses 3.3.2.1-3.3.2.12) over in-memory tables.

``tables`` maps a table name to a mapping key -> row in the layout of
``tpcc.schema``. Every condition is checked per warehouse / district, for the given
warehouses only, so a partition can check just the warehouses it holds. The result
is a list of human-readable violations, sorted by condition and then by key: the
same data always gives the same list. An empty list means consistent.

1. W_YTD = sum(D_YTD) over the warehouse's districts.
2. D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID) in each district (the NEW-ORDER part
   only for districts that have new orders).
3. max(NO_O_ID) - min(NO_O_ID) + 1 = number of NEW-ORDER rows in each district
   (again only where there are any).
4. sum(O_OL_CNT) = number of ORDER-LINE rows in each district.
5. O_CARRIER_ID is null iff the order has a NEW-ORDER row.
6. O_OL_CNT = number of the order's ORDER-LINE rows.
7. OL_DELIVERY_D is null iff its order's O_CARRIER_ID is null (a line without its
   order is a violation).

Conditions 5-7 are per order (or line): at most ``PER_ROW_SHOWN`` violations of each
are listed, then one line with how many more (a result must stay small).

Conditions 8-12 read HISTORY and CUSTOMER too. All but 10 read only rows that live
with their warehouse (a payment's history row is placed with the paying warehouse, an
order and its lines with the customer's), so a partition checks 1-9, 11 and 12 for the
warehouses it holds (``check_local``: ``tpcc.check_warehouse``, ``ordo tpcc check``).
Condition 10 needs every partition's HISTORY (the customer may live at another
warehouse than the one paid at), so it is checked on a whole database (``check_whole``:
the simulator's serial oracle, and dumps: ``ordo tpcc check --dump``, tpcc.dump_check).

8. W_YTD = sum(H_AMOUNT) of the warehouse's payments (H_W_ID).
9. D_YTD = sum(H_AMOUNT) of the district's payments (H_W_ID, H_D_ID).
10. C_BALANCE = sum(OL_AMOUNT of the customer's delivered lines) - sum(H_AMOUNT of the
    customer's payments (H_C_W_ID, H_C_D_ID, H_C_ID)).
11. count(ORDER) - count(NEW-ORDER) = 2100 + sum(C_DELIVERY_CNT) in each district.
    Clause 3.3.2.11 states it as "= 2100", which holds on a freshly loaded database,
    where every C_DELIVERY_CNT is 0; each delivered order removes one NEW-ORDER row and
    adds one to its customer's C_DELIVERY_CNT, so this form holds at every state.
12. C_BALANCE + C_YTD_PAYMENT = sum(OL_AMOUNT of the customer's delivered lines).

Conditions 10 and 12 are per customer and listed as 5-7 are.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping

from tpcc.schema import (
    C_BALANCE,
    C_DELIVERY_CNT,
    C_YTD_PAYMENT,
    CUSTOMER,
    D_NEXT_O_ID,
    D_YTD,
    DISTRICT,
    H_AMOUNT,
    H_C_D_ID,
    H_C_ID,
    H_C_W_ID,
    H_D_ID,
    H_W_ID,
    HISTORY,
    NEW_ORDER,
    NEW_ORDERS_PER_DISTRICT,
    O_C_ID,
    O_CARRIER_ID,
    O_OL_CNT,
    OL_AMOUNT,
    OL_DELIVERY_D,
    ORDER_LINE,
    ORDERS,
    ORDERS_PER_DISTRICT,
    W_YTD,
    WAREHOUSE,
)

Tables = Mapping[str, Mapping[tuple, tuple]]
DistrictId = tuple[int, int]  # (w_id, d_id)
PER_ROW_SHOWN = 10  # violations listed per per-order condition (5-7); then a count


def check_consistency(tables: Tables, warehouses: Iterable[int]) -> list[str]:
    """Violations of consistency conditions 1-7 for ``warehouses`` (empty: consistent)."""
    wanted = frozenset(warehouses)
    districts = sorted(k for k in tables.get(DISTRICT, {}) if k[0] in wanted)
    return [
        *condition_1(tables, wanted),
        *condition_2(tables, wanted, districts),
        *condition_3(tables, wanted, districts),
        *condition_4(tables, wanted, districts),
        *condition_5(tables, wanted),
        *condition_6(tables, wanted),
        *condition_7(tables, wanted),
    ]


def check_local(tables: Tables, warehouses: Iterable[int]) -> list[str]:
    """Violations of conditions 1-9, 11 and 12 for ``warehouses``: every condition whose
    rows live with the warehouse (a partition's tables suffice)."""
    return _check(tables, frozenset(warehouses), whole=False)


def check_whole(tables: Tables, warehouses: Iterable[int]) -> list[str]:
    """Violations of conditions 1-12 for ``warehouses`` in a whole database (every
    partition's rows: condition 10 reads payments made at other warehouses)."""
    return _check(tables, frozenset(warehouses), whole=True)


def _check(tables: Tables, wanted: frozenset[int], whole: bool) -> list[str]:
    districts = sorted(k for k in tables.get(DISTRICT, {}) if k[0] in wanted)
    delivered = _delivered_amounts(tables, wanted)
    return [
        *check_consistency(tables, wanted),
        *condition_8(tables, wanted),
        *condition_9(tables, districts),
        *(condition_10(tables, wanted, delivered) if whole else ()),
        *condition_11(tables, wanted, districts),
        *condition_12(tables, wanted, delivered),
    ]


def condition_1(tables: Tables, wanted: frozenset[int]) -> list[str]:
    """Clause 3.3.2.1: W_YTD = sum(D_YTD)."""
    warehouse = tables.get(WAREHOUSE, {})
    d_ytd_sum: Counter[int] = Counter()
    for (w_id, _d_id), row in tables.get(DISTRICT, {}).items():
        if w_id in wanted:
            d_ytd_sum[w_id] += row[D_YTD]
    violations = []
    for w_id in sorted(wanted):
        w_row = warehouse.get((w_id,))
        if w_row is None:
            violations.append(f"condition 1: warehouse {w_id} is missing")
        elif w_row[W_YTD] != d_ytd_sum[w_id]:
            violations.append(
                f"condition 1: warehouse {w_id}: w_ytd {w_row[W_YTD]} != sum(d_ytd) "
                f"{d_ytd_sum[w_id]}"
            )
    return violations


def condition_2(tables: Tables, wanted: frozenset[int], districts: list[DistrictId]) -> list[str]:
    """Clause 3.3.2.2: D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)."""
    max_o_id = _max_third(tables.get(ORDERS, {}), wanted)
    max_no_o_id = _max_third(tables.get(NEW_ORDER, {}), wanted)
    district = tables.get(DISTRICT, {})
    violations = []
    for w_d in districts:
        last_o_id = district[w_d][D_NEXT_O_ID] - 1
        if max_o_id.get(w_d, 0) != last_o_id:
            violations.append(
                f"condition 2: district {w_d}: d_next_o_id - 1 = {last_o_id} != "
                f"max(o_id) {max_o_id.get(w_d)}"
            )
        if w_d in max_no_o_id and max_no_o_id[w_d] != last_o_id:
            violations.append(
                f"condition 2: district {w_d}: d_next_o_id - 1 = {last_o_id} != "
                f"max(no_o_id) {max_no_o_id[w_d]}"
            )
    return violations


def condition_3(tables: Tables, wanted: frozenset[int], districts: list[DistrictId]) -> list[str]:
    """Clause 3.3.2.3: max(NO_O_ID) - min(NO_O_ID) + 1 = count(NEW-ORDER rows)."""
    lowest: dict[DistrictId, int] = {}
    highest: dict[DistrictId, int] = {}
    count: Counter[DistrictId] = Counter()
    for w_id, d_id, o_id in tables.get(NEW_ORDER, {}):
        if w_id not in wanted:
            continue
        w_d = (w_id, d_id)
        count[w_d] += 1
        if o_id < lowest.get(w_d, o_id + 1):
            lowest[w_d] = o_id
        if o_id > highest.get(w_d, o_id - 1):
            highest[w_d] = o_id
    violations = []
    for w_d in districts:
        if count[w_d] and highest[w_d] - lowest[w_d] + 1 != count[w_d]:
            violations.append(
                f"condition 3: district {w_d}: max(no_o_id) - min(no_o_id) + 1 = "
                f"{highest[w_d] - lowest[w_d] + 1} != {count[w_d]} new-order rows"
            )
    return violations


def condition_4(tables: Tables, wanted: frozenset[int], districts: list[DistrictId]) -> list[str]:
    """Clause 3.3.2.4: sum(O_OL_CNT) = count(ORDER-LINE rows)."""
    ol_cnt_sum: Counter[DistrictId] = Counter()
    for key, row in tables.get(ORDERS, {}).items():
        if key[0] in wanted:
            ol_cnt_sum[key[0], key[1]] += row[O_OL_CNT]
    lines: Counter[DistrictId] = Counter(
        (key[0], key[1]) for key in tables.get(ORDER_LINE, {}) if key[0] in wanted
    )
    return [
        f"condition 4: district {w_d}: sum(o_ol_cnt) {ol_cnt_sum[w_d]} != "
        f"{lines[w_d]} order-line rows"
        for w_d in districts
        if ol_cnt_sum[w_d] != lines[w_d]
    ]


def condition_5(tables: Tables, wanted: frozenset[int]) -> list[str]:
    """Clause 3.3.2.5: O_CARRIER_ID is null iff there is a NEW-ORDER row for the order."""
    new_order = tables.get(NEW_ORDER, {})
    return _shown(
        5,
        (
            (key, f"order {key}: o_carrier_id {row[O_CARRIER_ID]!r}, a new-order row")
            if key in new_order
            else (key, f"order {key}: o_carrier_id None, no new-order row")
            for key, row in tables.get(ORDERS, {}).items()
            if key[0] in wanted and (row[O_CARRIER_ID] is None) != (key in new_order)
        ),
    )


def condition_6(tables: Tables, wanted: frozenset[int]) -> list[str]:
    """Clause 3.3.2.6: O_OL_CNT = the number of the order's ORDER-LINE rows."""
    lines: Counter[tuple] = Counter(
        key[:3] for key in tables.get(ORDER_LINE, {}) if key[0] in wanted
    )
    return _shown(
        6,
        (
            (key, f"order {key}: o_ol_cnt {row[O_OL_CNT]} != {lines[key]} order-line rows")
            for key, row in tables.get(ORDERS, {}).items()
            if key[0] in wanted and row[O_OL_CNT] != lines[key]
        ),
    )


def condition_7(tables: Tables, wanted: frozenset[int]) -> list[str]:
    """Clause 3.3.2.7: OL_DELIVERY_D is null iff its order's O_CARRIER_ID is null."""
    orders = tables.get(ORDERS, {})

    def wrong(key: tuple, row: tuple) -> str | None:
        order = orders.get(key[:3])
        if order is None:
            return f"order line {key}: its order is missing"
        if (row[OL_DELIVERY_D] is None) != (order[O_CARRIER_ID] is None):
            return (
                f"order line {key}: ol_delivery_d {row[OL_DELIVERY_D]!r}, "
                f"o_carrier_id {order[O_CARRIER_ID]!r}"
            )
        return None

    found = (
        (key, wrong(key, row))
        for key, row in tables.get(ORDER_LINE, {}).items()
        if key[0] in wanted
    )
    return _shown(7, ((key, v) for key, v in found if v is not None))


def condition_8(tables: Tables, wanted: frozenset[int]) -> list[str]:
    """Clause 3.3.2.8: W_YTD = sum(H_AMOUNT) of the payments made at the warehouse."""
    paid: Counter[int] = Counter()
    for row in tables.get(HISTORY, {}).values():
        if row[H_W_ID] in wanted:
            paid[row[H_W_ID]] += row[H_AMOUNT]
    warehouse = tables.get(WAREHOUSE, {})
    return [
        f"condition 8: warehouse {w_id}: w_ytd {w_row[W_YTD]} != sum(h_amount) {paid[w_id]}"
        for w_id in sorted(wanted)
        if (w_row := warehouse.get((w_id,))) is not None and w_row[W_YTD] != paid[w_id]
    ]  # a missing warehouse is condition 1's


def condition_9(tables: Tables, districts: list[DistrictId]) -> list[str]:
    """Clause 3.3.2.9: D_YTD = sum(H_AMOUNT) of the payments made at the district."""
    paid: Counter[DistrictId] = Counter()
    for row in tables.get(HISTORY, {}).values():
        paid[row[H_W_ID], row[H_D_ID]] += row[H_AMOUNT]
    district = tables.get(DISTRICT, {})
    return [
        f"condition 9: district {w_d}: d_ytd {district[w_d][D_YTD]} != sum(h_amount) {paid[w_d]}"
        for w_d in districts
        if district[w_d][D_YTD] != paid[w_d]
    ]


def condition_10(
    tables: Tables, wanted: frozenset[int], delivered: Mapping[tuple, int]
) -> list[str]:
    """Clause 3.3.2.10: C_BALANCE = sum(OL_AMOUNT) of the customer's delivered lines -
    sum(H_AMOUNT) of the customer's payments (wherever they were made)."""
    paid: Counter[tuple] = Counter()
    for row in tables.get(HISTORY, {}).values():
        if row[H_C_W_ID] in wanted:
            paid[row[H_C_W_ID], row[H_C_D_ID], row[H_C_ID]] += row[H_AMOUNT]

    def wrong(key: tuple, row: tuple) -> str | None:
        if row[C_BALANCE] == delivered.get(key, 0) - paid[key]:
            return None
        return (
            f"customer {key}: c_balance {row[C_BALANCE]} != delivered "
            f"{delivered.get(key, 0)} - paid {paid[key]}"
        )

    return _per_customer(10, tables, wanted, wrong)


def condition_11(tables: Tables, wanted: frozenset[int], districts: list[DistrictId]) -> list[str]:
    """Clause 3.3.2.11, at any state: count(ORDER) - count(NEW-ORDER) = 2100 +
    sum(C_DELIVERY_CNT) in each district (the module docstring says why)."""
    orders: Counter[DistrictId] = Counter(k[:2] for k in tables.get(ORDERS, {}) if k[0] in wanted)
    new: Counter[DistrictId] = Counter(k[:2] for k in tables.get(NEW_ORDER, {}) if k[0] in wanted)
    deliveries: Counter[DistrictId] = Counter()
    for key, row in tables.get(CUSTOMER, {}).items():
        if key[0] in wanted:
            deliveries[key[0], key[1]] += row[C_DELIVERY_CNT]
    loaded = ORDERS_PER_DISTRICT - NEW_ORDERS_PER_DISTRICT
    return [
        f"condition 11: district {w_d}: {orders[w_d]} orders - {new[w_d]} new-orders != "
        f"{loaded} + sum(c_delivery_cnt) {deliveries[w_d]}"
        for w_d in districts
        if orders[w_d] - new[w_d] != loaded + deliveries[w_d]
    ]


def condition_12(
    tables: Tables, wanted: frozenset[int], delivered: Mapping[tuple, int]
) -> list[str]:
    """Clause 3.3.2.12: C_BALANCE + C_YTD_PAYMENT = sum(OL_AMOUNT) of the customer's
    delivered lines."""

    def wrong(key: tuple, row: tuple) -> str | None:
        if row[C_BALANCE] + row[C_YTD_PAYMENT] == delivered.get(key, 0):
            return None
        return (
            f"customer {key}: c_balance {row[C_BALANCE]} + c_ytd_payment "
            f"{row[C_YTD_PAYMENT]} != delivered {delivered.get(key, 0)}"
        )

    return _per_customer(12, tables, wanted, wrong)


def _per_customer(
    condition: int,
    tables: Tables,
    wanted: frozenset[int],
    wrong: Callable[[tuple, tuple], str | None],
) -> list[str]:
    """A per-customer condition's violations (``wrong``: the text, None if it holds)."""
    found = (
        (key, wrong(key, row)) for key, row in tables.get(CUSTOMER, {}).items() if key[0] in wanted
    )
    return _shown(condition, ((key, v) for key, v in found if v is not None))


def _delivered_amounts(tables: Tables, wanted: frozenset[int]) -> dict[tuple, int]:
    """sum(OL_AMOUNT) of delivered lines per customer (w, d, c) (an order's customer is
    in the order's district); a line whose order is missing is condition 7's."""
    per_order: Counter[tuple] = Counter()
    for key, row in tables.get(ORDER_LINE, {}).items():
        if key[0] in wanted and row[OL_DELIVERY_D] is not None:
            per_order[key[:3]] += row[OL_AMOUNT]
    orders = tables.get(ORDERS, {})
    out: Counter[tuple] = Counter()
    for o_key, amount in per_order.items():
        order = orders.get(o_key)
        if order is not None:
            out[o_key[0], o_key[1], order[O_C_ID]] += amount
    return dict(out)


def _shown(condition: int, violations: Iterable[tuple[tuple, str]]) -> list[str]:
    """A per-order condition's violations (key, text) in key order, the first
    PER_ROW_SHOWN of them, then a count of the rest. Only the violations are sorted
    (a consistent database has none), not the tables."""
    found = sorted(violations)
    out = [f"condition {condition}: {text}" for _key, text in found[:PER_ROW_SHOWN]]
    if len(found) > PER_ROW_SHOWN:
        out.append(f"condition {condition}: {len(found) - PER_ROW_SHOWN} more")
    return out


def _max_third(rows: Mapping[tuple, tuple], wanted: frozenset[int]) -> dict[DistrictId, int]:
    """max(key[2]) per (key[0], key[1]): the largest order id per district."""
    highest: defaultdict[DistrictId, int] = defaultdict(int)
    for key in rows:
        if key[0] in wanted and key[2] > highest[key[0], key[1]]:
            highest[key[0], key[1]] = key[2]
    return dict(highest)
