"""The five TPC-C transactions (clauses 2.4-2.8) as Ordo stored procedures, one module
each, and the consistency procedure. Importing this package registers every one of
them, once: it is the name a cluster loads (``tpcc.driver.PROCEDURE_MODULES``).

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

Modules: new_order, payment (all four Payment procedures), order_status, delivery (with
its recon), stock_level, check (check_warehouse); common holds what several of them
share (the bad-argument error, the customer a last name selects, the row layout they
rewrite by column position, checked at import).

Footprints and lock granularity (``tpcc.schema``): warehouse, district and customer
rows and stock (w, i) are locked per row; orders, new_order, order_line,
order_by_customer and history lock per district (w, d), so a footprint names the
(w, d) prefix for rows whose ids are only known after reading d_next_o_id. Every
transaction that inserts into those tables also holds its district row exclusively,
so the coarser lock costs no concurrency. Read-only procedures run unsequenced at one
replica and use short prefixes (length >= place_len = 1).

Dependent transactions (docs/TPCC.md, "Dependent transactions"): the footprint of Payment
by last name depends on which customer the name selects, and that of Delivery on the
customers of the oldest new orders. A read-only reconnaissance procedure predicts
those keys; the real transaction locks them, re-computes the prediction under its
locks and returns ``Restart(actual)`` when the prediction no longer covers what it
must touch. A restart happens before any write, on every replica alike (the check
reads only locked rows), and the sequencer re-sequences the call with the fresh
prediction (at most ``limits.dependent_restarts_max`` times).

Invariant relied on (every module): determinism. Bodies use only their arguments, the
rows they read and ``ctx.timestamp_ms`` / ``ctx.txn_id``; all arithmetic is integer.
"""

from tpcc.transactions import (  # noqa: F401  (importing a module registers its procedures)
    check,
    delivery,
    new_order,
    order_status,
    payment,
    stock_level,
)
