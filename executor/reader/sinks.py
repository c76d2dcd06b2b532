"""Sinks pushed from a reader: each subscriber of a stream gets every new batch of it
as the reader applies the epoch that made it (docs/STREAMS.md, "Sinks"), instead of
polling ``stream.read`` through a partition's lock manager.

The role owns no socket and no clock: ``on_message`` takes a subscriber's decoded
REQ_SUBSCRIBE / REQ_UNSUBSCRIBE (txn_library.wire.reader) with the time, and the owner
calls ``after_apply`` after the batches it applies; pushes accumulate in ``out`` by
client identity (``take``).

A page is what ``stream.read`` returns, run here on the reader's state at its applied
epoch (executor.reader.queries.run_at): the reader pushes exactly what a poll through
the sequencer would have read at that epoch. Delivery is at least once and in order
per subscription (ZeroMQ keeps a connection's frames in order; a frame lost to a
full queue or a reconnect is pushed again after ``limits.sink_resend_s`` without an
acknowledgement); the subscriber drops the ids it has taken, so it sees each batch
once, in order (txn_library.client.sinks). The subscriber's ``next_batch`` (sent on
every page it takes and every ``limits.sink_renew_s``) is its acknowledgement.

Invariants:
- A subscription's pushes are pages of consecutive batch ids from where the last one
  ended (or from the acknowledged id, when pushed again); never more than
  ``limits.sink_window_batches`` past the acknowledged id.
- At most ``limits.reader_subscriptions_max`` subscriptions, and at most
  ``limits.reader_subscriptions_per_client_max`` per client identity; a subscription
  not heard of for ``limits.sink_lease_s`` is dropped.
- Every subscribe is answered (a page, possibly empty, or an error), so a subscriber
  hears from a live reader at least every ``limits.sink_renew_s``.
- A reader that has not caught up since it started answers ``not_ready`` (the
  subscriber moves to another reader): its state is behind what the subscriber may
  already have taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from executor.core.storage import Storage
from executor.deterministic.snapshot import Snapshot, query_procedure
from executor.reader.follower import Follower
from executor.reader.queries import run_at
from txn_library import limits, placement
from txn_library.errors import (
    ERR_BAD_ARGUMENTS,
    ERR_NOT_READY,
    ERR_OVERLOADED,
    OK,
    BadRequest,
    invariant,
)
from txn_library.streams import stream_named
from txn_library.streams.spec import STREAMS, Stream
from txn_library.wire import reader as rwire

READ = "stream.read"


@dataclass(eq=False)
class _Sub:
    identity: bytes
    sub_id: int
    stream: Stream
    acked: int  # the next batch id the subscriber has not taken
    sent: int  # the next batch id to push
    heard: float  # when the subscriber last wrote
    progress: float  # when ``acked`` last moved, or the last push from ``acked``
    seen: tuple = ()  # the stream's (last, dropped) when last pushed: unchanged, no read


class ReaderSinks:
    def __init__(self, follower: Follower, name: str) -> None:
        self.follower = follower
        self.name = name  # "reader 0": how errors name this reader
        self.subs: dict[tuple[bytes, int], _Sub] = {}
        self.out: dict[bytes, list[rwire.SinkPush]] = {}
        self.pushed_batches = 0
        self.refused = 0

    # Subscribers ---------------------------------------------------------------------
    def on_message(self, identity: bytes, msg: Any, now: float) -> None:
        """A decoded REQ_SUBSCRIBE or REQ_UNSUBSCRIBE (checked here)."""
        problem = rwire.subscribe_problem(msg)
        if problem is not None:
            sub_id = msg[1] if isinstance(msg, tuple) and len(msg) > 1 else 0
            self._error(identity, sub_id if type(sub_id) is int else 0, ERR_BAD_ARGUMENTS, problem)
            return
        key = (identity, msg[1])
        if msg[0] == rwire.REQ_UNSUBSCRIBE:
            self.subs.pop(key, None)
            return
        _, sub_id, stream_name, next_batch = msg
        f = self.follower
        if not f.live:
            self._error(
                identity,
                sub_id,
                ERR_NOT_READY,
                f"{self.name} is catching up from the log (applied epoch {f.applied_epoch} "
                f"of {f.known_last_epoch}): subscribe at another reader",
            )
            return
        sub = self.subs.get(key)
        if sub is None:
            try:
                stream = stream_named(stream_name)
            except BadRequest as e:
                self._error(identity, sub_id, e.code, e.message)
                return
            mine = sum(1 for i, _ in self.subs if i == identity)
            if (
                len(self.subs) >= limits.reader_subscriptions_max
                or mine >= limits.reader_subscriptions_per_client_max
            ):
                self._error(
                    identity,
                    sub_id,
                    ERR_OVERLOADED,
                    f"{self.name} serves {len(self.subs)} subscriptions ({mine} of this "
                    f"client's; limits.reader_subscriptions_max = "
                    f"{limits.reader_subscriptions_max}, per client "
                    f"{limits.reader_subscriptions_per_client_max})",
                )
                return
            start = self._oldest_kept(stream) if next_batch is None else next_batch
            sub = self.subs[key] = _Sub(identity, sub_id, stream, start, start, now, now)
        elif sub.stream.name != stream_name:
            self._error(
                identity,
                sub_id,
                ERR_BAD_ARGUMENTS,
                f"subscription {sub_id} is to {sub.stream.name}, not {stream_name!r:.80}",
            )
            return
        sub.heard = now
        if next_batch is not None and next_batch > sub.acked:
            sub.acked, sub.progress = next_batch, now
            sub.sent = max(sub.sent, next_batch)
        elif sub.sent > sub.acked and now - sub.progress >= limits.sink_resend_s:
            sub.sent, sub.progress, sub.seen = sub.acked, now, ()  # lost: push again
        self._push(sub, answer=True)

    def after_apply(self, now: float) -> None:
        """Push what the epochs just applied made; drop the subscriptions past their lease."""
        for key, sub in list(self.subs.items()):
            if now - sub.heard >= limits.sink_lease_s:
                del self.subs[key]
                continue
            self._push(sub, answer=False)

    def take(self) -> dict[bytes, list[rwire.SinkPush]]:
        out, self.out = self.out, {}
        return out

    # Pages ---------------------------------------------------------------------------
    def _meta(self, stream: Stream) -> tuple:
        """The stream's (last batch id, last dropped id) now: one row, no body run."""
        key = (stream.home, stream.name)
        p = placement.partition_of(STREAMS, key, self.follower.partitions)
        storage: Storage = self.follower.storages[max(p, 0)]
        meta = storage.get(STREAMS, key)
        return () if meta is None else (meta[1], meta[3])

    def _oldest_kept(self, stream: Stream) -> int:
        meta = self._meta(stream)
        dropped = meta[1] if meta else None
        return 0 if dropped is None else dropped + 1

    def _push(self, sub: _Sub, answer: bool) -> None:
        room = sub.acked + limits.sink_window_batches - sub.sent
        seen = self._meta(sub.stream)
        if not answer and (room <= 0 or seen == sub.seen):
            return  # the window is full, or nothing new since the last push
        if room <= 0 or seen == sub.seen:  # a renewal: an empty page, as a heartbeat
            page: dict = {"batches": [], "first": None, "last": None, "dropped": None}
        else:
            page = self._read(sub, min(room, limits.stream_read_batches_max))
            batches = page["batches"]
            if batches:
                invariant(batches[0][0] >= sub.sent, "a page starts where the last one ended")
                sub.sent = batches[-1][0] + 1
                self.pushed_batches += len(batches)
            dropped = page.get("dropped")
            if dropped is not None and sub.sent <= dropped:
                sub.sent = dropped + 1  # the subscriber is told (a gap) and goes on or stops
            if len(batches) < min(room, limits.stream_read_batches_max):
                sub.seen = seen  # read to the end: nothing more until the stream moves
        self.out.setdefault(sub.identity, []).append(
            rwire.SinkPush(sub.sub_id, self.follower.applied_epoch, page)
        )

    def _read(self, sub: _Sub, max_batches: int) -> dict:
        f = self.follower
        args = (sub.stream.name, sub.sent, max_batches)
        proc, _ = query_procedure(READ, args, 1)  # checked; every partition is here
        status, value, _ = run_at(proc, args, [Snapshot(s, None) for s in f.storages], f.partitions)
        invariant(status == OK and isinstance(value, dict), "stream.read of a known stream")
        return value

    def _error(self, identity: bytes, sub_id: int, code: str, message: str) -> None:
        self.refused += 1
        self.out.setdefault(identity, []).append(
            rwire.SinkPush(sub_id, self.follower.applied_epoch, None, (code, message))
        )
