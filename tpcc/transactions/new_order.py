"""New-Order (TPC-C clause 2.4): ``tpcc.new_order(w_id, d_id, c_id, i_ids, supply_w_ids,
quantities)`` enters an order of 1..15 lines; an unused item id rolls the whole
transaction back (clause 2.4.2.3) as a logical Abort, before anything is written.

Footprint: the warehouse, district and customer rows, each item and each stock row
(s_w_id, s_i_id); orders, new_order, order_by_customer and order_line by the district
prefix (w_id, d_id), since o_id = d_next_o_id is read under the lock on the district
row, which New-Order holds exclusively. The order lines are checked before the
footprint is built, with one reason per bad call (``_check_lines``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpcc.schema import (
    C_CREDIT,
    C_DISCOUNT,
    C_LAST,
    CUSTOMER,
    CUSTOMERS_PER_DISTRICT,
    D_NEXT_O_ID,
    D_TAX,
    DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    I_DATA,
    I_NAME,
    I_PRICE,
    ITEM,
    ITEMS,
    NEW_ORDER,
    ORDER_BY_CUSTOMER,
    ORDER_LINE,
    ORDERS,
    S_DATA,
    S_DIST_01,
    S_DIST_FIRST,
    S_ORDER_CNT,
    S_QUANTITY,
    S_REMOTE_CNT,
    S_YTD,
    STOCK,
    W_TAX,
    WAREHOUSE,
)
from tpcc.transactions.common import bad_arguments
from txn_library.procedure import Abort, Arg, Context, Footprint, procedure

# Clause 2.4.1.3/2.4.1.5: 5..15 lines, quantity 1..10. Fewer lines are accepted
# (tests, hand-made calls); more are not.
ORDER_LINES_MIN = 1
ORDER_LINES_MAX = 15
QUANTITY_MAX = 10
# Clause 2.4.1.5: the rollback New-Order uses an unused item id.
UNUSED_I_ID = ITEMS + 1
ORIGINAL = "ORIGINAL"
ROLLBACK_REASON = "Item number is not valid"  # clause 2.4.3.4
BP = 10_000  # basis points per unit


def _check_lines(
    i_ids: Sequence[Any], supply_w_ids: Sequence[Any], quantities: Sequence[Any]
) -> None:
    n = len(i_ids)
    if (
        not (ORDER_LINES_MIN <= n <= ORDER_LINES_MAX)
        or len(supply_w_ids) != n
        or len(quantities) != n
    ):
        raise bad_arguments(
            f"tpcc.new_order: i_ids, supply_w_ids and quantities must have the same length "
            f"{ORDER_LINES_MIN}..{ORDER_LINES_MAX}"
        )
    # One plain loop (this runs at the sequencer, interpreted, and at every participant,
    # compiled): 2.3x faster interpreted than set(map(type, ...)), min and max. Errors
    # in the same order: a value not an int anywhere, then one below 1, then a quantity.
    low = False
    for values in (i_ids, supply_w_ids, quantities):
        for v in values:
            if type(v) is not int:
                raise bad_arguments("tpcc.new_order: order lines hold integers")
            if v < 1:
                low = True
    if low:
        raise bad_arguments("tpcc.new_order: item ids, supply warehouses and quantities are >= 1")
    for q in quantities:
        if q > QUANTITY_MAX:
            raise bad_arguments(f"tpcc.new_order: quantities are <= {QUANTITY_MAX}")


def _new_order_footprint(
    w_id: int, d_id: int, c_id: int, i_ids: Sequence[int], supply_w_ids: Sequence[int],
    quantities: Sequence[int],
) -> Footprint:  # fmt: skip
    _check_lines(i_ids, supply_w_ids, quantities)
    wd = (w_id, d_id)
    stock = tuple([(STOCK, (sw, i)) for sw, i in zip(supply_w_ids, i_ids, strict=True)])
    items = tuple([(ITEM, (i,)) for i in i_ids])
    return Footprint(
        reads=((WAREHOUSE, (w_id,)), (DISTRICT, wd), (CUSTOMER, (w_id, d_id, c_id)))
        + items
        + stock,
        writes=(
            (DISTRICT, wd),
            (ORDERS, wd),
            (NEW_ORDER, wd),
            (ORDER_BY_CUSTOMER, wd),
            (ORDER_LINE, wd),
        )
        + stock,
    )


@procedure(
    "tpcc.new_order",
    [
        Arg("w_id", "int", min_value=1),
        Arg("d_id", "int", min_value=1, max_value=DISTRICTS_PER_WAREHOUSE),
        Arg("c_id", "int", min_value=1, max_value=CUSTOMERS_PER_DISTRICT),
        Arg("i_ids", "list", max_len=ORDER_LINES_MAX),
        Arg("supply_w_ids", "list", max_len=ORDER_LINES_MAX),
        Arg("quantities", "list", max_len=ORDER_LINES_MAX),
    ],
    _new_order_footprint,
)
def new_order(
    ctx: Context, w_id: int, d_id: int, c_id: int, i_ids: Sequence[int],
    supply_w_ids: Sequence[int], quantities: Sequence[int],
) -> Any:  # fmt: skip
    """New-Order (clause 2.4.2): enter an order of 1..15 lines; an unused item id rolls
    the whole transaction back (clause 2.4.2.3) as a logical Abort.

    Returns (o_id, o_entry_d, total_amount, c_last, c_credit, c_discount, w_tax, d_tax,
    lines) with lines = [(i_name, s_quantity, brand_generic, i_price, ol_amount), ...]
    in input order; the other output fields of clause 2.4.3.3 are the caller's inputs.
    total_amount = sum(ol_amount) * (1 - c_discount) * (1 + w_tax + d_tax), rounded to
    the nearest cent.
    """
    get, put = ctx.get, ctx.put
    w = get(WAREHOUSE, (w_id,))
    wd = (w_id, d_id)
    d = get(DISTRICT, wd)
    c = get(CUSTOMER, (w_id, d_id, c_id))
    if w is None or d is None or c is None:
        return Abort(f"no warehouse/district/customer {(w_id, d_id, c_id)}")
    o_id = d[D_NEXT_O_ID]
    put(DISTRICT, wd, d[:D_NEXT_O_ID] + (o_id + 1,) + d[D_NEXT_O_ID + 1 :])
    ol_cnt = len(i_ids)
    all_local = 1
    for sw in supply_w_ids:
        if sw != w_id:
            all_local = 0
    ts = ctx.timestamp_ms
    put(ORDERS, (w_id, d_id, o_id), (o_id, d_id, w_id, c_id, ts, None, ol_cnt, all_local))
    put(NEW_ORDER, (w_id, d_id, o_id), (o_id, d_id, w_id))
    put(ORDER_BY_CUSTOMER, (w_id, d_id, c_id, o_id), ())
    dist_col = S_DIST_FIRST + d_id - 1
    lines = []
    total = 0
    ol_number = 0
    for i_id, sw, q in zip(i_ids, supply_w_ids, quantities, strict=True):
        ol_number += 1
        item = get(ITEM, (i_id,))
        if item is None:
            return Abort(ROLLBACK_REASON)
        s_key = (sw, i_id)
        s = get(STOCK, s_key)
        if s is None:
            return Abort(f"no stock {s_key}")
        s_quantity = s[S_QUANTITY]
        if s_quantity >= q + 10:
            s_quantity -= q
        else:
            s_quantity += 91 - q
        # One tuple display (the hot path): s_i_id, s_w_id, s_quantity, s_dist_01..10,
        # s_ytd, s_order_cnt, s_remote_cnt, s_data (layout checked at import).
        put(
            STOCK,
            s_key,
            (
                s[0], s[1], s_quantity, *s[S_DIST_01:S_YTD], s[S_YTD] + q,
                s[S_ORDER_CNT] + 1, s[S_REMOTE_CNT] + (sw != w_id), s[S_DATA],
            ),
        )  # fmt: skip
        i_price = item[I_PRICE]
        amount = q * i_price
        total += amount
        brand = "B" if ORIGINAL in item[I_DATA] and ORIGINAL in s[S_DATA] else "G"
        put(
            ORDER_LINE,
            (w_id, d_id, o_id, ol_number),
            (o_id, d_id, w_id, ol_number, i_id, sw, None, q, amount, s[dist_col]),
        )
        lines.append((item[I_NAME], s_quantity, brand, i_price, amount))
    c_discount, w_tax, d_tax = c[C_DISCOUNT], w[W_TAX], d[D_TAX]
    scale = BP * BP
    total = (total * (BP - c_discount) * (BP + w_tax + d_tax) + scale // 2) // scale
    return (o_id, ts, total, c[C_LAST], c[C_CREDIT], c_discount, w_tax, d_tax, lines)
