"""Built-in procedures for tests and demos: key-value get/put and a bank.

Tables:
  kv       key (k: str,)        row (value,)          placed by crc32c of the key
  account  key (account: int,)  row (balance_cents,)  placed by crc32c of the key

``bank.transfer`` aborts (a logical abort, a status) when the source is short of funds
or an account does not exist, so money is conserved under any interleaving.
"""

from __future__ import annotations

from typing import Any

from txn_library.catalog import Table, register_table
from txn_library.procedure import Abort, Arg, Footprint, procedure

KV = register_table(Table("kv", key_len=1, columns=("value",)))
ACCOUNT = register_table(Table("account", key_len=1, columns=("balance",)))

_ACCOUNTS_PER_CALL_MAX = 10_000


# Key-value --------------------------------------------------------------------
@procedure(
    "kv.put",
    [Arg("key", "str", max_len=1024), Arg("value", "any")],
    lambda key, value: Footprint(writes=(("kv", (key,)),)),
)
def kv_put(ctx: Any, key: str, value: Any) -> bool:
    """Set key to value."""
    ctx.put("kv", (key,), (value,))
    return True


@procedure(
    "kv.get",
    [Arg("key", "str", max_len=1024)],
    lambda key: Footprint(reads=(("kv", (key,)),)),
    read_only=True,
)
def kv_get(ctx: Any, key: str) -> Any:
    """The value of key, or None."""
    row = ctx.get("kv", (key,))
    return None if row is None else row[0]


@procedure(
    "kv.add",
    [Arg("key", "str", max_len=1024), Arg("delta", "int")],
    lambda key, delta: Footprint(reads=(("kv", (key,)),), writes=(("kv", (key,)),)),
)
def kv_add(ctx: Any, key: str, delta: int) -> int:
    """Add delta to an integer value (missing = 0); returns the new value."""
    row = ctx.get("kv", (key,))
    value = (row[0] if row is not None else 0) + delta
    ctx.put("kv", (key,), (value,))
    return value


# Bank -------------------------------------------------------------------------
def _acct(a: int) -> tuple[str, tuple]:
    return ("account", (a,))


@procedure(
    "bank.open",
    [
        Arg("first", "int", min_value=0),
        Arg("count", "int", min_value=1, max_value=_ACCOUNTS_PER_CALL_MAX),
        Arg("balance", "int", min_value=0),
    ],
    lambda first, count, balance: Footprint(
        reads=tuple(_acct(a) for a in range(first, first + count)),
        writes=tuple(_acct(a) for a in range(first, first + count)),
    ),
)
def bank_open(ctx: Any, first: int, count: int, balance: int) -> Any:
    """Open accounts first..first+count-1 with balance cents each; aborts if one exists."""
    for a in range(first, first + count):
        if ctx.get("account", (a,)) is not None:
            return Abort(f"account {a} already exists")
        ctx.put("account", (a,), (balance,))
    return count


@procedure(
    "bank.transfer",
    [Arg("src", "int"), Arg("dst", "int"), Arg("amount", "int", min_value=1)],
    lambda src, dst, amount: Footprint(
        reads=(_acct(src), _acct(dst)), writes=(_acct(src), _acct(dst))
    ),
)
def bank_transfer(ctx: Any, src: int, dst: int, amount: int) -> Any:
    """Move amount cents from src to dst; aborts on insufficient funds or unknown account."""
    s = ctx.get("account", (src,))
    d = ctx.get("account", (dst,))
    if s is None or d is None:
        return Abort(f"no account {src if s is None else dst}")
    if src == dst:
        return s[0]
    if s[0] < amount:
        return Abort("insufficient funds")
    ctx.put("account", (src,), (s[0] - amount,))
    ctx.put("account", (dst,), (d[0] + amount,))
    return s[0] - amount


@procedure(
    "bank.balance",
    [Arg("account", "int")],
    lambda account: Footprint(reads=(_acct(account),)),
    read_only=True,
)
def bank_balance(ctx: Any, account: int) -> Any:
    """Balance of one account in cents (None if it does not exist)."""
    row = ctx.get("account", (account,))
    return None if row is None else row[0]


@procedure(
    "bank.total",
    [
        Arg("first", "int", min_value=0),
        Arg("count", "int", min_value=1, max_value=_ACCOUNTS_PER_CALL_MAX),
    ],
    lambda first, count: Footprint(reads=tuple(_acct(a) for a in range(first, first + count))),
    read_only=True,
)
def bank_total(ctx: Any, first: int, count: int) -> int:
    """Sum of balances of a range of accounts: a serializable multi-partition read."""
    total = 0
    for a in range(first, first + count):
        row = ctx.get("account", (a,))
        if row is not None:
            total += row[0]
    return total
