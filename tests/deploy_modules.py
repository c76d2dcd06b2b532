"""Procedure modules the tests deploy through the log (``ordo deploy``,
txn_library.deployed)."""

from __future__ import annotations


def bump_module(version: int, name: str = "demo.bump") -> bytes:
    """A module whose procedure ``name`` adds ``version`` to a kv row and answers
    ``["v<version>", the new value]``: which version ran is in every answer."""
    return f'''
from txn_library.procedure import Footprint, procedure


@procedure("{name}", [("key", "str")],
           lambda key: Footprint(reads=(("kv", (key,)),), writes=(("kv", (key,)),)))
def bump(ctx, key):
    row = ctx.get("kv", (key,))
    value = (row[0] if row else 0) + {version}
    ctx.put("kv", (key,), (value,))
    return ["v{version}", value]
'''.encode()
