"""One member of the replicated ordering layer: its state machine, without I/O.

Every sequencer process of a replicated cluster runs one ``OrderingMember`` over its
own command log and a store (``sequencer.replication.OrderingStore``: ZooKeeper in a
cluster, cluster.ordering_zk; ``MemoryStore`` through the simulator's or a test's
view). The live loop (cluster.sequencer_server) and the simulator's node
(executor.deterministic.sim_sequencer) drive this same class; they keep only sockets,
clocks and their scheduling. Time comes in as ``now_s`` (monotonic seconds); what goes
out is returned, or handed to the callbacks the owner gave (``on_lead``,
``on_step_down``), or left in ``peer_fetches`` for the owner to send.

The states (``role``):
- FOLLOWER: copies committed batches into its local log: from the leader's
  publication (``on_published``: the next epoch only), from the store
  (``copy_committed``) when the feed showed a gap, when the last copy was not caught
  up, and at least every ``copy_backstop_s``; what the store has trimmed, from a peer's
  log service (``peer_fetches``, then ``on_peer_reply``). It reports its synced last
  epoch as progress, watches the election (when the owner gave one), and answers calls
  with ERR_NOT_LEADER naming the leader it knows and the term it believes current
  (``follower_reply``). It hastens a dead leader's replacement (below).
- CANDIDATE: named by the election (``elected``): it has claimed a new term and
  copies until it holds every committed batch, then leads; one that cannot catch up
  within ``candidate_catch_up_s_max`` resigns, so the next member leads.
- LEADER: serves through a ``Sequencer`` built over ``ReplicatedLog`` (each batch
  committed to the store under its term before it is appended and published; every
  batch and heartbeat carries the term). It reports progress and trims the store's
  tail (``trim_point``). A commit that fails (``NotLeader``: Deposed or CommitUnknown),
  a lost session (the owner's ``step_down``) or a newer leader ends it:
  ``Sequencer.step_down`` answers every unanswered call ERR_NOT_LEADER (clients resend,
  same ids, to the next leader) and the member follows.

A dead leader, told by its connections: the owner reports what happens to its
connection to each peer's publication (``on_peer_connection_lost``, ``_refused``,
``_up``). A connection the peer's kernel closed, followed by a reconnect to the peer's
address that is refused (nobody listens there), means the peer's process is gone: a
kill -9 or a crash, not a busy or slow leader, whose kernel keeps its connections and
accepts new ones. A follower that learns so of the leader the election names removes
that leader's standing from the election (``Election.remove_dead_leader``) instead of
waiting for its session to expire, and looks at the election at once; the next member
is elected and claims a term as always. Silence is never the signal: a leader that is
paused or cut off keeps its connections (or their closing is never seen), and its
session's expiry stays the backstop. Fencing is unchanged: even if the removed leader
lived, the new term's claim makes every commit of its term fail.

Embedded (no store): the member leads at once under term 0 over its plain command log
(``lead_alone``), as in Calvin without replication.

Invariants:
- ``seq`` is a Sequencer exactly while ``role`` is LEADER.
- The term this member knows never decreases; a claimed term is above every term it
  knew before.
- The local log only grows by committed batches, in epoch order (the next epoch from
  the feed, copies from the store or a peer; a leader's appends follow their commit).
- Progress written to the store is an epoch the local log has synced.
- Only a follower removes a leader from the election, and only one whose connection
  closed and whose address then refused a connection, with no connection up since.
- Nothing here reads a clock, opens a socket or starts a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sequencer.calls import is_req_id, serve_log_fetch
from sequencer.log import CommandLog
from sequencer.replication import (
    CopyProgress,
    NotLeader,
    OrderingStore,
    ReplicatedLog,
    copy_committed,
    copy_from_peer,
    trim_point,
)
from sequencer.sequencer import Sequencer
from txn_library import limits
from txn_library.errors import ERR_NOT_LEADER, ERROR, invariant
from txn_library.wire import sequencer as wire

log = logging.getLogger("ordo.sequencer")

LEADER, FOLLOWER, CANDIDATE = "leader", "follower", "candidate"

PEER_FETCH_RETRY_S = 0.5  # a gap's request to a peer is resent this often until answered


class Election(Protocol):
    """Who leads, as the store's election says (cluster.ordering_zk.ZooKeeperStore).
    The simulator elects from outside and calls ``OrderingMember.elected`` itself."""

    def take_election_change(self) -> bool:
        """Whether the election's members changed since the last call (then cleared:
        a later change is seen by the next call)."""
        ...

    def leader(self) -> int | None:
        """The member the election names, or None if nobody stands."""
        ...

    def current_term(self) -> int:
        """The store's current term."""
        ...

    def i_lead(self) -> bool:
        """This member is the one the election names."""
        ...

    def resign(self) -> None:
        """Leave the election and stand again at the back."""
        ...

    def remove_dead_leader(self, member: int) -> bool:
        """Remove ``member``'s standing if the election names it (its process is gone:
        its connections closed and its address refuses new ones), so the next member
        is named now rather than when its session expires. False if the election names
        another member or nobody (e.g. its session already ended)."""
        ...


@dataclass(frozen=True)
class MemberConfig:
    """How often a member does what (seconds). ``sync_every_s`` None: the owner syncs
    the local log (the simulator, after each batch, as its crash model needs), and the
    member syncs it only where a copy or a progress report must; ``progress_every_s``
    or ``trim_every_s`` None: never (the simulator's end checks read the whole
    committed log from its store)."""

    member: int
    members: int  # sequencers in the layer: the trim waits for each; peers to copy from
    copy_batches_per_turn: int = limits.sequencer_copy_batches_per_turn
    catch_up_batches_per_turn: int = limits.sequencer_copy_batches_per_turn  # candidate
    copy_backstop_s: float = limits.sequencer_copy_backstop_s
    election_check_s: float = limits.sequencer_election_check_s
    candidate_catch_up_s_max: float = limits.sequencer_candidate_catch_up_s_max
    sync_every_s: float | None = limits.sequencer_local_sync_s
    progress_every_s: float | None = limits.sequencer_progress_every_s
    trim_every_s: float | None = limits.sequencer_trim_every_s

    def __post_init__(self) -> None:
        invariant(0 <= self.member < max(self.members, 1), "member id outside the layer")
        invariant(
            self.copy_batches_per_turn > 0 and self.catch_up_batches_per_turn > 0,
            "a copy moves at least one batch per turn",
        )


SequencerFactory = Callable[[CommandLog | ReplicatedLog, int], Sequencer]
ReplicatedLogFactory = Callable[[CommandLog, OrderingStore, int], ReplicatedLog]


class OrderingMember:
    """One sequencer's part in the ordering layer (see module docstring).

    ``new_sequencer(command_log, term)`` builds the leader's role with the owner's
    options; ``on_lead(seq)`` is told once it leads; ``on_step_down(seq, reason)`` once
    a leader (``seq``: its retired Sequencer, whose outbox holds the ERR_NOT_LEADER
    answers to send) or a candidate (``seq`` None) follows again."""

    def __init__(
        self,
        local: CommandLog,
        store: OrderingStore | None,
        config: MemberConfig,
        new_sequencer: SequencerFactory,
        *,
        election: Election | None = None,
        on_lead: Callable[[Sequencer], None] | None = None,
        on_step_down: Callable[[Sequencer | None, str], None] | None = None,
        replicated_log: ReplicatedLogFactory = ReplicatedLog,
    ) -> None:
        self.local = local
        self.store = store
        self.config = config
        self.member = config.member
        self.election = election
        self._new_sequencer = new_sequencer
        self._on_lead = on_lead
        self._on_step_down = on_step_down
        self._replicated_log = replicated_log
        self.seq: Sequencer | None = None
        self.role = FOLLOWER
        self.term = 0  # the newest term this member knows
        self.leader: int | None = None  # the member it believes leads (None: unknown)
        self.copy = CopyProgress(0, local.last_epoch, local.last_epoch)
        self.announce = False  # a new leader names itself (a heartbeat) before anything
        self.peer_fetches: list[tuple[int, int]] = []  # epoch ranges to ask a peer for
        self.reported_epoch = -1  # the last progress written to the store
        self._feed_behind = False  # the feed showed an epoch past the next one
        self._candidate_since = 0.0
        self._peer_fetch_at = 0.0
        self._next_sync = self._next_progress = self._next_trim = 0.0
        self._next_copy = self._next_election = self._election_backstop = 0.0
        # Peers whose publication connection closed (not up since), and of those, the
        # ones whose address then refused a connection: their process is gone.
        self._peer_closed: dict[int, float] = {}  # peer -> when its connection closed
        self._peer_gone: set[int] = set()
        self.dead_leaders_removed = 0  # leaders this member removed from the election

    # State ---------------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        return self.role == LEADER

    def role_report(self) -> dict[str, Any]:
        """Who this member is and what it believes, for status reports."""
        return dict(
            role=self.role,
            member=self.member,
            term=self.term,
            leader=self.leader,
            local_last_epoch=self.local.last_epoch,
            replicated=self.store is not None,
            dead_leaders_removed=self.dead_leaders_removed,
        )

    def heartbeat(self) -> bytes:
        """The leader's heartbeat: its last epoch, its term, who it is."""
        seq = self.seq
        invariant(seq is not None, "only a leader sends heartbeats")
        assert seq is not None  # for mypy: the invariant above
        return wire.pack(wire.Heartbeat(seq.epoch, self.term, self.member))

    def take_announce(self) -> bool:
        """True once after taking leadership: send a heartbeat now."""
        announce, self.announce = self.announce, False
        return announce

    def take_peer_fetches(self) -> list[tuple[int, int]]:
        out, self.peer_fetches = self.peer_fetches, []
        return out

    # Leadership ----------------------------------------------------------------------
    def lead_alone(self) -> Sequencer:
        """Embedded (no store): lead at once, term 0, over the plain command log."""
        invariant(self.store is None, "a replicated member leads only once elected")
        return self._lead(0)

    def elected(self, now_s: float) -> None:
        """The election names this member: claim a new term (fencing every older
        leader), copy what it lacks, and lead once it holds every committed batch."""
        store = self.store
        invariant(store is not None, "only a replicated member is elected")
        assert store is not None  # for mypy: the invariant above
        invariant(self.role == FOLLOWER, f"elected while {self.role}")
        try:
            term = store.claim_term()
            invariant(term > self.term, f"claimed term {term} after knowing term {self.term}")
            self.term = term
            self.role = CANDIDATE
            self._candidate_since = now_s
            log.info("sequencer %d elected: term %d, catching up", self.member, term)
            self._copy_committed(now_s)
            self._lead_if_caught_up(now_s)
        except NotLeader as e:
            self.step_down(str(e))

    def _lead_if_caught_up(self, now_s: float) -> None:
        if self.role != CANDIDATE:
            return
        if self.copy.caught_up:
            self._lead(self.term)
        elif now_s - self._candidate_since > self.config.candidate_catch_up_s_max:
            log.warning(
                "sequencer %d cannot catch up (local %d, committed %d, gap %s): resigning",
                self.member,
                self.copy.local_last_epoch,
                self.copy.store_last_epoch,
                self.copy.gap,
            )
            self.role = FOLLOWER
            if self.election is not None:
                self.election.resign()

    def _lead(self, term: int) -> Sequencer:
        """Build the Sequencer over the (caught-up) local log and serve."""
        if self.config.sync_every_s is not None:  # else the owner syncs it (the simulator)
            self.local.sync()
        cmd_log: CommandLog | ReplicatedLog = self.local
        if self.store is not None:
            cmd_log = self._replicated_log(self.local, self.store, term)
        seq = self._new_sequencer(cmd_log, term)
        self.seq, self.term, self.leader, self.role = seq, term, self.member, LEADER
        self.announce = True
        if self._on_lead is not None:
            self._on_lead(seq)
        return seq

    def step_down(self, reason: str) -> None:
        """Stop leading (or standing): answer what is unanswered (ERR_NOT_LEADER), then
        follow. A follower stays one (it forgets who leads)."""
        seq, was = self.seq, self.role
        if seq is not None:
            seq.step_down(reason)
        self.seq, self.role, self.leader = None, FOLLOWER, None
        if was != FOLLOWER and self._on_step_down is not None:
            self._on_step_down(seq, reason)

    def check_deposed(self) -> bool:
        """After a tick: a leader whose commit failed steps down (True)."""
        seq = self.seq
        if seq is None or seq.deposed is None:
            return False
        self.step_down(seq.deposed)
        return True

    # Housekeeping --------------------------------------------------------------------
    def turn(self, now_s: float) -> None:
        """A replicated member's housekeeping: sync, copy, progress, trim, election.

        A NotLeader from the store ends leadership or candidacy here; any other store
        error (ZooKeeper unreachable or slow) propagates, and the owner tries again on
        its next turn (every step below is safe to repeat)."""
        invariant(self.store is not None, "only a replicated member has housekeeping")
        try:
            self._turn(now_s)
        except NotLeader as e:
            self.step_down(str(e))

    def _turn(self, now_s: float) -> None:
        config, store = self.config, self.store
        assert store is not None  # turn() checked
        if config.sync_every_s is not None and now_s >= self._next_sync:
            self._next_sync = now_s + config.sync_every_s
            self.local.sync()
        if self.role == LEADER:
            self._report_progress_if_due(now_s)
            if config.trim_every_s is not None and now_s >= self._next_trim:
                self._next_trim = now_s + config.trim_every_s
                store.trim_through(
                    trim_point(self.local.last_epoch, store.progress(), config.members)
                )
            return
        if self._feed_behind or not self.copy.caught_up or now_s >= self._next_copy:
            self._feed_behind = False
            self._next_copy = now_s + config.copy_backstop_s
            self._copy_committed(now_s)
        self._report_progress_if_due(now_s)
        self._remove_dead_leader(now_s)
        self._watch_election(now_s)
        self._lead_if_caught_up(now_s)

    def _remove_dead_leader(self, now_s: float) -> None:
        """A follower whose leader's process is gone (see the module docstring) removes
        it from the election and looks at the election at once; it tries again after
        each further refused reconnect while it still believes that member leads. A
        store error propagates (the owner's next turn tries again)."""
        election, leader = self.election, self.leader
        if election is None or self.role != FOLLOWER or leader not in self._peer_gone:
            return
        assert leader is not None  # in _peer_gone
        if election.remove_dead_leader(leader):
            self.dead_leaders_removed += 1
            log.warning(
                "sequencer %d: leader %d's connection closed %.0f ms ago and its address "
                "refuses connections: removed it from the election (term %d)",
                self.member,
                leader,
                1000.0 * (now_s - self._peer_closed.get(leader, now_s)),
                self.term,
            )
        self._peer_gone.discard(leader)
        self._next_election = self._election_backstop = now_s

    def _watch_election(self, now_s: float) -> None:
        election = self.election
        if election is None or self.role != FOLLOWER or now_s < self._next_election:
            return
        if not (election.take_election_change() or now_s >= self._election_backstop):
            return
        self._next_election = now_s + self.config.election_check_s
        self._election_backstop = now_s + self.config.copy_backstop_s
        self.leader = election.leader()
        self.term = max(self.term, election.current_term())  # a lagging server's read
        if election.i_lead():
            self.elected(now_s)

    def _report_progress_if_due(self, now_s: float) -> None:
        every = self.config.progress_every_s
        if every is not None and now_s >= self._next_progress:
            self._next_progress = now_s + every
            self.report_progress()

    def report_progress(self) -> None:
        """Write this member's synced last epoch to the store if it moved (a quorum
        write: only when there is news)."""
        assert self.store is not None
        self.local.sync()  # progress decides the trim: report synced epochs only
        epoch = self.local.last_epoch
        if epoch != self.reported_epoch:
            self.store.report_progress(self.member, epoch)
            self.reported_epoch = epoch

    def _copy_committed(self, now_s: float) -> None:
        assert self.store is not None
        config = self.config
        batches = (
            config.catch_up_batches_per_turn
            if self.role == CANDIDATE
            else config.copy_batches_per_turn
        )
        self.copy = copy_committed(self.local, self.store, batches)
        gap = self.copy.gap
        if gap is not None and now_s >= self._peer_fetch_at and config.members > 1:
            self._peer_fetch_at = now_s + PEER_FETCH_RETRY_S
            self.peer_fetches.append(gap)

    # Inputs --------------------------------------------------------------------------
    def on_peer_connection_lost(self, peer: int, now_s: float) -> None:
        """The connection to ``peer``'s publication closed (its kernel, or the network,
        ended it). Nothing follows from this alone: a reconnect decides."""
        self._peer_closed.setdefault(peer, now_s)

    def on_peer_connection_refused(self, peer: int) -> None:
        """A reconnect to ``peer``'s publication failed (refused: nobody listens at its
        address). After a lost connection this says the peer's process is gone; a
        follower whose leader it is removes it from the election on its next turn."""
        if peer in self._peer_closed:
            self._peer_gone.add(peer)

    def on_peer_connection_up(self, peer: int) -> None:
        """A connection to ``peer``'s publication is up: something listens there."""
        self._peer_closed.pop(peer, None)
        self._peer_gone.discard(peer)

    def on_published(self, data: bytes) -> bool:
        """A batch another sequencer published (a committed one): a follower appends
        the next epoch; anything else it ignores (a gap is copied from the store).
        True if appended. Raises ValueError or TypeError on a malformed batch,
        LogCorruption if the local log refuses it."""
        if self.role == LEADER:
            return False
        batch = wire.decode_batch(data)  # checked whole, as a copy is
        epoch = batch.epoch
        last = self.local.last_epoch
        if epoch != last + 1:
            self._feed_behind = epoch > last
            return False
        self.local.append(epoch, data)
        if batch.flags & wire.FLAG_DEPLOY:
            self.local.mark(epoch)  # its deploys are installed when this member leads
        return True

    def on_peer_reply(self, data: bytes) -> int:
        """A peer log service's LogBatches: append what extends the local log; returns
        how many. Raises ValueError or TypeError on a malformed reply, LogCorruption
        if the local log refuses it."""
        msg = wire.unpack(data)
        reply = wire.LogBatches._make(msg[1:])
        copied = copy_from_peer(self.local, reply.batches)
        if copied:
            self._peer_fetch_at = 0.0
            log.info(
                "copied %d batches from a peer, now at epoch %d", copied, self.local.last_epoch
            )
        return copied

    def serve_log(self, first: int, last: int) -> bytes | None:
        """The log service's reply: the leader's from its Sequencer, a follower's from
        its local log (None: fail-stopped)."""
        if self.seq is not None:
            return self.seq.log_reply(first, last)
        return serve_log_fetch(self.local, first, last)

    def follower_reply(
        self,
        frames: list[bytes],
        leader_address: Callable[[int], str],
        status: Callable[[], dict],
        cluster_info: dict,
    ) -> wire.ControlReply | wire.ResultsReply:
        """What a follower answers a client's frames: status and cluster.info requests
        their answer, calls ERR_NOT_LEADER with the leader's address (if known) and the
        term this member believes current (a client never follows an older term's
        hint), anything else an error naming the leader."""
        msg = None
        if len(frames) == 2 and len(frames[1]) <= limits.request_bytes_max:
            try:
                msg = wire.unpack(frames[1])
            except (ValueError, TypeError):
                msg = None
        kind = msg[0] if isinstance(msg, tuple) and msg else None
        hint = self.leader_hint(leader_address)
        if kind == wire.REQ_STATUS:
            return wire.StatusReply(status())
        if kind == wire.REQ_CLUSTER_INFO:
            return wire.ClusterInfoReply(cluster_info)
        if kind in wire.CALLS_KINDS and isinstance(msg, tuple) and len(msg) == 3:
            calls = msg[2] if isinstance(msg[2], tuple) else ()
            req_ids = [c[0] for c in calls if isinstance(c, tuple) and c and is_req_id(c[0])]
            answer = tuple(wire.NotLeaderAnswer(ERR_NOT_LEADER, hint, self.term))
            return wire.ResultsReply([(r, ERROR, answer) for r in req_ids])
        return wire.ErrorReply(f"{ERR_NOT_LEADER}: {hint or 'no leader known yet'}")

    def leader_hint(self, leader_address: Callable[[int], str]) -> str:
        """The address of the leader this member knows ("" if none, or itself)."""
        if self.leader is None or self.leader == self.member:
            return ""
        return leader_address(self.leader)
