"""The metrics of partitions, readers, the traditional mode's partitions and the
launcher: each samples the status its role already keeps (cluster.metrics.endpoint:
on the loop's thread, at most every SAMPLE_EVERY_S), adding nothing to the path a
transaction takes. The sequencer's, which also counts batches and answers, are in
cluster.metrics.sequencer.

Servers are passed in, not imported (the servers import this module), and read
through the attributes their modules document.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from cluster.metrics.endpoint import RoleMetrics, Sample


class PartitionMetrics(RoleMetrics):
    role = "partition"

    def __init__(self, server: Any, startup_s: float) -> None:
        """``server``: a cluster.partition_server.PartitionServer; ``startup_s``: how
        long loading its checkpoint (or genesis) took."""
        super().__init__(
            f"r{server.replica}p{server.partition_id}",
            replica=server.replica,
            partition=server.partition_id,
        )
        self.server = server
        self.startup_s = startup_s
        ck = server.checkpoints
        self.histograms.update(
            ordo_checkpoint_seconds=ck.write_seconds,
            ordo_checkpoint_pause_seconds=ck.pause_seconds,
        )

    def sample(self) -> Sample:
        s = self.server
        part, feed, ck = s.part, s.feed, s.checkpoints
        st = part.status()
        known = max(feed.known_last_epoch, st.last_epoch)
        v: Sample = {
            "ordo_partition_last_epoch": st.last_epoch,
            "ordo_partition_known_epoch": known,
            "ordo_partition_apply_lag_epochs": known - st.last_epoch,
            "ordo_partition_live": int(s.recovered_s is not None),
            "ordo_partition_txns_applied_total": st.txns_applied,
            "ordo_partition_active_txns": st.active_txns,
            "ordo_partition_blocked_txns": st.blocked,
            "ordo_partition_held_batches": len(feed.held),
            "ordo_partition_lock_waits_total": st.lock_waits,
            "ordo_partition_txn_waits_total": st.txn_waits,
            "ordo_partition_fast_path_txns_total": st.bypassed,
            "ordo_partition_peer_holds_expired_total": feed.peer_holds_expired,
            "ordo_partition_inputs_dropped_total": part.inputs_dropped,
            "ordo_partition_dataflow_failures_total": part.derived_failures,
            "ordo_partition_startup_seconds": self.startup_s,
            "ordo_partition_newest_checkpoint_epoch": st.newest_checkpoint_epoch,
            "ordo_checkpoints_skipped_total": ck.skipped,
            "ordo_checkpoints_failed_total": ck.failed,
        }
        if s.recovered_s is not None:
            v["ordo_partition_recovery_seconds"] = s.recovered_s
        return v


class ReaderMetrics(RoleMetrics):
    role = "reader"

    def __init__(self, server: Any) -> None:
        """``server``: a cluster.reader_server.ReaderServer."""
        super().__init__(f"reader-{server.reader}", reader=server.reader)
        self.server = server

    def sample(self) -> Sample:
        s = self.server
        f, q, sinks = s.follower, s.queries, s.sinks
        return {
            "ordo_reader_applied_epoch": f.applied_epoch,
            "ordo_reader_known_epoch": f.known_last_epoch,
            "ordo_reader_lag_epochs": max(0, f.behind()),
            "ordo_reader_live": int(f.live),
            "ordo_reader_txns_applied_total": f.txns_applied,
            "ordo_reader_hashes_checked_total": f.hashes_checked,
            "ordo_reader_determinism_violations_total": f.violations_count,
            "ordo_reader_queries_total": {("served",): q.served, ("refused",): q.refused},
            "ordo_reader_queries_waiting": q.waiting,
            "ordo_reader_subscriptions": len(sinks.subs),
            "ordo_reader_sink_batches_total": sinks.pushed_batches,
        }


class TraditionalMetrics(RoleMetrics):
    role = "traditional"

    def __init__(self, server: Any) -> None:
        """``server``: a cluster.traditional_server.TraditionalServer."""
        super().__init__(f"p{server.partition_id}", partition=server.partition_id)
        self.server = server

    def sample(self) -> Sample:
        st = self.server.part.status()
        return {
            "ordo_traditional_committed_total": st.committed,
            "ordo_traditional_aborted_total": st.aborted,
            "ordo_traditional_failed_total": st.failed,
            "ordo_traditional_restarts_total": st.deaths,
            "ordo_traditional_active_txns": st.active + st.branches,
            "ordo_traditional_in_doubt": st.in_doubt,
            "ordo_traditional_lock_waits_total": st.lock_waits,
            "ordo_traditional_blocked": st.blocked,
        }


class LauncherMetrics(RoleMetrics):
    """``ordo up``'s children. Its loop polls them (every 0.2 s); a scrape reads the
    return codes polling set and copies of its tables, and calls nothing."""

    role = "launcher"

    def __init__(self, group: Any) -> None:
        """``group``: a cluster.launcher.ProcessGroup."""
        super().__init__("launcher")
        self.group = group

    def collect(self) -> Iterator[Metric]:
        self._values = self.sample()
        yield from super().collect()

    def sample(self) -> Sample:
        g = self.group
        procs = dict(g.procs)
        ensemble = getattr(g, "ensemble", None)
        if ensemble is not None:
            procs.update((f"zookeeper-{n}", p) for n, p in dict(ensemble.procs).items())
        restarts = dict(g.restart_counts)
        return {
            "ordo_process_up": {(n,): int(p.returncode is None) for n, p in procs.items()},
            "ordo_process_restarts_total": {(n,): restarts.get(n, 0) for n in procs},
        }
