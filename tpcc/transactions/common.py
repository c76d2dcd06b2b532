"""What several TPC-C transactions share: the error a bad argument gets, the customer a
last name selects and its argument (Payment and Order-Status, clauses 2.5.2.2 and
2.6.2.2), and the districts of a warehouse (Delivery and check_warehouse).

Invariant: New-Order, Payment and Delivery rewrite rows by slicing them at column
positions; ``_check_layout`` fails at import if the schema's column order changes under
them (each of those modules imports this one).
"""

from __future__ import annotations

from tpcc.schema import (
    C_BALANCE,
    C_CITY,
    C_DATA,
    C_STATE,
    C_STREET_1,
    C_STREET_2,
    C_ZIP,
    COL_CUSTOMER,
    COL_DISTRICT,
    COL_STOCK,
    CUSTOMER_BY_NAME,
    D_NEXT_O_ID,
    DISTRICTS_PER_WAREHOUSE,
    S_DIST_01,
    S_QUANTITY,
    S_REMOTE_CNT,
)
from txn_library.errors import ERR_BAD_ARGUMENTS, BadRequest, invariant
from txn_library.procedure import Arg, Context

C_LAST_ARG = Arg("c_last", "str", max_len=16)
WAREHOUSE_DISTRICTS = tuple(range(1, DISTRICTS_PER_WAREHOUSE + 1))


def bad_arguments(message: str) -> BadRequest:
    return BadRequest(ERR_BAD_ARGUMENTS, message)


def is_int(v: object) -> bool:
    return type(v) is int


def customer_by_last_name(ctx: Context, c_w_id: int, c_d_id: int, c_last: str) -> int | None:
    """Clause 2.5.2.2 (and 2.6.2.2): of the customers with this last name, sorted by
    c_first, the one at position ceil(n/2); None if there is none."""
    rows = ctx.scan(CUSTOMER_BY_NAME, (c_w_id, c_d_id, c_last))
    if not rows:
        return None
    return rows[(len(rows) + 1) // 2 - 1][0][4]


def _check_layout() -> None:
    """The row rewrites of New-Order, Payment and Delivery slice rows by column
    position; fail at import if the schema's column order changes under them."""
    invariant(
        COL_CUSTOMER["c_ytd_payment"] == C_BALANCE + 1
        and COL_CUSTOMER["c_payment_cnt"] == C_BALANCE + 2
        and COL_CUSTOMER["c_delivery_cnt"] == C_BALANCE + 3,
        "customer payment columns must follow c_balance",
    )
    invariant(
        (S_QUANTITY, S_DIST_01) == (2, 3)
        and COL_STOCK["s_ytd"] == S_QUANTITY + 11
        and COL_STOCK["s_data"] == S_REMOTE_CNT + 1,
        "stock columns s_dist_01..s_dist_10, s_ytd, s_order_cnt, s_remote_cnt, s_data moved",
    )
    invariant(
        C_DATA == len(COL_CUSTOMER) - 1 and D_NEXT_O_ID == len(COL_DISTRICT) - 1,
        "c_data and d_next_o_id must be the last columns",
    )
    invariant(C_STREET_1 < C_STREET_2 < C_CITY < C_STATE < C_ZIP, "customer address moved")


_check_layout()
