"""TPC-C terminal inputs (clauses 2.4.1, 2.5.1, 2.6.1, 2.7.1, 2.8.1) as Ordo calls.

``TpccInputs.next(terminal)`` draws one transaction for a terminal: its type from the
mix, its inputs per the spec, and returns a ``Call`` (kind, procedure, args,
multi-partition flag). Shared by the driver (``ordo tpcc run``), the locust file and
the tests, so all of them send the same workload.

Determinism: everything comes from one ``TpccRandom`` seeded by the caller, with the
run-time NURand constants C derived from the load-time ones (clause 2.1.6.1), so a
seed reproduces the same stream of calls. Terminals are bound to a home warehouse
(and a district, for Stock-Level) as in clause 2.8.1.1 / 5.2.

Not modelled: keying and think times (clause 5.2.5). The driver runs terminals
back-to-back (closed loop) or at a fixed rate (open loop); see docs/TPCC.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpcc.loader import load_c
from tpcc.schema import (
    CUSTOMERS_PER_DISTRICT,
    DISTRICTS_PER_WAREHOUSE,
    ITEMS,
    WAREHOUSE,
)
from tpcc.tpcc_random import A_C_ID, A_C_LAST, A_OL_I_ID, LAST_NAMES, NURandC, TpccRandom
from tpcc.tpcc_random import derive_seed as _derive_seed
from tpcc.transactions.new_order import UNUSED_I_ID
from txn_library import placement

NEW_ORDER = "new_order"
PAYMENT = "payment"
ORDER_STATUS = "order_status"
DELIVERY = "delivery"
STOCK_LEVEL = "stock_level"
KINDS = (NEW_ORDER, PAYMENT, ORDER_STATUS, DELIVERY, STOCK_LEVEL)

# Percent of each kind. "standard" meets the minimum mix of clause 5.2.3 (Payment 43%,
# Order-Status, Delivery, Stock-Level 4% each), New-Order takes the rest.
MIXES: dict[str, dict[str, int]] = {
    "new-order": {NEW_ORDER: 100},
    "standard": {NEW_ORDER: 45, PAYMENT: 43, ORDER_STATUS: 4, DELIVERY: 4, STOCK_LEVEL: 4},
}

REMOTE_LINE_PCT_DEFAULT = 1  # clause 2.4.1.5: 1% of order lines from a remote warehouse
REMOTE_PAYMENT_PCT = 15  # clause 2.5.1.2
BY_NAME_PCT = 60  # clauses 2.5.1.2 and 2.6.1.2
ROLLBACK_PCT = 1  # clause 2.4.1.4
H_AMOUNT_MIN, H_AMOUNT_MAX = 100, 500_000  # 1.00 .. 5,000.00 (clause 2.5.1.3)


@dataclass(frozen=True)
class Call:
    kind: str
    proc: str
    args: tuple
    multi_partition: bool = False


@dataclass(frozen=True)
class Terminal:
    """A terminal's fixed home warehouse and district (clause 2.8.1.1)."""

    w_id: int
    d_id: int


def terminals_for(count: int, warehouses: int) -> list[Terminal]:
    """``count`` terminals spread evenly over warehouses, then districts."""
    return [
        Terminal(t % warehouses + 1, (t // warehouses) % DISTRICTS_PER_WAREHOUSE + 1)
        for t in range(count)
    ]


class TpccInputs:
    def __init__(
        self,
        warehouses: int,
        partitions: int,
        seed: int,
        *,
        load_seed: int,
        mix: str = "new-order",
        remote_line_pct: float = REMOTE_LINE_PCT_DEFAULT,
        payment_by_name_proc: str = "tpcc.payment_by_name",
    ) -> None:
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {sorted(MIXES)}")
        if warehouses < 1:
            raise ValueError("warehouses must be >= 1")
        self.warehouses = warehouses
        self.partitions = partitions
        rng0 = TpccRandom(_derive_seed(seed, "driver-c-run"))
        c_run = NURandC.for_run(load_c(load_seed), rng0)
        self.rng = TpccRandom(_derive_seed(seed, "driver"), c=c_run)
        self.remote_line_pct = remote_line_pct
        self.payment_by_name_proc = payment_by_name_proc
        weights = MIXES[mix]
        self._cumulative: list[tuple[int, str]] = []
        acc = 0
        for kind in KINDS:
            if weights.get(kind):
                acc += weights[kind]
                self._cumulative.append((acc, kind))
        self._total = acc
        self._part = [
            placement.partition_of(WAREHOUSE, (w,), partitions) for w in range(warehouses + 1)
        ]  # index 0 unused
        self._draw = {
            NEW_ORDER: self.new_order,
            PAYMENT: self.payment,
            ORDER_STATUS: self.order_status,
            DELIVERY: self.delivery,
            STOCK_LEVEL: self.stock_level,
        }

    def next(self, terminal: Terminal) -> Call:
        x = self.rng.uniform(1, self._total)
        for bound, kind in self._cumulative:
            if x <= bound:
                return self._draw[kind](terminal)
        raise AssertionError("unreachable: the mix covers 1..total")

    def _other_warehouse(self, w_id: int) -> int:
        other = self.rng.uniform(1, self.warehouses - 1)
        return other if other < w_id else other + 1

    def new_order(self, terminal: Terminal) -> Call:
        """Clause 2.4.1: NURand customer and items, 5..15 lines, 1% rollbacks (last item
        unused), ``remote_line_pct`` % of lines supplied by another warehouse."""
        r = self.rng
        w_id = terminal.w_id
        d_id = r.uniform(1, DISTRICTS_PER_WAREHOUSE)
        c_id = r.nurand(A_C_ID, 1, CUSTOMERS_PER_DISTRICT)
        ol_cnt = r.uniform(5, 15)
        rollback = r.uniform(1, 100) <= ROLLBACK_PCT
        remote_ok = self.warehouses > 1 and self.remote_line_pct > 0
        i_ids, supply, quantities = [], [], []
        multi = False
        home_part = self._part[w_id]
        for n in range(ol_cnt):
            i_ids.append(r.nurand(A_OL_I_ID, 1, ITEMS))
            sw = w_id
            if remote_ok and r.chance(self.remote_line_pct):
                sw = self._other_warehouse(w_id)
                if self._part[sw] != home_part:
                    multi = True
            supply.append(sw)
            quantities.append(r.uniform(1, 10))
            if rollback and n == ol_cnt - 1:
                i_ids[-1] = UNUSED_I_ID
        return Call(
            NEW_ORDER, "tpcc.new_order", (w_id, d_id, c_id, i_ids, supply, quantities), multi
        )

    def payment(self, terminal: Terminal) -> Call:
        """Clause 2.5.1: 85% home district, 15% a remote warehouse's customer; 60% by
        last name (a dependent transaction), 40% by number."""
        r = self.rng
        w_id = terminal.w_id
        d_id = r.uniform(1, DISTRICTS_PER_WAREHOUSE)
        if self.warehouses > 1 and r.uniform(1, 100) <= REMOTE_PAYMENT_PCT:
            c_w_id = self._other_warehouse(w_id)
            c_d_id = r.uniform(1, DISTRICTS_PER_WAREHOUSE)
        else:
            c_w_id, c_d_id = w_id, d_id
        multi = self._part[c_w_id] != self._part[w_id]
        h_amount = r.uniform(H_AMOUNT_MIN, H_AMOUNT_MAX)
        if r.uniform(1, 100) <= BY_NAME_PCT:
            c_last = LAST_NAMES[r.nurand(A_C_LAST, 0, 999)]
            args: tuple = (w_id, d_id, c_w_id, c_d_id, c_last, h_amount)
            return Call(PAYMENT, self.payment_by_name_proc, args, multi)
        c_id = r.nurand(A_C_ID, 1, CUSTOMERS_PER_DISTRICT)
        return Call(PAYMENT, "tpcc.payment", (w_id, d_id, c_w_id, c_d_id, c_id, h_amount), multi)

    def order_status(self, terminal: Terminal) -> Call:
        """Clause 2.6.1: home warehouse, random district, 60% by last name."""
        r = self.rng
        d_id = r.uniform(1, DISTRICTS_PER_WAREHOUSE)
        if r.uniform(1, 100) <= BY_NAME_PCT:
            c_id, c_last = 0, LAST_NAMES[r.nurand(A_C_LAST, 0, 999)]
        else:
            c_id, c_last = r.nurand(A_C_ID, 1, CUSTOMERS_PER_DISTRICT), ""
        return Call(ORDER_STATUS, "tpcc.order_status", (terminal.w_id, d_id, c_id, c_last))

    def delivery(self, terminal: Terminal) -> Call:
        """Clause 2.7.1: home warehouse, o_carrier_id uniform in 1..10."""
        return Call(DELIVERY, "tpcc.delivery", (terminal.w_id, self.rng.uniform(1, 10)))

    def stock_level(self, terminal: Terminal) -> Call:
        """Clause 2.8.1: the terminal's own district, threshold uniform in 10..20."""
        args = (terminal.w_id, terminal.d_id, self.rng.uniform(10, 20))
        return Call(STOCK_LEVEL, "tpcc.stock_level", args)
