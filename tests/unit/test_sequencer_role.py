"""The sequencer role without sockets: numbering across restarts and torn tails,
fail-stop on storage errors, dedup of retried calls across a restart, dependent-txn
restarts, and checkpoint flags."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest

import txn_library.workloads.bench_procedures  # noqa: F401  (bench.tag_update: dependent)
import txn_library.workloads.builtin  # noqa: F401
from sequencer.batch_order import multi_partition_last
from sequencer.calls import PendingCall
from sequencer.log import CommandLog, LogCorruption, iter_frames
from sequencer.sequencer import Sequencer
from txn_library import placement
from txn_library.errors import ERROR, OK, RESTART
from txn_library.wire import sequencer as wire
from txn_library.wire.partition import PartitionStatus

CLIENT = b"client-1"
STATUS = PartitionStatus(1, 1, 0, 0, 1, 0, 0, 0, False, 1, 0, 0, 0, 0, -1)  # one partition's report


def _seq(d: Path, **kw: object) -> Sequencer:
    return Sequencer(CommandLog(d), replicas=2, partitions=2, **kw)  # type: ignore[arg-type]


def _submit(s: Sequencer, *calls: tuple) -> None:
    s.on_calls(b"id", CLIENT, tuple((r, p, tuple(a)) for r, p, a in calls))


def test_numbering_continues_after_restart_and_after_a_torn_tail(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    for i in range(5):
        _submit(s, (i, "kv.put", (f"k{i}", i)))
        assert s.tick(1000 + i) is not None
    s.log.close()
    s = _seq(tmp_path)
    assert (s.epoch, s.next_txn_id) == (5, 5)
    s.log.close()
    seg = next(tmp_path.glob("segment-*.log"))
    seg.write_bytes(seg.read_bytes()[:-7])  # last frame cut in half
    s = _seq(tmp_path)
    assert (s.epoch, s.next_txn_id) == (4, 4)
    assert s.log.recovered_truncated_bytes > 0
    _submit(s, (99, "kv.put", ("again", 1)))
    batch = wire.decode_batch(s.tick(2000))  # type: ignore[arg-type]
    assert (batch.epoch, batch.prev_epoch, batch.first_txn_id) == (5, 4, 4)


def test_each_batch_records_the_digest_of_the_previous_one_across_restarts(
    tmp_path: Path,
) -> None:
    s = _seq(tmp_path)
    for i in range(3):
        _submit(s, (i, "kv.put", (f"k{i}", i)))
        s.tick(1000 + i)
    s.log.close()
    s = _seq(tmp_path)  # the digest of epoch 3 is recovered from the log
    _submit(s, (9, "kv.put", ("k9", 9)))
    s.tick(2000)
    s.log.close()
    payloads = [p for _e, p in iter_frames(tmp_path)]
    batches = [wire.decode_batch(p) for p in payloads]
    assert [b.epoch for b in batches] == [1, 2, 3, 4]
    assert batches[0].prev_digest == 0
    for prev, batch in zip(payloads, batches[1:], strict=False):
        assert batch.prev_digest == wire.batch_digest(prev)


def test_flipped_byte_in_the_middle_is_corruption_not_skipped(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    for i in range(5):
        _submit(s, (i, "kv.put", (f"k{i}", i)))
        s.tick(i)
    s.log.close()
    seg = next(tmp_path.glob("segment-*.log"))
    data = bytearray(seg.read_bytes())
    data[len(data) // 3] ^= 0x01
    seg.write_bytes(bytes(data))
    with pytest.raises(LogCorruption, match="epoch"):
        _seq(tmp_path)


class _FailingLog(CommandLog):
    def sync(self) -> None:
        raise OSError(28, "No space left on device")


def test_fail_stop_when_the_log_cannot_sync(tmp_path: Path) -> None:
    s = Sequencer(_FailingLog(tmp_path), replicas=1, partitions=1)
    _submit(s, (1, "kv.put", ("a", 1)), (2, "kv.put", ("b", 2)))
    assert s.tick(1) is None  # nothing published
    replies = s.take_client_out()[b"id"]
    assert [r[0] for r in replies] == [1, 2]
    assert all(r[1] == ERROR and r[2][0] == "unavailable" for r in replies)
    assert "outcome unknown" in replies[0][2][1]
    _submit(s, (3, "kv.put", ("c", 3)))
    (r,) = s.take_client_out()[b"id"]
    assert r[1] == ERROR and r[2][0] == "unavailable" and "No space" in r[2][1]
    assert s.status_report()["failed"]


def test_retried_call_is_not_executed_twice_across_a_restart(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    _submit(s, (7, "kv.add", ("x", 1)))
    s.tick(1)
    s.log.close()
    s = _seq(tmp_path)  # "crash": the result was never delivered
    _submit(s, (7, "kv.add", ("x", 1)))  # the client's retry, same ids
    assert s.tick(2) is None  # not sequenced again
    queries = s.take_query_out()
    assert len(queries) == 1
    (qid, _replica, name, args, min_txn) = next(iter(queries.values()))[0]
    assert name == "__result__" and args == (0,) and min_txn == 0
    s.on_results(0, 0, (), ((qid, 0, OK, 1),), STATUS)
    (r,) = s.take_client_out()[b"id"]
    assert r == (7, OK, 1)
    _submit(s, (7, "kv.add", ("x", 1)))  # and again: answered from the dedup cache
    assert s.take_client_out()[b"id"] == [(7, OK, 1)]


def test_restart_result_resequences_with_the_new_prediction(tmp_path: Path) -> None:
    s = _seq(tmp_path)
    _submit(s, (1, "bench.tag_update", (3, 1)))  # dependent: its recon read goes first
    ((_r, p), (query,)) = s.take_query_out().popitem()
    s.on_results(0, p, (), ((query[0], 0, OK, 7),), STATUS)  # the tag points to record 7
    batch = wire.decode_batch(s.tick(1))  # type: ignore[arg-type]
    assert batch.txns[0].args == (3, 1, 7)
    s.on_results(0, 0, ((0, RESTART, wire.pack(5)),), (), STATUS)  # it points to 5 now
    batch = wire.decode_batch(s.tick(2))  # type: ignore[arg-type]
    assert batch.txns[0].args == (3, 1, 5)
    assert s.stats.restarts == 1


def test_a_restart_from_a_procedure_without_recon_is_an_error_not_a_resequence(
    tmp_path: Path,
) -> None:
    """Only a dependent call keeps its arguments once logged (sequencer.epochs), so only
    it can be re-sequenced; any other procedure returning Restart gets an error."""
    s = _seq(tmp_path)
    _submit(s, (1, "kv.add", ("x", 1)))
    s.tick(1)
    s.on_results(0, 0, ((0, RESTART, wire.pack(5)),), (), STATUS)
    (r,) = s.take_client_out()[b"id"]
    assert r[1] == ERROR and r[2][0] == "procedure_failed"
    assert s.tick(2) is None and s.stats.restarts == 0


def test_checkpoint_flags_every_n_epochs_and_on_request(tmp_path: Path) -> None:
    s = _seq(tmp_path, checkpoint_every_epochs=3)
    flags = []
    for i in range(6):
        _submit(s, (i, "kv.put", ("k", i)))
        flags.append(wire.decode_batch(s.tick(i)).flags)  # type: ignore[arg-type]
    assert flags == [0, 0, 1, 0, 0, 1]  # periodic: a busy writer may skip these
    assert s.request_checkpoint() == 7
    empty = wire.decode_batch(s.tick(7))  # type: ignore[arg-type]
    # requested: every partition writes it (a busy writer finishes first)
    assert empty.flags == wire.FLAG_CHECKPOINT | wire.FLAG_CHECKPOINT_REQUESTED
    assert empty.txns == ()


def test_multi_partition_calls_go_last_but_an_ordered_connections_calls_keep_order(
    tmp_path: Path,
) -> None:
    """sequencer.batch_order: within a batch, multi-partition calls run after the
    single-partition ones; a connection that sent REQ_CALLS (ordered) keeps its calls
    in the order sent: its calls after a moved one move with it. REQ_CALLS_UNORDERED
    calls stay or move on their own."""
    s = _seq(tmp_path)
    p0 = [k for k in range(8) if placement.partition_of("account", (k,), 2) == 0]
    p1 = [k for k in range(8) if placement.partition_of("account", (k,), 2) == 1]
    multi, single = [p0[0], p1[0], 1], [p0[0], p0[1], 1]
    s.on_frame(
        b"u",
        msgpack.packb(
            [
                wire.REQ_CALLS_UNORDERED,
                b"cu",
                [
                    [1, "bank.transfer", multi],
                    [2, "bank.transfer", single],
                    [3, "kv.put", ["x", 1]],
                ],
            ]
        ),
    )
    s.on_frame(
        b"o",
        msgpack.packb(
            [
                wire.REQ_CALLS,
                b"co",
                [[1, "kv.put", ["y", 1]], [2, "bank.transfer", multi], [3, "kv.put", ["z", 1]]],
            ]
        ),
    )
    s.run_intake()
    batch = wire.decode_batch(s.tick(1000))  # type: ignore[arg-type]
    order = [(t.client_id, t.req_id) for t in batch.txns]
    taken = [(b"cu", 1), (b"cu", 2), (b"cu", 3), (b"co", 1), (b"co", 2), (b"co", 3)]
    assert sorted(order) == sorted(taken)  # round robin took every call
    assert order == [(b"cu", 2), (b"cu", 3), (b"co", 1), (b"cu", 1), (b"co", 2), (b"co", 3)]
    assert [len(t.participants) for t in batch.txns] == [1, 1, 1, 2, 2, 1]


@pytest.mark.parametrize("seed", range(20))
def test_batch_order_keeps_what_it_promises(seed: int) -> None:
    """multi_partition_last on random batches: a permutation; an ordered connection's
    calls in their order; single-partition calls of unordered connections never
    move; every single-partition call that stays precedes every multi-partition one."""
    rng = random.Random(seed)
    calls = []
    for i in range(rng.randrange(0, 40)):
        conn = rng.randrange(4)
        call = PendingCall(b"c%d" % conn, b"", i, None, (), (0, 1) if rng.random() < 0.2 else (0,))  # type: ignore[arg-type]
        call.ordered = conn < 2  # connections 0 and 1 ordered, 2 and 3 not
        calls.append(call)
    out = multi_partition_last(list(calls))
    assert sorted(c.req_id for c in out) == [c.req_id for c in calls]
    for conn in (b"c0", b"c1"):
        mine = [c.req_id for c in out if c.identity == conn]
        assert mine == sorted(mine)
    first_multi = next((i for i, c in enumerate(out) if len(c.participants) > 1), len(out))
    for i, c in enumerate(out):
        if len(c.participants) == 1 and not c.ordered:
            assert i < first_multi
    stayed = out[:first_multi]
    assert [c.req_id for c in stayed] == sorted(c.req_id for c in stayed)
    moved = out[first_multi:]
    assert [c.req_id for c in moved] == sorted(c.req_id for c in moved)


def test_results_reply_with_packed_values_is_the_generic_encoding() -> None:
    """wire.encode_results_reply (every server's reply path) gives the bytes the generic
    ResultsReply encoding gives, whether a value comes packed (a partition's) or not."""
    value = (7, "x", ((1, "a", 2.5), (2, "b", None)), [b"raw", {"k": -(1 << 63)}])
    replies = [(1, OK, value), (2, ERROR, ("overloaded", "slow down")), (None, OK, None)]
    generic = wire.encode(wire.ResultsReply(replies))
    assert wire.encode_results_reply(replies) == generic
    packed = [(r, st, wire.Packed(wire.pack(v))) for r, st, v in replies]
    assert wire.encode_results_reply(packed) == generic


def test_the_exactly_once_rebuild_reads_calls_where_they_lie_as_decoding_them_would(
    tmp_path: Path,
) -> None:
    """sequencer.results.logged_calls hashes a call's (procedure, arguments) bytes in
    the log instead of decoding and packing them again; it must give what decoding
    gives: every client call's ids and digest (a dependent call's without its
    prediction), txn ids in order, no dataflow step."""
    from sequencer.results import logged_calls
    from sequencer.retry_cache import call_body, call_digest
    from txn_library.procedure import lookup

    s = _seq(tmp_path)
    rng = random.Random(5)
    for i in range(40):
        calls = [(i * 10 + j, "kv.put", (f"k{rng.randrange(9)}", rng.random())) for j in range(3)]
        calls.append((i * 10 + 3, "kv.add", (f"k{i}", rng.randrange(-(2**40), 2**40))))
        calls.append((i * 10 + 4, "kv.put", (f"k{i}", [b"\x00" * rng.randrange(40), {"a": i}])))
        _submit(s, *calls)
        s.tick(i)
    _submit(s, (999, "bench.tag_update", (3, 1)))  # dependent: logged with its prediction
    ((_r, p), (query,)) = s.take_query_out().popitem()
    s.on_results(0, p, (), ((query[0], 0, OK, 7),), STATUS)
    s.tick(100)
    s.log.close()
    seen = 0
    for epoch, payload in iter_frames(tmp_path):
        batch = wire.decode_batch(payload)
        want = []
        for k, txn in enumerate(batch.txns):
            args = txn.args[:-1] if lookup(txn.proc).dependent else txn.args
            digest = call_digest(call_body(txn.proc, args))
            want.append((batch.first_txn_id + k, (txn.client_id, txn.req_id), digest))
        assert list(logged_calls(epoch, payload)) == want
        seen += len(want)
    assert seen == 40 * 5 + 1
