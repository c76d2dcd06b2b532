"""TPC-C initial population (clause 4.3.3.1) as a stream of (table, key, row).

``genesis`` is the cluster's genesis hook (ClusterConfig.genesis =
"tpcc.loader:genesis"): each partition generates only the warehouses placed on it,
plus the replicated ITEM table, when it starts from nothing.

Determinism: the items depend only on the seed, and the rows of warehouse w only on
(seed, w, load_ts_ms): each part draws from its own ``TpccRandom`` whose seed is
derived with a stable digest (``derive_seed``), so a partition can load just its
own warehouses and every replica, process and replay gets identical rows.

The NURand constant C used at load (for C_LAST of customers 1001..3000) is one per
database, ``load_c(seed)``; the driver derives its run-time C from it
(``NURandC.for_run``, clause 2.1.6.1).

Units follow ``tpcc.schema``: cents, basis points, milliseconds, None for null.
"""

from __future__ import annotations

from collections.abc import Iterator

from tqdm import tqdm

from tpcc.schema import (
    CUSTOMER,
    CUSTOMER_BY_NAME,
    CUSTOMERS_PER_DISTRICT,
    DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    HISTORY,
    ITEM,
    ITEMS,
    NEW_ORDER,
    NEW_ORDERS_PER_DISTRICT,
    ORDER_BY_CUSTOMER,
    ORDER_LINE,
    ORDERS,
    ORDERS_PER_DISTRICT,
    STOCK,
    STOCK_PER_WAREHOUSE,
    WAREHOUSE,
)
from tpcc.tpcc_random import LAST_NAMES, NURandC, TpccRandom, derive_seed
from txn_library import placement

LoadRow = tuple[str, tuple, tuple]


# Initial values of clause 4.3.3.1, in schema units.
W_YTD_INITIAL = 30_000_000  # 300,000.00
D_YTD_INITIAL = 3_000_000  # 30,000.00
D_NEXT_O_ID_INITIAL = ORDERS_PER_DISTRICT + 1
C_CREDIT_LIM_INITIAL = 5_000_000  # 50,000.00
C_BALANCE_INITIAL = -1000  # -10.00
C_YTD_PAYMENT_INITIAL = 1000  # 10.00
H_AMOUNT_INITIAL = 1000  # 10.00
C_MIDDLE = "OE"
BAD_CREDIT_PERCENT = 10
TAX_BP_MAX = 2000  # 0.2000
DISCOUNT_BP_MAX = 5000  # 0.5000
OL_QUANTITY_INITIAL = 5
DIST_LEN = 24  # s_dist_xx and ol_dist_info: a-string [24..24]
# Orders 1..2100 of each district are delivered; the last 900 are new orders.
DELIVERED_O_ID_MAX = ORDERS_PER_DISTRICT - NEW_ORDERS_PER_DISTRICT
# Customers 1..1000 take last names 0..999 in order; the rest use NURand.
SEQUENTIAL_LAST_NAMES = len(LAST_NAMES)


def load_c(seed: int) -> NURandC:
    """The NURand constants C used to populate the database (C-Load)."""
    return TpccRandom(derive_seed(seed, "nurand-load")).c


def generate(
    warehouses: int, seed: int, load_ts_ms: int, progress: bool = False
) -> Iterator[LoadRow]:
    """The whole database for warehouses 1..warehouses: items first, then each warehouse."""
    with tqdm(
        total=1 + warehouses, desc="tpcc load", unit="part", disable=None if progress else True
    ) as bar:
        yield from generate_items(seed)
        bar.update()
        for w_id in range(1, warehouses + 1):
            yield from generate_warehouse(w_id, seed, load_ts_ms)
            bar.update()


def genesis(
    partition: int, partitions: int, warehouses: int, seed: int, load_ts_ms: int
) -> Iterator[LoadRow]:
    """The initial rows one partition holds (ClusterConfig.genesis = "tpcc.loader:genesis").

    Every ITEM row (ITEM is replicated on every partition), then every row of each
    warehouse w in 1..warehouses placed on ``partition`` (the warehouse table's
    placement, ``placement.partition_of(WAREHOUSE, (w,), partitions)``; every table is
    placed by warehouse, so all of w's rows live there). A pure function of its
    arguments: every replica, restart and replay starts from the same state, and
    nothing goes through the command log. No progress bar here: partition processes
    log, the driver shows progress while it waits for them.
    """
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} not in [0, {partitions})")
    yield from generate_items(seed)
    for w_id in range(1, warehouses + 1):
        if placement.partition_of(WAREHOUSE, (w_id,), partitions) == partition:
            yield from generate_warehouse(w_id, seed, load_ts_ms)


def generate_items(seed: int) -> Iterator[LoadRow]:
    """The ITEM table (replicated on every partition)."""
    rng = TpccRandom(derive_seed(seed, "item"))
    uniform, a_string, data = rng.uniform, rng.a_string, rng.data_with_original
    for i_id in range(1, ITEMS + 1):
        row = (i_id, uniform(1, 10_000), a_string(14, 24), uniform(100, 10_000), data(26, 50))
        yield ITEM, (i_id,), row


def generate_warehouse(w_id: int, seed: int, load_ts_ms: int) -> Iterator[LoadRow]:
    """Every row of warehouse ``w_id``: a function of (seed, w_id, load_ts_ms) only."""
    rng = TpccRandom(derive_seed(seed, "warehouse", w_id), c=load_c(seed))
    yield WAREHOUSE, (w_id,), _warehouse_row(rng, w_id)
    yield from _stock(rng, w_id)
    for d_id in range(1, DISTRICTS_PER_WAREHOUSE + 1):
        yield DISTRICT, (w_id, d_id), _district_row(rng, w_id, d_id)
        yield from _customers(rng, w_id, d_id, load_ts_ms)
        yield from _orders(rng, w_id, d_id, load_ts_ms)


def _address(rng: TpccRandom) -> tuple[str, str, str, str, str]:
    """street_1, street_2, city, state, zip (clause 4.3.3.1)."""
    a = rng.a_string
    return a(10, 20), a(10, 20), a(10, 20), a(2, 2), rng.zip()


def _warehouse_row(rng: TpccRandom, w_id: int) -> tuple:
    name = rng.a_string(6, 10)
    return (w_id, name, *_address(rng), rng.uniform(0, TAX_BP_MAX), W_YTD_INITIAL)


def _district_row(rng: TpccRandom, w_id: int, d_id: int) -> tuple:
    name = rng.a_string(6, 10)
    address = _address(rng)
    tax = rng.uniform(0, TAX_BP_MAX)
    return (d_id, w_id, name, *address, tax, D_YTD_INITIAL, D_NEXT_O_ID_INITIAL)


def _stock(rng: TpccRandom, w_id: int) -> Iterator[LoadRow]:
    uniform, a_string, data = rng.uniform, rng.a_string, rng.data_with_original
    for i_id in range(1, STOCK_PER_WAREHOUSE + 1):
        quantity = uniform(10, 100)
        # s_dist_01..s_dist_10: ten a-strings of exactly 24, cut from one draw.
        dists = a_string(10 * DIST_LEN, 10 * DIST_LEN)
        row = (
            i_id, w_id, quantity,
            dists[0:24], dists[24:48], dists[48:72], dists[72:96], dists[96:120],
            dists[120:144], dists[144:168], dists[168:192], dists[192:216], dists[216:240],
            0, 0, 0, data(26, 50),
        )  # fmt: skip
        yield STOCK, (w_id, i_id), row


def _customers(rng: TpccRandom, w_id: int, d_id: int, load_ts_ms: int) -> Iterator[LoadRow]:
    """CUSTOMER with its customer_by_name entry, and one HISTORY row per customer."""
    uniform, a_string, chance = rng.uniform, rng.a_string, rng.chance
    for c_id in range(1, CUSTOMERS_PER_DISTRICT + 1):
        if c_id <= SEQUENTIAL_LAST_NAMES:
            c_last = LAST_NAMES[c_id - 1]
        else:
            c_last = rng.random_last_name()
        c_first = a_string(8, 16)
        address = _address(rng)
        c_phone = rng.n_string(16, 16)
        c_credit = "BC" if chance(BAD_CREDIT_PERCENT) else "GC"
        c_discount = uniform(0, DISCOUNT_BP_MAX)
        c_data = a_string(300, 500)
        row = (
            c_id, d_id, w_id, c_first, C_MIDDLE, c_last, *address, c_phone, load_ts_ms,
            c_credit, C_CREDIT_LIM_INITIAL, c_discount, C_BALANCE_INITIAL,
            C_YTD_PAYMENT_INITIAL, 1, 0, c_data,
        )  # fmt: skip
        yield CUSTOMER, (w_id, d_id, c_id), row
        yield CUSTOMER_BY_NAME, (w_id, d_id, c_last, c_first, c_id), ()
        h_row = (c_id, d_id, w_id, d_id, w_id, load_ts_ms, H_AMOUNT_INITIAL, a_string(12, 24))
        yield HISTORY, (w_id, d_id, c_id), h_row


def _orders(rng: TpccRandom, w_id: int, d_id: int, load_ts_ms: int) -> Iterator[LoadRow]:
    """ORDERS with order_by_customer entries, their ORDER-LINEs, and NEW-ORDER."""
    uniform, a_string = rng.uniform, rng.a_string
    customers = rng.permutation(CUSTOMERS_PER_DISTRICT)
    for o_id in range(1, ORDERS_PER_DISTRICT + 1):
        o_c_id = customers[o_id - 1]
        delivered = o_id <= DELIVERED_O_ID_MAX
        o_carrier_id = uniform(1, 10) if delivered else None
        o_ol_cnt = uniform(5, 15)
        o_row = (o_id, d_id, w_id, o_c_id, load_ts_ms, o_carrier_id, o_ol_cnt, 1)
        yield ORDERS, (w_id, d_id, o_id), o_row
        yield ORDER_BY_CUSTOMER, (w_id, d_id, o_c_id, o_id), ()
        ol_delivery_d = load_ts_ms if delivered else None
        # ol_dist_info of every line: a-strings of exactly 24, cut from one draw.
        dist_infos = a_string(DIST_LEN * o_ol_cnt, DIST_LEN * o_ol_cnt)
        for ol_number in range(1, o_ol_cnt + 1):
            ol_i_id = uniform(1, ITEMS)
            ol_amount = 0 if delivered else uniform(1, 999_999)
            end = DIST_LEN * ol_number
            ol_row = (
                o_id, d_id, w_id, ol_number, ol_i_id, w_id, ol_delivery_d,
                OL_QUANTITY_INITIAL, ol_amount, dist_infos[end - DIST_LEN : end],
            )  # fmt: skip
            yield ORDER_LINE, (w_id, d_id, o_id, ol_number), ol_row
        if not delivered:
            yield NEW_ORDER, (w_id, d_id, o_id), (o_id, d_id, w_id)
