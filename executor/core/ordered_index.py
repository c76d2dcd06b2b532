"""The sorted key index of one ordered table: prefix scans in key order.

Keys are grouped by their first ``group_len`` parts (``catalog.Table.index_prefix``: by
default the table's lock prefix, TPC-C's district, or one part fewer than the key when
rows are locked one by one; ORDER_BY_CUSTOMER groups by customer). A group is
a plain sorted list while its keys arrive in increasing order, which is how TPC-C's
keys grow (order ids per district), so an insert is one dict lookup, one comparison
and an append; the first key that arrives out of order turns that group into a
SortedList for good (TPC-C's ORDER_BY_CUSTOMER). The groups' prefixes are kept in a
SortedList, for scans of a prefix shorter than a group's and for iteration in order.

Replaced one SortedList per table (sortedcontainers' add is ~1.5 us of Python per key;
New Order inserts 13 index keys).

Invariants (checked by ``check``): every group is non-empty and sorted, holds exactly
the keys that start with its prefix, and ``prefixes`` holds exactly the groups'
prefixes; ``len`` is the number of keys. Iteration is in key order because a group's
prefix orders all of its keys against every other group's.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import TypeAlias

from sortedcontainers import SortedList

from txn_library.errors import invariant

Group: TypeAlias = "list[tuple] | SortedList"  # a list while keys came in order


class OrderedIndex:
    __slots__ = ("group_len", "groups", "prefixes", "_len")

    def __init__(self, group_len: int, keys: Iterable[tuple] = ()) -> None:
        invariant(group_len >= 0, "a group prefix has a length")
        self.group_len = group_len
        self.groups: dict[tuple, Group] = {}
        ordered = sorted(keys)  # ~linear: a loaded table's keys are mostly in order
        if group_len == 0:
            if ordered:
                self.groups[()] = ordered
        else:  # cut the sorted keys where the prefix changes: gallop, then bisect
            part = itemgetter(*range(group_len))
            groups = self.groups
            i, n = 0, len(ordered)
            while i < n:
                first = ordered[i]
                want = part(first)
                lo = hi = i + 1  # ordered[i:lo] share the prefix; ordered[hi] may not
                while hi < n and part(ordered[hi]) == want:
                    lo = hi + 1
                    hi = i + 2 * (hi - i)
                j = bisect_right(ordered, want, lo, min(hi, n), key=part)
                groups[first[:group_len]] = ordered[i:j]
                i = j
        self.prefixes = SortedList(self.groups)
        self._len = len(ordered)
        invariant(self._len == sum(map(len, self.groups.values())), "a key appears twice")

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple]:
        groups = self.groups
        for prefix in self.prefixes:
            yield from groups[prefix]

    def add(self, key: tuple) -> None:
        """Insert a key the index does not hold."""
        prefix = key[: self.group_len]
        group = self.groups.get(prefix)
        if group is None:
            self.groups[prefix] = [key]
            self.prefixes.add(prefix)
        elif isinstance(group, list):
            if key > group[-1]:
                group.append(key)
            else:  # out of order: this group is a SortedList from now on
                group = self.groups[prefix] = SortedList(group)
                group.add(key)
        else:
            group.add(key)
        self._len += 1

    def remove(self, key: tuple) -> None:
        """Remove a key the index holds."""
        prefix = key[: self.group_len]
        group = self.groups[prefix]
        if isinstance(group, list):
            i = bisect_left(group, key)
            invariant(i < len(group) and group[i] == key, "removing a key the index lacks")
            del group[i]
        else:
            group.remove(key)
        if not group:
            del self.groups[prefix]
            self.prefixes.remove(prefix)
        self._len -= 1

    def update(self, keys: Iterable[tuple]) -> None:
        """Insert keys the index does not hold (in order: appends where they can be)."""
        for key in sorted(keys):
            self.add(key)

    def starting_with(self, prefix: tuple) -> Iterator[tuple]:
        """Keys that start with ``prefix``, in key order."""
        n = len(prefix)
        gl = self.group_len
        if n >= gl:
            group = self.groups.get(prefix[:gl])
            if group is None:
                return
            if n == gl:
                yield from group
                return
            if isinstance(group, list):  # by position: a slice would copy the group's tail
                i, end = bisect_left(group, prefix), len(group)
                while i < end and group[i][:n] == prefix:
                    yield group[i]
                    i += 1
                return
            for key in group.irange(minimum=prefix):
                if key[:n] != prefix:
                    return
                yield key
            return
        groups = self.groups
        for gp in self.prefixes.irange(minimum=prefix):
            if gp[:n] != prefix:
                return
            yield from groups[gp]

    def copy(self) -> OrderedIndex:
        """An independent index with the same keys (and the same group kinds)."""
        dup = OrderedIndex(self.group_len)
        dup.groups = {
            p: g.copy() if isinstance(g, list) else SortedList(g) for p, g in self.groups.items()
        }
        dup.prefixes = SortedList(self.prefixes)
        dup._len = self._len
        return dup

    def check(self) -> None:
        """Assert the module docstring's invariants (tests, recompute_hash)."""
        gl = self.group_len
        invariant(list(self.prefixes) == sorted(self.groups), "prefixes are the groups'")
        total = 0
        for prefix, group in self.groups.items():
            keys: list[tuple] = list(group)
            invariant(bool(keys), "no empty group")
            invariant(keys == sorted(set(keys)), "a group is sorted, without repeats")
            invariant(all(k[:gl] == prefix for k in keys), "a group holds its prefix's keys")
            total += len(keys)
        invariant(total == self._len, "the index counts its keys")
