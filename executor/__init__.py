"""The executor layer: what a replica does with the ordered log.

core (storage, context, execution, checkpoints, genesis) is below the two engines,
deterministic (Calvin's: the partition role, the in-process replica, the serial
oracle, the simulator) and traditional (the 2PL+2PC baseline), which never import
each other; replay sits on top. No sockets, clocks or configuration files here: the
cluster layer runs these roles as processes (docs/ARCHITECTURE.md).
"""

from txn_library import native

native.install()  # before any compiled module is imported (txn_library.native)
