"""A simulation run's knobs, its planned faults and its result (records, no logic).

SimOptions fields left None are drawn from the seed by the Simulator, so a seed alone
fixes a run; SimResult.trace_digest is the same for the same seed in any process.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SimOptions:
    """A run's knobs; None means drawn from the seed."""

    replicas: int | None = None
    partitions: int | None = None
    clients: int | None = None
    calls: int = 150  # over all clients, besides the workload's setup calls
    in_flight_max: int | None = None  # per client
    think_max_us: int | None = None
    faults: bool = True
    partition_crashes: int | None = None
    sequencer_crashes: int | None = None  # with sequencers > 1: leader kills and cut-offs
    sequencers: int = 1  # > 1: a replicated ordering layer over a simulated store
    # Dataflows' recovery (txn_library.streams): None: weak for odd seeds, strong for
    # even ones (decided without drawing from the seed's generator)
    dataflow_recovery: str | None = None
    # Share of the workload's read-only calls a client sends as snapshot queries straight
    # to a replica's partitions (docs/QUERIES.md); each answer is checked against the
    # serial oracle at the epoch it names. 0: none (and no versions kept).
    query_share: float = 0.0
    # Readers (executor/reader/: every partition in one process, following the log):
    # how many; they need a reader node (Simulator's ``reader_node``). 0: none, and the
    # run is what it was without them. Everything about them draws from their own
    # generator, so readers never change the cluster's history.
    readers: int = 0
    # Share of the workload's read-only calls a client also sends to a reader as a
    # snapshot, at_epoch or read-committed query; each answer is checked against the
    # serial oracle at the epoch it names.
    reader_query_share: float = 0.5
    reader_crashes: int | None = None  # kill -9 and restart (empty) of readers
    session_timeout_ms: int = 1_000  # a lost leader's "ZooKeeper session" expires then
    # With sequencers > 1: also the replicated layer's harder faults, drawn per seed and
    # overlapping (sim_plan.plan_ha_faults): paused members, one-way cuts, wiped
    # followers, the store losing a server or slow, clock jumps. Off: the run is what
    # it was without them.
    ha_faults: bool = False
    pub_drop_pct: float | None = None
    checkpoint_every_epochs: int | None = None
    checkpoint_keep: int = 3
    checkpoint_store: str = "file"  # "file" (executor.core.checkpoint in a temp dir) or "memory"
    checkpoint_write_max_us: int = 20_000
    epoch_ms: int = 10
    client_retry_ms: int | None = None
    client_timeout_ms: int = 15_000
    quiesce_limit_ms: int = 20_000  # after the clients finish
    time_limit_ms: int = 600_000
    plant: str | None = None
    strict_liveness: bool = False  # a call that times out fails the run
    keep_trace: bool = False


@dataclass
class SimResult:
    seed: int
    workload: str
    shape: str
    failures: list[str]
    stalls: list[str]  # liveness: calls never answered
    counters: dict[str, int]
    trace_digest: str
    faults: list[str]
    strict_liveness: bool = False
    trace: list[str] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    # The outcome: (replica, partition, state hash) of every partition at the end, and a
    # digest of every answer the clients' calls got (not their queries')
    final_hashes: list[tuple[int, int, int]] = field(default_factory=list)
    answers_digest: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures and not (self.strict_liveness and self.stalls)

    @property
    def first_failure(self) -> str:
        if self.failures:
            return self.failures[0]
        return self.stalls[0] if self.stalls else ""

    def summary(self) -> str:
        c = self.counters
        state = "ok" if self.ok else f"FAILED ({len(self.failures)} failures)"
        readers = ""
        if c.get("readers"):
            readers = (
                f"readers {c['readers']} (crashes {c['reader_crashes']}, answers checked "
                f"{c['reader_answers']}, refused {c['reader_refusals']}, hashes checked "
                f"{c['reader_hashes_checked']}), "
            )
        return (
            f"seed {self.seed} {self.workload} {self.shape}: {state}; {readers}"
            f"epochs {c['epochs']}, txns {c['txns']} ({c['multi_partition_txns']} multi-partition, "
            f"{c['dependent_restarts']} restarts), calls {c['calls']} "
            f"({c['timeouts']} timed out, {c['client_retries']} retries), "
            f"crashes p{c['partition_crashes']} s{c['sequencer_crashes']}, "
            f"pub drops {c['pub_drops']}, lost {c['lost_in_crash']}, "
            f"checkpoints {c['checkpoints']}, restores {c['replica_restores']}, "
            f"{c['events']} events, {c['sim_ms']} ms simulated"
        )


@dataclass(frozen=True)
class Fault:
    at_us: int
    # "partition", "sequencer" or "reader"; with ha_faults also "pause", "oneway",
    # "wipe", "store" and "clock" (sim_plan.plan_ha_faults)
    kind: str
    replica: int = 0  # "reader": the reader
    partition: int = 0
    mode: str = "now"  # sequencer: "now", "in_sync", "before_publish", "sync_error";
    # replicated: "kill" (the leader, kill -9) or "cut" (the leader off the store);
    # oneway: "leader-to-parts", "parts-to-leader", "clients-to-seqs";
    # store: "lose-server" (unreachable, then slow) or "slow"
    down_us: int = 0
    corrupt_checkpoint: bool = False
    member: int = -1  # pause, clock, wipe: that member (-1: the leader at the time)
    delta_us: int = 0  # clock: the jump; store "slow": a commit's latency
    targets: tuple[int, ...] = ()  # oneway: replicas, or clients
    timeout_pct: float = 0.0  # store: share of commits that time out (applied)

    def describe(self) -> str:
        at, down = self.at_us // 1000, self.down_us // 1000
        who = "the leader" if self.member < 0 else f"seq{self.member}"
        if self.kind == "pause":
            return f"{at} ms: pause {who} for {down} ms"
        if self.kind == "clock":
            return f"{at} ms: {who}'s clock jumps {self.delta_us // 1000:+d} ms"
        if self.kind == "wipe":
            return f"{at} ms: crash a follower, wipe its disk, restart after {down} ms"
        if self.kind == "store":
            return (
                f"{at} ms: store {self.mode} for {down} ms "
                f"(commits take {self.delta_us // 1000} ms, {self.timeout_pct}% time out)"
            )
        if self.kind == "oneway":
            return f"{at} ms: cut {self.mode} {list(self.targets)} for {down} ms"
        if self.kind == "reader":
            return (
                f"{self.at_us // 1000} ms: crash reader{self.replica} for {self.down_us // 1000} ms"
            )
        if self.kind == "partition":
            extra = ", corrupt checkpoint" if self.corrupt_checkpoint else ""
            return (
                f"{self.at_us // 1000} ms: crash r{self.replica}p{self.partition} for "
                f"{self.down_us // 1000} ms{extra}"
            )
        if self.mode == "cut":
            return f"{self.at_us // 1000} ms: cut the leader off the store for {down} ms"
        return (
            f"{self.at_us // 1000} ms: crash sequencer ({self.mode}) for {self.down_us // 1000} ms"
        )
