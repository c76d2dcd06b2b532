"""What a sequencer answers to ``cluster.info`` (txn_library.wire.sequencer REQ_CLUSTER_INFO): where
the cluster's snapshot and read-committed queries go, so a client that has one
sequencer's address can query without the cluster directory (docs/QUERIES.md).

Invariant: public keys only. The map is built from the config and the server roles'
public keys (``SocketSecurity.servers``); no secret is ever read here.
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster.config import ClusterConfig
from cluster.security import partition_role, reader_role


def cluster_info(config: ClusterConfig, public_keys: Mapping[str, bytes]) -> dict:
    """The REP_CLUSTER_INFO map of ``config``'s cluster; ``public_keys``: every server
    role's public key by role name (empty when the cluster runs without CURVE)."""
    partitions = config.query_addrs()
    readers = config.reader_addrs
    info: dict = {
        "partitions": partitions,
        "readers": readers,
        "partition_keys": None,
        "reader_keys": None,
        # whether the replicas' partitions can answer a snapshot at an older epoch (a
        # client with no reader to ask says why, ClusterConfig.replica_versions)
        "replica_versions": config.replica_versions,
    }
    if config.curve:
        info["partition_keys"] = [
            [public_keys[partition_role(r, p)] for p in range(config.partitions)]
            for r in range(config.replicas)
        ]
        info["reader_keys"] = [public_keys[reader_role(i)] for i in range(config.readers)]
    return info
