"""The five TPC-C transactions (clauses 2.4-2.8) as Ordo stored procedures.

Procedures (positional arguments; money in cents, rates in basis points, dates in ms):

  tpcc.new_order(w_id, d_id, c_id, i_ids, supply_w_ids, quantities)        clause 2.4
  tpcc.payment(w_id, d_id, c_w_id, c_d_id, c_id, h_amount)                 clause 2.5
  tpcc.payment_by_name(w_id, d_id, c_w_id, c_d_id, c_last, h_amount)       clause 2.5
      dependent: recon ``tpcc.payment_recon``; the sequencer appends the predicted c_id
  tpcc.payment_by_name_rc(...same...)      read-committed variant: no re-check
  tpcc.delivery(w_id, o_carrier_id)                                         clause 2.7
      dependent: recon ``tpcc.delivery_recon``; appends a per-district prediction
  tpcc.order_status(w_id, d_id, c_id, c_last)    read-only; c_id 0 = by last name, 2.6
  tpcc.stock_level(w_id, d_id, threshold)        read-only                  clause 2.8
  tpcc.check_warehouse(w_id)                     read-only; consistency conditions 1-9, 11, 12

Footprints and lock granularity (``tpcc.schema``): warehouse, district and customer
rows and stock (w, i) are locked per row; orders, new_order, order_line,
order_by_customer and history lock per district (w, d), so a footprint names the
(w, d) prefix for rows whose ids are only known after reading d_next_o_id. Every
transaction that inserts into those tables also holds its district row exclusively,
so the coarser lock costs no concurrency. Read-only procedures run unsequenced at one
replica and use short prefixes (length >= place_len = 1).

Dependent transactions (README, "Dependent transactions"): the footprint of Payment
by last name depends on which customer the name selects, and that of Delivery on the
customers of the oldest new orders. A read-only reconnaissance procedure predicts
those keys; the real transaction locks them, re-computes the prediction under its
locks and returns ``Restart(actual)`` when the prediction no longer covers what it
must touch. A restart happens before any write, on every replica alike (the check
reads only locked rows), and the sequencer re-sequences the call with the fresh
prediction (at most ``limits.dependent_restarts_max`` times).

Invariants relied on:
- NEW-ORDER ids of a district are contiguous (consistency condition 3): New-Order
  appends d_next_o_id and Delivery removes the oldest. Delivery and its recon find
  the oldest new order by probing (a binary search over [1, d_next_o_id - 1]) rather
  than scanning the ~900 rows of the district.
- Determinism: bodies use only their arguments, the rows they read and
  ``ctx.timestamp_ms`` / ``ctx.txn_id``; all arithmetic is integer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpcc.consistency import check_local
from tpcc.schema import (
    C_BALANCE,
    C_CITY,
    C_CREDIT,
    C_CREDIT_LIM,
    C_DATA,
    C_DELIVERY_CNT,
    C_DISCOUNT,
    C_FIRST,
    C_LAST,
    C_MIDDLE,
    C_PAYMENT_CNT,
    C_PHONE,
    C_SINCE,
    C_STATE,
    C_STREET_1,
    C_STREET_2,
    C_YTD_PAYMENT,
    C_ZIP,
    COL_CUSTOMER,
    COL_DISTRICT,
    COL_STOCK,
    CUSTOMER,
    CUSTOMER_BY_NAME,
    CUSTOMERS_PER_DISTRICT,
    D_NAME,
    D_NEXT_O_ID,
    D_STREET_1,
    D_TAX,
    D_YTD,
    D_ZIP,
    DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    HISTORY,
    HISTORY_SEQ_LOADED_MAX,
    I_DATA,
    I_NAME,
    I_PRICE,
    ITEM,
    ITEMS,
    NEW_ORDER,
    O_C_ID,
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
    S_DATA,
    S_DIST_01,
    S_DIST_FIRST,
    S_ORDER_CNT,
    S_QUANTITY,
    S_REMOTE_CNT,
    S_YTD,
    STOCK,
    W_NAME,
    W_STREET_1,
    W_TAX,
    W_YTD,
    W_ZIP,
    WAREHOUSE,
)
from txn_library.errors import ERR_BAD_ARGUMENTS, BadRequest, invariant
from txn_library.procedure import Abort, Arg, Context, Footprint, Restart, procedure

# Clause 2.4.1.3/2.4.1.5: 5..15 lines, quantity 1..10. Fewer lines are accepted
# (tests, hand-made calls); more are not.
ORDER_LINES_MIN = 1
ORDER_LINES_MAX = 15
QUANTITY_MAX = 10
# Clause 2.4.1.5: the rollback New-Order uses an unused item id.
UNUSED_I_ID = ITEMS + 1
H_AMOUNT_MAX = 500_000  # 5,000.00 (clause 2.5.1.3)
C_DATA_LEN_MAX = 500
C_DATA_SHOWN = 200  # clause 2.5.3.4: first 200 characters of c_data
STOCK_LEVEL_ORDERS = 20  # clause 2.8.2.2: the last 20 orders of the district
# Delivery predicts (and locks) the customers of this many oldest new orders per
# district, so that a prediction survives Deliveries of the same warehouse sequenced
# between its recon and its execution (each moves every district's oldest new order
# forward by one). With 100 closed-loop terminals per warehouse, ~4 Deliveries of a
# warehouse are in flight at once: depth 3 restarted ~90% of them, depth 10 almost none.
DELIVERY_PREDICTION_DEPTH = 10
ORIGINAL = "ORIGINAL"
ROLLBACK_REASON = "Item number is not valid"  # clause 2.4.3.4
BP = 10_000  # basis points per unit
HISTORY_SEQ_BASE = HISTORY_SEQ_LOADED_MAX + 1

DistrictPrediction = tuple[int, tuple[int, ...]]  # (oldest o_id or d_next_o_id, c_ids)


def _bad(message: str) -> BadRequest:
    return BadRequest(ERR_BAD_ARGUMENTS, message)


def _is_int(v: object) -> bool:
    return type(v) is int


# --- New-Order (clause 2.4) -------------------------------------------------------------


def _check_lines(
    i_ids: Sequence[Any], supply_w_ids: Sequence[Any], quantities: Sequence[Any]
) -> None:
    n = len(i_ids)
    if (
        not (ORDER_LINES_MIN <= n <= ORDER_LINES_MAX)
        or len(supply_w_ids) != n
        or len(quantities) != n
    ):
        raise _bad(
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
                raise _bad("tpcc.new_order: order lines hold integers")
            if v < 1:
                low = True
    if low:
        raise _bad("tpcc.new_order: item ids, supply warehouses and quantities are >= 1")
    for q in quantities:
        if q > QUANTITY_MAX:
            raise _bad(f"tpcc.new_order: quantities are <= {QUANTITY_MAX}")


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


# --- Payment (clause 2.5) ---------------------------------------------------------------


def _payment_writes(w_id: int, d_id: int, customer_key: tuple | None) -> tuple:
    writes: tuple = ((WAREHOUSE, (w_id,)), (DISTRICT, (w_id, d_id)), (HISTORY, (w_id, d_id)))
    if customer_key is not None:
        writes += ((CUSTOMER, customer_key),)
    return writes


def _payment_footprint(
    w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_id: int, h_amount: int
) -> Footprint:
    c_key = (c_w_id, c_d_id, c_id)
    return Footprint(
        reads=((WAREHOUSE, (w_id,)), (DISTRICT, (w_id, d_id)), (CUSTOMER, c_key)),
        writes=_payment_writes(w_id, d_id, c_key),
    )


def _by_name_footprint(
    w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_last: str, h_amount: int,
    predicted_c_id: Any,
) -> Footprint:  # fmt: skip
    if predicted_c_id is not None and not _is_int(predicted_c_id):
        raise _bad(f"tpcc.payment_by_name: prediction must be a c_id, not {predicted_c_id!r}")
    reads: tuple = ((WAREHOUSE, (w_id,)), (DISTRICT, (w_id, d_id)))
    reads += ((CUSTOMER_BY_NAME, (c_w_id, c_d_id, c_last)),)
    c_key = None if predicted_c_id is None else (c_w_id, c_d_id, predicted_c_id)
    if c_key is not None:
        reads += ((CUSTOMER, c_key),)
    return Footprint(reads=reads, writes=_payment_writes(w_id, d_id, c_key))


def _by_name_rc_footprint(
    w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_last: str, h_amount: int,
    predicted_c_id: Any,
) -> Footprint:  # fmt: skip
    fp = _by_name_footprint(w_id, d_id, c_w_id, c_d_id, c_last, h_amount, predicted_c_id)
    return Footprint(reads=tuple(e for e in fp.reads if e[0] != CUSTOMER_BY_NAME), writes=fp.writes)


_PAYMENT_ARGS = [
    Arg("w_id", "int", min_value=1),
    Arg("d_id", "int", min_value=1, max_value=DISTRICTS_PER_WAREHOUSE),
    Arg("c_w_id", "int", min_value=1),
    Arg("c_d_id", "int", min_value=1, max_value=DISTRICTS_PER_WAREHOUSE),
]
_H_AMOUNT = Arg("h_amount", "int", min_value=1, max_value=H_AMOUNT_MAX)
_C_LAST = Arg("c_last", "str", max_len=16)


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


def _pay(
    ctx: Context, w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_id: int, h_amount: int
) -> Any:
    """The body of clause 2.5.2.2 once the customer is known."""
    get, put = ctx.get, ctx.put
    wd = (w_id, d_id)
    c_key = (c_w_id, c_d_id, c_id)
    w = get(WAREHOUSE, (w_id,))
    d = get(DISTRICT, wd)
    c = get(CUSTOMER, c_key)
    if w is None or d is None or c is None:
        return Abort(f"no warehouse/district {wd} or customer {c_key}")
    put(WAREHOUSE, (w_id,), w[:W_YTD] + (w[W_YTD] + h_amount,) + w[W_YTD + 1 :])
    put(DISTRICT, wd, d[:D_YTD] + (d[D_YTD] + h_amount,) + d[D_YTD + 1 :])
    c_balance = c[C_BALANCE] - h_amount
    c_data = c[C_DATA]
    shown = ""
    if c[C_CREDIT] == "BC":
        entry = f"{c_id} {c_d_id} {c_w_id} {d_id} {w_id} {_money(h_amount)} "
        c_data = (entry + c_data)[:C_DATA_LEN_MAX]
        shown = c_data[:C_DATA_SHOWN]
    put(
        CUSTOMER,
        c_key,
        c[:C_BALANCE]
        + (c_balance, c[C_YTD_PAYMENT] + h_amount, c[C_PAYMENT_CNT] + 1)
        + c[C_DELIVERY_CNT:C_DATA]
        + (c_data,)
        + c[C_DATA + 1 :],
    )
    ts = ctx.timestamp_ms
    h_data = w[W_NAME] + "    " + d[D_NAME]
    put(
        HISTORY,
        (w_id, d_id, HISTORY_SEQ_BASE + ctx.txn_id),
        (c_id, c_d_id, c_w_id, d_id, w_id, ts, h_amount, h_data),
    )
    return (
        c_id,
        c[C_FIRST],
        c[C_MIDDLE],
        c[C_LAST],
        c[C_STREET_1 : C_ZIP + 1],
        c[C_PHONE],
        c[C_SINCE],
        c[C_CREDIT],
        c[C_CREDIT_LIM],
        c[C_DISCOUNT],
        c_balance,
        shown,
        w[W_STREET_1 : W_ZIP + 1],
        d[D_STREET_1 : D_ZIP + 1],
        ts,
    )


@procedure(
    "tpcc.payment",
    [*_PAYMENT_ARGS, Arg("c_id", "int", min_value=1, max_value=CUSTOMERS_PER_DISTRICT), _H_AMOUNT],
    _payment_footprint,
)
def payment(
    ctx: Context, w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_id: int, h_amount: int
) -> Any:
    """Payment by customer number (clause 2.5.2.2).

    Returns (c_id, c_first, c_middle, c_last, (c_street_1, c_street_2, c_city, c_state,
    c_zip), c_phone, c_since, c_credit, c_credit_lim, c_discount, c_balance,
    c_data[:200] if c_credit is BC else "", (w_street_1 .. w_zip), (d_street_1 .. d_zip),
    h_date): the output fields of clause 2.5.3.3 that the caller does not already know.
    """
    return _pay(ctx, w_id, d_id, c_w_id, c_d_id, c_id, h_amount)


def customer_by_last_name(ctx: Context, c_w_id: int, c_d_id: int, c_last: str) -> int | None:
    """Clause 2.5.2.2 (and 2.6.2.2): of the customers with this last name, sorted by
    c_first, the one at position ceil(n/2); None if there is none."""
    rows = ctx.scan(CUSTOMER_BY_NAME, (c_w_id, c_d_id, c_last))
    if not rows:
        return None
    return rows[(len(rows) + 1) // 2 - 1][0][4]


@procedure(
    "tpcc.payment_recon",
    [*_PAYMENT_ARGS, _C_LAST, _H_AMOUNT],
    lambda w_id, d_id, c_w_id, c_d_id, c_last, h_amount: Footprint(
        reads=((CUSTOMER_BY_NAME, (c_w_id, c_d_id, c_last)),)
    ),
    read_only=True,
)
def payment_recon(
    ctx: Context, w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_last: str, h_amount: int
) -> int | None:
    """Reconnaissance for Payment by last name: predicts the c_id it selects."""
    return customer_by_last_name(ctx, c_w_id, c_d_id, c_last)


@procedure(
    "tpcc.payment_by_name",
    [*_PAYMENT_ARGS, _C_LAST, _H_AMOUNT],
    _by_name_footprint,
    recon="tpcc.payment_recon",
)
def payment_by_name(
    ctx: Context, w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_last: str,
    h_amount: int, predicted_c_id: int | None,
) -> Any:  # fmt: skip
    """Payment by customer last name (clause 2.5.2.2), a dependent transaction.

    ``predicted_c_id`` (appended by the sequencer from ``tpcc.payment_recon``) is
    re-checked under the lock on the name's customer_by_name prefix; on a mismatch the
    result is Restart(actual c_id) and nothing is written. Returns what tpcc.payment
    returns.
    """
    actual = customer_by_last_name(ctx, c_w_id, c_d_id, c_last)
    if actual != predicted_c_id:
        return Restart(actual)
    if actual is None:
        return Abort(f"no customer named {c_last!r} in district {(c_w_id, c_d_id)}")
    return _pay(ctx, w_id, d_id, c_w_id, c_d_id, actual, h_amount)


@procedure(
    "tpcc.payment_by_name_rc",
    [*_PAYMENT_ARGS, _C_LAST, _H_AMOUNT],
    _by_name_rc_footprint,
    recon="tpcc.payment_recon",
)
def payment_by_name_rc(
    ctx: Context, w_id: int, d_id: int, c_w_id: int, c_d_id: int, c_last: str,
    h_amount: int, predicted_c_id: int | None,
) -> Any:  # fmt: skip
    """Payment by last name, read-committed variant: pays the customer the recon read
    selected, without re-checking (and without locking the name index). Serializable
    for TPC-C itself, whose transactions never change customer names; under a workload
    that does, the selection may be stale by the time the payment runs."""
    if predicted_c_id is None:
        return Abort(f"no customer named {c_last!r} in district {(c_w_id, c_d_id)}")
    return _pay(ctx, w_id, d_id, c_w_id, c_d_id, predicted_c_id, h_amount)


# --- Delivery (clause 2.7) --------------------------------------------------------------


def oldest_new_order(ctx: Context, w_id: int, d_id: int, hint: int | None = None) -> int | None:
    """The oldest NEW-ORDER o_id of a district (None if it has none), clause 2.7.4.2.

    NEW-ORDER ids of a district are contiguous and end at d_next_o_id - 1, so a row
    exists for o_id exactly when lo <= o_id <= hi: try ``hint`` first, else binary
    search for lo. About log2(3000) point reads instead of a scan of ~900 rows.
    """
    get = ctx.get
    d = get(DISTRICT, (w_id, d_id))
    if d is None:
        return None
    hi = d[D_NEXT_O_ID] - 1
    if hi < 1 or get(NEW_ORDER, (w_id, d_id, hi)) is None:
        return None
    if (
        hint is not None
        and 1 <= hint <= hi
        and get(NEW_ORDER, (w_id, d_id, hint)) is not None
        and (hint == 1 or get(NEW_ORDER, (w_id, d_id, hint - 1)) is None)
    ):
        return hint
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if get(NEW_ORDER, (w_id, d_id, mid)) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


def delivery_prediction(ctx: Context, w_id: int) -> tuple[DistrictPrediction, ...]:
    """Per district: (oldest new-order o_id, or d_next_o_id if none; the o_c_id of up to
    DELIVERY_PREDICTION_DEPTH oldest new orders)."""
    get = ctx.get
    out = []
    for d_id in range(1, DISTRICTS_PER_WAREHOUSE + 1):
        lo = oldest_new_order(ctx, w_id, d_id)
        if lo is None:
            d = get(DISTRICT, (w_id, d_id))
            out.append((0 if d is None else d[D_NEXT_O_ID], ()))
            continue
        c_ids = []
        for o_id in range(lo, lo + DELIVERY_PREDICTION_DEPTH):
            if get(NEW_ORDER, (w_id, d_id, o_id)) is None:
                break
            o = get(ORDERS, (w_id, d_id, o_id))
            if o is not None and o[O_C_ID] not in c_ids:
                c_ids.append(o[O_C_ID])
        out.append((lo, tuple(c_ids)))
    return tuple(out)


_WAREHOUSE_DISTRICTS = tuple(range(1, DISTRICTS_PER_WAREHOUSE + 1))
_DISTRICT_CUSTOMERS = tuple(range(1, CUSTOMERS_PER_DISTRICT + 1))


@procedure(
    "tpcc.delivery_recon",
    [Arg("w_id", "int", min_value=1), Arg("o_carrier_id", "int", min_value=1, max_value=10)],
    lambda w_id, o_carrier_id: Footprint(
        reads=((DISTRICT, (w_id,)), (NEW_ORDER, (w_id,)), (ORDERS, (w_id,)))
    ),
    read_only=True,
)
def delivery_recon(ctx: Context, w_id: int, o_carrier_id: int) -> Any:
    """Reconnaissance for Delivery: ``delivery_prediction`` of the warehouse."""
    return delivery_prediction(ctx, w_id)


def _check_delivery_prediction(prediction: Any) -> None:
    ok = isinstance(prediction, (tuple, list)) and len(prediction) == DISTRICTS_PER_WAREHOUSE
    if ok:
        for entry in prediction:
            if not (
                isinstance(entry, (tuple, list))
                and len(entry) == 2
                and _is_int(entry[0])
                and isinstance(entry[1], (tuple, list))
                and len(entry[1]) <= DELIVERY_PREDICTION_DEPTH
                and all(_is_int(c) for c in entry[1])
            ):
                ok = False
                break
    if not ok:
        raise _bad(f"tpcc.delivery: malformed prediction {prediction!r}")


def _delivery_footprint(w_id: int, o_carrier_id: int, prediction: Any) -> Footprint:
    _check_delivery_prediction(prediction)
    reads: list = []
    writes: list = []
    for d_id, (_lo, c_ids) in zip(_WAREHOUSE_DISTRICTS, prediction, strict=True):
        wd = (w_id, d_id)
        reads.append((DISTRICT, wd))
        for table in (NEW_ORDER, ORDERS, ORDER_LINE):
            reads.append((table, wd))
            writes.append((table, wd))
        for c_id in c_ids:
            reads.append((CUSTOMER, (w_id, d_id, c_id)))
            writes.append((CUSTOMER, (w_id, d_id, c_id)))
    return Footprint(reads=tuple(reads), writes=tuple(writes))


@procedure(
    "tpcc.delivery",
    [Arg("w_id", "int", min_value=1), Arg("o_carrier_id", "int", min_value=1, max_value=10)],
    _delivery_footprint,
    recon="tpcc.delivery_recon",
)
def delivery(ctx: Context, w_id: int, o_carrier_id: int, prediction: Any) -> Any:
    """Delivery (clause 2.7.4.2) of one warehouse: in each district, the oldest new order
    is delivered (new-order row deleted, o_carrier_id set, order lines dated, customer
    balance += sum(ol_amount), c_delivery_cnt += 1); a district without one is skipped.

    A dependent transaction: the customers it updates are predicted. If the oldest new
    order of some district belongs to a customer outside the prediction, it returns
    Restart(fresh prediction) and writes nothing. Returns the delivered o_id per district
    (None where skipped): the content of the deferred-execution result (clause 2.7.2.2).
    """
    get, put = ctx.get, ctx.put
    chosen: list[tuple[int, int] | None] = []
    for d_id, (lo, c_ids) in zip(_WAREHOUSE_DISTRICTS, prediction, strict=True):
        o_id = oldest_new_order(ctx, w_id, d_id, lo)
        if o_id is None:
            chosen.append(None)
            continue
        o = get(ORDERS, (w_id, d_id, o_id))
        if o is None or o[O_C_ID] not in c_ids:
            return Restart(delivery_prediction(ctx, w_id))
        chosen.append((o_id, o[O_C_ID]))
    ts = ctx.timestamp_ms
    delivered: list[int | None] = []
    for d_id, pick in zip(_WAREHOUSE_DISTRICTS, chosen, strict=True):
        if pick is None:
            delivered.append(None)
            continue
        o_id, c_id = pick
        ctx.delete(NEW_ORDER, (w_id, d_id, o_id))
        o = get(ORDERS, (w_id, d_id, o_id))
        if o is None:  # a NEW-ORDER row without its ORDER: the database is inconsistent
            raise LookupError(f"order {(w_id, d_id, o_id)} of a new-order row is missing")
        put(ORDERS, (w_id, d_id, o_id), o[:O_CARRIER_ID] + (o_carrier_id,) + o[O_CARRIER_ID + 1 :])
        amount = 0
        for key, ol in ctx.scan(ORDER_LINE, (w_id, d_id, o_id)):
            amount += ol[OL_AMOUNT]
            put(ORDER_LINE, key, ol[:OL_DELIVERY_D] + (ts,) + ol[OL_DELIVERY_D + 1 :])
        c_key = (w_id, d_id, c_id)
        c = get(CUSTOMER, c_key)
        if c is None:
            raise LookupError(f"customer {c_key} of order {o_id} is missing")
        put(
            CUSTOMER,
            c_key,
            c[:C_BALANCE]
            + (c[C_BALANCE] + amount,)
            + c[C_BALANCE + 1 : C_DELIVERY_CNT]
            + (c[C_DELIVERY_CNT] + 1,)
            + c[C_DELIVERY_CNT + 1 :],
        )
        delivered.append(o_id)
    return tuple(delivered)


# --- Order-Status (clause 2.6) and Stock-Level (clause 2.8): read-only -------------------


@procedure(
    "tpcc.order_status",
    [
        Arg("w_id", "int", min_value=1),
        Arg("d_id", "int", min_value=1, max_value=DISTRICTS_PER_WAREHOUSE),
        Arg("c_id", "int", min_value=0, max_value=CUSTOMERS_PER_DISTRICT),
        _C_LAST,
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


# --- Consistency (clause 3.3.2) ---------------------------------------------------------


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
    for d_id in _WAREHOUSE_DISTRICTS:
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


def _check_layout() -> None:
    """The row rewrites above slice rows by column position; fail at import if the
    schema's column order changes under them."""
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
