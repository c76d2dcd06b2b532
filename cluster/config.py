"""Cluster layout: how many replicas and partitions, and where every endpoint lives.

Invariants: every address is on 127.0.0.1 (or ipc://); ports are derived from one
base port so a whole cluster is described by (base_port, replicas, partitions,
data_dir). The config is written to ``data_dir/cluster.json`` by ``ordo up`` and read
by every other command, so all processes agree on it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
CONFIG_FILE = "cluster.json"
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
    # tpcc.procedures, `ordo up --module M` any other).
    procedure_modules: tuple[str, ...] = field(default=("txn_library.builtin",))
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
    log_segment_bytes: int = 0  # 0 = limits.segment_bytes_max
    # Fault injection, for tests only: each partition drops every Nth batch it receives
    # over PUB/SUB (0 = never), forcing the gap-repair path through the log service.
    fault_drop_every_nth_batch: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.partitions < 1:
            raise ValueError("replicas and partitions must be >= 1")
        if not (1024 <= self.base_port <= 65535 - 16 - self.replicas * self.partitions):
            raise ValueError(f"base_port {self.base_port} out of range")
        if self.epoch_duration_ms < 1:
            raise ValueError("epoch_duration_ms must be >= 1")

    # Sequencer endpoints -------------------------------------------------------
    @property
    def client_addr(self) -> str:
        return f"tcp://{HOST}:{self.base_port}"

    @property
    def publish_addr(self) -> str:
        return f"tcp://{HOST}:{self.base_port + 1}"

    @property
    def log_service_addr(self) -> str:
        return f"tcp://{HOST}:{self.base_port + 2}"

    @property
    def results_addr(self) -> str:
        return f"tcp://{HOST}:{self.base_port + 3}"

    # Partition endpoints -------------------------------------------------------
    def partition_addr(self, replica: int, partition: int) -> str:
        """Inbound PULL socket of one partition: peer reads and sequencer queries."""
        return f"tcp://{HOST}:{self.base_port + 16 + replica * self.partitions + partition}"

    # Files ---------------------------------------------------------------------
    @property
    def log_dir(self) -> Path:
        return Path(self.data_dir) / "log"

    def checkpoint_dir(self, replica: int) -> Path:
        return Path(self.data_dir) / f"replica-{replica}" / "checkpoints"

    def to_json(self) -> str:
        d = asdict(self)
        d["procedure_modules"] = list(self.procedure_modules)
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterConfig:
        d = json.loads(text)
        d["procedure_modules"] = tuple(d.get("procedure_modules", ()))
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
