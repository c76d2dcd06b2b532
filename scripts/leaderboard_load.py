"""The three ways scripts/leaderboard.py drives a flow, each keeping every batch it
pushed and when it was done.

- ``pipelined`` (the dataflow way): one client pushes batches with increasing ids on
  one ordered connection; a subscriber thread on its own connection follows the flow's
  sink. A batch is done when its output is in the sink: its latency covers the whole
  chain. Closed loop (``rate`` 0): up to ``in_flight`` unanswered pushes, the next sent
  when one is answered; its throughput is the saturating rate. Open loop (``rate``
  R > 0): push i is due at ``t0 + i / R`` whatever came back (``OpenLoop``), and
  latencies count from when it was due, so a sender that falls behind shows in them
  (no coordinated omission); ``in_flight`` still bounds what is unanswered, and a push
  held back by it is counted (``late``).
- ``chained`` (H-Store's ordered way): per batch, synchronous calls push, then each
  step (``Client.call``); the next batch after the last step answered.
- ``unordered`` (asynchronous, no order guaranteed): the push and every step of many
  batches in flight at once through cluster/loadgen.py, whose connections send
  REQ_CALLS_UNORDERED; a batch is done when its last call is answered.

Measurement: a run is ``warmup_s`` then a window of ``seconds`` (or, with ``batches``,
exactly that many batches and the whole run as the window). Batches/s counts batches
done inside the window; latency percentiles are of batches submitted inside it: push to
sink (``latency_ms``) and, for the dataflow way, push to acknowledged
(``ack_latency_ms``). ``timeline`` is batches done per second of the whole run, warm-up
included, so a figure that drifts with the run's length shows where.

Invariants: batch ids are consecutive from ``first``; every batch a loop submits is in
``Run.submitted`` and the loop ends only when each is done or the drain time is over
(``Run.undone`` says how many were not); every call's outcome is counted, none decided
here; an open loop's due times only grow, by exactly ``1 / rate`` a push.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from leaderboard_cluster import Flow, Source

from cluster.load_shapes import Call, CallLike, ClosedLoop
from cluster.loadgen import LoadGenerator
from cluster.measure import latency_percentiles_ms
from txn_library import limits
from txn_library.client import Client
from txn_library.errors import ABORTED, ERROR, OK, BatchesGone, OrdoError
from txn_library.streams import PUSH

QUANTILES = (0.5, 0.99)
DRAIN_S = 60.0  # after the last push, how long a run waits for the rest to be done
SINK_POLL_S = 0.002  # Client.subscribe's default
LATE_S = 0.001  # an open-loop push sent this long after its due time counts as late


@dataclass
class Run:
    """What one load loop did (times: time.perf_counter seconds)."""

    way: str  # "dataflow", "chained" or "async"
    flow: Flow
    source: Source
    first: int
    submitted: dict[int, float] = field(default_factory=dict)  # sent, or due (open loop)
    done: dict[int, float] = field(default_factory=dict)  # its sink batch seen
    acked: dict[int, float] = field(default_factory=dict)  # its push answered (dataflow)
    outputs: dict[int, list[tuple]] = field(default_factory=dict)  # sink batches seen
    refused: int = 0  # pushes answered "aborted" (an id that did not increase)
    skipped: int = 0  # step answers that processed nothing (chained, async)
    sink_gaps: int = 0  # batches the subscriber never saw (fell behind retention)
    errors: Counter[str] = field(default_factory=Counter)
    window: tuple[float, float] = (0.0, 0.0)
    rate: float = 0.0
    late: int = 0  # open loop: pushes sent after their due time (the in-flight bound)
    began: float = 0.0  # when the first push was due

    @property
    def batch_ids(self) -> list[int]:
        return sorted(self.submitted)

    @property
    def undone(self) -> int:
        return len(self.submitted) - len(self.done)

    def summary(self) -> dict[str, Any]:
        w0, w1 = self.window
        span = max(w1 - w0, 1e-9)
        done_in = sum(1 for t in self.done.values() if w0 <= t < w1)
        inside = [b for b, t in self.submitted.items() if w0 <= t < w1]
        lat = [self.done[b] - self.submitted[b] for b in inside if b in self.done]
        row: dict[str, Any] = {
            "way": self.way,
            "flow": self.flow.dataflow,
            "batches": len(self.submitted),
            "first_batch": self.first,
            "window_s": round(span, 2),
            "batches_per_s": round(done_in / span, 1),
            "latency_ms": latency_percentiles_ms(lat, QUANTILES),
            "latency_samples": len(lat),
            "rate_per_s": self.rate or None,
            "undone": self.undone,
            "pushes_refused": self.refused,
            "step_answers_skipped": self.skipped,
            "sink_gaps": self.sink_gaps,
            "errors": dict(self.errors),
            "timeline_per_s": timeline(self.done.values(), self.began or w0),
        }
        if self.acked:
            ack = [self.acked[b] - self.submitted[b] for b in inside if b in self.acked]
            row["ack_latency_ms"] = latency_percentiles_ms(ack, QUANTILES)
            # answers per second: a closed loop's convoys show as multiples of its window
            row["ack_timeline_per_s"] = timeline(self.acked.values(), self.began or w0)
        if self.rate:
            row["pushes_late"] = self.late
        return row


def timeline(times: Iterable[float], start: float) -> list[int]:
    """How many of ``times`` fall in each whole second from ``start`` (earlier ones
    are left out; the last second may be partial)."""
    counts: list[int] = []
    for t in times:
        if t < start:
            continue
        i = int(t - start)
        if i >= len(counts):
            counts.extend([0] * (i + 1 - len(counts)))
        counts[i] += 1
    return counts


class OpenLoop:
    """When each push of an open loop is due: ``start + i / rate`` for the i-th, fixed
    in advance (a late push does not move the ones after it)."""

    def __init__(self, rate: float, start: float) -> None:
        if not rate > 0:
            raise ValueError(f"an open loop needs a rate > 0, not {rate!r}")
        self.rate = rate
        self.start = start

    def due(self, i: int) -> float:
        return self.start + i / self.rate


def _error_name(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:120]


# The dataflow way ------------------------------------------------------------------------
def pipelined(
    address: str,
    flow: Flow,
    source: Source,
    first: int,
    *,
    warmup_s: float,
    seconds: float,
    in_flight: int,
    rate: float = 0.0,
    batches: int | None = None,
    sink_poll_s: float = SINK_POLL_S,
) -> Run:
    """Push batches ``first``, ``first + 1``, ... until the window ends (or ``batches``
    are pushed), at most ``in_flight`` unanswered; with ``rate``, open loop: push i due
    at ``t0 + i / rate`` (module docstring). The subscriber polls the sink every
    ``sink_poll_s`` while it has nothing new."""
    run = Run("dataflow", flow, source, first, rate=rate)
    slots = threading.BoundedSemaphore(in_flight)
    stop = threading.Event()
    follower = threading.Thread(
        target=_follow, args=(address, flow.sink, first, run, stop, sink_poll_s), daemon=True
    )
    follower.start()
    futures = []
    with Client(address) as c:
        t0 = time.perf_counter()
        run.began = t0
        schedule = OpenLoop(rate, t0) if rate else None
        end = t0 + warmup_s + seconds
        b = first
        while _more(b, first, batches, end):
            tuples = source.tuples(b)
            if schedule is not None:
                due = schedule.due(b - first)
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                slots.acquire()
                sent = time.perf_counter()
                if sent - due > LATE_S:
                    run.late += 1
                run.submitted[b] = due
            else:
                slots.acquire()
                run.submitted[b] = time.perf_counter()
            f = c.submit_push(flow.border, b, tuples)
            f.add_done_callback(partial(_acked, run, slots, b))
            futures.append(f)
            b += 1
        pushed_until = time.perf_counter()
        for f in futures:
            try:
                if f.result(timeout=DRAIN_S + limits.client_timeout_s_default).aborted:
                    run.refused += 1
            except (OrdoError, TimeoutError) as e:
                run.errors[_error_name(e)] += 1
    last = b - 1
    deadline = time.perf_counter() + DRAIN_S
    while last >= first and last not in run.done and time.perf_counter() < deadline:
        if not follower.is_alive():
            break
        time.sleep(0.005)
    stop.set()
    follower.join(timeout=10)
    run.window = (t0 + warmup_s, end) if batches is None else (t0, pushed_until)
    if batches is not None and run.done:  # the whole run: until the last batch was done
        run.window = (t0, max(run.done.values()))
    return run


def _acked(run: Run, slots: threading.BoundedSemaphore, batch_id: int, _f: Any) -> None:
    """A push answered (on the client's I/O thread): note when, free its slot."""
    run.acked[batch_id] = time.perf_counter()
    slots.release()


def _more(b: int, first: int, batches: int | None, end: float) -> bool:
    """Whether batch ``b`` is still to be pushed: a count, else until ``end``."""
    return b < first + batches if batches is not None else time.perf_counter() < end


def _follow(
    address: str, sink: str, first: int, run: Run, stop: threading.Event, poll_s: float
) -> None:
    """Subscriber: note when each batch of ``sink`` appears (and keep its tuples), and
    count the batches the sink dropped before it read them (it goes on past a gap)."""

    def gap(g: BatchesGone) -> None:
        run.sink_gaps += g.last_missing - g.first_missing + 1  # the flow's ids are dense

    try:
        with Client(address) as c:
            batches = c.subscribe(
                sink, from_batch=first, poll_s=poll_s, stop=stop.is_set, on_gap=gap
            )
            for b, tuples in batches:
                run.done[b] = time.perf_counter()
                run.outputs[b] = tuples
    except OrdoError as e:
        run.errors[f"subscriber: {_error_name(e)}"] += 1


# H-Store's ordered way -------------------------------------------------------------------
def chained(
    address: str,
    flow: Flow,
    source: Source,
    first: int,
    *,
    warmup_s: float,
    seconds: float,
    batches: int | None = None,
) -> Run:
    """Per batch: call push, then each step, each waiting for the previous answer."""
    run = Run("chained", flow, source, first)
    with Client(address) as c:
        t0 = time.perf_counter()
        end = t0 + warmup_s + seconds
        b = first
        while _more(b, first, batches, end):
            run.submitted[b] = time.perf_counter()
            try:
                if c.call(PUSH, flow.border, b, source.tuples(b)).aborted:
                    run.refused += 1
                for step in flow.steps:
                    if _skipped(c.call(step, b).value):
                        run.skipped += 1
                run.done[b] = time.perf_counter()
            except OrdoError as e:
                run.errors[_error_name(e)] += 1
            b += 1
        run.window = (t0 + warmup_s, end) if batches is None else (t0, time.perf_counter())
    fetch_outputs(address, run)
    return run


def _skipped(value: Any) -> bool:
    return isinstance(value, dict) and "skipped" in value


# Asynchronous, unordered -----------------------------------------------------------------
def unordered(
    address: str,
    flow: Flow,
    source: Source,
    first: int,
    *,
    warmup_s: float,
    seconds: float,
    in_flight: int,
    connections: int,
) -> Run:
    """Push and steps of every batch as independent calls, ``in_flight`` at a time on
    ``connections`` unordered connections (cluster/loadgen.py; terminal t on connection
    t % connections), until the window ends; the batch being handed out then is
    finished, so every batch gets all its calls. One unordered connection keeps its
    single-partition calls in the order sent (sequencer/batch_order.py); several, taken
    round robin by the sequencer as H-Store's many asynchronous clients, do not."""
    run = Run("async", flow, source, first)
    per_batch = 1 + len(flow.steps)
    left: dict[int, int] = {}
    state = {"batch": first, "step": 0}
    end = [0.0]

    def next_call(_terminal: int) -> CallLike | None:
        b, i = state["batch"], state["step"]
        if i == 0:
            if time.perf_counter() >= end[0]:
                return None
            left[b] = per_batch
            call = Call(PUSH, (flow.border, b, source.tuples(b)), "push")
        else:
            call = Call(flow.steps[i - 1], (b,), "step")
        state["step"] = (i + 1) % per_batch
        state["batch"] = b + (state["step"] == 0)
        return call

    def on_answer(
        _t: int, call: CallLike, status: Any, value: Any, sent: float, answered: float
    ) -> None:
        b = call.args[1] if call.proc == PUSH else call.args[0]
        if call.proc == PUSH:
            run.submitted[b] = sent
            if status == ABORTED:
                run.refused += 1
        elif status == OK and _skipped(value):
            run.skipped += 1
        if status == ERROR:
            run.errors[f"{call.proc}: {value[0] if value else status}"] += 1
        left[b] -= 1
        if left[b] == 0:
            run.done[b] = answered

    load = ClosedLoop(terminals=in_flight)
    with LoadGenerator(address, next_call, load, connections=connections) as gen:
        t0 = time.perf_counter()
        end[0] = t0 + warmup_s + seconds
        gen.run(warmup_s=0.0, duration_s=None, drain_s=DRAIN_S, on_answer=on_answer)
    for b in left:  # a batch whose push was never answered still counts as pushed
        run.submitted.setdefault(b, end[0])
    run.window = (t0 + warmup_s, end[0])
    fetch_outputs(address, run)
    return run


# Outputs -----------------------------------------------------------------------------------
def fetch_outputs(address: str, run: Run) -> None:
    """The sink batches the stream still keeps (its last ``retain_batches``) from the
    run's first batch on, for the check (the dataflow way's subscriber saw them all)."""
    with Client(address) as c:
        nxt = run.first
        while True:
            r = c.call("stream.read", run.flow.sink, nxt, limits.stream_read_batches_max)
            if not r.ok:
                run.errors[f"stream.read: {r.value}"] += 1
                return
            page = r.value.get("batches") or []
            for b, tuples in page:
                run.outputs[b] = [tuple(t) for t in tuples]
                nxt = b + 1
            if not page:
                return
