"""What a dataflow step touches, and ships, per batch (issue 44): a step names batch b's
rows in its footprint, and the batches a sink's retention drops are ``local`` entries
(txn_library.procedure.Footprint), trimmed only at the stream's home and never sent to
a peer. A step whose state lives on another partition than its streams
(txn_library.workloads.retention_bench) then sends its peer the same bytes per batch whatever
its sink keeps; the live Partition code (in process) and the serial oracle agree hash
for hash, compiled and pure."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

import txn_library.workloads.retention_bench as rb
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from txn_library.errors import OK, BadRequest
from txn_library.procedure import Arg, Footprint, Procedure, lookup
from txn_library.streams import (
    PUSH,
    Dataflow,
    StreamContext,
    derived_txns,
    stream,
    stream_procedure,
)
from txn_library.streams.spec import STREAM_BATCHES, STREAMS
from txn_library.wire import partition as ewire
from txn_library.wire.sequencer import Batch, Txn

PARTITIONS = 2
CLIENT = b"footprints"
FILL = 5_000  # batches pushed to each sink before the measured one


class Log:
    """Batches as the sequencer builds them (strong recovery: derived steps logged)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.next_txn = 0
        self.req = 0

    def batch(self, pushes: Sequence[tuple[str, int, list]]) -> Batch:
        calls = []
        for name, b, tuples in pushes:
            self.req += 1
            parts = lookup(PUSH).participants_of((name, b, tuples), PARTITIONS)
            calls.append(Txn(PUSH, (name, b, tuples), parts, CLIENT, self.req))
        txns = (*calls, *derived_txns(calls, PARTITIONS))
        self.epoch += 1
        batch = Batch(self.epoch, self.epoch - 1, self.next_txn, 1000 + self.epoch, 7, txns)
        self.next_txn += len(txns)
        return batch


def shipped(r: LocalReplica, batch: Batch) -> int:
    """Apply ``batch`` to every partition of ``r`` and move the reads between them as
    the partition servers do (one ``Reads`` message per sender and peer); the bytes of
    those messages."""
    for p in r.parts:
        p.on_batch(batch)
    total = 0
    while True:
        moving = []
        for p in r.parts:
            peer_out, results, _ = p.take_outputs()
            for txn_id, status, value, _data in results:
                r.results[txn_id] = (status, value)
            moving += [(q, p.partition, entries) for q, entries in peer_out.items()]
        if not moving:
            return total
        for q, src, entries in moving:
            total += len(ewire.encode(ewire.Reads(src, entries)))
            r.parts[q].on_reads(src, tuple(entries))


def sink_meta(r: LocalReplica, sink: str) -> tuple:
    home = r.parts[(rb.STREAM_HOME - 1) % PARTITIONS].storage
    meta = home.get(STREAMS, (rb.STREAM_HOME, sink))
    assert meta is not None
    return meta


def test_a_step_with_state_elsewhere_ships_the_same_bytes_whatever_its_sink_keeps() -> None:
    """Two flows, sinks keeping 50 and 5,000 batches, each fed the same 5,000 batches;
    then batch 5,001 of each: its step (streams on partition 0, state on partition 1)
    ships the same bytes but for the names and the sink's row (first, last, count,
    dropped), though one sink holds a hundred times the other's batches: a state row, a
    batch row, a tuple, the progress and stream rows, well under a kilobyte."""
    small, large = 50, 5_000
    flows = {r: rb.names(r) for r in (small, large)}
    log, replica, oracle = Log(), LocalReplica(PARTITIONS), SerialExecutor()
    for first in range(1, FILL + 1, 100):
        batch = log.batch(
            [(flows[r][1], b, [(b,)]) for b in range(first, first + 100) for r in flows]
        )
        replica.apply(batch)
        oracle.apply(batch)
    sent = {}
    for r, (_, border, _) in flows.items():
        batch = log.batch([(border, FILL + 1, [(FILL + 1,)])])
        sent[r] = shipped(replica, batch)
        oracle.apply(batch)
        assert replica.idle()
    assert replica.state_hash == oracle.state_hash
    assert replica.results == oracle.results
    assert all(v[0] == OK for v in replica.results.values())
    first_small, last_small, count_small, dropped_small = sink_meta(replica, flows[small][2])
    assert (last_small, count_small) == (FILL + 1, last_small - first_small + 1)
    assert small <= count_small <= small + small // 16 and dropped_small == first_small - 1
    assert sink_meta(replica, flows[large][2]) == (1, FILL + 1, FILL + 1, None)
    # The flows' names differ by two characters in a few keys, and their sinks' rows
    # differ; shipping the sink's batch rows cost ~33 and ~192 KB a batch here.
    assert abs(sent[small] - sent[large]) <= 16, sent
    assert sent[large] < 1_000, sent


def test_retention_trims_only_at_the_home_and_every_engine_agrees_with_gapped_ids() -> None:
    """Batch ids with gaps (the trim falls back to one scan) and dense runs (walked by
    key), a sink keeping 50: the partition holding the streams trims, its peer does not
    (nor needs to), and the replica equals the serial oracle, results and hash, with
    reads delivered in a shuffled order."""
    _, border, sink = rb.names(50)
    rng = random.Random(44)
    ids, b = [], 0
    for _ in range(700):
        b += 1 if rng.random() < 0.5 else rng.randint(2, 9)
        ids.append(b)
    log = Log()
    batches = [
        log.batch([(border, i, [(i,), (i + 1,)]) for i in ids[k : k + 7]])
        for k in range(0, len(ids), 7)
    ]
    replica, oracle = LocalReplica(PARTITIONS, shuffle_seed=3), SerialExecutor()
    for batch in batches:
        replica.apply(batch)
        oracle.apply(batch)
    assert replica.state_hash == oracle.state_hash
    assert replica.results == oracle.results
    home = replica.parts[(rb.STREAM_HOME - 1) % PARTITIONS].storage
    kept = [k[2] for k, _ in home.scan(STREAM_BATCHES, (rb.STREAM_HOME, sink))]
    assert kept == ids[-len(kept) :] and 50 <= len(kept) <= 53
    assert home.scan(sink, (rb.STREAM_HOME,))[0][0][1] == kept[0]  # older tuples went too
    first, last, count, dropped = sink_meta(replica, sink)
    assert (first, last, count) == (kept[0], ids[-1], len(kept))
    assert dropped == ids[-len(kept) - 1]
    state = replica.parts[(rb.STATE_HOME - 1) % PARTITIONS].storage.get(
        rb.STATE, (rb.STATE_HOME, "rb50")
    )
    assert state == (len(ids), sum(2 * i + 1 for i in ids))


def test_a_step_footprint_names_its_batch_and_marks_what_retention_drops_local() -> None:
    fp = lookup("rb50.step").footprint(77)
    h = rb.STREAM_HOME
    assert (STREAM_BATCHES, (h, "rb50_in", 77)) in fp.reads
    assert ("rb50_in", (h, 77)) in fp.reads
    assert set(fp.local) == {(STREAM_BATCHES, (h, "rb50_out")), ("rb50_out", (h,))}
    shipped_prefixes = [
        (t, k) for t, k in fp.reads if (t, k) not in fp.local and t in ("rb50_in", "rb50_out")
    ]
    assert shipped_prefixes == [("rb50_in", (h, 77))]  # batch 77's tuples, no more
    assert lookup("rb50.step").participants_of((77,), PARTITIONS) == (0, 1)


# A step that reads its own sink's batch rows: they are shipped to the state's
# partition, as any read, and never trimmed there from rows it does not hold.
UX_KEY = (rb.STATE_HOME, "ux")
stream("ux_in", [("x", "int")], home=rb.STREAM_HOME)
stream("ux_out", [("x", "int")], home=rb.STREAM_HOME, retain_batches=5)


@stream_procedure(
    "ux.step",
    input="ux_in",
    output="ux_out",
    reads=[(STREAM_BATCHES, (rb.STREAM_HOME, "ux_out"))],
    writes=[(rb.STATE, UX_KEY)],
)
def _ux_step(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> list[tuple]:
    kept = len(ctx.scan(STREAM_BATCHES, (rb.STREAM_HOME, "ux_out")))
    row = ctx.get(rb.STATE, UX_KEY)
    ctx.put(rb.STATE, UX_KEY, ((row[0] if row else 0) + 1, (row[1] if row else 0) + kept))
    return tuples


Dataflow("ux", [_ux_step])


def test_a_step_that_reads_its_sinks_batches_gets_them_shipped() -> None:
    """The sink's batch rows are then no local entry: the state's partition reads what
    the streams' partition reads, and both compute the same state row."""
    fp = lookup("ux.step").footprint(3)
    assert (STREAM_BATCHES, (rb.STREAM_HOME, "ux_out")) not in fp.local
    assert fp.local == (("ux_out", (rb.STREAM_HOME,)),)
    log = Log()
    batches = [log.batch([("ux_in", b, [(b,)])]) for b in range(1, 40)]
    replica, oracle = LocalReplica(PARTITIONS, shuffle_seed=5), SerialExecutor()
    for batch in batches:
        replica.apply(batch)
        oracle.apply(batch)
    assert replica.state_hash == oracle.state_hash
    state = replica.parts[(rb.STATE_HOME - 1) % PARTITIONS].storage.get(rb.STATE, UX_KEY)
    assert oracle.storage.get(rb.STATE, UX_KEY) == state
    assert state is not None and state[0] == 39


def _local_proc(fp: Footprint) -> Procedure:
    return Procedure("t.local", (Arg("x", "int"),), lambda x: fp, lambda ctx, x: None)


@pytest.mark.parametrize(
    "fp",
    [
        Footprint(reads=((STREAMS, (1, "s")),), local=((STREAMS, (1, "s")),)),
        Footprint(writes=((STREAMS, (1, "s")),), local=((STREAMS, (1, "s")),)),
    ],
)
def test_a_local_entry_must_be_read_and_written(fp: Footprint) -> None:
    with pytest.raises(BadRequest, match="not both read and written"):
        _local_proc(fp).participants_of((1,), PARTITIONS)


# A border stream keeping fewer batches than one epoch pushes: its steps run after every
# push of the epoch, so retention must keep what they have not processed yet.
stream("few_in", [("x", "int")], home=rb.STREAM_HOME, retain_batches=3)
stream("few_out", [("x", "int")], home=rb.STATE_HOME, retain_batches=1_000)


@stream_procedure("few.copy", input="few_in", output="few_out")
def _few_copy(ctx: StreamContext, batch_id: int, tuples: list[tuple]) -> list[tuple]:
    return tuples


Dataflow("few", [_few_copy])


def test_a_border_keeping_fewer_batches_than_an_epoch_pushes_skips_none() -> None:
    """Ten pushes in one epoch to a border that keeps 3: every one reaches the sink
    (before, the pushes trimmed batches 1-6 before the step ran, and it skipped them
    without a word); the stream keeps what its step has not processed, and once it has,
    retention applies again. Partitions and the oracle agree."""
    log = Log()
    epochs = [
        log.batch([("few_in", b, [(b,)]) for b in range(1, 11)]),
        log.batch([("few_in", b, [(b,)]) for b in range(11, 16)]),
    ]
    replica, oracle = LocalReplica(PARTITIONS, shuffle_seed=3), SerialExecutor()
    for batch in epochs:
        replica.apply(batch)
        oracle.apply(batch)
    assert replica.state_hash == oracle.state_hash
    sink = oracle.storage
    got = [key[2] for key, _ in sink.scan(STREAM_BATCHES, (rb.STATE_HOME, "few_out"))]
    assert got == list(range(1, 16))
    border = sink.get(STREAMS, (rb.STREAM_HOME, "few_in"))
    assert border is not None and border[2] <= 3 + 1 + 5  # trimmed again after the step ran
