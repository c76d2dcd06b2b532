"""``--check`` of scripts/leaderboard.py: every pushed batch processed exactly once and in
order, read from the command log, and each flow's output equal to a plain-Python model
fed the same input.

From the log (``executor.replay.batches.iter_batches``, each batch expanded by
``txn_library.streams.batch_txns``, so a weak-recovery log reads as a strong one):
the committed pushes of each flow's border stream, and for each step the batches it
processed, by the rule ``run_step`` applies in serial order (a step processes b when b
is after its last batch and its input stream holds b; a push commits when its id is
after the stream's last; a stream between two steps gives b up to its last consumer,
where the engine does so). The progress rows (``ordo_dataflow_progress``, from a fresh
checkpoint of replica 0) must say the same (last batch, batches processed): that ties
the reading of the log to what ran. Then the models: S-Store's leaderboard
(``txn_library.workloads.leaderboard.Model``: the board after every batch the sink kept, and the
final votes, removals, total and trending-3) and the chains (each step's total, the
sink's values).

Invariants: the log is read up to the checkpoint's epoch, so log and state are one
moment; nothing is written to the cluster but that checkpoint request; a verdict lists
every failure it counts (pushes not committed, batches a step never processed, calls
that came before their input or after a later batch, model differences).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leaderboard_cluster import Flow, Target
from leaderboard_load import Run

from cluster.launcher import wait_quiescent
from executor.core import checkpoint as ckpt
from executor.core.storage import Storage
from executor.replay.batches import ReplayFailure, iter_batches
from sequencer.log import LogCorruption
from txn_library.placement import partition_of
from txn_library.streams import PUSH, batch_txns, dataflow_named, stream_named
from txn_library.streams.spec import PROGRESS

CHECKPOINT_WAIT_S = 300.0
EXAMPLES = 3  # differences quoted per kind


@dataclass
class StepTrace:
    """One step as the log has it; counters cover calls for batches of the runs."""

    processed: list[int] = field(default_factory=list)
    calls: int = 0
    before_input: int = 0  # called for b when its input did not hold b (not yet, or taken)
    passed: int = 0  # called for b at or before the last batch it processed
    inversions: int = 0  # called for b after a call for a later batch
    top: int = -1


@dataclass
class FlowTrace:
    """A flow's border stream and steps, replayed from the log by their rules."""

    flow: Flow
    since: int  # the first batch of the runs checked: counters start there
    pushes: dict[int, tuple] = field(default_factory=dict)  # committed: batch -> tuples
    pushed: list[int] = field(default_factory=list)  # committed, in log order
    refused: int = 0
    repeated: int = 0  # the same id with the same tuples: answered from the first
    steps: dict[str, StepTrace] = field(default_factory=dict)
    holds: dict[str, set[int]] = field(default_factory=dict)  # stream -> batch ids
    progress: dict[str, int] = field(default_factory=dict)

    def push(self, batch_id: int, tuples: tuple) -> None:
        counted = batch_id >= self.since
        first = self.pushes.get(batch_id)
        if first is not None:  # answered from the first push, or refused (other tuples)
            if first == tuples:
                self.repeated += counted
            else:
                self.refused += counted
            return
        if self.pushed and batch_id <= self.pushed[-1]:
            self.refused += counted
            return
        self.pushes[batch_id] = tuples
        self.pushed.append(batch_id)
        self.holds.setdefault(self.flow.border, set()).add(batch_id)

    def step(self, name: str, source: str, output: str | None, batch_id: int, drops: bool) -> None:
        """A call of step ``name`` for ``batch_id``; ``drops``: it is its input's last
        consumer and the engine then deletes the batch from that stream."""
        tr = self.steps.setdefault(name, StepTrace())
        counted = batch_id >= self.since
        tr.calls += counted
        tr.inversions += counted and batch_id < tr.top
        tr.top = max(tr.top, batch_id)
        last = self.progress.get(name)
        if last is not None and batch_id <= last:
            tr.passed += counted
        elif batch_id not in self.holds.get(source, ()):
            tr.before_input += counted
        else:
            self.progress[name] = batch_id
            tr.processed.append(batch_id)
            if output is not None:
                self.holds.setdefault(output, set()).add(batch_id)
            if drops:
                self.holds[source].discard(batch_id)


def trace_log(
    log_dir: Path, partitions: int, flows: list[tuple[Flow, int]], last_epoch: int
) -> dict[str, FlowTrace]:
    """Replay the pushes and steps of ``flows`` ((flow, first batch checked) pairs)
    from epoch 1 to ``last_epoch`` of the log."""
    traces: dict[str, FlowTrace] = {}
    border: dict[str, FlowTrace] = {}
    procs: dict[str, tuple[FlowTrace, list[tuple[Any, bool]]]] = {}
    for flow, since in flows:
        df = dataflow_named(flow.dataflow)
        assert df is not None
        t = traces[flow.dataflow] = FlowTrace(flow, since)
        border[df.border.name] = t
        drops = {s.name: _drops_batch(df, s) for s in df.order}
        for s in df.order:
            procs[s.name] = (t, [(s, drops[s.name])])
        for u in df.units:
            procs[u.proc_name] = (t, [(s, drops[s.name]) for s in u.steps])
    for _epoch, batch, _size in iter_batches(log_dir, 1, last_epoch):
        for txn in batch_txns(batch, partitions):
            if txn.proc == PUSH:
                pushed_to = border.get(txn.args[0])
                if pushed_to is not None:
                    pushed_to.push(txn.args[1], tuple(tuple(x) for x in txn.args[2]))
                continue
            found = procs.get(txn.proc)
            if found is not None:
                flow_trace, steps = found
                for s, dropping in steps:
                    flow_trace.step(s.name, s.input, s.output, txn.args[0], dropping)
    return traces


def _drops_batch(df: Any, step: Any) -> bool:
    """Whether ``step``, as the last consumer of its input, deletes the batch from it: a
    stream between two steps keeps its batches only until they are taken
    (``txn_library.streams.dataflow.listed``)."""
    from txn_library.streams.dataflow import listed

    return df.last_consumer(step.input) is step and not listed(step.input)


# State ------------------------------------------------------------------------------------
@dataclass
class State:
    """Replica 0 at one epoch: the partitions' storage that were asked for, or (no
    checkpoints on this cluster) each dataflow's ``dataflow.status`` only."""

    epoch: int
    storages: dict[int, Storage]
    status: dict[str, dict]


def read_state(target: Target, flows: list[Flow]) -> State:
    cfg = target.cfg
    parts = {_partition(f, cfg.partitions) for f in flows}
    with target.client(timeout_s=60.0) as c:
        st = wait_quiescent(c, cfg.replicas, cfg.partitions, timeout_s=120.0)
        if cfg.checkpoint_keep <= 0:
            status = {f.dataflow: c.call("dataflow.status", f.dataflow).value for f in flows}
            return State(int(st["epoch"]), {}, status)
        from cluster.fresh_checkpoint import hold_fresh_checkpoint

        with hold_fresh_checkpoint(c, cfg, 0, CHECKPOINT_WAIT_S) as (epoch, files):
            storages = {p: ckpt.load(files[p])[1] for p in sorted(parts)}
    return State(epoch, storages, {})


def _home(flow: Flow) -> int:
    return stream_named(flow.border).home


def _partition(flow: Flow, partitions: int) -> int:
    return partition_of(PROGRESS, (_home(flow), flow.dataflow, flow.steps[0]), partitions)


# Verdicts ---------------------------------------------------------------------------------
@dataclass
class Verdict:
    way: str
    flow: str
    batches: int
    problems: list[str]
    counts: dict[str, Any]
    expected_to_fail: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "expected_to_fail": self.expected_to_fail,
            "batches": self.batches,
            "problems": self.problems,
            "counts": self.counts,
        }


def check(target: Target, runs: list[Run]) -> list[Verdict]:
    """One verdict per run (at most one run per flow), from one checkpoint and one pass
    over the log."""
    if len({r.flow.dataflow for r in runs}) != len(runs):
        raise ValueError("check: one run per flow")
    flows = [(r.flow, r.first) for r in runs]
    state = read_state(target, [r.flow for r in runs])
    try:
        traces = trace_log(target.cfg.log_dir, target.cfg.partitions, flows, state.epoch)
    except (ReplayFailure, LogCorruption, OSError) as e:
        reason = f"cannot read the command log {target.cfg.log_dir} to epoch {state.epoch}: {e}"
        return [Verdict(r.way, r.flow.dataflow, len(r.submitted), [reason], {}) for r in runs]
    out = []
    for r in runs:
        v = _verdict(r, traces[r.flow.dataflow], state, target.cfg.partitions)
        v.expected_to_fail = r.way == "async"
        out.append(v)
    return out


def _verdict(run: Run, trace: FlowTrace, state: State, partitions: int) -> Verdict:
    ids = run.batch_ids
    problems: list[str] = []
    counts: dict[str, Any] = {
        "pushes_committed": sum(1 for b in ids if b in trace.pushes),
        "pushes_refused": trace.refused,
        "pushes_repeated": trace.repeated,
        "steps": {},
    }
    if run.undone:
        problems.append(f"{run.undone} batches were not done when the run ended")
    if run.errors:
        problems.append(f"errors: {dict(run.errors)}")
    not_pushed = [b for b in ids if b not in trace.pushes]
    if not_pushed:
        problems.append(
            f"{len(not_pushed)} of {len(ids)} pushes not committed ({trace.refused} refused: "
            f"a batch id not after the stream's last); e.g. {not_pushed[:EXAMPLES]}"
        )
    storage = state.storages.get(_partition(run.flow, partitions))
    for name in run.flow.steps:
        tr = trace.steps.get(name, StepTrace())
        done = set(tr.processed)
        missing = [b for b in ids if b not in done]
        counts["steps"][name] = {
            "processed": len(ids) - len(missing),
            "missing": len(missing),
            "calls": tr.calls,
            "before_input": tr.before_input,
            "passed": tr.passed,
            "out_of_order": tr.inversions,
        }
        if missing:
            problems.append(
                f"{name}: {len(missing)} of {len(ids)} batches never processed, e.g. "
                f"{missing[:EXAMPLES]} (calls when its input did not hold the batch: "
                f"{tr.before_input}; for a batch at or before its last: {tr.passed}; after "
                f"a later batch's call: {tr.inversions})"
            )
        problems += _progress_problems(run.flow, name, tr, storage, state)
    if run.flow.kind == "leaderboard":
        problems += _leaderboard_problems(run, trace, storage, counts)
    else:
        problems += _chain_problems(run, trace, storage, counts)
    return Verdict(run.way, run.flow.dataflow, len(ids), problems, counts)


def _progress_problems(
    flow: Flow, step: str, tr: StepTrace, storage: Storage | None, state: State
) -> list[str]:
    logged = (tr.processed[-1], len(tr.processed)) if tr.processed else None
    if storage is None:
        last = (state.status.get(flow.dataflow) or {}).get("steps", {}).get(step)
        if last != (logged[0] if logged else None):
            return [f"{step}: dataflow.status says its last batch is {last}; the log, {logged}"]
        return []
    row = storage.get(PROGRESS, (_home(flow), flow.dataflow, step))
    stored = (row[0], row[1]) if row is not None else None
    if stored != logged:
        return [
            f"{step}: its progress row says (last batch, batches) = {stored}; the log says {logged}"
        ]
    return []


def _prior(run: Run, trace: FlowTrace) -> list[tuple]:
    """Input of batches pushed before the run (earlier runs on an attached cluster)."""
    return [trace.pushes[b] for b in trace.pushed if b < run.first]


def _leaderboard_problems(
    run: Run, trace: FlowTrace, storage: Storage | None, counts: dict[str, Any]
) -> list[str]:
    from txn_library.workloads.leaderboard import VARIANT, Model

    model = Model()
    for votes in _prior(run, trace):
        model.batch(votes)
    compared, bad = 0, []
    for b in run.batch_ids:
        model.batch(run.source.tuples(b))
        got = run.outputs.get(b)
        if got is not None:
            compared += 1
            if got != model.board:
                bad.append((b, got, list(model.board)))
    counts["boards_compared"] = compared
    counts["boards_different"] = len(bad)
    problems = []
    if bad:
        b, got, want = bad[0]
        problems.append(
            f"the board differs from the model after {len(bad)} of {compared} batches "
            f"(first: batch {b}: {got} against {want})"
        )
    if storage is None:
        return problems
    v = VARIANT[run.flow.dataflow]
    h = v.home
    found = {k[1]: (r[0], bool(r[1])) for k, r in storage.scan(v.contestants, (h,))}
    want_c = {c: (model.votes[c], model.active[c]) for c in model.votes}
    if found != want_c:
        diff = sorted(c for c in set(found) | set(want_c) if found.get(c) != want_c.get(c))
        problems.append(
            f"contestants (votes, in the show) differ from the model for {len(diff)}: "
            + ", ".join(f"{c}: {found.get(c)} vs {want_c.get(c)}" for c in diff[:EXAMPLES])
        )
    total = storage.get(v.totals, (h, "votes"))
    if (total[0] if total else 0) != len(model.recorded):
        problems.append(
            f"{total[0] if total else 0} votes recorded; the model recorded {len(model.recorded)}"
        )
    trend = [(k[1], r[0], r[1]) for k, r in storage.scan(v.trend, (h,))]
    if trend != model.trending:
        problems.append(f"trending-3 {trend}; the model's {model.trending}")
    counts["votes_recorded"] = len(model.recorded)
    counts["contestants_left"] = sum(model.active.values())
    return problems


def _chain_problems(
    run: Run, trace: FlowTrace, storage: Storage | None, counts: dict[str, Any]
) -> list[str]:
    from txn_library.workloads.chains import TOTALS

    n = len(run.flow.steps)
    totals = Counter[int]()
    for before in _prior(run, trace):
        for i in range(n):
            totals[i] += sum(x + i for (x,) in before)
    compared, bad = 0, []
    for b in run.batch_ids:
        tuples = run.source.tuples(b)
        for i in range(n):
            totals[i] += sum(x + i for (x,) in tuples)
        got = run.outputs.get(b)
        if got is not None:
            compared += 1
            if got != [(x + n,) for (x,) in tuples]:
                bad.append(b)
    counts["outputs_compared"] = compared
    problems = []
    if bad:
        problems.append(f"sink output differs for {len(bad)} of {compared} batches: {bad[:3]}")
    if storage is not None:
        h = _home(run.flow)
        for i, step in enumerate(run.flow.steps):
            row = storage.get(TOTALS, (h, step))
            if (row[0] if row else 0) != totals[i]:
                problems.append(f"{step}: total {row}; the model's {totals[i]}")
    return problems
