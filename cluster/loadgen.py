"""The one load generator: closed or open loop over ZeroMQ, measurement windows, percentiles.

Used by ``ordo tpcc run`` (tpcc/driver.py), the bank transfer runs (cluster/bank_load.py:
bench_transfers, the demo, recovery and replay tests and benchmarks), the paper
experiments (scripts/paper_experiments.py), the HA benchmark's failover load
(scripts/bench_ha.py), the hostile-input run's good client (scripts/fuzz_cluster.py) and
the queries benchmark (scripts/bench_queries.py).
It is a client of the cluster speaking the client wire contract
(txn_library.client.protocol.ClientProtocol), driven from one thread with no per-call
futures: each loop turn drains the replies, generates the answering terminals' next
calls and sends them together (one frame per socket, unless more than
``limits.loadgen_frame_calls_max`` calls or the intake's byte bound split it).

What it drives (calls, sources, routes, closed and open loops): cluster/load_shapes.py.
Where calls travel (a socket per connection and target, or per connection failing over
between sequencers): cluster/load_sockets.py. Queries straight to a replica's
partitions (snapshot, read committed), calls of the kinds a ``QueryTargets`` names:
cluster/load_queries.py. Raw frames beside the load (hostile input, probes):
cluster/load_raw.py. Measurement records and the one percentile rule:
cluster/measure.py.

Measurement: a run is warm-up, window, drain. Only answers that arrive inside the window
[start + warmup_s, start + warmup_s + duration_s) are counted in ``Window.kinds`` (ok /
aborted / error per kind, latencies of ok and aborted calls). With ``duration_s`` None
the window lasts until the source is exhausted and every call is answered. After the
window the generator sends nothing more and waits up to ``drain_s`` for calls still
outstanding (their answers count only in ``kinds_all`` and the timeline). Latency is
from a call's first send to its answer's arrival, as seen by this loop. ``on_answer``
sees every answer (and timeout) of the run, whatever the phase, with its times: a
client-side ledger keeps what it needs from there.

Invariants and bounds:
- At most ``limits.loadgen_in_flight_max`` calls outstanding in all, queries
  included (closed loop: terminals x in_flight_per_terminal; open loop: in_flight_max),
  checked when a generator is built; per terminal at most ``in_flight_per_terminal``
  (closed loop).
- A call unanswered after ``retry_s`` is resent with the same (client_id, req_id), so it
  executes at most once; once ``timeout_s`` has passed (noticed within ``retry_s``) it
  counts as an error "<proc>: timeout" and its terminal moves on. A connection that
  fails over resends its unanswered calls the same way; ERR_NOT_LEADER is never counted.
- Latencies kept per kind and window: at most ``limits.loadgen_latency_samples_max``;
  past that a seeded uniform sample of that size (reservoir), so percentiles stay
  unbiased and memory stays bounded.
- The timeline holds at most ``limits.loadgen_timeline_buckets_max`` buckets.
- The generator never decides an outcome: every count is a result the cluster returned,
  or a timeout.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import zmq

from cluster.load_queries import QuerySockets, QueryTargets
from cluster.load_shapes import (
    CallLike,
    CallSource,
    ClosedLoop,
    Load,
    OpenLoop,
    Router,
    check_shape,
)
from cluster.load_sockets import LoadSockets
from cluster.measure import (
    KindStats,
    Timeline,
    Window,
    new_timeline,
    timeline_answer,
)
from txn_library import limits
from txn_library.client.protocol import ClientProtocol
from txn_library.errors import ABORTED, ERROR, OK
from txn_library.wire import sequencer as wire
from txn_library.wire.curve import ClientCurve

EXPIRY_CHECK_S = 0.1  # how often outstanding calls are checked for resend and timeout
POLL_MS_MAX = 100  # the loop wakes at least this often
TIMEOUT_CODE = "timeout"


# on_answer(terminal, call, status, value, first sent at, answered at): every answer and
# timeout of a run (times: time.perf_counter seconds)
AnswerHook = Callable[[int, CallLike, Any, Any, float, float], None]
# on_move(at, connection, address): a connection failed over (time.perf_counter seconds)
MoveHook = Callable[[float, int, str], None]


# --- The generator -----------------------------------------------------------------------


# A call sent and not yet answered: (terminal, call, first sent at, last sent at, its
# encoding, index of its socket). A plain tuple: one is built per call on the hot path.
_Pending = tuple[int, CallLike, float, float, bytes, int]


class LoadGenerator:
    """Drives ``source`` against ``targets`` with the shape ``load``; one ``run`` each.

    ``targets``: client addresses; one (the sequencer) unless ``route`` picks among
    several (a traditional cluster's partitions, see ``home_router``) or ``failover``
    is set (every sequencer of a replicated ordering layer: each connection talks to one
    at a time and moves between them, cluster/load_sockets.py). ``connections``: client
    identities (one DEALER socket per target each, or one with failover); terminal t
    uses connection t % connections. ``curve``: CURVE keys, one per target (see
    cluster.security.client_curves). ``queries``: the calls of the kinds it names go
    to the partitions' query sockets as queries (cluster/load_queries.py), the others
    to ``targets``. ``seed`` drives think times, Poisson arrivals and latency sampling.
    Not thread-safe: build, run and close it on one thread
    (cluster/load_background.py runs one on a thread of its own).
    """

    def __init__(
        self,
        targets: str | Sequence[str],
        source: CallSource,
        load: Load,
        *,
        route: Router | None = None,
        connections: int = 1,
        timeout_s: float = limits.client_timeout_s_default,
        retry_s: float = 5.0,
        seed: int = 1,
        failover: bool = False,
        curve: Sequence[ClientCurve] | None = None,
        queries: QueryTargets | None = None,
    ) -> None:
        self.targets = [targets] if isinstance(targets, str) else list(targets)
        check_shape(load, len(self.targets), route, connections, timeout_s, retry_s, failover)
        self.source = source
        self.load = load
        self.route = route
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.rng = random.Random(seed)
        self.malformed_replies = 0  # reply frames or entries that could not be read
        self.socks = LoadSockets(self.targets, connections, failover=failover, curve=curve)
        self.protos: list[ClientProtocol] = self.socks.protos
        self.queries: QuerySockets | None = None
        if queries is not None:
            try:
                self.queries = QuerySockets(
                    queries, self.protos, self.socks.poller, len(self.socks.sockets)
                )
            except BaseException:
                self.socks.close()
                raise
        self._ran = False
        # Run state (a generator runs once)
        self._ids = itertools.count(1)  # req ids, unique across connections
        self._pending: dict[int, _Pending] = {}  # req_id -> call, in order of last send
        # Every slot's outbox: the sequencer sockets', then the query sockets' (the same
        # lists their owners send and empty in place)
        self._outbox = self.socks.outbox
        if self.queries is not None:
            self._outbox = [*self.socks.outbox, *self.queries.outbox]
        self._calls_out = [0] * len(self._outbox)  # pending calls per socket
        self._control: deque[Callable[[Any], None]] = deque()  # replies expected, socket 0
        self._on_answer: AnswerHook | None = None
        self._on_move: MoveHook | None = None
        self._closed = isinstance(load, ClosedLoop)
        self._think_s = load.think_s if isinstance(load, ClosedLoop) else 0.0
        self._finished: list[bool] = []  # closed loop: the terminal's source ran dry
        self._thinking: list[tuple[float, int, int]] = []  # heap (due, seq, terminal)
        self._think_seq = itertools.count()
        self._active = 0  # terminals that may still send
        self._exhausted = False  # open loop: the source ran dry
        self._rr = 0  # open loop: the next terminal
        self._arrivals = 0  # open loop: calls due so far
        self._next_arrival = math.inf
        self._window = Window()
        self._measuring = False
        self._t0 = 0.0

    @property
    def failovers(self) -> int:
        """Times a connection moved to another sequencer (failover)."""
        return self.socks.failovers

    def close(self) -> None:
        if self.queries is not None:
            self.queries.close()
        self.socks.close()

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Running ------------------------------------------------------------------------
    def run(
        self,
        *,
        warmup_s: float = 0.0,
        duration_s: float | None = None,
        drain_s: float = 30.0,
        status_at_edges: bool = False,
        events: Sequence[tuple[float, Callable[[], None]]] = (),
        on_edge: Callable[[str], None] | None = None,
        on_tick: Callable[[float, bool, Window, int], None] | None = None,
        tick_s: float = 1.0,
        timeline_bucket_s: float | None = None,
        late_after_s: float = 0.2,
        on_answer: AnswerHook | None = None,
        on_move: MoveHook | None = None,
    ) -> Window:
        """Warm-up, window, drain; returns the window.

        ``duration_s`` None: the window ends when the source is exhausted and every
        call is answered (or timed out). ``status_at_edges``: the cluster's status is
        read at both edges of the window (``Window.status_start``/``status_end``).
        ``events``: (seconds after start, fn) run once on this thread. ``on_edge``:
        called with "start" and "end" at the window's edges. ``on_tick``: every
        ``tick_s`` until the window ends, with (seconds since start, measuring,
        window so far, calls outstanding). ``timeline_bucket_s``: keep a ``Timeline``
        (needs ``duration_s``). ``on_answer``: every answer and timeout, on this thread
        (``AnswerHook``). ``on_move``: every failover of a connection (``MoveHook``).
        """
        if self._ran:
            raise RuntimeError("a LoadGenerator runs once (answers of a run end with it)")
        self._ran = True
        self._on_answer, self._on_move = on_answer, on_move
        if warmup_s < 0 or (duration_s is not None and duration_s <= 0) or drain_s < 0:
            raise ValueError("warmup_s >= 0, duration_s > 0 (or None) and drain_s >= 0")
        w = self._window
        t0 = self._t0 = time.perf_counter()
        self.socks.start(t0)
        window_start = t0 + warmup_s
        window_end = math.inf if duration_s is None else window_start + duration_s
        if timeline_bucket_s is not None:
            w.timeline = new_timeline(warmup_s, duration_s, timeline_bucket_s, late_after_s)
        events_at = sorted(events, key=lambda e: e[0])
        clock = _Clock(t0, events_at, tick_s if on_tick is not None else None, w.timeline)
        if warmup_s == 0:  # the first calls are inside the window
            self._edge("start", t0, status_at_edges, on_edge)
        self._start_load(t0)
        while True:
            now = time.perf_counter()
            if not self._measuring and now >= window_start:
                self._edge("start", now, status_at_edges, on_edge)
            if now >= window_end or (self._measuring and self._done()):
                break
            next_edge = window_end if self._measuring else window_start
            self._turn(now, next_edge, clock, issuing=True)
            if on_tick is not None and clock.tick_due(time.perf_counter()):
                on_tick(time.perf_counter() - t0, self._measuring, w, len(self._pending))
        self._edge("end", time.perf_counter(), status_at_edges, on_edge)
        clock.stop_ticks()
        deadline = time.perf_counter() + drain_s
        while (self._pending or self._control) and (now := time.perf_counter()) < deadline:
            self._turn(now, deadline, clock, issuing=False)
        self._finish()
        return w

    def _done(self) -> bool:
        """The source is exhausted and nothing is outstanding."""
        if self._pending:
            return False
        if isinstance(self.load, ClosedLoop):
            return self._active == 0 and not self._thinking
        return self._exhausted

    def _edge(
        self, edge: str, now: float, status: bool, on_edge: Callable[[str], None] | None
    ) -> None:
        w = self._window
        if edge == "start":
            w.started_at, self._measuring = now, True
        else:
            w.ended_at, self._measuring = now, False
        if status:

            def keep(body: Any) -> None:
                if edge == "start":
                    w.status_start = body
                else:
                    w.status_end = body

            self._ask_status(keep)
        if on_edge is not None:
            on_edge(edge)

    def _ask_status(self, deliver: Callable[[Any], None]) -> None:
        self._control.append(deliver)
        self.socks.sockets[0].send(wire.encode(wire.StatusRequest()))

    def _turn(self, now: float, next_edge: float, clock: _Clock, *, issuing: bool) -> None:
        """One loop turn: wait for replies (or the next timer), take them, do what is
        due, send what was produced."""
        wake = min(next_edge, clock.next_due(), self._next_send_due(issuing))
        timeout_ms = 0 if wake <= now else min(POLL_MS_MAX, math.ceil((wake - now) * 1000))
        ready = self.socks.poller.poll(timeout_ms)
        now = time.perf_counter()
        slot_of = self.socks.slot_of
        queries = self.queries
        for sock, _events in ready:
            slot = slot_of.get(sock)
            if slot is not None:
                self._receive(sock, slot, now, issuing)
            elif queries is not None and sock in queries.slot_of:
                self._receive_queries(queries, sock, now, issuing)
            else:
                self.socks.dropped(sock)  # a failover connection's monitor
        if self.socks.failover:
            self._fail_over(now)
        if issuing:
            self._send_due(now)
        clock.run_due(now, self, issuing)
        self.socks.flush()
        if queries is not None:
            queries.flush()

    # Sending ------------------------------------------------------------------------
    def _start_load(self, now: float) -> None:
        load = self.load
        if isinstance(load, ClosedLoop):
            self._finished = [False] * load.terminals
            self._active = load.terminals
            k = load.in_flight_per_terminal
            self._issue([t for t in range(load.terminals) for _ in range(k)], now)
        else:
            self._next_arrival = now + self._arrival_gap()

    def _arrival_gap(self) -> float:
        assert isinstance(self.load, OpenLoop)
        if self.load.arrivals == "poisson":
            return self.rng.expovariate(self.load.rate_per_s)
        return 1.0 / self.load.rate_per_s

    def _next_send_due(self, issuing: bool) -> float:
        if not issuing:
            return math.inf
        if isinstance(self.load, OpenLoop):
            return math.inf if self._exhausted else self._next_arrival
        return self._thinking[0][0] if self._thinking else math.inf

    def _send_due(self, now: float) -> None:
        load = self.load
        if isinstance(load, ClosedLoop):
            due: list[int] = []
            while self._thinking and self._thinking[0][0] <= now:
                due.append(heapq.heappop(self._thinking)[2])
            self._issue(due, now)
            return
        while not self._exhausted and self._next_arrival <= now:
            if load.arrivals == "fixed":
                self._arrivals += 1  # from the start, so fixed spacing does not drift
                self._next_arrival = self._t0 + (self._arrivals + 1) / load.rate_per_s
            else:
                self._next_arrival += self._arrival_gap()
            if len(self._pending) >= load.in_flight_max:
                if self._measuring:
                    self._window.skipped += 1
                continue
            self._issue([self._rr], now)
            self._rr = (self._rr + 1) % load.terminals

    def _issue(self, terminals: list[int], now: float) -> None:
        """Send each listed terminal's next call; a terminal whose source gives None is
        done (closed loop) or the source is exhausted (open loop)."""
        finished = self._finished
        source = self.source
        pending = self._pending
        ids = self._ids
        queries = self.queries
        one_socket = len(self.socks.outbox) == 1
        encode = self.protos[0].encode_call
        outbox = self._outbox[0]
        sent = sent_first = 0  # calls sent, and of them to the first socket (one_socket)
        for t in terminals:
            if finished and finished[t]:
                continue
            call = source(t)
            if call is None:
                if finished:
                    finished[t] = True
                    self._active -= 1
                else:
                    self._exhausted = True
                continue
            req_id = next(ids)
            if queries is not None and queries.takes(call):
                data, sock = queries.encode(req_id, call, t % len(self.protos))
                pending[req_id] = (t, call, now, now, data, sock)
                self._outbox[sock].append(data)
                self._calls_out[sock] += 1
            elif one_socket:
                data = encode(req_id, call.proc, call.args)
                pending[req_id] = (t, call, now, now, data, 0)
                outbox.append(data)
                sent_first += 1
            else:
                conn = t % len(self.protos)
                target = 0 if self.route is None else self.route(call.proc, call.args)
                sock = self.socks.slot(conn, target)
                data = self.protos[conn].encode_call(req_id, call.proc, call.args)
                pending[req_id] = (t, call, now, now, data, sock)
                self._outbox[sock].append(data)
                self._calls_out[sock] += 1
            sent += 1
        self._calls_out[0] += sent_first
        if self._measuring:
            self._window.sent += sent

    def _think(self, t: int, now: float) -> None:
        """Closed loop: terminal t sends its next call after its think time."""
        load = self.load
        assert isinstance(load, ClosedLoop)
        delay = load.think_s
        if load.think == "exponential":
            delay = self.rng.expovariate(1.0 / load.think_s)
        heapq.heappush(self._thinking, (now + delay, next(self._think_seq), t))

    # Receiving ----------------------------------------------------------------------
    def _receive(self, sock: zmq.Socket, slot: int, now: float, issuing: bool) -> None:
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.socks.heard(slot, now)
            msg = ClientProtocol.read_reply(frame)
            if msg is None:
                self.malformed_replies += 1
                continue
            kind, body = msg[0], msg[1]
            if kind in (wire.REP_STATUS, wire.REP_OK, wire.REP_ERROR):
                if self._control and slot == 0:
                    self._control.popleft()(body if kind == wire.REP_STATUS else None)
                continue
            if kind != wire.REP_RESULTS or not isinstance(body, tuple):
                self.malformed_replies += 1
                continue
            self.socks.leader_term(slot, wire.results_term(msg))  # as Client does
            self._answer(self.socks.not_leader(slot, body, now), now, issuing)

    def _receive_queries(
        self, queries: QuerySockets, sock: zmq.Socket, now: float, issuing: bool
    ) -> None:
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            answers = queries.answers(frame)
            if answers is None:
                self.malformed_replies += 1
                continue
            self._answer(answers, now, issuing)

    def _answer(self, entries: Iterable[Any], now: float, issuing: bool) -> None:
        """Count answers, entries (req_id, status, value) of outstanding calls (others are
        ignored: late duplicates); closed loop: their terminals send their next calls."""
        pending = self._pending
        w = self._window
        kinds_all = w.kinds_all
        kinds = w.kinds
        timeline = w.timeline
        measuring = self._measuring
        samples_max = limits.loadgen_latency_samples_max
        calls_out = self._calls_out
        on_answer = self._on_answer
        free: list[int] = []
        for entry in entries:
            try:
                req_id, status, value = entry
                p = pending.pop(req_id, None)
            except (TypeError, ValueError):
                self.malformed_replies += 1
                continue
            if p is None:
                continue
            t, call, first_sent = p[0], p[1], p[2]
            calls_out[p[5]] -= 1
            free.append(t)
            kind = call.kind
            kinds_all[kind] += 1
            if timeline is not None:
                timeline_answer(timeline, self._t0, first_sent, now)
            if on_answer is not None:
                on_answer(t, call, status, value, first_sent, now)
            if not measuring:
                continue
            k = kinds.get(kind)
            if k is None:
                k = kinds[kind] = KindStats()
            if status == OK or status == ABORTED:
                if status == OK:
                    k.ok += 1
                else:
                    k.aborted += 1
                if call.multi_partition:
                    k.multi_partition += 1
                latencies = k.latencies_s
                if len(latencies) < samples_max:
                    latencies.append(now - first_sent)
                else:  # reservoir: keep a uniform sample of every latency so far
                    j = self.rng.randrange(k.ok + k.aborted)
                    if j < samples_max:
                        latencies[j] = now - first_sent
            else:
                k.errors += 1
                code = value[0] if status == ERROR and value else str(status)
                w.error_codes[f"{call.proc}: {code}"] += 1
        if not (self._closed and issuing):
            return
        if self._think_s > 0:
            for t in free:
                if not self._finished[t]:
                    self._think(t, now)
            return
        self._issue(free, now)

    def _expire(self, now: float, issuing: bool) -> None:
        """Resend calls unanswered for retry_s (same ids); time out those past timeout_s.

        ``_pending`` is in order of last send (a resend moves a call to the end), so the
        scan stops at the first call too young to look at.
        """
        look_after = min(self.retry_s, self.timeout_s)
        due: list[int] = []
        for req_id, p in self._pending.items():
            if now - p[3] < look_after:
                break
            due.append(req_id)
        timed_out: list[tuple[int, int, tuple[str, str]]] = []
        for req_id in due:
            t, call, first_sent, _last_sent, data, sock = self._pending[req_id]
            if now - first_sent >= self.timeout_s:
                timed_out.append((req_id, ERROR, (TIMEOUT_CODE, "")))
                continue
            del self._pending[req_id]  # back in at the end: the order is by last send
            self._pending[req_id] = (t, call, first_sent, now, data, sock)
            self._outbox[sock].append(data)
        if timed_out:
            self._answer(timed_out, now, issuing)

    def _fail_over(self, now: float) -> None:
        """Connections that failed over (or were told to ask again) resend their
        unanswered calls, same ids; the order of ``_pending`` stays by last send."""
        for slot, moved_to in self.socks.fail_over(now, self._calls_out):
            if moved_to is not None and self._on_move is not None:
                self._on_move(now, slot, moved_to)
            again = [req_id for req_id, p in self._pending.items() if p[5] == slot]
            for req_id in again:
                t, call, first_sent, _last_sent, data, sock = self._pending.pop(req_id)
                self._pending[req_id] = (t, call, first_sent, now, data, sock)
                self._outbox[sock].append(data)

    def _sample(self, now: float) -> None:
        tl = self._window.timeline
        assert tl is not None
        old = sum(1 for p in self._pending.values() if now - p[2] > tl.late_after_s)
        tl.samples.append((round(now - self._t0, 3), len(self._pending), old))

    def _finish(self) -> None:
        w = self._window
        w.unanswered = len(self._pending)
        tl = w.timeline
        if tl is not None:
            for p in self._pending.values():  # never answered: late for good
                b = int((p[2] - self._t0) / tl.bucket_s)
                if b < len(tl.submitted):
                    tl.submitted[b] += 1
                    tl.late[b] += 1


class _Clock:
    """The loop's timers other than sending: events, ticks, expiry checks, samples."""

    def __init__(
        self,
        t0: float,
        events: list[tuple[float, Callable[[], None]]],
        tick_s: float | None,
        timeline: Timeline | None,
    ) -> None:
        self.t0 = t0
        self.events = deque((t0 + at, fn) for at, fn in events)
        self.tick_s = tick_s or math.inf
        self.next_tick = t0 + self.tick_s
        self.next_expiry = t0 + EXPIRY_CHECK_S
        self.timeline = timeline
        self.samples_taken = 0

    def next_sample(self) -> float:
        tl = self.timeline
        if tl is None or self.samples_taken >= len(tl.answers):
            return math.inf
        return self.t0 + (self.samples_taken + 1) * tl.bucket_s

    def next_due(self) -> float:
        due = min(self.next_tick, self.next_expiry, self.next_sample())
        return min(due, self.events[0][0]) if self.events else due

    def tick_due(self, now: float) -> bool:
        if now < self.next_tick:
            return False
        self.next_tick += self.tick_s
        return True

    def stop_ticks(self) -> None:
        self.next_tick = math.inf

    def run_due(self, now: float, gen: LoadGenerator, issuing: bool) -> None:
        while self.events and self.events[0][0] <= now:
            self.events.popleft()[1]()
        if now >= self.next_expiry:
            gen._expire(now, issuing)
            self.next_expiry = now + EXPIRY_CHECK_S
        while now >= self.next_sample():
            gen._sample(now)
            self.samples_taken += 1
