"""Clients learn the leader by term (txn_library/client/failover.py, the not_leader
answer of txn_library/wire/sequencer.py): a hint naming a term below the highest seen
is never followed, a newer term's hint is followed even to an address just left, and
answers without a term (a deposed leader's, an older sequencer's) work as before. Pure
logic on a given clock: no socket."""

from __future__ import annotations

from txn_library import limits
from txn_library.client.failover import Failover
from txn_library.client.protocol import to_outcome
from txn_library.errors import ERR_NOT_LEADER, ERROR, CallFailed
from txn_library.wire import sequencer as wire

A, B, C = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"
STEP = limits.client_failover_backoff_s


def test_a_not_leader_answer_reads_its_hint_and_term_and_tolerates_older_shapes() -> None:
    assert wire.not_leader_answer((ERR_NOT_LEADER, B, 4)) == (ERR_NOT_LEADER, B, 4)
    assert wire.not_leader_answer((ERR_NOT_LEADER, "deposed: term 5")).term == -1  # type: ignore[union-attr]
    assert wire.not_leader_answer((ERR_NOT_LEADER, B, "x")) == (ERR_NOT_LEADER, B, -1)
    assert wire.not_leader_answer((ERR_NOT_LEADER,)) == (ERR_NOT_LEADER, "", -1)
    assert wire.not_leader_answer(("overloaded", "later")) is None
    assert wire.not_leader_answer("not_leader") is None
    # encoded as a plain array, decoded as the tuple the client reads
    value = wire.unpack(wire.pack(tuple(wire.NotLeaderAnswer(ERR_NOT_LEADER, C, 2))))
    assert wire.not_leader_answer(value) == (ERR_NOT_LEADER, C, 2)


def test_a_single_address_client_is_told_not_leader_clearly() -> None:
    out = to_outcome(ERROR, (ERR_NOT_LEADER, B, 3), 0.0)
    assert isinstance(out, CallFailed) and out.code == ERR_NOT_LEADER and B in str(out)


def test_a_hint_of_an_older_term_is_never_followed() -> None:
    f = Failover([A, B, C], now=0.0)
    f.not_leader(B, 0.0, term=3)  # a follower that saw term 3's election
    assert f.due(STEP, calls_out=True) == B and f.term == 3
    # B does not lead yet and its view is older: it names term 2's leader, A
    f.not_leader(A, 2 * STEP, term=2)
    assert f.stale_hints == 1 and f.term == 3
    assert f.due(3 * STEP, calls_out=True) == C  # the next address, never back to A
    f.not_leader(B, 4 * STEP, term=3)
    assert f.due(5 * STEP, calls_out=True) == B
    f.not_leader(A, 6 * STEP, term=1)
    assert f.due(7 * STEP, calls_out=True) == C and f.term == 3 and f.stale_hints == 2


def test_a_newer_term_is_followed_back_to_a_dropped_address_at_once() -> None:
    f = Failover([A, B, C], now=0.0)
    f.not_leader(A, 0.0, term=1)  # A leads term 1
    assert f.due(STEP, calls_out=True) == A  # already there: resend
    f.heard(STEP)
    f.connection_dropped()  # A's process died
    assert f.due(2 * STEP, calls_out=True) == B
    f.not_leader(A, 3 * STEP, term=1)  # B still names the dead leader, same term
    assert f.due(3 * STEP, calls_out=True) is None  # stays, asks B again shortly
    assert f.due(3 * STEP + STEP, calls_out=True) == B
    # A restarted and was elected again: a newer term names it, followed at once
    f.not_leader(A, 5 * STEP, term=2)
    assert f.due(6 * STEP, calls_out=True) == A and f.term == 2


def test_answers_without_a_term_follow_the_hint_as_before() -> None:
    f = Failover([A, B, C], now=0.0)
    f.not_leader(C, 0.0, term=5)
    assert f.due(STEP, calls_out=True) == C
    f.not_leader("stepping down: commit refused", 2 * STEP)  # a deposed leader's reason
    assert f.due(3 * STEP, calls_out=True) == A  # no address: the next one
    f.not_leader(B, 4 * STEP)  # no term given (an older sequencer): followed
    assert f.due(5 * STEP, calls_out=True) == B and f.term == 5


def test_the_leaders_answers_carry_its_term_and_older_hints_are_ignored_after() -> None:
    replies = [(1, 0, "v"), (2, 0, "w")]
    plain = wire.unpack(wire.encode_results_reply(replies, [3, 0]))
    assert wire.results_term(plain) == 0  # one sequencer: the bytes as before
    msg = wire.unpack(wire.encode_results_reply(replies, None, term=6))
    assert wire.results_term(msg) == 6 and wire.results_epochs(msg, 2) == (0, 0)
    msg = wire.unpack(wire.encode_results_reply(replies, [3, 0], term=6))
    assert wire.results_epochs(msg, 2) == (3, 0) and msg[1] == ((1, 0, "v"), (2, 0, "w"))
    assert wire.results_term((wire.REP_RESULTS, (), (), "6")) == 0
    f = Failover([A, B, C], now=0.0)
    f.leader_term(wire.results_term(msg))  # served by term 6's leader at A
    f.not_leader(C, 0.0, term=5)  # A steps down; an answer naming term 5's C: ignored
    assert f.due(STEP, calls_out=True) == B and f.stale_hints == 1  # the next, not C
