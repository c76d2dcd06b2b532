"""New-Order's order lines are checked before its footprint, with one reason per call.

The check runs at the sequencer (interpreted) and at every participant (compiled), so
the reason for a bad call must not depend on which value a loop meets first: any value
that is not an int (a bool is not) is reported before any value below 1, and that
before a quantity above QUANTITY_MAX.
"""

from __future__ import annotations

from typing import Any

import pytest

from tpcc.transactions.new_order import QUANTITY_MAX
from txn_library.errors import BadRequest
from txn_library.procedure import lookup

NEW_ORDER = lookup("tpcc.new_order")


def _reason(i_ids: Any, supply_w_ids: Any, quantities: Any) -> str | None:
    try:
        NEW_ORDER.footprint_of((1, 1, 1, i_ids, supply_w_ids, quantities))
    except BadRequest as e:
        return e.message
    return None


INTS = "tpcc.new_order: order lines hold integers"
POSITIVE = "tpcc.new_order: item ids, supply warehouses and quantities are >= 1"
QUANTITY = f"tpcc.new_order: quantities are <= {QUANTITY_MAX}"


@pytest.mark.parametrize(
    ("i_ids", "supply_w_ids", "quantities", "reason"),
    [
        ([1, 2, 3], [1, 1, 1], [1, 5, QUANTITY_MAX], None),
        ([1, True, 3], [1, 1, 1], [1, 1, 1], INTS),  # a bool is not an int here
        ([0, 2, 3], [1, 1, 1], [1, 1, "x"], INTS),  # not an int, though 0 comes first
        ([1, 2, 3], [1, 1.0, 1], [1, 1, 1], INTS),
        ([1, 2, 3], [1, 0, 1], [1, 1, 1], POSITIVE),
        ([1, 2, 3], [1, 1, 1], [QUANTITY_MAX + 1, 1, -1], POSITIVE),  # -1 before 11
        ([1, 2, 3], [1, 1, 1], [1, QUANTITY_MAX + 1, 1], QUANTITY),
        ([1, 2], [1], [1, 1], "same length"),
        ([], [], [], "same length"),
    ],
)
def test_order_lines(i_ids: list, supply_w_ids: list, quantities: list, reason: str | None) -> None:
    got = _reason(i_ids, supply_w_ids, quantities)
    if reason == "same length":
        assert got is not None and reason in got
    else:
        assert got == reason
