"""A Prometheus configuration that scrapes every process of a cluster.

``ordo up`` writes one beside cluster.json (``DATA_DIR/prometheus.yml``): run
``prometheus --config.file=DATA_DIR/prometheus.yml`` and every process is a target,
labelled with its name (``ordo_process``: launcher, sequencer-0, r0p1, reader-0) so an
alert names what is down. The text is YAML written by hand (flow-style lists and maps
with quoted strings), so nothing beyond the standard library is needed to make it.
"""

from __future__ import annotations

import json
from pathlib import Path

from cluster.config import ClusterConfig

CONFIG_FILE = "prometheus.yml"
JOB = "ordo"


def prometheus_config(
    config: ClusterConfig,
    scrape_interval_s: float = 5.0,
    rule_files: tuple[str, ...] = (),
    traditional: bool = False,
) -> str:
    """The configuration's text: one job, a target per process of ``config`` (of the
    traditional mode: the launcher and the partitions, its only processes)."""
    interval = f"{scrape_interval_s:g}s"
    lines = [
        f"# Written by `ordo up` for the cluster in {config.data_dir}: every process's",
        "# Prometheus endpoint (cluster.json's metrics_addrs). docs/OPERATIONS.md.",
        "global:",
        f"  scrape_interval: {interval}",
        f"  evaluation_interval: {interval}",
    ]
    if rule_files:
        lines.append("rule_files:")
        lines += [f"  - {json.dumps(str(f))}" for f in rule_files]
    lines += ["scrape_configs:", f"  - job_name: {JOB}", "    static_configs:"]
    for name, addr in config.metrics_addrs().items():
        if traditional and not (name == "launcher" or name.startswith("r0p")):
            continue
        lines.append(f"      - targets: [{json.dumps(addr)}]")
        lines.append(f"        labels: {{ordo_process: {json.dumps(name)}}}")
    return "\n".join(lines) + "\n"


def write_prometheus_config(config: ClusterConfig, traditional: bool = False) -> Path:
    path = Path(config.data_dir) / CONFIG_FILE
    path.write_text(prometheus_config(config, traditional=traditional))
    return path
