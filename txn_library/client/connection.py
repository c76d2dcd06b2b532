"""A client's socket to one sequencer: a DEALER (CURVE keys set when given), and a
monitor that tells when its connection drops.

Used by ``txn_library.client.Client`` and the load generator (cluster/load_sockets.py);
with txn_library.client, the one place below cluster/ that opens sockets (the
import-linter contract names both).

Invariants: a DEALER never lingers and has no high-water marks (the client bounds what
it has in flight: ``limits.client_in_flight_max``, ``limits.loadgen_in_flight_max``);
its CURVE keys are set before it connects; every monitor has an inproc endpoint of its
own; a monitor is stopped on its socket before its reading end closes (``unwatch``,
``close_watched``), or libzmq's I/O thread blocks on its next event.
"""

from __future__ import annotations

import itertools
import logging

import zmq

from txn_library.wire.curve import ClientCurve

_MONITORS = itertools.count()  # unique inproc endpoints for connection monitors
log = logging.getLogger(__name__)


def connect_dealer(ctx: zmq.Context, address: str, curve: ClientCurve | None) -> zmq.Socket:
    """A DEALER connected to ``address`` (CURVE with ``curve``'s keys, if given)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    if curve is not None:
        sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.client_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.client_secret)
        sock.setsockopt(zmq.CURVE_SERVERKEY, curve.server_public)
    try:
        sock.connect(address)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


def watch(sock: zmq.Socket, poller: zmq.Poller, owner: object, address: str) -> zmq.Socket | None:
    """Monitor ``sock``'s connection (its drop moves the client at once): the monitor
    socket, registered with ``poller``, or None if it cannot be made. The endpoint is
    unique per monitor: pyzmq's default names it by the socket's file descriptor, which a
    quickly closed and reopened socket reuses while the old endpoint may still be bound.
    Without a monitor the silence rule still holds."""
    addr = f"inproc://ordo-client-monitor-{id(owner):x}-{next(_MONITORS)}"
    try:
        mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED, addr=addr)
    except zmq.ZMQError as e:
        log.warning("ordo client: cannot watch the connection to %s: %s", address, e)
        return None
    poller.register(mon, zmq.POLLIN)
    return mon


def unwatch(sock: zmq.Socket, mon: zmq.Socket | None, poller: zmq.Poller) -> None:
    """Stop and close ``watch``'s monitor of ``sock`` (None: there is none)."""
    if mon is not None:
        poller.unregister(mon)
        try:
            sock.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket is about to close anyway
        mon.close(linger=0)


def close_watched(sock: zmq.Socket, mon: zmq.Socket | None) -> None:
    """Close ``sock`` and ``watch``'s monitor of it (None: none), the monitor stopped
    first. libzmq's I/O thread sends each event to the monitor with a blocking send: a
    monitor whose reading end closed while the socket still watches it blocks that
    thread at the next event (a drop, a refused handshake), and with it every socket of
    the context, for good: every later connection of the process, the client's and any
    other, then times out (the test suite's flake, issue 45)."""
    if mon is not None:
        try:
            sock.disable_monitor()
        except zmq.ZMQError:
            pass  # already closed
        mon.close(linger=0)
    sock.close(linger=0)


def drain_drops(mon: zmq.Socket) -> bool:
    """Take the monitor's waiting events; True if there was one (only
    EVENT_DISCONNECTED is monitored: the connection dropped)."""
    dropped = False
    while mon.poll(0):
        mon.recv_multipart()
        dropped = True
    return dropped
