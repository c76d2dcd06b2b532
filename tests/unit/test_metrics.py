"""Metrics without a cluster: histogram counts, the metrics ports in the config,
the catalog against docs/OPERATIONS.md and the alert rules, a collector's text format,
the sequencer's counting from a real Sequencer, and `ordo status --watch` screens."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cluster.commands.watch import Snapshot, render, watch
from cluster.config import ClusterConfig
from cluster.metrics import Buckets, RoleMetrics, SequencerMetrics, catalog
from cluster.metrics.scrape import prometheus_config

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "docs" / "ordo-alerts.yml"


def test_buckets_are_cumulative_and_end_with_every_observation() -> None:
    b = Buckets((0.01, 0.1, 1.0))
    b.add(0.005)
    b.add(0.05, 3)
    b.add(7.0)
    buckets, total = b.cumulative()
    assert buckets == [("0.01", 1.0), ("0.1", 4.0), ("1.0", 4.0), ("+Inf", 5.0)]
    assert total == pytest.approx(0.005 + 0.15 + 7.0)


def _ports(cfg: ClusterConfig) -> list[int]:
    """Every port the cluster's processes bind, metrics included."""
    addrs = [
        *(
            a
            for m in range(cfg.sequencers)
            for a in (
                cfg.client_addr_of(m),
                cfg.publish_addr_of(m),
                cfg.log_service_addr_of(m),
                cfg.results_addr_of(m),
            )
        ),
        *(cfg.partition_addr(r, p) for r in range(cfg.replicas) for p in range(cfg.partitions)),
        *(a for row in cfg.query_addrs() for a in row),
        *cfg.reader_addrs,
        *cfg.metrics_addrs().values(),
    ]
    ports = [int(a.rsplit(":", 1)[1]) for a in addrs]
    for n in range(1, cfg.zookeeper_servers + 1):
        ports += [cfg.zookeeper_client_port(n) + i for i in range(3)]
    return ports


@pytest.mark.parametrize(
    "shape",
    [
        {},
        {"replicas": 3, "partitions": 4, "readers": 2},
        {"sequencers": 3, "zookeeper_servers": 3, "readers": 1},
        {"metrics_base_port": 30_000},
    ],
)
def test_every_process_has_its_own_metrics_port_apart_from_every_other(shape: dict) -> None:
    cfg = ClusterConfig(base_port=20_000, **shape)
    ports = _ports(cfg)
    assert len(ports) == len(set(ports))
    names = cfg.metrics_addrs()
    assert len(names) == 1 + cfg.sequencers + cfg.replicas * cfg.partitions + cfg.readers
    if not shape.get("metrics_base_port"):  # derived: right after the cluster's other ports
        assert max(ports) == 20_000 + max(p - 20_000 for p in ports)
        assert sorted(int(a.rsplit(":", 1)[1]) for a in names.values())[-1] < 20_000 + 64


def test_cluster_json_names_the_metrics_addresses_and_older_files_load() -> None:
    cfg = ClusterConfig(base_port=20_000, readers=1)
    written = json.loads(cfg.to_json())
    assert written["metrics_addrs"] == cfg.metrics_addrs()
    assert written["metrics_addrs"]["sequencer-0"] == "127.0.0.1:20026"
    assert ClusterConfig.from_json(cfg.to_json()) == cfg
    del written["metrics_base_port"], written["metrics_addrs"]  # a file from before metrics
    assert ClusterConfig.from_json(json.dumps(written)) == cfg


def test_a_metrics_port_range_over_the_cluster_ports_is_refused() -> None:
    with pytest.raises(ValueError, match="overlap"):
        ClusterConfig(base_port=20_000, metrics_base_port=20_010)
    with pytest.raises(ValueError, match="out of range"):
        ClusterConfig(base_port=20_000, metrics_base_port=65_530)


def test_operations_page_lists_every_metric_as_the_catalog_says() -> None:
    page = (ROOT / "docs" / "OPERATIONS.md").read_text()
    table = page.split(catalog.BEGIN)[1].split(catalog.END)[0].strip()
    assert table == catalog.markdown_table(), "stale: run scripts/gen_metrics_doc.py"


def test_alert_rules_pass_promtool_and_name_only_metrics_that_exist() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/setup.sh installs Debian's prometheus package"
    done = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    known = {m.name for ms in (*catalog.BY_ROLE.values(), catalog.PROCESS) for m in ms}
    known |= {"up", "vector"}
    exprs = re.findall(r"^\s+expr: (.*)$", ALERTS.read_text(), re.M)
    for expr in exprs:
        for name in re.findall(r"\b((?:ordo|process)_[a-z_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in known or base in known, f"{expr}: no metric {name}"


class _Fixed(RoleMetrics):
    role = "partition"

    def sample(self) -> dict:
        return {"ordo_partition_last_epoch": 42, "ordo_partition_txns_applied_total": 7}


def test_a_collector_renders_its_sample_with_the_role_labels_in_prometheus_text() -> None:
    m = _Fixed("r1p0", replica=1, partition=0)
    m.histograms["ordo_checkpoint_seconds"] = b = Buckets((1.0, 10.0))
    b.add(2.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(m)
    m.turn(0.0)
    text = generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("ordo_partition_last_epoch", (("partition", "0"), ("replica", "1")))] == 42
    key = ("ordo_partition_txns_applied_total", (("partition", "0"), ("replica", "1")))
    assert samples[key] == 7
    assert samples[("ordo_process_info", (("process", "r1p0"), ("role", "partition")))] == 1
    assert samples[("ordo_checkpoint_seconds_count", (("partition", "0"), ("replica", "1")))] == 1


def test_sequencer_metrics_count_procedures_outcomes_and_latency_from_a_real_sequencer(
    tmp_path: Path,
) -> None:
    from sequencer.log import CommandLog
    from sequencer.sequencer import Sequencer
    from txn_library.procedure import load_modules
    from txn_library.wire import sequencer as wire

    load_modules(("txn_library.workloads.builtin",))
    log = CommandLog(tmp_path / "log", fsync=False)
    seq = Sequencer(log, 1, 1)
    server = SimpleNamespace(
        member=0,
        store=None,
        seq=seq,
        local=log,
        term=0,
        _copy=SimpleNamespace(store_last_epoch=0),
        heap=SimpleNamespace(trims=2, released_bytes=5 << 20),
    )
    m = SequencerMetrics(server)
    calls = [(i, "kv.put", [f"k{i}", "v"]) for i in range(3)] + [(9, "kv.add", ["k0", 1])]
    seq.on_frame(b"c", wire.encode(wire.CallsRequest(b"client", calls)))
    seq.run_intake()
    data = seq.tick(1_000)
    assert data is not None
    m.on_tick(seq, data)
    assert m.sequenced == {"kv.put": 3, "kv.add": 1}
    epoch = seq.epoch
    m.on_replies({b"c": [(0, 0, b""), (1, 0, b""), (2, 1, b"")]}, {b"c": [epoch, epoch, epoch]})
    assert m.answered == {0: 2, 1: 1}
    assert sum(m.latency.counts) == 3
    values = m.sample()
    assert values["ordo_txns_answered_total"] == {("ok",): 2, ("aborted",): 1}
    assert values["ordo_batches_total"] == 1 and values["ordo_sequencer_leader"] == 1
    assert (values["ordo_heap_trims_total"], values["ordo_heap_trimmed_bytes_total"]) == (
        2,
        5 << 20,
    )  # the process's HeapTrim (cluster.heap_trim)
    log.close()


def _snap(at: float, applied: int, down: bool = False) -> Snapshot:
    part = {
        "replica": 0,
        "partition": 0,
        "pid": 11,
        "last_epoch": 90,
        "txns_applied": applied,
        "active": 0,
        "blocked": 0,
        "newest_checkpoint_epoch": 0,
        "down": down,
        "catching_up": False,
    }
    leader = {
        "epoch": 100,
        "txns_sequenced": applied,
        "calls_rejected": 0,
        "determinism_violations": 0,
        "pending": 0,
        "in_flight": 0,
        "partitions": [part],
    }
    reader = {"pid": 12, "applied_epoch": 97, "txns_applied": applied, "queries_served": 0}
    return Snapshot(at, "now", leader, [], [{**reader, "live": True}, None])


def test_watch_screens_show_rates_lag_and_states() -> None:
    cfg = ClusterConfig(readers=2)
    first = render(cfg, _snap(10.0, 1000), None)
    assert "(-/s)" in first  # no rate before a second screen
    screen = render(cfg, _snap(12.0, 5000, down=True), _snap(10.0, 1000))
    row = next(line for line in screen.splitlines() if line.strip().startswith("0         0"))
    assert row.split()[3:6] == ["90", "10", "2,000"] and row.endswith("DOWN")
    assert "(2,000/s)" in screen
    assert screen.splitlines()[-1].endswith("DOWN") and "   3 " in screen  # reader lag 3
    shown: list[str] = []
    snaps = iter([_snap(0.0, 0), _snap(0.0, 0), _snap(0.0, 0)])
    watch(cfg, 0.0, 3, tty=False, write=shown.append, take=lambda _cfg: next(snaps))
    assert len(shown) == 3 and shown[1].startswith("\n") and "\x1b" not in "".join(shown)
    no_leader = Snapshot(0.0, "now", None, error="no answer: timed out")
    assert render(cfg, no_leader, None).splitlines()[-1] == "no answer: timed out"


def test_prometheus_config_lists_every_process_once() -> None:
    cfg = ClusterConfig(base_port=20_000, readers=1)
    text = prometheus_config(cfg, scrape_interval_s=1)
    assert "scrape_interval: 1s" in text
    for name, addr in cfg.metrics_addrs().items():
        assert text.count(f'["{addr}"]') == 1 and f'"{name}"' in text
    trad = prometheus_config(cfg, traditional=True)
    assert "sequencer-0" not in trad and "reader-0" not in trad
    assert "r0p1" in trad and "r1p1" not in trad


def test_sequencer_counters_never_go_back_across_terms_and_a_follower_reports_its_lag(
    tmp_path: Path,
) -> None:
    from sequencer.log import CommandLog
    from sequencer.sequencer import Sequencer
    from txn_library.procedure import load_modules
    from txn_library.wire import sequencer as wire

    load_modules(("txn_library.workloads.builtin",))
    log = CommandLog(tmp_path / "log", fsync=False)
    server = SimpleNamespace(
        member=1,
        store=None,
        seq=None,
        local=log,
        term=0,
        _copy=SimpleNamespace(store_last_epoch=0),
        heap=SimpleNamespace(trims=0, released_bytes=0),
    )
    m = SequencerMetrics(server)
    for term in (1, 2):  # a leader, deposed, then leading again with a new Sequencer
        server.seq = seq = Sequencer(log, 1, 1, term=term)
        server.term = term
        seq.on_frame(b"c", wire.encode(wire.CallsRequest(b"cl", [(term, "kv.put", ["k", 1])])))
        seq.run_intake()
        m.on_tick(seq, seq.tick(term))
        leading = m.sample()
        assert leading["ordo_sequencer_leader"] == 1
        assert leading["ordo_batches_total"] >= term  # the term's first batch, and the call's
        server.seq = None
        following = m.sample()
        assert following["ordo_batches_total"] == leading["ordo_batches_total"]
        assert following["ordo_calls_accepted_total"] == term
    server._copy = SimpleNamespace(store_last_epoch=log.last_epoch + 7)
    assert m.sample()["ordo_sequencer_follower_lag_epochs"] == 7
    assert m.sample()["ordo_sequencer_leader"] == 0
    assert m.sequenced == {"kv.put": 2}
    log.close()
