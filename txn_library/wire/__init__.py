"""The wire formats: every message that crosses a socket, as positional msgpack arrays.

sequencer.py is the sequencer's contract (client intake, batches, the log service,
``cluster.info``), partition.py the executor's (what partitions send and receive),
reader.py a reader's one socket, messages.py the named-message machinery they share
(``Family``), curve.py a client's CURVE credentials. Nothing here opens a socket.

Invariants: a message kind is one NamedTuple in exactly one module here, decoded and
checked against the limits table before anything acts on it; no module here imports
the client, the workloads or any layer above txn_library.
"""
