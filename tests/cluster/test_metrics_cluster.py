"""Metrics of a live cluster: every role's endpoint, and a real Prometheus server
(Debian's package, which scripts/setup.sh installs) scraping the cluster, computing a
rate through its HTTP API, evaluating docs/ordo-alerts.yml, and seeing a partition
killed with kill -9 go down."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from cluster import cli
from cluster.config import ClusterConfig
from cluster.fresh_checkpoint import wait_fresh_checkpoint
from cluster.launcher import free_base_port, wait_quiescent
from cluster.metrics import catalog
from cluster.metrics.scrape import prometheus_config
from cluster.traditional_server import TraditionalCluster
from txn_library.client import Client
from txn_library.workloads.bank import open_accounts

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTS = 100
DEADLINE_S = 30.0


def scrape(address: str) -> dict[str, dict[tuple, float]]:
    """metric sample name -> {sorted labels: value} from one endpoint."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def until(what: str, check: Callable[[], Any], timeout_s: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something true; fail with ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.2)


def test_every_role_serves_its_metrics_with_the_counts_of_what_ran(make_cluster) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(replicas=1, partitions=2, readers=1)
    cfg: ClusterConfig = lc.config
    with Client(cfg.client_addr) as c:
        open_accounts(c, ACCOUNTS, 1000)
        answers = [c.submit("bank.transfer", i, i + 1, 1) for i in range(40)]
        assert all(f.result().ok for f in answers)
        bad = c.call("bank.transfer", 1, 2, 10**9)  # insufficient funds: a logical abort
        assert bad.aborted
        wait_fresh_checkpoint(c, range(1), 2, 60.0)  # `ordo checkpoint`: each partition one
        wait_quiescent(c, 1, 2)
    addrs = cfg.metrics_addrs()

    def sequencer_counted() -> dict | None:
        m = scrape(addrs["sequencer-0"])
        got = m["ordo_txns_sequenced_total"].get((("member", "0"), ("procedure", "bank.transfer")))
        return m if got == 41 else None

    seq = until("the sequencer's sample shows 41 transfers", sequencer_counted)
    names = {m.name for m in catalog.SEQUENCER if m.kind != catalog.HISTOGRAM}
    names -= {"ordo_zookeeper_commit_seconds"}
    assert names <= set(seq), names - set(seq)
    answered = seq["ordo_txns_answered_total"]
    assert answered[(("member", "0"), ("outcome", "aborted"))] == 1
    assert answered[(("member", "0"), ("outcome", "ok"))] >= 41  # the transfers, bank.open
    assert seq["ordo_txn_latency_seconds_count"][(("member", "0"),)] >= 42
    assert seq["ordo_batch_txns_sum"][(("member", "0"),)] >= 42
    assert seq["process_resident_memory_bytes"][()] > 10 << 20
    for p in range(2):
        key = (("member", "0"), ("partition", str(p)), ("replica", "0"))
        assert seq["ordo_replica_partition_up"][key] == 1
        assert seq["ordo_replica_apply_lag_epochs"][key] == 0

    applied = 0.0
    for p in range(2):
        part = scrape(addrs[f"r0p{p}"])
        missing = {m.name for m in catalog.PARTITION if m.kind != catalog.HISTOGRAM} - set(part)
        assert not missing, missing
        key = (("partition", str(p)), ("replica", "0"))
        assert part["ordo_partition_live"][key] == 1
        assert part["ordo_checkpoint_seconds_count"][key] >= 1
        assert part["ordo_checkpoint_pause_seconds_count"][key] >= 1
        assert part["ordo_partition_newest_checkpoint_epoch"][key] > 0
        applied += part["ordo_partition_txns_applied_total"][key]
    assert applied >= 42  # each transfer applied at its home partition at least
    reader = scrape(addrs["reader-0"])
    assert {m.name for m in catalog.READER} <= set(reader)
    launcher = scrape(addrs["launcher"])
    assert launcher["ordo_process_up"][(("process", "r0p1"),)] == 1

    # `ordo status --watch` draws two screens of the live cluster (into a pipe: no
    # terminal codes), the second with rates.
    watched = CliRunner().invoke(
        cli.main,
        ["status", "--watch", "--count", "2", "--interval", "0.3", "--data-dir", cfg.data_dir],
    )
    assert watched.exit_code == 0, watched.output
    screens = watched.output.split("ordo status --watch")[1:]
    assert len(screens) == 2 and "\x1b" not in watched.output
    rows = [line.split() for line in screens[1].splitlines() if line.endswith("live")]
    assert len(rows) == 3  # two partitions and the reader
    assert all(r[5] != "-" for r in rows[:2])  # txns/s, from the first screen to this one


def test_traditional_partitions_serve_their_metrics(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        replicas=1, partitions=2, base_port=free_base_port(), data_dir=str(tmp_path / "d")
    )
    with TraditionalCluster(cfg) as tc, Client(tc.client_addrs[0]) as c:
        assert c.call("kv.put", "k", 1).ok
        m = until(
            "partition 0 counts its commit",
            lambda: (
                (s := scrape(cfg.metrics_addrs()["r0p0"]))
                .get("ordo_traditional_committed_total", {})
                .get((("partition", "0"),))
                and s
            ),
        )
        assert {x.name for x in catalog.TRADITIONAL} <= set(m)
        assert scrape(cfg.metrics_addrs()["launcher"])["ordo_process_up"][(("process", "p1"),)]


class PrometheusAPI:
    def __init__(self, address: str) -> None:
        self.address = address

    def get(self, path: str, **params: str) -> Any:
        url = f"http://{self.address}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict, float]]:
        return [
            (row["metric"], float(row["value"][1]))
            for row in self.get("query", query=expr)["result"]
        ]


@contextmanager
def prometheus(tmp_path: Path, config_text: str) -> Iterator[PrometheusAPI]:
    """A Prometheus server on a free port, its data in ``tmp_path``; killed after."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus missing: scripts/setup.sh installs Debian's prometheus package"
    config = tmp_path / "prometheus.yml"
    config.write_text(config_text)
    address = f"127.0.0.1:{free_base_port(1)}"
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={address}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        api = PrometheusAPI(address)

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"http://{address}/-/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False

        until("Prometheus is ready", ready)
        yield api
    finally:
        proc.kill()
        proc.wait()
        log.close()


@contextmanager
def steady_transfers(address: str) -> Iterator[None]:
    """Transfers, 50 at a time, from a thread until the block ends."""
    stop = threading.Event()

    def run() -> None:
        with Client(address) as c:
            i = 0
            while not stop.is_set():
                futs = [c.submit("bank.transfer", (i + k) % ACCOUNTS, k, 1) for k in range(50)]
                for f in futs:
                    f.result()
                i += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=30)


def test_prometheus_scrapes_the_cluster_computes_a_rate_and_sees_a_replica_down(
    make_cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(replicas=1, partitions=2)
    cfg: ClusterConfig = lc.config
    with Client(cfg.client_addr) as c:
        open_accounts(c, ACCOUNTS, 1000)
    alert_rules = str(ROOT / "docs" / "ordo-alerts.yml")
    text = prometheus_config(cfg, scrape_interval_s=1, rule_files=(alert_rules,))
    with prometheus(tmp_path, text) as api:
        with steady_transfers(cfg.client_addr):
            rate = 'sum(rate(ordo_txns_sequenced_total{procedure="bank.transfer"}[5s]))'
            rows = until("a positive transfer rate", lambda: [v for _, v in api.query(rate) if v])
            assert rows[0] > 0
            want = len(cfg.metrics_addrs())
            up = until("every process scraped", lambda: len(r := api.query("up")) == want and r)
            assert {m["ordo_process"]: v for m, v in up} == dict.fromkeys(cfg.metrics_addrs(), 1.0)
            p99 = (
                "histogram_quantile(0.99, sum by (le) (rate(ordo_txn_latency_seconds_bucket[5s])))"
            )
            assert until("a latency quantile", lambda: [v for _, v in api.query(p99) if v > 0])

            rules: list[dict] = []

            def quiet() -> bool:  # evaluated since every target was up, none alerting
                rules[:] = api.get("rules")["groups"][0]["rules"]
                return all(
                    r["health"] == "ok" and r["state"] == "inactive" and r["lastEvaluation"] > t
                    for r in rules
                )

            t = time.strftime("%Y-%m-%dT%H:%M:%S")  # local time, as Prometheus shows it
            try:
                until("every alert rule evaluated, healthy and inactive", quiet)
            except AssertionError:
                shown = [(r["name"], r["health"], r["state"], r.get("lastError")) for r in rules]
                raise AssertionError(f"alert rules not quiet: {shown}") from None
        # kill -9 a partition: its target goes down and OrdoProcessDown is pending
        lc.kill("r0p1")
        until(
            "the killed partition's target down", lambda: api.query('up{ordo_process="r0p1"} == 0')
        )
        alerts = until(
            "OrdoProcessDown pending for r0p1",
            lambda: [
                a
                for a in api.get("alerts")["alerts"]
                if a["labels"]["alertname"] == "OrdoProcessDown"
            ],
        )
        assert alerts[0]["labels"]["ordo_process"] == "r0p1"
