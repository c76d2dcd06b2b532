"""Prometheus metrics for every role (docs/OPERATIONS.md lists them and the alerts).

  catalog.py    every metric: name, type, labels, meaning (the doc's table)
  buckets.py    histogram counts as plain numbers, added to by a role's loop
  endpoint.py   the HTTP endpoint (prometheus_client) and the collectors' base
  sequencer.py  the sequencer's: batches, procedures, outcomes, latency, queues
  roles.py      partitions', readers', the traditional mode's, the launcher's
  scrape.py     a Prometheus scrape configuration for a cluster

prometheus_client lives here, in cluster/, and nowhere below: the roles keep their
own counters and status, which these collectors read (never the reverse), and the
library runs only on its scrape thread. Each process serves at the address
cluster.json names for it (ClusterConfig.metrics_addrs).
"""

from cluster.metrics.buckets import LATENCY_BOUNDS_S, Buckets
from cluster.metrics.endpoint import Endpoint, RoleMetrics, serve
from cluster.metrics.roles import (
    LauncherMetrics,
    PartitionMetrics,
    ReaderMetrics,
    TraditionalMetrics,
)
from cluster.metrics.sequencer import SequencerMetrics

__all__ = [
    "LATENCY_BOUNDS_S",
    "Buckets",
    "Endpoint",
    "LauncherMetrics",
    "PartitionMetrics",
    "ReaderMetrics",
    "RoleMetrics",
    "SequencerMetrics",
    "TraditionalMetrics",
    "serve",
]
