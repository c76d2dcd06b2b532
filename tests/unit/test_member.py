"""The ordering member's state machine (sequencer.member.OrderingMember) over the
in-memory store: followers copy, an elected member claims a term, catches up and
leads, a deposed leader steps down answering its calls not_leader, a follower names
the leader and the term, terms never decrease, a follower removes a leader whose
connection closed and whose address refuses connections from the election (and never
a leader that is merely silent, or reconnected); and both drivers (the live process
and the simulator's node) run this one class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers kv.*)
from sequencer.log import CommandLog
from sequencer.member import CANDIDATE, FOLLOWER, LEADER, MemberConfig, OrderingMember
from sequencer.replication import CommitUnknown, MemoryStore, ReplicatedLog
from sequencer.sequencer import Sequencer
from txn_library.errors import ERR_NOT_LEADER, ERROR, InvariantViolation
from txn_library.wire import sequencer as wire

ROOT = Path(__file__).resolve().parents[2]
ADDRESSES = ["tcp://s0:1", "tcp://s1:1", "tcp://s2:1"]


class FakeElection:
    """The store's election as a test sets it; its term is the store's unless ``term``
    says otherwise (a read from a server that lags)."""

    def __init__(self, store: MemoryStore, leader: int | None, term: int | None = None) -> None:
        self.store = store
        self.named = leader
        self.term = term
        self.changed = True
        self.resigned = 0
        self.me = -1
        self.standing = [0, 1, 2]  # members in election order after the leader
        self.removals: list[int] = []  # remove_dead_leader calls
        self.remove_fails = 0  # that many removals raise first (the store unreachable)

    def take_election_change(self) -> bool:
        changed, self.changed = self.changed, False
        return changed

    def leader(self) -> int | None:
        return self.named

    def current_term(self) -> int:
        return self.store.term if self.term is None else self.term

    def i_lead(self) -> bool:
        return self.named == self.me

    def resign(self) -> None:
        self.resigned += 1

    def remove_dead_leader(self, member: int) -> bool:
        self.removals.append(member)
        if self.remove_fails:
            self.remove_fails -= 1
            raise ConnectionError("ZooKeeper unreachable")  # as kazoo's errors, not NotLeader
        if self.named != member:
            return False
        self.standing.remove(member)
        self.named = self.standing[0] if self.standing else None
        self.changed = True
        return True


class Member(OrderingMember):
    """An OrderingMember with what its owner was told recorded."""

    def __init__(
        self,
        tmp: Path,
        member: int,
        store: MemoryStore,
        election: FakeElection | None = None,
        **config: float | int | None,
    ) -> None:
        self.led: list[Sequencer] = []
        self.retired: list[tuple[Sequencer | None, str]] = []
        if election is not None:
            election.me = member
        super().__init__(
            CommandLog(tmp / f"log-{member}", fsync=False),
            store,
            MemberConfig(member, 3, **config),  # type: ignore[arg-type]
            lambda log, term: Sequencer(log, 1, 2, term=term, seed_source=lambda: 7),
            election=election,
            on_lead=self.led.append,
            on_step_down=lambda seq, reason: self.retired.append((seq, reason)),
        )


def put(seq: Sequencer, req: int, key: str) -> None:
    seq.on_calls(b"conn", b"c1", ((req, "kv.put", (key, req)),))


def leader_with_batches(tmp: Path, store: MemoryStore, batches: int) -> Member:
    """Member 0 elected over an empty store, having committed ``batches`` batches."""
    m = Member(tmp, 0, store)
    m.elected(0.0)
    seq = m.seq
    assert seq is not None
    for i in range(1, batches + 1):
        put(seq, i, f"k{i}")
        assert seq.tick(1_000 + i) is not None
    return m


def test_a_follower_copies_committed_batches_from_the_store_and_the_feed(tmp_path: Path) -> None:
    store = MemoryStore()
    lead = leader_with_batches(tmp_path, store, 5)
    f = Member(tmp_path, 1, store, copy_batches_per_turn=3)
    f.turn(0.0)
    assert (f.role, f.local.last_epoch, f.copy.caught_up) == (FOLLOWER, 3, False)
    f.turn(0.001)  # not caught up: copies again without waiting for the backstop
    assert f.local.last_epoch == 5 and f.copy.caught_up
    # the leader's publication: the next epoch is appended, a gap only noted
    seq = lead.seq
    assert seq is not None
    put(seq, 6, "k6")
    six = seq.tick(2_000)
    put(seq, 7, "k7")
    seven = seq.tick(2_001)
    assert six is not None and seven is not None
    assert f.on_published(six) and f.local.last_epoch == 6
    assert not f.on_published(six)  # already here
    put(seq, 8, "k8")
    eight = seq.tick(2_002)
    assert eight is not None and not f.on_published(eight)  # 7 was missed
    f.turn(0.002)  # the feed showed a gap: copied from the store at once
    assert f.local.last_epoch == 8
    assert [d for _e, d in f.local.read_range(1, 8)] == [store.read(e) for e in range(1, 9)]
    assert lead.local.last_epoch == 8


def test_an_elected_member_claims_a_term_catches_up_and_leads(tmp_path: Path) -> None:
    store = MemoryStore()
    leader_with_batches(tmp_path, store, 8)  # term 1, epochs 1..8
    election = FakeElection(store, leader=0)
    m = Member(tmp_path, 2, store, election, copy_batches_per_turn=2, catch_up_batches_per_turn=3)
    m.turn(0.0)  # a follower: copies, learns who leads and the term
    assert (m.role, m.leader, m.term, m.local.last_epoch) == (FOLLOWER, 0, 1, 2)
    store.trim_through(2)  # nothing lost: it has them
    election.named, election.changed = 2, True
    m.turn(1.0)  # copies 3..4; named: claims term 2 (fencing term 1), copies 5..7
    assert (m.role, m.term, store.term, m.local.last_epoch) == (CANDIDATE, 2, 2, 7)
    assert m.seq is None and m.led == []
    m.turn(1.1)  # copies 8: it holds every committed batch, and leads
    assert (m.role, m.leader) == (LEADER, 2)
    seq = m.seq
    assert seq is not None and m.led == [seq]
    assert isinstance(seq.log, ReplicatedLog) and seq.log.term == 2
    assert seq.epoch == 8  # epochs continue after the last committed batch
    assert m.take_announce() and not m.take_announce()
    hb = wire.unpack(m.heartbeat())
    assert wire.Heartbeat._make(hb) == wire.Heartbeat(8, 2, 2)  # last epoch, term, who
    put(seq, 9, "k9")
    data = seq.tick(9_000)
    assert data is not None and wire.decode_batch(data).term == 2 and store.read(9) == data


def test_a_candidate_that_cannot_catch_up_asks_a_peer_then_resigns(tmp_path: Path) -> None:
    store = MemoryStore()
    leader_with_batches(tmp_path, store, 6)
    store.trim_through(4)  # epochs 1..4 only in the peers' logs now
    election = FakeElection(store, leader=1)
    m = Member(tmp_path, 1, store, election, candidate_catch_up_s_max=2.0)
    m.turn(10.0)
    assert (m.role, m.term, m.copy.gap) == (CANDIDATE, 2, (1, 4))
    assert m.take_peer_fetches() == [(1, 4)]
    m.turn(10.1)  # asked already: not again before the retry time
    assert m.take_peer_fetches() == [] and m.role == CANDIDATE
    m.turn(12.5)  # nobody answered in time: let the next member lead
    assert (m.role, m.seq, election.resigned) == (FOLLOWER, None, 1)


def test_a_candidate_leads_once_a_peer_fills_the_gap(tmp_path: Path) -> None:
    store = MemoryStore()
    old = leader_with_batches(tmp_path, store, 6)
    store.trim_through(4)
    election = FakeElection(store, leader=1)
    m = Member(tmp_path, 1, store, election)
    m.turn(0.0)
    assert m.role == CANDIDATE and m.take_peer_fetches() == [(1, 4)]
    batches = [d for _e, d in old.local.read_range(1, 4)]
    assert m.on_peer_reply(wire.encode(wire.LogBatches(batches, 4))) == 4
    m.turn(0.1)
    assert m.role == LEADER and m.local.last_epoch == 6


def test_a_deposed_leader_steps_down_and_answers_its_calls_not_leader(tmp_path: Path) -> None:
    store = MemoryStore()
    old = leader_with_batches(tmp_path, store, 2)
    new = Member(tmp_path, 1, store)
    new.turn(0.0)
    new.elected(0.0)  # claims term 2: the old leader is fenced
    assert new.role == LEADER and new.term == 2
    seq = old.seq
    assert seq is not None
    put(seq, 10, "x")
    assert seq.tick(5_000) is None  # its commit fails: nothing to publish
    assert old.check_deposed()
    assert (old.role, old.seq, old.leader) == (FOLLOWER, None, None)
    [(retired, reason)] = old.retired
    assert retired is seq and "term" in reason
    answers = retired.take_client_out()[b"conn"]  # in flight or pending: go elsewhere
    assert sorted(r for r, _s, _v in answers) == [1, 2, 10]
    assert {(s, v[0]) for _r, s, v in answers} == {(ERROR, ERR_NOT_LEADER)}
    assert old.local.last_epoch == 2  # never appended what was not committed
    assert not old.check_deposed()  # once


def test_a_leader_cut_off_the_store_steps_down_on_its_turn_or_its_commit(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    m = leader_with_batches(tmp_path, store, 1)
    seq = m.seq
    assert seq is not None
    put(seq, 5, "y")
    store.available = False  # the commit's outcome is unknown: never published
    assert seq.tick(6_000) is None and m.check_deposed()
    [(_retired, reason)] = m.retired
    assert "unreachable" in reason
    store.available = True
    m.elected(1.0)  # leads again, a newer term
    assert m.role == LEADER and m.term == 2
    store.available = False
    m.turn(2.0)  # its progress report fails the same way: it follows
    assert m.role == FOLLOWER and len(m.retired) == 2


def test_a_follower_answers_not_leader_with_the_leader_and_the_term(tmp_path: Path) -> None:
    store = MemoryStore()
    leader_with_batches(tmp_path, store, 1)
    m = Member(tmp_path, 2, store, FakeElection(store, leader=0, term=3))
    m.turn(0.0)
    frame = wire.encode(wire.CallsRequest(b"cl", ((7, "kv.put", ("k", 1)), (8, "kv.get", ("k",)))))
    reply = m.follower_reply([b"id", frame], ADDRESSES.__getitem__, dict, {"q": 1})
    assert isinstance(reply, wire.ResultsReply)
    answers = [(r, s, wire.not_leader_answer(v)) for r, s, v in reply.results]
    want = wire.NotLeaderAnswer(ERR_NOT_LEADER, ADDRESSES[0], 3)
    assert answers == [(7, ERROR, want), (8, ERROR, want)]
    status = m.follower_reply(
        [b"id", wire.encode(wire.StatusRequest())],
        ADDRESSES.__getitem__,
        lambda: {"me": 2},
        {},
    )
    assert status == wire.StatusReply({"me": 2})
    junk = m.follower_reply([b"id", b"\xc1"], ADDRESSES.__getitem__, dict, {})
    assert isinstance(junk, wire.ErrorReply) and ADDRESSES[0] in junk[0]
    m.leader = None  # nobody known: no hint, still the term
    reply = m.follower_reply([b"id", frame], ADDRESSES.__getitem__, dict, {})
    assert isinstance(reply, wire.ResultsReply)
    assert wire.not_leader_answer(reply.results[0][2]) == (ERR_NOT_LEADER, "", 3)


def test_terms_never_decrease(tmp_path: Path) -> None:
    store = MemoryStore()
    store.term = 4  # claimed by others before this member started
    election = FakeElection(store, leader=0)
    m = Member(tmp_path, 1, store, election)
    seen = []
    # (who leads, the store's term, what a lagging server says the term is)
    steps = [(0, 4, None), (0, 4, 2), (1, 4, None), (0, 9, None), (0, 9, 3)]
    for now, (named, term, lagging) in enumerate(steps):
        if m.role == LEADER:
            m.step_down("a newer leader")
        store.term = max(store.term, term)
        election.named, election.term, election.changed = named, lagging, True
        m.turn(float(now * 100))
        seen.append(m.term)
    assert seen == [4, 4, 5, 9, 9]  # a lagging read never takes it back; a claim goes up


def test_a_claim_below_a_known_term_is_an_invariant_violation(tmp_path: Path) -> None:
    store = MemoryStore()
    m = Member(tmp_path, 1, store, FakeElection(store, leader=0, term=4))
    m.turn(0.0)
    assert m.term == 4
    with pytest.raises(InvariantViolation):
        m.elected(1.0)  # the store's claim gives term 1: a store that went back


def test_a_leader_reports_synced_progress_and_trims_what_every_member_has(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    m = leader_with_batches(tmp_path, store, 5)
    store.report_progress(1, 5)
    store.report_progress(2, 3)
    m.turn(100.0)
    assert store.progress()[0] == 5 and m.reported_epoch == 5
    assert store.tail_first_epoch() == 4  # every member has 1..3


def test_a_claim_that_fails_leaves_a_follower(tmp_path: Path) -> None:
    store = MemoryStore()
    m = Member(tmp_path, 1, store)
    store.available = False
    m.elected(0.0)
    assert (m.role, m.term, m.seq, m.retired) == (FOLLOWER, 0, None, [])
    with pytest.raises(CommitUnknown):
        store.claim_term()


def test_a_follower_removes_a_leader_whose_connection_closed_and_is_refused(
    tmp_path: Path,
) -> None:
    """kill -9 of the leader: its kernel closes the connection and nobody listens at
    its address any more. The next member is elected without waiting for the dead
    leader's session, and claims a term (fencing it should it live after all)."""
    store = MemoryStore()
    leader_with_batches(tmp_path, store, 3)  # member 0 leads term 1
    election = FakeElection(store, leader=0)
    m = Member(tmp_path, 1, store, election)
    m.turn(0.0)
    assert (m.role, m.leader, m.term) == (FOLLOWER, 0, 1)
    m.on_peer_connection_lost(0, 1.0)
    m.turn(1.001)  # closed, not yet refused: nothing (a reconnect decides)
    assert election.removals == [] and m.role == FOLLOWER
    m.on_peer_connection_refused(0)
    m.turn(1.02)  # gone: removed, and the election (naming member 1) looked at at once
    assert election.removals == [0] and m.dead_leaders_removed == 1
    assert (m.role, m.term, store.term) == (LEADER, 2, 2)
    assert m.role_report()["dead_leaders_removed"] == 1


def test_a_busy_or_silent_leader_is_never_removed(tmp_path: Path) -> None:
    """Silence is not the signal; nor is a closed connection that comes back, nor a
    refused connection that no closed one preceded (a peer not yet started)."""
    store = MemoryStore()
    leader_with_batches(tmp_path, store, 1)
    election = FakeElection(store, leader=0)
    m = Member(tmp_path, 1, store, election)
    for t in range(100):  # no word from the leader for 100 s
        m.turn(float(t))
    m.on_peer_connection_refused(0)  # no connection had closed
    m.turn(101.0)
    m.on_peer_connection_lost(0, 102.0)
    m.on_peer_connection_up(0)  # reconnected: it listens, so it lives
    m.on_peer_connection_refused(0)
    m.turn(103.0)
    assert election.removals == [] and (m.role, m.leader) == (FOLLOWER, 0)


def test_only_a_follower_removes_and_only_the_leader(tmp_path: Path) -> None:
    store = MemoryStore()
    leader_with_batches(tmp_path, store, 1)
    election = FakeElection(store, leader=0)
    m = Member(tmp_path, 1, store, election)
    m.turn(0.0)
    m.on_peer_connection_lost(2, 1.0)  # another follower died: not this member's concern
    m.on_peer_connection_refused(2)
    m.turn(1.1)
    assert election.removals == []
    election.named, election.changed = 2, True  # ... until the election names it
    m.turn(1.2)  # learns that 2 leads
    m.turn(1.3)  # and that 2 is gone
    assert election.removals == [2] and m.leader == 0  # the election names 0 again
    lead = leader_with_batches(tmp_path / "l", MemoryStore(), 1)
    lead.on_peer_connection_lost(1, 2.0)
    lead.on_peer_connection_refused(1)
    lead.turn(2.1)
    assert lead.role == LEADER and lead.dead_leaders_removed == 0


def test_a_removal_the_store_did_not_answer_is_tried_again(tmp_path: Path) -> None:
    store = MemoryStore()
    leader_with_batches(tmp_path, store, 1)
    election = FakeElection(store, leader=0)
    m = Member(tmp_path, 2, store, election)
    m.turn(0.0)
    m.on_peer_connection_lost(0, 1.0)
    m.on_peer_connection_refused(0)
    election.remove_fails = 1
    with pytest.raises(ConnectionError):  # the owner's guard takes store errors
        m.turn(1.1)
    m.turn(1.2)
    assert election.removals == [0, 0] and m.dead_leaders_removed == 1
    assert (m.role, m.leader) == (FOLLOWER, 1)  # member 1 is next: this one follows


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize(
    "driver", ["cluster/sequencer_server.py", "executor/deterministic/sim_sequencer.py"]
)
def test_both_drivers_run_the_one_member(driver: str) -> None:
    """import-linter cannot require an import: the live process and the simulator's
    node each build an OrderingMember, and neither copies, trims or steps down itself."""
    path = ROOT / driver
    names = _imported_names(path)
    assert "sequencer.member.OrderingMember" in names
    assert "OrderingMember(" in path.read_text()
    state_machine = {
        "sequencer.replication.copy_committed",
        "sequencer.replication.copy_from_peer",
        "sequencer.replication.trim_point",
        "sequencer.replication.NotLeader",
        "sequencer.calls.serve_log_fetch",
    }
    assert not names & state_machine
    assert ".claim_term(" not in path.read_text()
    assert ".step_down(" not in path.read_text().replace("ordering.step_down(", "")
