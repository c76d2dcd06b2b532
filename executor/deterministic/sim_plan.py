"""What a seed draws before the run starts: the ranges every draw comes from, the
clients and the fault plan.

The simulator draws, from its one ``random.Random`` and in this order: the cluster's
shape, the workload, the checkpoint interval, the network's link profile
(``link_profile``), the clients (``make_clients``), then the faults (``plan_faults``);
during the run it draws delays, drops, restart and restore times from the same ranges
here. A SimOptions field that is set replaces its draw.

Readers' crashes (``plan_reader_faults``) are drawn from the readers' own generator, so
a run with readers keeps the cluster's draws, and its history, as without them.

With ``SimOptions.ha_faults`` and a replicated ordering layer, ``plan_ha_faults``
then draws the harder faults, each count from 0, at times drawn independently over
the same span (so they overlap: a pause during a cut during a slow store):
- ``pause``: a member (the leader at the time, or a follower) stops, alive and
  silent, for a quarter to two and a half session timeouts; past one, its session
  expires and another member is elected; it resumes with its old beliefs;
- ``oneway``: a link that loses packets one way: the leader's publication to some
  replicas, those replicas' reports to the leader, or some clients' calls to one
  sequencer (the leader at the time, or another);
- ``wipe``: a follower crashes and loses its disk, and restarts empty;
- ``store``: the ensemble loses a server (unreachable for a while, then slow) or is
  slow (each commit costs its committer a latency; some time out after they were
  applied);
- ``clock``: a member's wall clock jumps back (up to half a second) or forward (up
  to five seconds).
They draw after every other fault, so a seed without them keeps its history.

Invariants: the plan is a pure function of the seed and the options; faults fall in
[FAULT_FIRST_US, horizon], while the clients work; a planted bug gets the faults it
needs to show (``lose-synced`` and ``no-retry-rebuild``: a sequencer crash, of mode
"now" for ``lose-synced``; ``publish-before-commit``: two leader faults;
``fenced-leader-serves-reads``: a leader paused past its session;
``partition-accepts-old-term``: the leader's publication cut from a replica).
"""

from __future__ import annotations

import random

from executor.deterministic.sim_client import SimClient
from executor.deterministic.sim_network import LinkProfile
from executor.deterministic.sim_options import Fault, SimOptions
from executor.deterministic.sim_world import World
from txn_library.workloads.contract import Workload

# What a seed draws from (when SimOptions leaves it None), in one place.
SHAPES = ((2, 2), (2, 2), (2, 3), (3, 2), (1, 3))  # (replicas, partitions)
CLIENTS = (2, 6)
IN_FLIGHT_PER_CLIENT = (1, 4)
THINK_MAX_US = (0, 2_000, 20_000)
CLIENT_RETRY_MS = (100, 1_000)
CHECKPOINT_EVERY_EPOCHS = (4, 25)
DELAY_MIN_US = (20, 50, 100)
DELAY_MAX_US = (300, 1_500, 5_000)
SPIKE_PCT = (0.0, 1.0, 5.0)
SPIKE_MAX_US = (5_000, 30_000)
PUB_DROP_PCT = (0, 0, 1, 5, 15)
PARTITION_CRASHES_MAX = 3
PARTITION_DOWN_US = (5_000, 400_000)
CORRUPT_CHECKPOINT_SHARE = 0.2
SEQUENCER_CRASHES_MAX = 2
SEQUENCER_DOWN_US = (5_000, 500_000)
SEQUENCER_CRASH_MODES = ("now", "now", "in_sync", "before_publish", "sync_error")
LEADER_FAULT_MODES = ("kill", "cut")  # replicated ordering layer
FAULT_FIRST_US = 10_000
HORIZON_MIN_US = 200_000  # faults fall in [FAULT_FIRST_US, horizon]: while clients work
CALL_LATENCY_GUESS_US = 25_000  # for the horizon: ~2 epochs per call
SUPERVISOR_RESTART_US = (1_000, 100_000)  # a fail-stopped sequencer is restarted after
REPLICA_RESTORE_US = (1_000, 50_000)  # the operator restores a replica after
CLIENT_START_US = 5_000  # clients start within
READER_CRASHES_MAX = 3  # drawn from the readers' generator
READER_DOWN_US = (5_000, 400_000)
# ha_faults (plan_ha_faults): how many of each at most, and their ranges
PAUSES_MAX = 2
PAUSE_SESSIONS = (0.25, 2.5)  # a pause lasts this many session timeouts
PAUSE_FOLLOWER_SHARE = 0.3
ONEWAY_MAX = 2
ONEWAY_MODES = ("leader-to-parts", "parts-to-leader", "clients-to-seqs")
ONEWAY_US = (20_000, 1_500_000)
WIPES_MAX = 1
WIPE_DOWN_US = (5_000, 500_000)
STORE_FAULTS_MAX = 1
STORE_MODES = ("lose-server", "slow")
STORE_DOWN_US = (50_000, 800_000)  # lose-server: unreachable this long (then slow)
STORE_SLOW_US = (100_000, 2_000_000)  # slow: this long
STORE_COMMIT_US = (1_000, 40_000)  # a slow store's commit latency
STORE_TIMEOUT_PCT = (0.0, 5.0, 20.0)  # a slow store's commits that time out (applied)
CLOCK_JUMPS_MAX = 2
CLOCK_BACK_US = (10_000, 500_000)
CLOCK_FORWARD_US = (10_000, 5_000_000)


def link_profile(rng: random.Random, opts: SimOptions) -> LinkProfile:
    """Delay and loss of the run's network."""
    return LinkProfile(
        delay_min_us=rng.choice(DELAY_MIN_US),
        delay_max_us=rng.choice(DELAY_MAX_US),
        spike_pct=rng.choice(SPIKE_PCT),
        spike_max_us=rng.choice(SPIKE_MAX_US),
        pub_drop_pct=(
            opts.pub_drop_pct if opts.pub_drop_pct is not None else rng.choice(PUB_DROP_PCT)
        ),
    )


def make_clients(world: World, workload: Workload) -> list[SimClient]:
    """The run's clients, each with its share of ``opts.calls`` (its knobs drawn once,
    for all)."""
    rng, opts = world.rng, world.opts
    n = opts.clients or rng.randint(*CLIENTS)
    in_flight = opts.in_flight_max or rng.randint(*IN_FLIGHT_PER_CLIENT)
    think = opts.think_max_us if opts.think_max_us is not None else rng.choice(THINK_MAX_US)
    retry_ms = opts.client_retry_ms or rng.randint(*CLIENT_RETRY_MS)
    clients = []
    for i in range(n):
        count = opts.calls // n + (1 if i < opts.calls % n else 0)
        clients.append(
            SimClient(
                world,
                i,
                workload.client_calls(i, n),
                count,
                in_flight,
                retry_ms * 1000,
                opts.client_timeout_ms * 1000,
                think,
            )
        )
    return clients


def fault_horizon_us(opts: SimOptions, clients: list[SimClient]) -> int:
    """Faults fall before this: while the clients work (a guess from their knobs)."""
    c0 = clients[0]
    per_client = opts.calls / len(clients)
    per_call_us = c0.think_max_us / 2 + CALL_LATENCY_GUESS_US
    return int(max(HORIZON_MIN_US, per_client * per_call_us / c0.in_flight_max))


def plan_reader_faults(
    rng: random.Random, opts: SimOptions, clients: list[SimClient]
) -> list[Fault]:
    """The readers' crashes (kill -9, a restart ``down_us`` later), by time, drawn
    from the readers' own generator ``rng`` (none without readers or faults)."""
    if not opts.faults or opts.readers <= 0:
        return []
    horizon_us = fault_horizon_us(opts, clients)
    n = opts.reader_crashes
    if n is None:
        n = rng.randint(0, READER_CRASHES_MAX)
    faults = [
        Fault(
            rng.randint(FAULT_FIRST_US, horizon_us),
            "reader",
            rng.randrange(opts.readers),
            down_us=rng.randint(*READER_DOWN_US),
        )
        for _ in range(n)
    ]
    return sorted(faults, key=lambda f: f.at_us)


def plan_faults(
    rng: random.Random,
    opts: SimOptions,
    clients: list[SimClient],
    replicas: int,
    partitions: int,
    replicated: bool,
) -> list[Fault]:
    """The faults of the run, by time (none if ``opts.faults`` is off)."""
    if not opts.faults:
        return []
    horizon_us = fault_horizon_us(opts, clients)
    n_part = opts.partition_crashes
    if n_part is None:
        n_part = rng.randint(0, PARTITION_CRASHES_MAX)
    n_seq = opts.sequencer_crashes
    if n_seq is None:
        n_seq = rng.randint(0, SEQUENCER_CRASHES_MAX)
    if opts.plant in ("lose-synced", "no-retry-rebuild"):
        n_seq = max(n_seq, 1)
    faults = []
    for _ in range(n_part):
        faults.append(
            Fault(
                rng.randint(FAULT_FIRST_US, horizon_us),
                "partition",
                rng.randrange(replicas),
                rng.randrange(partitions),
                down_us=rng.randint(*PARTITION_DOWN_US),
                corrupt_checkpoint=(
                    opts.checkpoint_store == "file" and rng.random() < CORRUPT_CHECKPOINT_SHARE
                ),
            )
        )
    if replicated:  # leader kills and cut-offs
        if opts.plant in ("publish-before-commit", "no-exactly-once-rebuild"):
            n_seq = max(n_seq, 2)
        for _ in range(n_seq):
            faults.append(
                Fault(
                    rng.randint(FAULT_FIRST_US, horizon_us),
                    "sequencer",
                    mode=rng.choice(LEADER_FAULT_MODES),
                    down_us=rng.randint(*SEQUENCER_DOWN_US),
                )
            )
        if opts.ha_faults:
            faults += plan_ha_faults(rng, opts, horizon_us, replicas, len(clients))
        return sorted(faults, key=lambda f: f.at_us)
    for _ in range(n_seq):
        mode = rng.choice(SEQUENCER_CRASH_MODES)
        if opts.plant == "lose-synced":
            mode = "now"
        faults.append(
            Fault(
                rng.randint(FAULT_FIRST_US, horizon_us),
                "sequencer",
                mode=mode,
                down_us=rng.randint(*SEQUENCER_DOWN_US),
            )
        )
    return sorted(faults, key=lambda f: f.at_us)


def plan_ha_faults(
    rng: random.Random, opts: SimOptions, horizon_us: int, replicas: int, clients: int
) -> list[Fault]:
    """The replicated layer's harder faults (see module docstring), unsorted."""
    members = opts.sequencers
    session_us = opts.session_timeout_ms * 1000

    def at() -> int:
        return rng.randint(FAULT_FIRST_US, horizon_us)

    def some(n: int) -> tuple[int, ...]:
        return tuple(sorted(rng.sample(range(n), rng.randint(1, n))))

    faults = []
    n_pause = rng.randint(0, PAUSES_MAX)
    if opts.plant == "fenced-leader-serves-reads":
        n_pause = max(n_pause, 2)
    for i in range(n_pause):
        follower = rng.random() < PAUSE_FOLLOWER_SHARE
        lo, hi = PAUSE_SESSIONS
        pause_us = int(session_us * rng.uniform(lo, hi))
        if opts.plant == "fenced-leader-serves-reads" and i == 0:
            follower, pause_us = False, int(session_us * hi)
        faults.append(
            Fault(
                at(), "pause", member=rng.randrange(members) if follower else -1, down_us=pause_us
            )
        )
    n_oneway = rng.randint(0, ONEWAY_MAX)
    if opts.plant == "partition-accepts-old-term":
        n_oneway = max(n_oneway, 2)
    for i in range(n_oneway):
        mode = rng.choice(ONEWAY_MODES)
        if opts.plant == "partition-accepts-old-term" and i == 0:
            mode = "leader-to-parts"
        down = rng.randint(*ONEWAY_US)
        if mode == "clients-to-seqs":
            member = rng.randrange(-1, members)
            faults.append(
                Fault(at(), "oneway", mode=mode, down_us=down, member=member, targets=some(clients))
            )
        else:
            faults.append(Fault(at(), "oneway", mode=mode, down_us=down, targets=some(replicas)))
    for _ in range(rng.randint(0, WIPES_MAX)):
        faults.append(
            Fault(at(), "wipe", member=rng.randrange(members), down_us=rng.randint(*WIPE_DOWN_US))
        )
    for _ in range(rng.randint(0, STORE_FAULTS_MAX)):
        mode = rng.choice(STORE_MODES)
        down = rng.randint(*(STORE_DOWN_US if mode == "lose-server" else STORE_SLOW_US))
        faults.append(
            Fault(
                at(),
                "store",
                mode=mode,
                down_us=down,
                delta_us=rng.randint(*STORE_COMMIT_US),
                timeout_pct=rng.choice(STORE_TIMEOUT_PCT),
            )
        )
    for _ in range(rng.randint(0, CLOCK_JUMPS_MAX)):
        if rng.random() < 0.5:
            delta = -rng.randint(*CLOCK_BACK_US)
        else:
            delta = rng.randint(*CLOCK_FORWARD_US)
        faults.append(Fault(at(), "clock", member=rng.randrange(-1, members), delta_us=delta))
    return faults
