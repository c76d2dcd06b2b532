"""Payment (TPC-C clause 2.5): by customer number, ``tpcc.payment(w_id, d_id, c_w_id,
c_d_id, c_id, h_amount)``, and by last name, ``tpcc.payment_by_name(w_id, d_id, c_w_id,
c_d_id, c_last, h_amount)``.

Payment by last name is a dependent transaction: its recon ``tpcc.payment_recon``
predicts the c_id the name selects, the sequencer appends it, and the transaction
re-checks it under the lock on the name's customer_by_name prefix, returning
Restart(actual c_id) and writing nothing on a mismatch. ``tpcc.payment_by_name_rc`` is
the read-committed variant: it pays the predicted customer without the re-check.

Invariant: history rows are keyed (w_id, d_id, HISTORY_SEQ_BASE + txn id), above every
h_seq the loader uses, so a payment never overwrites a history row.
"""

from __future__ import annotations

from typing import Any

from tpcc.schema import (
    C_BALANCE,
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
    C_STREET_1,
    C_YTD_PAYMENT,
    C_ZIP,
    CUSTOMER,
    CUSTOMER_BY_NAME,
    CUSTOMERS_PER_DISTRICT,
    D_NAME,
    D_STREET_1,
    D_YTD,
    D_ZIP,
    DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    HISTORY,
    HISTORY_SEQ_LOADED_MAX,
    W_NAME,
    W_STREET_1,
    W_YTD,
    W_ZIP,
    WAREHOUSE,
)
from tpcc.transactions.common import C_LAST_ARG, bad_arguments, customer_by_last_name, is_int
from txn_library.procedure import Abort, Arg, Context, Footprint, Restart, procedure

H_AMOUNT_MAX = 500_000  # 5,000.00 (clause 2.5.1.3)
C_DATA_LEN_MAX = 500
C_DATA_SHOWN = 200  # clause 2.5.3.4: first 200 characters of c_data
HISTORY_SEQ_BASE = HISTORY_SEQ_LOADED_MAX + 1


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
    if predicted_c_id is not None and not is_int(predicted_c_id):
        raise bad_arguments(
            f"tpcc.payment_by_name: prediction must be a c_id, not {predicted_c_id!r}"
        )
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


@procedure(
    "tpcc.payment_recon",
    [*_PAYMENT_ARGS, C_LAST_ARG, _H_AMOUNT],
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
    [*_PAYMENT_ARGS, C_LAST_ARG, _H_AMOUNT],
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
    [*_PAYMENT_ARGS, C_LAST_ARG, _H_AMOUNT],
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
