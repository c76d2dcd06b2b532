"""Order-Status (TPC-C clause 2.6), read-only: ``tpcc.order_status(w_id, d_id, c_id,
c_last)`` returns a customer (by c_id, or by last name when c_id is 0) and their most
recent order with its lines. It runs unsequenced at one replica, so its footprint names
(w_id, d_id) prefixes only.
"""

from __future__ import annotations

from typing import Any

from tpcc.schema import (
    C_BALANCE,
    C_FIRST,
    C_LAST,
    C_MIDDLE,
    CUSTOMER,
    CUSTOMER_BY_NAME,
    CUSTOMERS_PER_DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    O_CARRIER_ID,
    O_ENTRY_D,
    OL_AMOUNT,
    OL_DELIVERY_D,
    OL_I_ID,
    OL_QUANTITY,
    OL_SUPPLY_W_ID,
    ORDER_BY_CUSTOMER,
    ORDER_LINE,
    ORDERS,
)
from tpcc.transactions.common import C_LAST_ARG, customer_by_last_name
from txn_library.procedure import Abort, Arg, Context, Footprint, procedure


@procedure(
    "tpcc.order_status",
    [
        Arg("w_id", "int", min_value=1),
        Arg("d_id", "int", min_value=1, max_value=DISTRICTS_PER_WAREHOUSE),
        Arg("c_id", "int", min_value=0, max_value=CUSTOMERS_PER_DISTRICT),
        C_LAST_ARG,
    ],
    lambda w_id, d_id, c_id, c_last: Footprint(
        reads=tuple(
            (t, (w_id, d_id))
            for t in (CUSTOMER, CUSTOMER_BY_NAME, ORDER_BY_CUSTOMER, ORDERS, ORDER_LINE)
        )
    ),
    read_only=True,
)
def order_status(ctx: Context, w_id: int, d_id: int, c_id: int, c_last: str) -> Any:
    """Order-Status (clause 2.6.2.2): a customer (by c_id, or by last name when c_id is 0)
    and their most recent order with its lines.

    Returns (c_id, c_first, c_middle, c_last, c_balance, o_id, o_entry_d, o_carrier_id,
    [(ol_supply_w_id, ol_i_id, ol_quantity, ol_amount, ol_delivery_d), ...]); the order
    fields are None if the customer has no order. Aborts if there is no such customer.
    """
    if c_id == 0:
        found = customer_by_last_name(ctx, w_id, d_id, c_last)
        if found is None:
            return Abort(f"no customer named {c_last!r} in district {(w_id, d_id)}")
        c_id = found
    c = ctx.get(CUSTOMER, (w_id, d_id, c_id))
    if c is None:
        return Abort(f"no customer {(w_id, d_id, c_id)}")
    head = (c_id, c[C_FIRST], c[C_MIDDLE], c[C_LAST], c[C_BALANCE])
    orders = ctx.scan(ORDER_BY_CUSTOMER, (w_id, d_id, c_id))
    if not orders:
        return (*head, None, None, None, [])
    o_id = orders[-1][0][3]
    o = ctx.get(ORDERS, (w_id, d_id, o_id))
    if o is None:
        return (*head, o_id, None, None, [])
    lines = [
        (ol[OL_SUPPLY_W_ID], ol[OL_I_ID], ol[OL_QUANTITY], ol[OL_AMOUNT], ol[OL_DELIVERY_D])
        for _key, ol in ctx.scan(ORDER_LINE, (w_id, d_id, o_id))
    ]
    return (*head, o_id, o[O_ENTRY_D], o[O_CARRIER_ID], lines)
