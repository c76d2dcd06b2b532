"""Delivery (TPC-C clause 2.7): ``tpcc.delivery(w_id, o_carrier_id)`` delivers the oldest
new order of each district of a warehouse, in one transaction.

A dependent transaction: its recon ``tpcc.delivery_recon`` predicts, per district, the
oldest new-order id and the customers of the DELIVERY_PREDICTION_DEPTH oldest new
orders; the sequencer appends the prediction, the transaction locks those customers and
returns Restart(fresh prediction), writing nothing, when the oldest new order of some
district belongs to a customer outside it.

Invariant relied on: NEW-ORDER ids of a district are contiguous (consistency condition
3): New-Order appends d_next_o_id and Delivery removes the oldest. Delivery and its recon
find the oldest new order by probing (a binary search over [1, d_next_o_id - 1]) rather
than scanning the ~900 rows of the district.
"""

from __future__ import annotations

from typing import Any

from tpcc.schema import (
    C_BALANCE,
    C_DELIVERY_CNT,
    CUSTOMER,
    D_NEXT_O_ID,
    DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    NEW_ORDER,
    O_C_ID,
    O_CARRIER_ID,
    OL_AMOUNT,
    OL_DELIVERY_D,
    ORDER_LINE,
    ORDERS,
)
from tpcc.transactions.common import WAREHOUSE_DISTRICTS, bad_arguments, is_int
from txn_library.procedure import Arg, Context, Footprint, Restart, procedure

# Delivery predicts (and locks) the customers of this many oldest new orders per
# district, so that a prediction survives Deliveries of the same warehouse sequenced
# between its recon and its execution (each moves every district's oldest new order
# forward by one). With 100 closed-loop terminals per warehouse, ~4 Deliveries of a
# warehouse are in flight at once: depth 3 restarted ~90% of them, depth 10 almost none.
DELIVERY_PREDICTION_DEPTH = 10

DistrictPrediction = tuple[int, tuple[int, ...]]  # (oldest o_id or d_next_o_id, c_ids)


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
                and is_int(entry[0])
                and isinstance(entry[1], (tuple, list))
                and len(entry[1]) <= DELIVERY_PREDICTION_DEPTH
                and all(is_int(c) for c in entry[1])
            ):
                ok = False
                break
    if not ok:
        raise bad_arguments(f"tpcc.delivery: malformed prediction {prediction!r}")


def _delivery_footprint(w_id: int, o_carrier_id: int, prediction: Any) -> Footprint:
    _check_delivery_prediction(prediction)
    reads: list = []
    writes: list = []
    for d_id, (_lo, c_ids) in zip(WAREHOUSE_DISTRICTS, prediction, strict=True):
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
    for d_id, (lo, c_ids) in zip(WAREHOUSE_DISTRICTS, prediction, strict=True):
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
    for d_id, pick in zip(WAREHOUSE_DISTRICTS, chosen, strict=True):
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
