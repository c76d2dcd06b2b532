"""The ``ordo`` commands, one module per kind: running the cluster's processes (run),
a client's (client), checkpoints and the command log (checkpoints), and what they
share (common). cluster/cli.py assembles them into the ``ordo`` group; none of them
imports it.
"""
