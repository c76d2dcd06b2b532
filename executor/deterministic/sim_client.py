"""A simulated client: ``txn_library.client.protocol.ClientProtocol`` driven by simulated time.

It encodes calls exactly as ``Client`` does (one encoding per call, frames within
the intake bounds), keeps up to ``in_flight_max`` calls outstanding, resends an
unanswered call with the *same* (client_id, req_id) every ``retry_us``, and gives up
after ``timeout_us`` (a timeout: the call may or may not have committed).

The ledger (``records``) keeps every call made and every answer received, in order,
including second answers to a retried call: the checks compare them with the log and
the serial oracle. ERR_NOT_LEADER (a deposed leader's answer) is not an answer: the
call is resent, same ids, to the leader, as ``Client`` does. The planted bug
``client-new-ids-on-resend`` resends under a new request id instead; the ledger keeps
it one call (``CallRecord.aliases``), so the checks see a call logged twice.

With readers (``SimOptions.readers``), a share of the read-only calls a client takes
from its workload is also sent to a reader as a query (``reader_queries``): a
snapshot at the reader's applied epoch, one at a named epoch (``at_epoch``: near the
newest epoch an answer told this client, or a little ahead of it) or read committed.
The call itself goes to the sequencer as without readers, and everything about the
reader query (whether, which reader, which epoch, its retries) draws from the
readers' generator and never wakes the client's calls: readers never change the
history. A ``not_ready`` answer sends the query to another reader, at most
``READER_NOT_READY_TRIES`` times (the live client tries each reader once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from executor.deterministic.sim_network import Node, Payload
from executor.deterministic.sim_world import World
from txn_library.client.protocol import ClientProtocol
from txn_library.errors import ERR_NOT_LEADER, ERR_NOT_READY, ERROR
from txn_library.procedure import lookup
from txn_library.wire import sequencer as wire

CLIENT_POLL_US = 50_000
# A reader query's isolation, by weight: at the reader's applied epoch, at an epoch the
# query names, read committed (also the applied epoch's state on a reader).
READER_ISOLATIONS = (("snapshot", 4), ("at_epoch", 4), ("read_committed", 2))
READER_AT_EPOCH_BACK_MAX = 30  # a named epoch: up to this many before the newest seen
READER_AT_EPOCH_AHEAD_MAX = 2  # ... or up to this many after it (the reader waits)
READER_AT_EPOCH_AHEAD_SHARE = 0.1
READER_NOT_READY_TRIES = 4


@dataclass
class CallRecord:
    client_id: bytes
    req_id: int
    proc: str
    args: tuple  # as the sequencer decodes it (lists arrive as tuples)
    sent_us: int
    answers: list[tuple[int, int, Any]] = field(default_factory=list)  # (time, status, value)
    sends: int = 0
    timed_out: bool = False
    aliases: list[int] = field(default_factory=list)  # planted: other req ids it was sent as


@dataclass
class QueryRecord:
    """A query a client sent straight to a replica's partitions (a snapshot) or to a
    reader, and every answer it got: (time, status, value, epoch)."""

    qid: int
    proc: str
    args: tuple
    sent_us: int
    answers: list[tuple[int, int, Any, int]] = field(default_factory=list)
    sends: int = 0
    timed_out: bool = False
    isolation: str = "snapshot"
    at_epoch: int = -1  # the epoch it names (-1: the one the answerer picks)
    readers: list[int] = field(default_factory=list)  # the reader of each answer


@dataclass
class _QueryPending:
    record: QueryRecord
    resend_us: int
    deadline_us: int
    not_ready: int = 0


@dataclass
class _Pending:
    record: CallRecord
    encoded: bytes
    resend_us: int
    deadline_us: int


class SimClient:
    def __init__(
        self,
        sim: World,
        index: int,
        calls: Iterator[tuple[str, tuple]],
        count: int,
        in_flight_max: int,
        retry_us: int,
        timeout_us: int,
        think_max_us: int,
    ) -> None:
        self.sim = sim
        self.index = index
        self.node = Node(f"c{index}")
        self.identity = b"conn-%d" % index
        self.proto = ClientProtocol(b"sim-client-%d" % index)
        self.records: list[CallRecord] = []
        self._calls = calls
        self._left = count
        self._setup: list[tuple[str, tuple]] = []
        self._setup_req = -1  # request id of the setup call in flight
        self.in_flight_max = in_flight_max
        self.retry_us = retry_us
        self.timeout_us = timeout_us
        self.think_max_us = think_max_us
        self._pending: dict[int, _Pending] = {}
        self.queries: list[QueryRecord] = []
        self._qpending: dict[int, _QueryPending] = {}
        self.reader_queries: list[QueryRecord] = []
        self._rpending: dict[int, _QueryPending] = {}
        self._reader_epoch_seen = 0  # the newest epoch a reader's answer named
        self._reader_polling = False
        self.started = False
        self.retries = 0
        # Planted ``client-new-ids-on-resend``: req id -> its call (ids no longer index
        # ``records``)
        self._new_ids = sim.opts.plant == "client-new-ids-on-resend"
        self._by_req: dict[int, CallRecord] = {}
        self.on_setup_done: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        return (
            self.started
            and not self._pending
            and not self._qpending
            and not self._setup
            and self._left <= 0
        )

    @property
    def reader_queries_done(self) -> bool:
        """Every reader query answered, refused for good or timed out (not part of
        ``done``: the calls' run must not wait on readers)."""
        return not self._rpending

    def start(self, setup: list[tuple[str, tuple]] | None = None) -> None:
        """Begin; ``setup`` calls go first, one at a time, before the workload's."""
        self.started = True
        self._setup = list(setup or [])
        self.sim.loop.after(CLIENT_POLL_US, self._poll)
        self._fill()

    def _in_setup(self) -> bool:
        return bool(self._setup) or self._setup_req in self._pending

    def _fill(self) -> None:
        if not self._in_setup() and self.on_setup_done is not None:
            hook, self.on_setup_done = self.on_setup_done, None
            hook()
        batch: list[bytes] = []
        while len(self._pending) < self.in_flight_max:
            if self._setup_req in self._pending:
                break  # setup calls run alone, in order
            if self._setup:
                proc, args = self._setup.pop(0)
                batch.append(self._issue(proc, args))
                self._setup_req = self.records[-1].req_id
            elif self._left > 0:
                self._left -= 1
                proc, args = next(self._calls)
                if self.sim.readers and lookup(proc).read_only:
                    self._maybe_ask_reader(proc, args)
                share = self.sim.opts.query_share
                if share > 0 and lookup(proc).read_only and self.sim.rng.random() < share:
                    self._issue_query(proc, args)
                else:
                    batch.append(self._issue(proc, args))
            else:
                break
        if batch:
            self._send(batch)

    def _issue(self, proc: str, args: tuple) -> bytes:
        now = self.sim.loop.now_us
        req_id = self.proto.next_req_id()
        encoded = self.proto.encode_call(req_id, proc, args)
        decoded_args = wire.unpack(wire.pack(args))
        record = CallRecord(self.proto.client_id, req_id, proc, decoded_args, now)
        self.records.append(record)
        if self._new_ids:
            self._by_req[req_id] = record
        self._pending[req_id] = _Pending(
            record, encoded, now + self.retry_us, now + self.timeout_us
        )
        record.sends += 1
        return encoded

    def _send(self, calls: list[bytes]) -> None:
        seq = self.sim.seq_node
        for frame in self.proto.frames(calls):
            self.sim.net.send(
                self.node, seq.node, "call", frame, self._deliver_to_sequencer, park=True
            )

    # Snapshot queries, straight to a partition of a replica (docs/QUERIES.md) ---------
    def _issue_query(self, proc: str, args: tuple) -> None:
        now = self.sim.loop.now_us
        record = QueryRecord(len(self.queries) + 1, proc, wire.unpack(wire.pack(args)), now)
        self.queries.append(record)
        self._qpending[record.qid] = _QueryPending(
            record, now + self.retry_us, now + self.timeout_us
        )
        self._send_query(record)

    def _send_query(self, record: QueryRecord) -> None:
        """To the first partition its footprint touches, of a replica drawn anew."""
        sim = self.sim
        parts = lookup(record.proc).participants_of(record.args, sim.partitions)
        target = sim.parts[sim.rng.randrange(sim.replicas)][parts[0]]
        frame = wire.pack(
            [
                wire.REQ_QUERY,
                self.proto.client_id,
                [[record.qid, record.proc, list(record.args), "snapshot", -1]],
            ]
        )
        record.sends += 1
        identity = self.identity

        def deliver(f: Payload) -> None:
            target.on_query_frame(identity, f)

        sim.net.send(self.node, target.node, "query", frame, deliver)

    def on_query_reply(self, frame: Payload) -> None:
        assert isinstance(frame, bytes)
        msg = wire.unpack(frame)
        now = self.sim.loop.now_us
        answered = False
        for qid, status, value, epoch in msg[1]:  # the value was spliced in packed
            if not 1 <= qid <= len(self.queries):
                self.sim.failure(f"client {self.index}: answer for unknown query {qid}")
                continue
            record = self.queries[qid - 1]
            record.answers.append((now, status, value, epoch))
            if status == ERROR and isinstance(value, tuple) and value[:1] == (ERR_NOT_READY,):
                continue  # that replica is recovering: asked again (another) at the next poll
            if self._qpending.pop(qid, None) is not None:
                answered = True
        if answered:
            self._after_answer()

    # Queries to readers (docs/QUERIES.md, "Readers") ----------------------------------
    def _maybe_ask_reader(self, proc: str, args: tuple) -> None:
        rng = self.sim.readers_rng
        if rng.random() >= self.sim.opts.reader_query_share:
            return
        kinds = [k for k, _ in READER_ISOLATIONS]
        kind = rng.choices(kinds, [w for _, w in READER_ISOLATIONS])[0]
        at = -1
        if kind == "at_epoch":
            seen = self._reader_epoch_seen
            if rng.random() < READER_AT_EPOCH_AHEAD_SHARE:
                at = seen + rng.randint(1, READER_AT_EPOCH_AHEAD_MAX)
            else:
                at = max(0, seen - rng.randint(0, READER_AT_EPOCH_BACK_MAX))
        isolation = "read_committed" if kind == "read_committed" else "snapshot"
        now = self.sim.loop.now_us
        record = QueryRecord(
            len(self.reader_queries) + 1,
            proc,
            wire.unpack(wire.pack(args)),
            now,
            isolation=isolation,
            at_epoch=at,
        )
        self.reader_queries.append(record)
        if not self._reader_polling:
            self._reader_polling = True
            self.sim.loop.after(CLIENT_POLL_US, self._reader_poll)
        self._rpending[record.qid] = _QueryPending(
            record, now + self.retry_us, now + self.timeout_us
        )
        self._send_reader_query(record)

    def _send_reader_query(self, record: QueryRecord) -> None:
        """To a reader drawn anew (up or not: a query to a dead one is lost)."""
        sim = self.sim
        r = sim.readers_rng.randrange(len(sim.readers))
        target = sim.readers[r]
        call = [record.qid, record.proc, list(record.args), record.isolation, record.at_epoch]
        frame = wire.pack([wire.REQ_QUERY, self.proto.client_id, [call]])
        record.sends += 1
        identity = self.identity

        def deliver(f: Payload) -> None:
            target.on_query_frame(identity, f)

        sim.net.send(self.node, target.node, "rquery", frame, deliver)

    def on_reader_reply(self, frame: Payload, reader: int) -> None:
        assert isinstance(frame, bytes)
        msg = wire.unpack(frame)
        now = self.sim.loop.now_us
        for qid, status, value, epoch in msg[1]:  # the value was spliced in packed
            if not 1 <= qid <= len(self.reader_queries):
                self.sim.failure(f"client {self.index}: reader answer for unknown query {qid}")
                continue
            record = self.reader_queries[qid - 1]
            record.answers.append((now, status, value, epoch))
            record.readers.append(reader)
            if status != ERROR:
                self._reader_epoch_seen = max(self._reader_epoch_seen, epoch)
            p = self._rpending.get(qid)
            if p is None:
                continue  # a second answer (the query was resent): checked all the same
            not_ready = (
                status == ERROR and isinstance(value, tuple) and value[:1] == (ERR_NOT_READY,)
            )
            if not_ready and p.not_ready < READER_NOT_READY_TRIES:
                p.not_ready += 1
                p.resend_us = now  # to another reader, at the next poll
                continue
            del self._rpending[qid]

    def _reader_poll(self) -> None:
        now = self.sim.loop.now_us
        for qid, q in list(self._rpending.items()):
            if now >= q.deadline_us:
                del self._rpending[qid]
                q.record.timed_out = True
            elif now >= q.resend_us:
                q.resend_us = now + self.retry_us
                self._send_reader_query(q.record)
        self._reader_polling = bool(self._rpending)
        if self._reader_polling:
            self.sim.loop.after(CLIENT_POLL_US, self._reader_poll)

    def _deliver_to_sequencer(self, frame: Payload) -> None:
        assert isinstance(frame, bytes)
        self.sim.seq_node.on_client_frame(self.identity, frame)

    def on_reply(self, frame: Payload) -> None:
        assert isinstance(frame, bytes)
        reply = self.proto.parse_reply(frame)
        if reply is None or reply[0] != wire.REP_RESULTS:
            self.sim.failure(f"client {self.index}: unreadable reply {frame[:60]!r}")
            return
        now = self.sim.loop.now_us
        answered = False
        for req_id, status, value in reply[1]:
            if req_id is None:
                self.sim.failure(f"client {self.index}: frame rejected: {value!r}")
                continue
            record = self._record_of(req_id)
            if record is None:
                self.sim.failure(f"client {self.index}: answer for unknown request {req_id}")
                continue
            if status == ERROR and isinstance(value, tuple) and value[:1] == (ERR_NOT_LEADER,):
                p = self._pending.get(req_id)  # a deposed leader's: resend to the leader
                if p is not None:
                    p.resend_us = now
                continue
            record.answers.append((now, status, value))
            if self._pending.pop(req_id, None) is not None:
                answered = True
        if answered:
            self._after_answer()

    def _record_of(self, req_id: int) -> CallRecord | None:
        if self._new_ids:
            return self._by_req.get(req_id)
        return self.records[req_id - 1] if 1 <= req_id <= len(self.records) else None

    def _renumber(self, req_id: int, p: _Pending) -> _Pending:
        """Planted ``client-new-ids-on-resend``: the resend is a new request."""
        record = p.record
        new_id = self.proto.next_req_id()
        encoded = self.proto.encode_call(new_id, record.proc, record.args)
        del self._pending[req_id]
        moved = _Pending(record, encoded, p.resend_us, p.deadline_us)
        self._pending[new_id] = moved
        self._by_req[new_id] = record
        record.aliases.append(new_id)
        if self._setup_req == req_id:
            self._setup_req = new_id
        return moved

    def _after_answer(self) -> None:
        think = self.sim.rng.randint(0, self.think_max_us) if self.think_max_us else 0
        self.sim.loop.after(think, self._fill)

    def _poll(self) -> None:
        now = self.sim.loop.now_us
        resend: list[bytes] = []
        expired = False
        for req_id, p in list(self._pending.items()):
            if now >= p.deadline_us:
                del self._pending[req_id]
                p.record.timed_out = True
                expired = True
                self.sim.trace.note(now, f"timeout c{self.index} {req_id} {p.record.proc}")
            elif now >= p.resend_us:
                if self._new_ids:
                    p = self._renumber(req_id, p)
                p.resend_us = now + self.retry_us
                p.record.sends += 1
                self.retries += 1
                resend.append(p.encoded)
        if resend:
            self._send(resend)
        for qid, q in list(self._qpending.items()):
            if now >= q.deadline_us:
                del self._qpending[qid]
                q.record.timed_out = True
                expired = True
            elif now >= q.resend_us:
                q.resend_us = now + self.retry_us
                self._send_query(q.record)
        if expired:
            self._after_answer()
        if not self.done:
            self.sim.loop.after(CLIENT_POLL_US, self._poll)
