"""The client: what a program uses to call procedures, push to streams, query and subscribe.

``Client`` (core.py) owns one I/O thread and its DEALER socket to a sequencer; the
rest of this room is what it is made of, each without I/O of its own except
connection.py: protocol.py (calls encoded once, replies read), queries.py (the query
channel to readers or partitions), failover.py (which sequencer to talk to, and when to
move), connection.py (the socket and the monitor that tells when it drops) and
routing.py (``RoutingClient``, one Client per partition, for the 2PL baseline).

Invariant: the names below are the client's public API (``from txn_library.client
import Client``); the modules behind them may move, these imports may not.
"""

from txn_library.client.core import CLIENT_ID_BYTES_MAX, Client, ClientProtocol, Result, to_outcome
from txn_library.client.queries import QueryAnswer

__all__ = ["CLIENT_ID_BYTES_MAX", "Client", "ClientProtocol", "QueryAnswer", "Result", "to_outcome"]
