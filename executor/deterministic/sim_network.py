"""Discrete-event loop, simulated clock and simulated network of the cluster simulator.

One priority queue of ``(time_us, seq, callback, args)``: the clock jumps from event to
event, ties are broken by the order events were scheduled, so a run is a pure function
of its seed. Nothing here reads the wall clock, sleeps, or touches a socket.

The network gives ZeroMQ's guarantees and nothing stronger:
- Every channel ``(sender, receiver, kind)`` is FIFO (TCP under ZeroMQ): a message is
  delivered after a random delay but never before an earlier one on its channel.
- PUB/SUB messages (``lossy=True``) may be dropped (slow joiner, high-water mark).
- A message is lost if its receiver crashes before it arrives (it was in a dead TCP
  connection), and so is one still in its sender's queues (sent less than
  ``sender_queue_us`` before the sender crashed); older ones were in the kernel and
  still arrive.
- A message sent while its receiver is down is dropped, except on connecting
  sockets that queue until the peer is back (``park=True``: PUSH without
  ZMQ_IMMEDIATE, DEALER): it waits, and reaches the receiver's next incarnation
  unless its sender dies first.
- A paused process (``pause``: SIGSTOP, a long GC or VM stall) is alive and silent:
  what reaches it waits in its socket buffers, and its own timers (``NodeLoop``) do
  not fire; at ``resume`` both run, in the order they came due, at the resume time.
- A one-way cut (``cut(src, dst)``: a link that loses packets one way, TCP
  retransmitting) holds what ``src`` sends ``dst``, in order, until ``heal``; it
  then arrives, unless either end died meanwhile (the connection died with it).
  Cuts of the same link nest (each ``cut`` needs its ``heal``).
Payloads are bytes (or a tuple of byte frames), exactly what goes on the wire.

Observers (``Node.observer``: the readers) watch the cluster without changing its run:
every delay and drop of a message to or from an observer is drawn from the
observers' own generator (``observer_rng``), so adding observers to a seed leaves the
draws of the cluster's own messages, and so its history, as they were.

Invariants: time only grows; a node's incarnation only grows; a message is
delivered at most once, to the incarnation that was up when it was sent, never to a
paused node and never across a cut link; a node's held inputs keep their order;
traffic of an observer never draws from the cluster's generator.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from txn_library.errors import invariant

Payload = bytes | tuple[bytes, ...]
Deliver = Callable[[Payload], None]


class Trace:
    """A rolling digest of everything that happened (and, optionally, the lines)."""

    def __init__(self, keep: bool) -> None:
        self._hash = xxhash.xxh3_128()
        self.lines: list[str] | None = [] if keep else None

    def note(self, now_us: int, text: str) -> None:
        line = f"{now_us} {text}"
        self._hash.update(line.encode())
        self._hash.update(b"\n")
        if self.lines is not None:
            self.lines.append(line)

    def digest(self) -> str:
        return self._hash.hexdigest()


class EventLoop:
    def __init__(self) -> None:
        self.now_us = 0
        self.events = 0
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    def at(self, when_us: int, fn: Callable[..., None], *args: Any) -> None:
        invariant(when_us >= self.now_us, f"event scheduled in the past ({when_us})")
        heapq.heappush(self._heap, (when_us, self._seq, fn, args))
        self._seq += 1

    def after(self, delay_us: int, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now_us + delay_us, fn, *args)

    def run(self, stop: Callable[[], bool], limit_us: int) -> bool:
        """Run events until ``stop()`` (checked after each) or the time limit; True if
        stopped by ``stop``."""
        heap = self._heap
        while heap:
            when, _, fn, args = heap[0]
            if when > limit_us:
                return False
            heapq.heappop(heap)
            self.now_us = when
            self.events += 1
            fn(*args)
            if stop():
                return True
        return False


@dataclass
class Node:
    """A simulated process: its name, whether it runs, and which life it is in."""

    name: str
    up: bool = True
    incarnation: int = 0
    crashed_at_us: int = -1
    observer: bool = False  # its traffic draws from Network.observer_rng
    paused: bool = False  # alive, silent: inputs and timers wait (Network.pause)


@dataclass
class LinkProfile:
    """Delay and loss of one run's network (drawn from the seed)."""

    delay_min_us: int = 30
    delay_max_us: int = 1_500
    spike_pct: float = 1.0  # share of messages delayed by a spike
    spike_max_us: int = 30_000
    pub_drop_pct: float = 0.0
    sender_queue_us: int = 100


@dataclass
class NetStats:
    sent: int = 0
    delivered: int = 0
    dropped_pub: int = 0
    lost_crash: int = 0
    parked: int = 0
    held_pause: int = 0  # messages that waited for a paused receiver
    held_cut: int = 0  # messages that waited for a cut link to heal
    lost_cut: int = 0  # ... and were lost: an end died before the heal
    by_kind: dict[str, int] = field(default_factory=dict)


class Network:
    def __init__(
        self,
        loop: EventLoop,
        rng: random.Random,
        profile: LinkProfile,
        trace: Trace,
        observer_rng: random.Random | None = None,
    ):
        self.loop = loop
        self.rng = rng
        self.observer_rng = observer_rng
        self.profile = profile
        self.trace = trace
        self.stats = NetStats()
        self._last_us: dict[tuple[str, str, str], int] = {}
        self._parked: dict[str, list[tuple[Node, int, str, Payload, Deliver]]] = {}
        self.in_flight = 0
        # Paused nodes' inputs and timers, in the order they came due (see ``pause``)
        self._held: dict[str, list[tuple[Callable[..., None], tuple[Any, ...]]]] = {}
        # One-way cuts: (src name, dst name) -> how many cuts hold the link
        self._cuts: dict[tuple[str, str], int] = {}
        self._cut_held: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        # Called for every message sent (the simulator's record of who answered what)
        self.tap: Callable[[Node, Node, str, Payload], None] | None = None

    # Pauses and one-way cuts -----------------------------------------------------------
    def pause(self, node: Node) -> None:
        """``node`` stops: what reaches it, and its own timers, wait until ``resume``."""
        node.paused = True

    def resume(self, node: Node) -> None:
        """``node`` runs again: everything it missed runs now, in the order it came due."""
        node.paused = False
        for fn, args in self._held.pop(node.name, []):
            self.loop.at(self.loop.now_us, fn, *args)

    def hold(self, node: Node, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        """An input or a timer of paused ``node``: runs at its resume."""
        self._held.setdefault(node.name, []).append((fn, args))

    def cut(self, src: Node, dst: Node) -> None:
        """What ``src`` sends ``dst`` is held from now until ``heal`` (one way)."""
        key = (src.name, dst.name)
        self._cuts[key] = self._cuts.get(key, 0) + 1

    def heal(self, src: Node, dst: Node) -> None:
        """Undo one ``cut``; once none holds the link, what it held goes on, in order."""
        key = (src.name, dst.name)
        n = self._cuts.get(key, 0) - 1
        invariant(n >= 0, f"heal of a link that is not cut: {key}")
        if n:
            self._cuts[key] = n
            return
        del self._cuts[key]
        for args in self._cut_held.pop(key, []):
            self.in_flight += 1
            self.loop.at(self.loop.now_us, self._arrive, *args)

    def _rng(self, src: Node, dst: Node) -> random.Random:
        if src.observer or dst.observer:
            invariant(self.observer_rng is not None, "an observer needs observer_rng")
            assert self.observer_rng is not None
            return self.observer_rng
        return self.rng

    def _delay_us(self, rng: random.Random) -> int:
        p = self.profile
        d = rng.randint(p.delay_min_us, p.delay_max_us)
        if p.spike_pct and rng.random() * 100.0 < p.spike_pct:
            d += rng.randint(0, p.spike_max_us)
        return d

    def send(
        self,
        src: Node,
        dst: Node,
        kind: str,
        payload: Payload,
        deliver: Deliver,
        lossy: bool = False,
        park: bool = False,
    ) -> None:
        """Queue ``payload`` from ``src`` to ``dst``; ``deliver(payload)`` runs on arrival."""
        stats = self.stats
        stats.sent += 1
        stats.by_kind[kind] = stats.by_kind.get(kind, 0) + 1
        if self.tap is not None:
            self.tap(src, dst, kind, payload)
        drop_pct = self.profile.pub_drop_pct
        if lossy and drop_pct and self._rng(src, dst).random() * 100 < drop_pct:
            stats.dropped_pub += 1
            self.trace.note(self.loop.now_us, f"drop {kind} {src.name}>{dst.name}")
            return
        if park and not dst.up:
            stats.parked += 1
            parked = self._parked.setdefault(dst.name, [])
            parked.append((src, src.incarnation, kind, payload, deliver))
            return
        self._schedule(src, dst, kind, payload, deliver)

    def reconnect(self, dst: Node) -> None:
        """``dst`` is up again: what connecting sockets queued for it goes out now."""
        for src, src_life, kind, payload, deliver in self._parked.pop(dst.name, []):
            if src.incarnation == src_life:  # else the queue died with its sender
                self._schedule(src, dst, kind, payload, deliver)

    def _schedule(
        self, src: Node, dst: Node, kind: str, payload: Payload, deliver: Deliver
    ) -> None:
        channel = (src.name, dst.name, kind)
        now = self.loop.now_us
        when = max(now + self._delay_us(self._rng(src, dst)), self._last_us.get(channel, 0))
        self._last_us[channel] = when
        self.in_flight += 1
        self.loop.at(
            when,
            self._arrive,
            src,
            src.incarnation,
            dst,
            dst.incarnation,
            now,
            kind,
            payload,
            deliver,
        )

    def _arrive(
        self,
        src: Node,
        src_life: int,
        dst: Node,
        dst_life: int,
        sent_us: int,
        kind: str,
        payload: Payload,
        deliver: Deliver,
    ) -> None:
        self.in_flight -= 1
        if self._cuts and (src.name, dst.name) in self._cuts:
            if src.incarnation == src_life and dst.incarnation == dst_life:
                self.stats.held_cut += 1
                self._cut_held.setdefault((src.name, dst.name), []).append(
                    (src, src_life, dst, dst_life, sent_us, kind, payload, deliver)
                )
                return
            self.stats.lost_cut += 1  # the connection died with an end
            return
        if dst.paused and dst.up and dst.incarnation == dst_life:
            self.stats.held_pause += 1
            self.in_flight += 1  # still on its way: it arrives at the resume
            self.hold(
                dst,
                self._arrive,
                (src, src_life, dst, dst_life, sent_us, kind, payload, deliver),
            )
            return
        lost = not dst.up or dst.incarnation != dst_life
        if (
            not lost
            and src.incarnation != src_life
            and src.crashed_at_us - sent_us < self.profile.sender_queue_us
        ):
            lost = True  # still in the dead sender's queues
        digest = xxhash.xxh3_64_hexdigest(
            payload if isinstance(payload, bytes) else b"".join(payload)
        )
        if lost:
            self.stats.lost_crash += 1
            self.trace.note(self.loop.now_us, f"lost {kind} {src.name}>{dst.name} {digest}")
            return
        self.stats.delivered += 1
        self.trace.note(self.loop.now_us, f"recv {kind} {src.name}>{dst.name} {digest}")
        deliver(payload)


class NodeLoop:
    """The event loop as one node sees it: its timers wait while it is paused
    (``Network.pause``), and its clock may be skewed (``skew_us``: a clock that jumped;
    it only shifts what ``now_us`` reads, never when events run)."""

    def __init__(self, loop: EventLoop, net: Network) -> None:
        self._loop = loop
        self._net = net
        self.node: Node | None = None  # set once the node exists
        self.skew_us = 0

    @property
    def now_us(self) -> int:
        return self._loop.now_us + self.skew_us

    def at(self, when_us: int, fn: Callable[..., None], *args: Any) -> None:
        real = max(self._loop.now_us, when_us - self.skew_us)
        self._loop.at(real, self._fire, fn, args)

    def after(self, delay_us: int, fn: Callable[..., None], *args: Any) -> None:
        self._loop.at(self._loop.now_us + delay_us, self._fire, fn, args)

    def _fire(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        node = self.node
        if node is not None and node.paused:
            self._net.hold(node, fn, args)
        else:
            fn(*args)
