"""Sockets that more than one role server opens the same way.

A partition's inbox (PULL, bound at its address) and its PUSH sockets to the other
partitions of the same replica: the read exchange of the deterministic engine and the
lock/2PC messages of the baseline travel over this mesh. High-water marks are off
(the roles bound what they queue: txn_library/limits.py); a PUSH never lingers.
With CURVE on (``security``), the inbox admits role keys only, and every PUSH
authenticates the peer partition it connects to.
"""

from __future__ import annotations

import zmq

from cluster.config import ClusterConfig
from cluster.security import SocketSecurity, partition_role


def replica_mesh(
    ctx: zmq.Context,
    config: ClusterConfig,
    replica: int,
    partition: int,
    security: SocketSecurity | None = None,
) -> tuple[zmq.Socket, dict[int, zmq.Socket]]:
    """(inbox, {peer partition: PUSH}) of ``partition`` in ``replica``."""
    sec = security or SocketSecurity.off()
    inbox = ctx.socket(zmq.PULL)
    inbox.setsockopt(zmq.RCVHWM, 0)
    sec.server(inbox, clients=False)
    inbox.bind(config.partition_addr(replica, partition))
    peers: dict[int, zmq.Socket] = {}
    for q in range(config.partitions):
        if q != partition:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            sec.client(s, partition_role(replica, q))
            s.connect(config.partition_addr(replica, q))
            peers[q] = s
    return inbox, peers
