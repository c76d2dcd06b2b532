"""Named messages on a positional wire: one family of message types per contract.

A message type is a NamedTuple of the fields after its kind; on the wire it travels as
the msgpack array ``[kind, *fields]`` (never a map). A ``Family`` maps the types of one
contract (client/sequencer, partition inbox, the baseline's peers) to their kinds, both
ways, so the sender writes and the receiver reads one named record.

Invariants: kinds are unique within a family; ``named`` returns an instance of the
type registered for the kind, with that type's fields (trailing fields with defaults
may be absent: records of older logs), or raises ValueError (the caller refuses the
message whole; nothing is half-applied).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from txn_library.errors import invariant


class Family:
    def __init__(self, kinds: dict[type, int]) -> None:
        self.kind_of = dict(kinds)
        self.type_of: dict[int, Any] = {kind: cls for cls, kind in kinds.items()}
        invariant(len(self.type_of) == len(self.kind_of), "two message types share a kind")

    def array(self, msg: NamedTuple) -> tuple:
        """``[kind, *fields]``: the positional array a named message travels as."""
        return (self.kind_of[type(msg)], *msg)

    def encode(self, msg: NamedTuple) -> bytes:
        return msgpack.packb(self.array(msg))

    def named(self, array: Any) -> Any:
        """The named message of a decoded ``[kind, *fields]``; ValueError otherwise."""
        if not isinstance(array, tuple) or not array:
            raise ValueError("a message is [kind, ...]")
        cls = self.type_of.get(array[0]) if type(array[0]) is int else None
        if cls is None:
            raise ValueError(f"unknown message kind {array[0]!r:.20}")
        try:
            return cls(*array[1:])
        except TypeError:  # too many fields, or a field without a default missing
            raise ValueError(
                f"{cls.__name__} has {len(cls._fields)} fields, not {len(array) - 1}"
            ) from None
