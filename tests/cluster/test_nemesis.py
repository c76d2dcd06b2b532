"""The nemesis (cluster/nemesis.py): its schedule, and two minutes of it against the HA
cluster on network-namespace hosts.

The schedule tests are pure (no processes): a schedule is a function of its seed, and
no instant of it has more faults open than the cluster survives. The run is CI's
version of ``scripts/nemesis.py --minutes 2 --seed 5`` (seed 5's two minutes kill the
leader and a follower, stop the leader, cut two hosts off in turn, kill each ZooKeeper
server and kill and stop partitions of both replicas) and holds the cluster to every
check of the nemesis. Like test_ha_hosts.py, it fails, never skips, where namespaces
cannot be made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from cluster.nemesis import (
    OPEN_FAULTS_MAX,
    ZK_SERVERS,
    events_of,
    make_schedule,
    open_faults_at,
    run_nemesis,
    summary_lines,
    survivable,
)
from cluster.netns import Hosts
from cluster.netns_cluster import HOSTS

CI_SEED = 5
CI_DURATION_S = 120.0
LONG_S = 1800.0


@pytest.mark.parametrize("seed", range(1, 41))
def test_a_schedule_is_a_function_of_its_seed_and_always_survivable(seed: int) -> None:
    faults = make_schedule(seed, LONG_S)
    assert faults == make_schedule(seed, LONG_S)
    assert faults[: len(make_schedule(seed, 60.0))] == make_schedule(seed, 60.0)
    for f in faults:
        assert 0 < f.start_s < f.end_s <= LONG_S
        open_now = open_faults_at(faults, f.start_s)
        assert len(open_now) <= OPEN_FAULTS_MAX
        assert survivable([g.target for g in open_now]), (f, open_now)
    events = events_of(faults)
    assert len(events) == 2 * len(faults)
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)


def test_the_rules_refuse_what_the_cluster_cannot_survive() -> None:
    assert not survivable(["zk1", "zk2"])  # no ZooKeeper quorum
    assert not survivable(["h1", "zk3"])  # a cut host takes its ZooKeeper server
    assert not survivable(["sequencer:leader", "h2"])  # two sequencers
    assert not survivable(["r0p1", "r1p1"])  # partition 1 has no replica left
    assert not survivable(["r0p0", "r1p1"])  # no replica whole: multi-partition txns stall
    assert not survivable(["h2", "h3"])
    assert not survivable(["r0p0", "zk1", "sequencer:follower"])  # three at once
    assert not survivable(["h2", "r1p0"])  # h2 holds replica 0 of every partition
    assert survivable(["sequencer:leader", ZK_SERVERS[0]])
    assert survivable(["h3", "r1p0"])  # the same replica twice: the other serves


def test_the_ci_schedule_has_every_kind_of_fault() -> None:
    faults = make_schedule(CI_SEED, CI_DURATION_S)
    targets = {(f.kind, f.target) for f in faults}
    assert {f.kind for f in faults} == {"kill9", "sigstop", "link", "zk"}
    assert ("kill9", "sequencer:leader") in targets
    assert ("sigstop", "sequencer:leader") in targets


def test_two_minutes_of_faults_leave_every_acknowledged_transfer_applied_once(
    make_hosts: Callable[[Sequence[str]], Hosts], tmp_path: Path
) -> None:
    net = make_hosts(HOSTS)
    result = run_nemesis(net, tmp_path, CI_DURATION_S, CI_SEED)
    summary = "\n".join(summary_lines(result))
    assert result.get("ok"), summary
    planned = events_of(make_schedule(CI_SEED, CI_DURATION_S))
    assert [(a["action"], a["target"]) for a in result["applied"]] == [
        (e.action, e.target) for e in planned
    ]
    assert result["acked"] > 0, summary
