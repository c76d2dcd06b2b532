"""The state hash of a partition, and the digests it keeps so that an overwrite hashes
the old row out without packing it again.

State hash: the sum mod 2**64 (``MASK64``) of xxh3_64(msgpack([table, key, row])) over
every row of every *partitioned* table a Storage holds. It is independent of dict order,
process and partition layout (the sum over partitions equals the hash of the whole
database), and costs O(1) per write (subtract the old row's digest, add the new).
Replicated read-only tables (TPC-C ITEM) are hashed separately (``Storage.static_hash``).
Replicas, recovery and replay compare it at epoch boundaries.

Digests of overwritten rows (``KeptDigests``): a transaction's overwrite keeps the
digest of the row it installs, so that the next overwrite of that row hashes it out with
one dict look-up instead of packing it again (a New Order overwrites 11 rows, its
district and ten stock rows, and re-packing them cost ~7% of a partition's
instructions, measured with callgrind). Inserted rows are not kept (most are never
overwritten), and at ``limits.overwritten_digests_max`` all are forgotten at once, so
the memory is bounded and nothing depends on what is kept.

Invariants (checked by ``Storage.recompute_hash``): a kept digest is the digest of its
key's row now; every path that changes a row outside ``Storage.apply`` drops its digest
(``drop``); a key kept is a decoded row (never pending); ``held`` counts the kept
digests of every table.
"""

from __future__ import annotations

from txn_library.errors import invariant

MASK64 = (1 << 64) - 1


class KeptDigests:
    __slots__ = ("by_table", "held")

    def __init__(self) -> None:
        self.by_table: dict[str, dict[tuple, int]] = {}  # table -> {key: its row's digest}
        self.held = 0  # how many, over all tables

    def add_table(self, table: str) -> None:
        self.by_table[table] = {}

    def drop(self, table: str, key: tuple) -> None:
        """Forget ``key``'s kept digest: its row changes outside ``Storage.apply``."""
        if self.by_table[table].pop(key, None) is not None:
            self.held -= 1

    def forget(self) -> None:
        """Forget every kept digest (at ``limits.overwritten_digests_max``)."""
        for kept in self.by_table.values():
            kept.clear()
        self.held = 0

    def check_count(self) -> None:
        invariant(sum(map(len, self.by_table.values())) == self.held, "kept digests miscounted")
