"""TPC-C tables (clause 1.3) as Ordo tables, plus two secondary indexes.

Rows are tuples in exactly the order of ``Table.columns`` (the spec's column names,
lower case); keys are tuples of the primary-key columns, warehouse first, so that
``place_by_first_int`` puts every row of warehouse w on partition (w - 1) % P.
Procedure code indexes rows with the module-level constants: ``row[C_BALANCE]``.

Units, chosen so that every computation is integer and therefore deterministic:
- money (w_ytd, d_ytd, c_balance, c_ytd_payment, c_credit_lim, h_amount, i_price,
  ol_amount) in integer cents;
- tax and discount (w_tax, d_tax, c_discount) in integer basis points (1/10000);
- dates (c_since, h_date, o_entry_d, ol_delivery_d) in integer milliseconds;
- nullable columns (o_carrier_id, ol_delivery_d) hold None.

Lock granularity: every write transaction already holds the district row
exclusively, so district-level locks (lock_len 2) on history, new_order, orders,
order_by_customer, order_line and stock cost no concurrency. Customer rows are
locked exactly (Payment by last name predicts a c_id and must re-check it).

History has no primary key in the spec; its key is (h_w_id, h_d_id, h_seq) with
h_seq unique within the district. The loader uses h_seq = c_id (1..3000);
transactions must use h_seq > HISTORY_SEQ_LOADED_MAX. h_seq is not a row column.

Invariant: each ``<COLUMN>`` constant equals that column's index in its table, and
all column names are unique across tables (checked when this module loads).
"""

from __future__ import annotations

from txn_library.catalog import Table, place_by_first_int, register_table
from txn_library.errors import invariant

# Cardinalities (clause 1.2.1 and 4.3.3.1).
DISTRICTS_PER_WAREHOUSE = 10
CUSTOMERS_PER_DISTRICT = 3000
ITEMS = 100_000
STOCK_PER_WAREHOUSE = 100_000
ORDERS_PER_DISTRICT = 3000
NEW_ORDERS_PER_DISTRICT = 900
HISTORY_SEQ_LOADED_MAX = CUSTOMERS_PER_DISTRICT

# Table names.
WAREHOUSE = "warehouse"
DISTRICT = "district"
CUSTOMER = "customer"
CUSTOMER_BY_NAME = "customer_by_name"
HISTORY = "history"
NEW_ORDER = "new_order"
ORDERS = "orders"
ORDER_BY_CUSTOMER = "order_by_customer"
ORDER_LINE = "order_line"
ITEM = "item"
STOCK = "stock"

COLUMNS: dict[str, tuple[str, ...]] = {
    WAREHOUSE: (
        "w_id", "w_name", "w_street_1", "w_street_2", "w_city", "w_state", "w_zip",
        "w_tax", "w_ytd",
    ),
    DISTRICT: (
        "d_id", "d_w_id", "d_name", "d_street_1", "d_street_2", "d_city", "d_state",
        "d_zip", "d_tax", "d_ytd", "d_next_o_id",
    ),
    CUSTOMER: (
        "c_id", "c_d_id", "c_w_id", "c_first", "c_middle", "c_last", "c_street_1",
        "c_street_2", "c_city", "c_state", "c_zip", "c_phone", "c_since", "c_credit",
        "c_credit_lim", "c_discount", "c_balance", "c_ytd_payment", "c_payment_cnt",
        "c_delivery_cnt", "c_data",
    ),
    CUSTOMER_BY_NAME: (),
    HISTORY: (
        "h_c_id", "h_c_d_id", "h_c_w_id", "h_d_id", "h_w_id", "h_date", "h_amount",
        "h_data",
    ),
    NEW_ORDER: ("no_o_id", "no_d_id", "no_w_id"),
    ORDERS: (
        "o_id", "o_d_id", "o_w_id", "o_c_id", "o_entry_d", "o_carrier_id", "o_ol_cnt",
        "o_all_local",
    ),
    ORDER_BY_CUSTOMER: (),
    ORDER_LINE: (
        "ol_o_id", "ol_d_id", "ol_w_id", "ol_number", "ol_i_id", "ol_supply_w_id",
        "ol_delivery_d", "ol_quantity", "ol_amount", "ol_dist_info",
    ),
    ITEM: ("i_id", "i_im_id", "i_name", "i_price", "i_data"),
    STOCK: (
        "s_i_id", "s_w_id", "s_quantity", "s_dist_01", "s_dist_02", "s_dist_03",
        "s_dist_04", "s_dist_05", "s_dist_06", "s_dist_07", "s_dist_08", "s_dist_09",
        "s_dist_10", "s_ytd", "s_order_cnt", "s_remote_cnt", "s_data",
    ),
}  # fmt: skip

# The columns that make up each key, in key order (for dumps and documentation).
KEY_COLUMNS: dict[str, tuple[str, ...]] = {
    WAREHOUSE: ("w_id",),
    DISTRICT: ("d_w_id", "d_id"),
    CUSTOMER: ("c_w_id", "c_d_id", "c_id"),
    CUSTOMER_BY_NAME: ("c_w_id", "c_d_id", "c_last", "c_first", "c_id"),
    HISTORY: ("h_w_id", "h_d_id", "h_seq"),
    NEW_ORDER: ("no_w_id", "no_d_id", "no_o_id"),
    ORDERS: ("o_w_id", "o_d_id", "o_id"),
    ORDER_BY_CUSTOMER: ("o_w_id", "o_d_id", "o_c_id", "o_id"),
    ORDER_LINE: ("ol_w_id", "ol_d_id", "ol_o_id", "ol_number"),
    ITEM: ("i_id",),
    STOCK: ("s_w_id", "s_i_id"),
}

# Every key part is an id (int) except the customer's names in CUSTOMER_BY_NAME.
KEY_TYPES: dict[str, tuple[type, ...]] = {CUSTOMER_BY_NAME: (int, int, str, str, int)}

COL: dict[str, dict[str, int]] = {
    name: {column: i for i, column in enumerate(columns)} for name, columns in COLUMNS.items()
}
COL_WAREHOUSE = COL[WAREHOUSE]
COL_DISTRICT = COL[DISTRICT]
COL_CUSTOMER = COL[CUSTOMER]
COL_HISTORY = COL[HISTORY]
COL_NEW_ORDER = COL[NEW_ORDER]
COL_ORDERS = COL[ORDERS]
COL_ORDER_LINE = COL[ORDER_LINE]
COL_ITEM = COL[ITEM]
COL_STOCK = COL[STOCK]


def col(table_name: str, column: str) -> int:
    """Index of ``column`` in rows of ``table_name``; KeyError names what is unknown."""
    try:
        return COL[table_name][column]
    except KeyError:
        raise KeyError(f"no column {column!r} in table {table_name!r}") from None


# Column indexes; checked against COLUMNS by _check_column_constants() below.
W_ID, W_NAME, W_STREET_1, W_STREET_2, W_CITY, W_STATE, W_ZIP, W_TAX, W_YTD = range(9)
(
    D_ID, D_W_ID, D_NAME, D_STREET_1, D_STREET_2, D_CITY, D_STATE, D_ZIP, D_TAX, D_YTD,
    D_NEXT_O_ID,
) = range(11)  # fmt: skip
(
    C_ID, C_D_ID, C_W_ID, C_FIRST, C_MIDDLE, C_LAST, C_STREET_1, C_STREET_2, C_CITY,
    C_STATE, C_ZIP, C_PHONE, C_SINCE, C_CREDIT, C_CREDIT_LIM, C_DISCOUNT, C_BALANCE,
    C_YTD_PAYMENT, C_PAYMENT_CNT, C_DELIVERY_CNT, C_DATA,
) = range(21)  # fmt: skip
H_C_ID, H_C_D_ID, H_C_W_ID, H_D_ID, H_W_ID, H_DATE, H_AMOUNT, H_DATA = range(8)
NO_O_ID, NO_D_ID, NO_W_ID = range(3)
O_ID, O_D_ID, O_W_ID, O_C_ID, O_ENTRY_D, O_CARRIER_ID, O_OL_CNT, O_ALL_LOCAL = range(8)
(
    OL_O_ID, OL_D_ID, OL_W_ID, OL_NUMBER, OL_I_ID, OL_SUPPLY_W_ID, OL_DELIVERY_D,
    OL_QUANTITY, OL_AMOUNT, OL_DIST_INFO,
) = range(10)  # fmt: skip
I_ID, I_IM_ID, I_NAME, I_PRICE, I_DATA = range(5)
(
    S_I_ID, S_W_ID, S_QUANTITY, S_DIST_01, S_DIST_02, S_DIST_03, S_DIST_04, S_DIST_05,
    S_DIST_06, S_DIST_07, S_DIST_08, S_DIST_09, S_DIST_10, S_YTD, S_ORDER_CNT,
    S_REMOTE_CNT, S_DATA,
) = range(17)  # fmt: skip
S_DIST_FIRST = S_DIST_01  # s_dist_xx for district d is at S_DIST_FIRST + d - 1


def _check_column_constants() -> None:
    names = [c for columns in COLUMNS.values() for c in columns]
    invariant(len(names) == len(set(names)), "TPC-C column names must be unique across tables")
    module = globals()
    for table_name, columns in COLUMNS.items():
        for i, column in enumerate(columns):
            invariant(
                module.get(column.upper()) == i,
                f"schema constant {column.upper()} != {i} (index in {table_name})",
            )


_check_column_constants()


def _warehouse_table(
    name: str, key_len: int, lock_len: int, *, ordered: bool = False, index_len: int | None = None
) -> Table:
    return register_table(
        Table(
            name=name,
            key_len=key_len,
            lock_len=lock_len,
            place_len=1,
            placement=place_by_first_int,
            ordered=ordered,
            index_len=index_len,
            columns=COLUMNS[name],
            key_columns=KEY_COLUMNS[name],
            key_types=KEY_TYPES.get(name, (int,) * key_len),
        )
    )


TABLES: dict[str, Table] = {
    WAREHOUSE: _warehouse_table(WAREHOUSE, 1, 1),
    DISTRICT: _warehouse_table(DISTRICT, 2, 2),
    CUSTOMER: _warehouse_table(CUSTOMER, 3, 3),
    CUSTOMER_BY_NAME: _warehouse_table(CUSTOMER_BY_NAME, 5, 3, ordered=True),
    # Ordered so a warehouse's payments can be scanned (consistency conditions 8 and 9
    # at its partition); h_seq grows with the txn id, so keys arrive in order per district.
    HISTORY: _warehouse_table(HISTORY, 3, 2, ordered=True),
    NEW_ORDER: _warehouse_table(NEW_ORDER, 3, 2, ordered=True),
    ORDERS: _warehouse_table(ORDERS, 3, 2, ordered=True),
    # Indexed per customer: a customer's order ids only grow (appends), while per
    # district they arrive in random customer order (a SortedList insert each).
    ORDER_BY_CUSTOMER: _warehouse_table(ORDER_BY_CUSTOMER, 4, 2, ordered=True, index_len=3),
    ORDER_LINE: _warehouse_table(ORDER_LINE, 4, 2, ordered=True),
    ITEM: register_table(
        Table(
            name=ITEM,
            key_len=1,
            replicated=True,
            columns=COLUMNS[ITEM],
            key_columns=KEY_COLUMNS[ITEM],
        )
    ),
    STOCK: _warehouse_table(STOCK, 2, 2),
}
