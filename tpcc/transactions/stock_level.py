"""Stock-Level (TPC-C clause 2.8), read-only: ``tpcc.stock_level(w_id, d_id, threshold)``
counts the distinct items of the district's last 20 orders whose s_quantity in the home
warehouse is below ``threshold``. It runs unsequenced at one replica (prefix footprint).
"""

from __future__ import annotations

from typing import Any

from tpcc.schema import (
    D_NEXT_O_ID,
    DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    OL_I_ID,
    ORDER_LINE,
    S_QUANTITY,
    STOCK,
)
from txn_library.procedure import Abort, Arg, Context, Footprint, procedure

STOCK_LEVEL_ORDERS = 20  # clause 2.8.2.2: the last 20 orders of the district


@procedure(
    "tpcc.stock_level",
    [
        Arg("w_id", "int", min_value=1),
        Arg("d_id", "int", min_value=1, max_value=DISTRICTS_PER_WAREHOUSE),
        Arg("threshold", "int", min_value=0, max_value=1000),
    ],
    lambda w_id, d_id, threshold: Footprint(
        reads=((DISTRICT, (w_id, d_id)), (ORDER_LINE, (w_id, d_id)), (STOCK, (w_id,)))
    ),
    read_only=True,
)
def stock_level(ctx: Context, w_id: int, d_id: int, threshold: int) -> Any:
    """Stock-Level (clause 2.8.2.2): how many distinct items of the district's last 20
    orders have s_quantity below ``threshold`` in the home warehouse."""
    d = ctx.get(DISTRICT, (w_id, d_id))
    if d is None:
        return Abort(f"no district {(w_id, d_id)}")
    next_o_id = d[D_NEXT_O_ID]
    items = set()
    for o_id in range(max(1, next_o_id - STOCK_LEVEL_ORDERS), next_o_id):
        for _key, ol in ctx.scan(ORDER_LINE, (w_id, d_id, o_id)):
            items.add(ol[OL_I_ID])
    low = 0
    get = ctx.get
    for i_id in items:  # a count: the iteration order does not matter
        s = get(STOCK, (w_id, i_id))
        if s is not None and s[S_QUANTITY] < threshold:
            low += 1
    return low
