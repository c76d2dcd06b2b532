"""Cluster layout: replicas, partitions, sequencers, ZooKeeper servers, and where each runs.

The embedded default is one host (127.0.0.1), one sequencer and no ZooKeeper. A
highly available cluster names its hosts (name -> IP address) and places every role
on one: ``sequencer_hosts[i]`` runs sequencer i, ``zookeeper_hosts[n-1]`` ZooKeeper
server n, ``partition_hosts[r][p]`` partition p of replica r. Every process binds its
own host's address; the others connect to it there.

Ports are derived from one base port, the same on every host, so each role's ports
are distinct even when several hosts are one machine:
  sequencer i         base + 4i + (0 client, 1 publish, 2 log service, 3 results)
  partition (r, p)    base + 16 + r * partitions + p
  ZooKeeper server n  base + 16 + replicas * partitions + 3(n - 1) + (0 client,
                      1 peer, 2 election)
  query (r, p)        after the ZooKeeper servers' ports: + r * partitions + p
  reader i            after the query ports: + i (its one socket: queries, status)
  metrics             Prometheus endpoints (HTTP, cluster.metrics), from
                      ``metrics_base_port`` (0: right after the readers' ports):
                      + 0 the launcher (``ordo up``), + 1 + i sequencer i,
                      + 1 + SEQUENCERS_MAX + r * partitions + p partition (r, p) (the
                      traditional mode's partition p: (0, p)), then + i reader i

Invariants: at most ``SEQUENCERS_MAX`` sequencers (their ports stay below base + 16);
more than one sequencer needs a ZooKeeper ensemble (1 or 3 servers), which elects the
leader and holds the committed tail of the log (sequencer.replication); every host a
role is placed on is named in ``hosts`` (or the placement is empty: all on
127.0.0.1). The config is written to ``data_dir/cluster.json`` by ``ordo up`` and read
by every other command, so all processes agree on it.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from txn_library import limits

HOST = "127.0.0.1"
LOCAL = "local"  # the host name of the embedded default: 127.0.0.1
CONFIG_FILE = "cluster.json"
SEQUENCERS_MAX = 4
READERS_MAX = 64
SEQUENCER_PORTS = 4
METRICS_FIXED_PORTS = 1 + SEQUENCERS_MAX  # the launcher's, then one per sequencer
ZOOKEEPER_PORTS = 3
ZOOKEEPER_SERVER_COUNTS = (0, 1, 3)
DEFAULT_BASE_PORT = 17100
DEFAULT_DATA_DIR = "ordo-data"


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 2
    partitions: int = 2
    base_port: int = DEFAULT_BASE_PORT
    data_dir: str = DEFAULT_DATA_DIR
    epoch_duration_ms: int = 10
    fsync: bool = True
    # Modules whose import registers procedures and tables (same list everywhere). The
    # engine's default is the built-ins; a workload adds its own (`ordo tpcc ...` adds
    # tpcc.transactions, `ordo up --module M` any other).
    procedure_modules: tuple[str, ...] = field(default=("txn_library.workloads.builtin",))
    # Initial database: "module:function" called as fn(partition, partitions, **genesis_args)
    # on every partition that starts from nothing; it yields (table, key, row) for the
    # rows that partition holds (replicated tables: every partition). Deterministic, so
    # every replica and every replay starts from the same state without logging it.
    genesis: str | None = None
    genesis_args: dict = field(default_factory=dict)
    # Checkpoint every N epochs (0 = never).
    checkpoint_every_epochs: int = 0
    checkpoint_every_s: float = 0.0  # also (or instead) by time; 0 = never
    checkpoint_keep: int = 3  # per partition; 0 = drain at boundaries but write nothing
    # Dataflows (txn_library.streams): "strong" logs the transactions a push derives,
    # "weak" only the push (every reader derives them again). Same state either way.
    dataflow_recovery: str = "strong"
    # Whether the transactional replicas keep recent row versions for snapshot queries
    # (executor/core/versions.py, docs/QUERIES.md). None: they do when no reader serves
    # the cluster, and keep none when readers do (readers keep their own), so the
    # transactions stop paying for them (``replica_versions``). Off, a replica answers
    # a snapshot only at the epoch it has completed; read committed works.
    query_versions: bool | None = None
    log_segment_bytes: int = 0  # 0 = limits.segment_bytes_max
    # Fault injection, for tests only: each partition drops every Nth batch it receives
    # over PUB/SUB (0 = never), forcing the gap-repair path through the log service.
    fault_drop_every_nth_batch: int = 0
    # High availability (sequencer.replication). One sequencer and no ZooKeeper is the
    # embedded default; N sequencers need a ZooKeeper ensemble of 1 or 3 servers.
    sequencers: int = 1
    zookeeper_servers: int = 0
    # Hosts: name -> IP address. Empty: every role on 127.0.0.1.
    hosts: dict = field(default_factory=dict)
    sequencer_hosts: tuple[str, ...] = ()  # host of sequencer i; () = all local
    zookeeper_hosts: tuple[str, ...] = ()  # host of ZooKeeper server n (1-based) at n-1
    partition_hosts: tuple[tuple[str, ...], ...] = ()  # [replica][partition]
    zookeeper_root: str = "/ordo"  # the ensemble's node holding this cluster's state
    # CURVE on every ZeroMQ socket (cluster.security); the loopback default runs without.
    curve: bool = False
    # Readers (executor/reader/): processes that follow the log holding every partition
    # and answer snapshot and read-committed queries. 0: the replicas' partitions do.
    readers: int = 0
    reader_hosts: tuple[str, ...] = ()  # host of reader i; () = all local
    # How far back a reader serves snapshots, in the batches' logged time (seconds;
    # within limits.versions_bytes_max bytes per partition): docs/QUERIES.md.
    reader_retention_s: float = limits.reader_retention_s_default
    # First port of the Prometheus endpoints (cluster.metrics; layout above). 0: right
    # after the readers' ports. cluster.json also lists every endpoint
    # (``metrics_addrs``, written for the reader; ignored when loaded).
    metrics_base_port: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.partitions < 1:
            raise ValueError("replicas and partitions must be >= 1")
        top = (
            16
            + 2 * self.replicas * self.partitions
            + ZOOKEEPER_PORTS * self.zookeeper_servers
            + self.readers
        )
        if not self.metrics_base_port:
            top += self.metrics_ports
        if not (1024 <= self.base_port <= 65535 - top):
            raise ValueError(f"base_port {self.base_port} out of range")
        if self.metrics_base_port:
            first, last = self.metrics_base_port, self.metrics_base_port + self.metrics_ports
            if not (1024 <= first <= 65535 - self.metrics_ports):
                raise ValueError(f"metrics_base_port {first} out of range")
            if first < self.base_port + top and self.base_port < last:
                raise ValueError(
                    f"metrics ports {first}..{last - 1} overlap the cluster's ports "
                    f"{self.base_port}..{self.base_port + top - 1}"
                )
        if self.epoch_duration_ms < 1:
            raise ValueError("epoch_duration_ms must be >= 1")
        if not 1 <= self.sequencers <= SEQUENCERS_MAX:
            raise ValueError(f"sequencers must be 1..{SEQUENCERS_MAX}, not {self.sequencers}")
        if self.zookeeper_servers not in ZOOKEEPER_SERVER_COUNTS:
            raise ValueError("zookeeper_servers must be 0, 1 or 3")
        if self.dataflow_recovery not in ("strong", "weak"):
            raise ValueError("dataflow_recovery must be 'strong' or 'weak'")
        if not 0 <= self.readers <= READERS_MAX:
            raise ValueError(f"readers must be 0..{READERS_MAX}, not {self.readers}")
        retention = self.reader_retention_s
        if type(retention) not in (int, float) or not (
            0 < retention <= limits.reader_retention_s_max
        ):
            raise ValueError(
                f"reader_retention_s must be a number of seconds in "
                f"(0, {limits.reader_retention_s_max:g}], not {retention!r:.40}"
            )
        if self.sequencers > 1 and not self.zookeeper_servers:
            raise ValueError("more than one sequencer needs a ZooKeeper ensemble")
        self._check_placement()

    def _check_placement(self) -> None:
        for name, addr in self.hosts.items():
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                raise ValueError(f"host {name!r}: {addr!r} is not an IP address") from None
        wanted = (
            ("sequencer_hosts", self.sequencer_hosts, self.sequencers),
            ("zookeeper_hosts", self.zookeeper_hosts, self.zookeeper_servers),
            ("partition_hosts", self.partition_hosts, self.replicas),
            ("reader_hosts", self.reader_hosts, self.readers),
        )
        for what, placed, count in wanted:
            if placed and len(placed) != count:
                raise ValueError(f"{what} names {len(placed)} hosts, expected {count}")
        for row in self.partition_hosts:
            if len(row) != self.partitions:
                raise ValueError(f"partition_hosts rows name {self.partitions} hosts each")
        for name in (
            *self.sequencer_hosts,
            *self.zookeeper_hosts,
            *(h for row in self.partition_hosts for h in row),
            *self.reader_hosts,
        ):
            if name != LOCAL and name not in self.hosts:
                raise ValueError(f"host {name!r} is not in hosts")

    # Placement -------------------------------------------------------------------
    @property
    def replicated(self) -> bool:
        """The ordering layer is replicated through ZooKeeper (leader election, terms)."""
        return self.zookeeper_servers > 0

    def host_address(self, name: str) -> str:
        return HOST if name == LOCAL else str(self.hosts[name])

    def sequencer_host(self, member: int) -> str:
        return self.host_address(self.sequencer_hosts[member] if self.sequencer_hosts else LOCAL)

    def partition_host(self, replica: int, partition: int) -> str:
        if not self.partition_hosts:
            return HOST
        return self.host_address(self.partition_hosts[replica][partition])

    def reader_host(self, reader: int) -> str:
        return self.host_address(self.reader_hosts[reader] if self.reader_hosts else LOCAL)

    def zookeeper_host(self, server: int) -> str:
        """Address of ZooKeeper server ``server`` (1-based, its myid)."""
        return self.host_address(
            self.zookeeper_hosts[server - 1] if self.zookeeper_hosts else LOCAL
        )

    @property
    def zookeeper_base_port(self) -> int:
        return self.base_port + 16 + self.replicas * self.partitions

    def zookeeper_client_port(self, server: int) -> int:
        return self.zookeeper_base_port + ZOOKEEPER_PORTS * (server - 1)

    @property
    def zookeeper_connect(self) -> str:
        """kazoo's hosts string: every server's client address."""
        return ",".join(
            f"{self.zookeeper_host(n)}:{self.zookeeper_client_port(n)}"
            for n in range(1, self.zookeeper_servers + 1)
        )

    # Sequencer endpoints -------------------------------------------------------
    def _sequencer_addr(self, member: int, port: int) -> str:
        if not 0 <= member < self.sequencers:
            raise ValueError(f"no sequencer {member} (the cluster has {self.sequencers})")
        port += self.base_port + SEQUENCER_PORTS * member
        return f"tcp://{self.sequencer_host(member)}:{port}"

    def client_addr_of(self, member: int) -> str:
        return self._sequencer_addr(member, 0)

    def publish_addr_of(self, member: int) -> str:
        return self._sequencer_addr(member, 1)

    def log_service_addr_of(self, member: int) -> str:
        return self._sequencer_addr(member, 2)

    def results_addr_of(self, member: int) -> str:
        return self._sequencer_addr(member, 3)

    @property
    def client_addrs(self) -> list[str]:
        """Every sequencer's client address: what a client fails over between."""
        return [self.client_addr_of(i) for i in range(self.sequencers)]

    @property
    def client_addr(self) -> str:
        """Sequencer 0's client address (the only one of the embedded default)."""
        return self.client_addr_of(0)

    @property
    def publish_addr(self) -> str:
        return self.publish_addr_of(0)

    @property
    def log_service_addr(self) -> str:
        return self.log_service_addr_of(0)

    @property
    def results_addr(self) -> str:
        return self.results_addr_of(0)

    # Partition endpoints -------------------------------------------------------
    def partition_addr(self, replica: int, partition: int) -> str:
        """Inbound PULL socket of one partition: peer reads and sequencer queries."""
        port = self.base_port + 16 + replica * self.partitions + partition
        return f"tcp://{self.partition_host(replica, partition)}:{port}"

    def query_addr(self, replica: int, partition: int) -> str:
        """ROUTER socket of one partition for snapshot and read-committed queries
        (clients, directly: executor/deterministic/snapshot.py). Its port follows the
        ZooKeeper servers' ports."""
        port = (
            self.zookeeper_base_port
            + ZOOKEEPER_PORTS * self.zookeeper_servers
            + replica * self.partitions
            + partition
        )
        return f"tcp://{self.partition_host(replica, partition)}:{port}"

    def query_addrs(self) -> list[list[str]]:
        """Every partition's query address, [replica][partition]."""
        return [
            [self.query_addr(r, p) for p in range(self.partitions)] for r in range(self.replicas)
        ]

    # Reader endpoints ----------------------------------------------------------
    def reader_addr(self, reader: int) -> str:
        """ROUTER socket of reader ``reader``: queries (as a partition's query socket
        takes them) and its status (txn_library.wire.reader). After the query ports."""
        if not 0 <= reader < self.readers:
            raise ValueError(f"no reader {reader} (the cluster has {self.readers})")
        port = (
            self.zookeeper_base_port
            + ZOOKEEPER_PORTS * self.zookeeper_servers
            + self.replicas * self.partitions
            + reader
        )
        return f"tcp://{self.reader_host(reader)}:{port}"

    @property
    def replica_versions(self) -> bool:
        """Whether the replicas' partitions keep row versions (``query_versions``)."""
        return self.readers == 0 if self.query_versions is None else self.query_versions

    @property
    def reader_addrs(self) -> list[str]:
        return [self.reader_addr(i) for i in range(self.readers)]

    # Metrics endpoints ---------------------------------------------------------
    @property
    def metrics_ports(self) -> int:
        """How many ports the Prometheus endpoints take (layout: module docstring)."""
        return METRICS_FIXED_PORTS + self.replicas * self.partitions + self.readers

    @property
    def metrics_port_first(self) -> int:
        if self.metrics_base_port:
            return self.metrics_base_port
        return (
            self.zookeeper_base_port
            + ZOOKEEPER_PORTS * self.zookeeper_servers
            + self.replicas * self.partitions
            + self.readers
        )

    @property
    def launcher_metrics_addr(self) -> tuple[str, int]:
        """(host, port) of ``ordo up``'s own endpoint (its children's states)."""
        return HOST, self.metrics_port_first

    def sequencer_metrics_addr(self, member: int) -> tuple[str, int]:
        if not 0 <= member < self.sequencers:
            raise ValueError(f"no sequencer {member} (the cluster has {self.sequencers})")
        return self.sequencer_host(member), self.metrics_port_first + 1 + member

    def partition_metrics_addr(self, replica: int, partition: int) -> tuple[str, int]:
        port = self.metrics_port_first + METRICS_FIXED_PORTS + replica * self.partitions
        return self.partition_host(replica, partition), port + partition

    def reader_metrics_addr(self, reader: int) -> tuple[str, int]:
        if not 0 <= reader < self.readers:
            raise ValueError(f"no reader {reader} (the cluster has {self.readers})")
        port = self.metrics_port_first + METRICS_FIXED_PORTS + self.replicas * self.partitions
        return self.reader_host(reader), port + reader

    def metrics_addrs(self) -> dict[str, str]:
        """Every Prometheus endpoint, by process name ("launcher", "sequencer-0",
        "r0p1", "reader-0"), as HOST:PORT: what ``ordo up`` prints and a Prometheus
        scrape configuration lists."""
        addrs = {"launcher": self.launcher_metrics_addr}
        for m in range(self.sequencers):
            addrs[f"sequencer-{m}"] = self.sequencer_metrics_addr(m)
        for r in range(self.replicas):
            for p in range(self.partitions):
                addrs[f"r{r}p{p}"] = self.partition_metrics_addr(r, p)
        for i in range(self.readers):
            addrs[f"reader-{i}"] = self.reader_metrics_addr(i)
        return {name: f"{host}:{port}" for name, (host, port) in addrs.items()}

    # Files ---------------------------------------------------------------------
    @property
    def log_dir(self) -> Path:
        """The command log of the single sequencer (sequencer 0's when replicated)."""
        return self.sequencer_log_dir(0)

    def sequencer_log_dir(self, member: int) -> Path:
        if not self.replicated:
            return Path(self.data_dir) / "log"
        return Path(self.data_dir) / f"sequencer-{member}" / "log"

    @property
    def zookeeper_dir(self) -> Path:
        return Path(self.data_dir) / "zookeeper"

    def checkpoint_dir(self, replica: int) -> Path:
        return Path(self.data_dir) / f"replica-{replica}" / "checkpoints"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "metrics_addrs": self.metrics_addrs()}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterConfig:
        d = json.loads(text)
        d.pop("metrics_addrs", None)  # derived from the fields (to_json)
        for name in ("procedure_modules", "sequencer_hosts", "zookeeper_hosts", "reader_hosts"):
            d[name] = tuple(d.get(name, ()))
        d["partition_hosts"] = tuple(tuple(row) for row in d.get("partition_hosts", ()))
        return cls(**d)

    def save(self) -> Path:
        path = Path(self.data_dir) / CONFIG_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, data_dir: str | Path) -> ClusterConfig:
        path = Path(data_dir) / CONFIG_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"no cluster config at {path}: start a cluster with `ordo up` "
                f"or pass --data-dir pointing at one"
            )
        return cls.from_json(path.read_text())
