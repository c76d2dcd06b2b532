"""A process's Prometheus endpoint and the base of every role's collector.

Who does what, so that metrics cost the engine nothing per transaction:
- the role's loop (its one thread) keeps plain counters where events happen (a batch,
  a flush of answers: ``Buckets``, ``collections.Counter``) and, at most every
  ``SAMPLE_EVERY_S``, calls ``RoleMetrics.turn``, which reads the role's own status
  (``sample``) into a fresh dict and swaps it in;
- prometheus_client's HTTP thread (``serve``) renders that dict and the histograms at
  each scrape, and calls nothing of the role: no role method ever runs on two
  threads.

A port already in use, or any other failure to serve, is logged and the role runs on
without an endpoint (Prometheus then shows the target down): metrics never stop the
engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from cluster.metrics import catalog
from cluster.metrics.buckets import Buckets

log = logging.getLogger("ordo.metrics")

SAMPLE_EVERY_S = 0.25  # a scrape sees values at most this old

Sample = dict[str, Any]  # metric name -> value, or {label values: value}


class RoleMetrics(Collector):
    """One process's metrics: the role's catalog entries (cluster.metrics.catalog)."""

    role = "any"

    def __init__(self, process: str, **role_labels: object) -> None:
        names = catalog.ROLE_LABELS[self.role]
        self.process = process
        self.label_values = [str(role_labels[n]) for n in names]
        self.metrics = catalog.BY_ROLE[self.role]
        self.histograms: dict[str, Buckets] = {}
        self._values: Sample = {}
        self._next_sample = 0.0

    def turn(self, now: float) -> None:
        """The loop's one call per turn: a sample at most every SAMPLE_EVERY_S."""
        if now >= self._next_sample:
            self._next_sample = now + SAMPLE_EVERY_S
            self._values = self.sample()

    def sample(self) -> Sample:
        """The role's values now (on the loop's thread). Overridden by each role."""
        return {}

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to check at registration; families come at scrape

    def collect(self) -> Iterator[Metric]:
        values = self._values  # one read: the loop swaps in a new dict, never edits
        yield _family(
            catalog.COMMON[0],
            catalog.ROLE_LABELS["any"],
            [((self.role, self.process), 1.0)],
        )
        names = catalog.ROLE_LABELS[self.role]
        const = tuple(self.label_values)
        for m in self.metrics:
            if m.kind == catalog.HISTOGRAM:
                b = self.histograms.get(m.name)
                if b is not None and any(b.counts):
                    buckets, total = b.cumulative()
                    h = HistogramMetricFamily(m.name, m.help, labels=names)
                    h.add_metric(list(const), buckets, total)
                    yield h
                continue
            v = values.get(m.name)
            if v is None:
                continue
            if m.labels:
                rows = [(const + tuple(map(str, k)), float(x)) for k, x in v.items()]
            else:
                rows = [(const, float(v))]
            yield _family(m, names + m.labels, rows)


def _family(
    m: catalog.Metric, labels: tuple[str, ...], rows: list[tuple[tuple[str, ...], float]]
) -> Metric:
    fam: CounterMetricFamily | GaugeMetricFamily
    if m.kind == catalog.COUNTER:
        fam = CounterMetricFamily(m.name, m.help, labels=labels)
    else:
        fam = GaugeMetricFamily(m.name, m.help, labels=labels)
    for key, value in rows:
        fam.add_metric(list(key), value)
    return fam


class Endpoint:
    """A running HTTP endpoint; ``close`` stops it (idempotent)."""

    def __init__(self, server: Any, thread: Any, address: str) -> None:
        self._server, self._thread, self.address = server, thread, address

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def serve(collector: Collector, host: str, port: int) -> Endpoint | None:
    """Serve ``collector`` and the process collector (RSS, CPU, fds) at
    http://host:port/metrics from a daemon thread; None (logged) if it cannot."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        log.error("metrics: cannot serve at %s:%d (%s); running without", host, port, e)
        return None
    log.info("metrics at http://%s:%d/metrics (pid %d)", host, port, os.getpid())
    return Endpoint(server, thread, f"{host}:{port}")
