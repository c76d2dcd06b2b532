"""Raw frames beside the load: input the client contract forbids, sent through one place.

The load generator speaks the client wire contract only. A hostile-input run
(scripts/fuzz_cluster.py) also sends what no client should: bytes that are not msgpack,
messages of the wrong shape, frames past the intake bounds, junk to the internal
sockets (the sequencer's results PULL, partitions' PULLs, the log service ROUTER), and
probes that read one exact reply. ``RawChannel`` holds those sockets by name; the
frames themselves are the caller's (what to send is the fuzz script's job, how it
travels is this module's).

``play`` sends a schedule of messages at their times (fractions of a duration), taking
replies as they come; ``ask`` sends one frame and waits for one reply.

Invariants: a send never blocks: a message the socket cannot queue now is not sent and
is counted so (``send`` returns False); every socket's queues are bounded by its
high-water marks (``sndhwm``, ``rcvhwm``); a socket never lingers; ``play`` ends by
``duration_s * (1 + PLAY_LATE_SHARE) + PLAY_LATE_S + PLAY_LINGER_S`` after it starts
(a message whose time comes later is counted as not sent).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

import zmq

PLAY_LATE_SHARE = 0.1  # a schedule may run this share of its duration late ...
PLAY_LATE_S = 2.0  # ... plus this long; later messages are not sent
PLAY_LINGER_S = 3.0  # replies are taken this long after the last message
PLAY_LINGER_POLL_S = 0.05

# Socket kinds a channel opens: DEALER (replies come back) or PUSH (one way).
DEALER, PUSH = zmq.DEALER, zmq.PUSH


@dataclass
class Played:
    """What ``play`` did, per message kind."""

    sent: Counter[str] = field(default_factory=Counter)
    sent_bytes: Counter[str] = field(default_factory=Counter)
    not_sent: Counter[str] = field(default_factory=Counter)  # send queue full or time up
    marked: list[tuple[float, str]] = field(default_factory=list)  # (s after start, kind)


class RawChannel:
    """Named sockets for raw frames, on a ZeroMQ context of its own. Not thread-safe.

    ``open(name, address, kind)`` connects a DEALER or PUSH; ``send`` queues a
    (multi-frame) message without blocking; ``replies`` takes what came back on the
    DEALERs.
    """

    def __init__(self, *, sndhwm: int = 64, rcvhwm: int = 256) -> None:
        self._ctx: zmq.Context = zmq.Context()
        self._sndhwm = sndhwm
        self._rcvhwm = rcvhwm
        self._socks: dict[str, zmq.Socket] = {}

    def open(self, name: str, address: str, kind: int = DEALER) -> None:
        """Connect socket ``name`` (once: a name already open is left as it is)."""
        if name in self._socks:
            return
        if kind not in (DEALER, PUSH):
            raise ValueError("a raw channel opens DEALER or PUSH sockets")
        s = self._ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, self._sndhwm)
        s.setsockopt(zmq.RCVHWM, self._rcvhwm)
        s.connect(address)
        self._socks[name] = s

    def send(self, name: str, frames: Sequence[bytes]) -> bool:
        """Queue one message of ``frames`` on ``name``; False if it cannot be now."""
        try:
            self._socks[name].send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def replies(self) -> Iterator[tuple[str, bytes]]:
        """(name, frame) of every reply waiting on the DEALER sockets."""
        for name, s in self._socks.items():
            if s.type != DEALER:
                continue
            while s.poll(0):
                yield name, s.recv()

    def ask(self, name: str, frame: bytes, timeout_s: float) -> bytes | None:
        """Send ``frame`` on DEALER ``name`` and wait for its next reply (None: none came
        within ``timeout_s``, or the frame could not be sent)."""
        if not self.send(name, [frame]):
            return None
        s = self._socks[name]
        if not s.poll(int(timeout_s * 1000)):
            return None
        return s.recv()

    def play(
        self,
        schedule: Sequence[tuple[float, str]],
        duration_s: float,
        message: Callable[[str], tuple[str, list[bytes]]],
        on_reply: Callable[[str, bytes], None],
        marked: Collection[str] = (),
    ) -> Played:
        """Send each (fraction of ``duration_s``, kind) of ``schedule`` (in order) at its
        time: ``message(kind)`` gives (socket name, frames), made when it is due.
        Replies go to ``on_reply(name, frame)`` after each send and for PLAY_LINGER_S
        after the last. Kinds in ``marked`` have their send times kept (``Played``)."""
        out = Played()
        start = time.monotonic()
        deadline = start + duration_s * (1 + PLAY_LATE_SHARE) + PLAY_LATE_S
        for i, (frac, kind) in enumerate(schedule):
            now = time.monotonic()
            if now > deadline:
                for _f, k in schedule[i:]:
                    out.not_sent[k] += 1
                break
            due = start + frac * duration_s
            if due > now:
                time.sleep(due - now)
            name, frames = message(kind)
            if self.send(name, frames):
                out.sent[kind] += 1
                out.sent_bytes[kind] += sum(len(f) for f in frames)
                if kind in marked:
                    out.marked.append((round(time.monotonic() - start, 3), kind))
            else:
                out.not_sent[kind] += 1
            self._take_replies(on_reply)
        end = time.monotonic() + PLAY_LINGER_S
        while time.monotonic() < end:  # late replies (bounded wait)
            self._take_replies(on_reply)
            time.sleep(PLAY_LINGER_POLL_S)
        return out

    def _take_replies(self, on_reply: Callable[[str, bytes], None]) -> None:
        for name, frame in self.replies():
            on_reply(name, frame)

    def close(self) -> None:
        for s in self._socks.values():
            s.close(linger=0)
        self._socks.clear()
        self._ctx.term()

    def __enter__(self) -> RawChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
