"""The traditional baseline: strict two-phase locking (wait-die) and two-phase commit
over the same storage and procedures, as a role with no sockets (docs/TRADITIONAL.md).

messages (wire contract and log records) < options, shared, attempt < intake,
coordinator, participant < partition (the role) < simulator (an in-process cluster)
and oracle (the serializability check).
"""
