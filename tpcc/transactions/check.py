"""Consistency (TPC-C clause 3.3.2) as a read-only procedure: ``tpcc.check_warehouse(w_id)``
checks conditions 1-9, 11 and 12 on one warehouse's rows at the replica that runs it
(condition 10 needs other warehouses' payments: ``tpcc.consistency``).
"""

from __future__ import annotations

from tpcc.consistency import check_local
from tpcc.schema import (
    CUSTOMER,
    CUSTOMERS_PER_DISTRICT,
    DISTRICT,
    HISTORY,
    NEW_ORDER,
    ORDER_LINE,
    ORDERS,
    WAREHOUSE,
)
from tpcc.transactions.common import WAREHOUSE_DISTRICTS
from txn_library.procedure import Arg, Context, Footprint, procedure

_DISTRICT_CUSTOMERS = tuple(range(1, CUSTOMERS_PER_DISTRICT + 1))


@procedure(
    "tpcc.check_warehouse",
    [Arg("w_id", "int", min_value=1)],
    lambda w_id: Footprint(
        reads=tuple(
            (t, (w_id,))
            for t in (WAREHOUSE, DISTRICT, CUSTOMER, HISTORY, ORDERS, NEW_ORDER, ORDER_LINE)
        )
    ),
    read_only=True,
)
def check_warehouse(ctx: Context, w_id: int) -> list[str]:
    """Consistency conditions 1-9, 11 and 12 (clause 3.3.2; 10 needs other warehouses'
    payments: tpcc.consistency) on one warehouse's rows at the replica that runs it;
    returns the violations (empty: consistent)."""
    get = ctx.get
    w = get(WAREHOUSE, (w_id,))
    districts: dict[tuple, tuple] = {}
    customers: dict[tuple, tuple] = {}
    for d_id in WAREHOUSE_DISTRICTS:
        d = get(DISTRICT, (w_id, d_id))
        if d is not None:
            districts[(w_id, d_id)] = d
        for c_id in _DISTRICT_CUSTOMERS:  # customers are loaded, never inserted
            c = get(CUSTOMER, (w_id, d_id, c_id))
            if c is not None:
                customers[(w_id, d_id, c_id)] = c
    tables: dict[str, dict[tuple, tuple]] = {
        WAREHOUSE: {} if w is None else {(w_id,): w},
        DISTRICT: districts,
        CUSTOMER: customers,
        HISTORY: dict(ctx.scan(HISTORY, (w_id,))),
        ORDERS: dict(ctx.scan(ORDERS, (w_id,))),
        NEW_ORDER: dict(ctx.scan(NEW_ORDER, (w_id,))),
        ORDER_LINE: dict(ctx.scan(ORDER_LINE, (w_id,))),
    }
    return check_local(tables, [w_id])
