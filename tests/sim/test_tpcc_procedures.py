"""TPC-C transactions in one process, through the real sequencer and partition code.

``Sim`` wires a real ``Sequencer`` (with a command log in a temp dir) to two in-process
replicas (``LocalReplica``, 2 partitions, shuffled peer delivery) and to the serial
oracle (``SerialExecutor``, one partition): calls go through validation, recon
queries, epochs and the log exactly as on a live cluster; every batch goes through
msgpack. After every batch the sim asserts that both replicas and the serial executor
return identical results and state hashes, so every test below also checks
determinism across replicas and partition layouts.

The database (W=2) is the simulator's TPC-C genesis image, built once per process (a
worker that ran a TPC-C simulation already holds it) and cloned for each replica's
partitions and the oracle; tests share one Sim and assert on differences, so each test
also passes alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from executor.core.storage import Storage
from executor.deterministic.oracle import SerialExecutor
from executor.deterministic.replica import LocalReplica
from executor.deterministic.workloads import GenesisImage, clone_storage, genesis_image
from executor.replay.spark_jobs import write_table
from executor.replay.tables import table_layout
from sequencer.calls import make_batch
from sequencer.log import CommandLog
from sequencer.sequencer import Sequencer
from tests.heap_checks import no_cycles
from tpcc import schema as s
from tpcc.consistency import check_whole
from tpcc.dump_check import NEEDED, check_dump
from tpcc.inputs import TpccInputs, terminals_for
from tpcc.loader import generate_items, generate_warehouse, genesis
from tpcc.sim_workload import GENESIS, LOAD_SEED, LOAD_TS_MS
from tpcc.tpcc_random import LAST_NAMES
from tpcc.transactions.delivery import delivery_recon
from tpcc.transactions.new_order import BP, ROLLBACK_REASON, UNUSED_I_ID
from tpcc.transactions.payment import payment_by_name_rc
from txn_library import placement
from txn_library.client import ClientProtocol
from txn_library.errors import ABORTED, ERROR, OK, RESTART
from txn_library.wire import partition as ewire
from txn_library.wire import sequencer as wire

SEED = LOAD_SEED  # the simulator's TPC-C database (tpcc.sim_workload)
WAREHOUSES = 2
PARTITIONS = 2
REPLICAS = 2

LoadRows = list[tuple[str, tuple, tuple]]


# --- The in-process cluster ---------------------------------------------------------------


class Sim:
    """Sequencer + REPLICAS LocalReplicas + serial oracle, stepped synchronously."""

    def __init__(self, image: GenesisImage, log_dir: Path) -> None:
        self.seq = Sequencer(CommandLog(log_dir, fsync=False), REPLICAS, PARTITIONS)
        self.replicas = [
            LocalReplica(PARTITIONS, [clone_storage(p) for p in image.partitions], r, r)
            for r in range(REPLICAS)
        ]
        self.serial = SerialExecutor(clone_storage(image.whole))
        self.proto = ClientProtocol(b"sim-client")
        self.now_ms = LOAD_TS_MS + 60_000
        # Rewrites a recon answer: (recon procedure, prediction) -> prediction.
        self.tamper: Callable[[str, Any], Any] | None = None
        self.batches: list[tuple] = []
        self._query_names: dict[int, str] = {}

    # Client side ---------------------------------------------------------------------
    def call(self, proc: str, *args: Any, replica: int | None = None) -> tuple[int, Any]:
        return self.call_all([(proc, args)], replica=replica)[0]

    def call_all(
        self, calls: list[tuple[str, tuple]], replica: int | None = None
    ) -> list[tuple[int, Any]]:
        req_ids = [self.proto.next_req_id() for _ in calls]
        frame = self.proto.encode_calls(
            [(r, name, args, replica) for r, (name, args) in zip(req_ids, calls, strict=True)]
        )
        msg = wire.unpack(frame)
        self.seq.on_calls(b"sim", msg[1], msg[2])
        answers: dict[int, tuple[int, Any]] = {}
        for _ in range(1000):
            self._collect(answers)
            if len(answers) == len(req_ids):
                return [answers[r] for r in req_ids]
            self._serve_queries()
            self._collect(answers)
            self._tick()
        raise AssertionError(f"unanswered calls: {set(req_ids) - set(answers)}")

    def _collect(self, answers: dict[int, tuple[int, Any]]) -> None:
        for replies in self.seq.take_client_out().values():
            for req_id, status, value in wire.unpack(wire.encode_results_reply(replies))[1]:
                answers[req_id] = (status, value)

    # Partitions ----------------------------------------------------------------------
    def _serve_queries(self) -> None:
        for (r, p), queries in self.seq.take_query_out().items():
            part = self.replicas[r].parts[p]
            for qid, tag, name, args, min_txn_id in queries:
                self._query_names[qid] = name
                part.on_query(qid, tag, name, args, min_txn_id)
            peer_out, results, answers = part.take_outputs()
            assert not peer_out and not results
            out = []
            for qid, tag, status, value in _roundtrip(answers):
                name = self._query_names.pop(qid)
                if self.tamper is not None and name.endswith("_recon") and status == OK:
                    value = self.tamper(name, value)
                out.append((qid, tag, status, value))
            self.seq.on_results(r, p, (), tuple(out), part.status())

    def _tick(self) -> None:
        data = self.seq.tick(self.now_ms)
        self.now_ms += 10
        if data is None:
            return
        batch = wire.decode_batch(data)
        self.batches.append(batch)
        self.serial.apply(batch)
        first, n = batch.first_txn_id, len(batch.txns)
        expected = {t: self.serial.results[t] for t in range(first, first + n)}
        for r, rep in enumerate(self.replicas):
            rep.apply(batch)
            got = {t: rep.results[t] for t in range(first, first + n)}
            assert got == expected, f"replica {r} differs from serial execution"
            assert rep.state_hash == self.serial.state_hash, f"replica {r} state hash differs"
            results = tuple((t, st, v, msgpack.packb(v)) for t, (st, v) in got.items())
            msg = ewire.unpack(ewire.results_message(r, 0, results, (), rep.parts[0].status()))
            self.seq.on_results(r, 0, msg[3], (), rep.parts[0].status())
        assert self.seq.stats.determinism_violations == 0

    # Inspection ------------------------------------------------------------------------
    def row(self, table: str, key: tuple) -> tuple | None:
        """A row from the serial oracle; asserts every replica's owning partition agrees."""
        row = self.serial.storage.get(table, key)
        p = placement.partition_of(table, key, PARTITIONS)
        for rep in self.replicas:
            assert rep.parts[p].storage.get(table, key) == row
        return row

    def logged(self, proc: str) -> list[tuple[int, tuple]]:
        """(txn id, txn) of every logged call of ``proc``, in log order."""
        out = []
        for batch in self.batches:
            txn_id = batch.first_txn_id
            for txn in batch.txns:
                if txn.proc == proc:
                    out.append((txn_id, txn))
                txn_id += 1
        return out

    def hashes(self) -> list[int]:
        return [self.serial.state_hash] + [r.state_hash for r in self.replicas]


def _roundtrip(value: Any) -> Any:
    return ewire.unpack(ewire.pack(value))


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    args = {"warehouses": WAREHOUSES, "seed": SEED, "load_ts_ms": LOAD_TS_MS}
    image = genesis_image(GENESIS, args, PARTITIONS)
    sim = Sim(image, tmp_path_factory.mktemp("tpcc-sim") / "log")
    yield sim
    sim.seq.log.close()


# --- Genesis --------------------------------------------------------------------------------


def test_genesis_loads_own_warehouses_and_every_item() -> None:
    rows = list(genesis(1, 2, warehouses=2, seed=SEED, load_ts_ms=LOAD_TS_MS))
    items = list(generate_items(SEED))
    # warehouse 2 lives on partition (2-1) % 2 = 1
    assert rows == items + list(generate_warehouse(2, SEED, LOAD_TS_MS))
    assert placement.partition_of(s.WAREHOUSE, (2,), 2) == 1
    with pytest.raises(ValueError):
        next(genesis(2, 2, warehouses=2, seed=SEED, load_ts_ms=LOAD_TS_MS))


# --- New-Order (clause 2.4) -----------------------------------------------------------------


def _stock_after(s_quantity: int, q: int) -> int:
    return s_quantity - q if s_quantity >= q + 10 else s_quantity - q + 91


def test_new_order_enters_order_lines_and_stock(sim: Sim) -> None:
    w, d, c = 1, 3, 42
    i_ids, qty = (11, 22, 33), (5, 6, 7)
    district = sim.row(s.DISTRICT, (w, d))
    stock = [sim.row(s.STOCK, (w, i)) for i in i_ids]
    status, out = sim.call("tpcc.new_order", w, d, c, i_ids, (w, w, w), qty)
    assert status == OK
    o_id, o_entry_d, total, c_last, c_credit, c_discount, w_tax, d_tax, lines = out
    assert o_id == district[s.D_NEXT_O_ID]
    assert sim.row(s.DISTRICT, (w, d))[s.D_NEXT_O_ID] == o_id + 1
    order = sim.row(s.ORDERS, (w, d, o_id))
    assert order == (o_id, d, w, c, o_entry_d, None, 3, 1)
    assert sim.row(s.NEW_ORDER, (w, d, o_id)) == (o_id, d, w)
    assert sim.row(s.ORDER_BY_CUSTOMER, (w, d, c, o_id)) == ()
    amounts = []
    for n, (i_id, q, before) in enumerate(zip(i_ids, qty, stock, strict=True), start=1):
        item = sim.row(s.ITEM, (i_id,))
        after = sim.row(s.STOCK, (w, i_id))
        assert after[s.S_QUANTITY] == _stock_after(before[s.S_QUANTITY], q)
        assert after[s.S_YTD] == before[s.S_YTD] + q
        assert after[s.S_ORDER_CNT] == before[s.S_ORDER_CNT] + 1
        assert after[s.S_REMOTE_CNT] == before[s.S_REMOTE_CNT]
        line = sim.row(s.ORDER_LINE, (w, d, o_id, n))
        assert line[s.OL_I_ID] == i_id and line[s.OL_QUANTITY] == q
        assert line[s.OL_AMOUNT] == q * item[s.I_PRICE]
        assert line[s.OL_DIST_INFO] == before[s.S_DIST_FIRST + d - 1]
        assert line[s.OL_DELIVERY_D] is None
        assert lines[n - 1][:2] == (item[s.I_NAME], after[s.S_QUANTITY])
        amounts.append(line[s.OL_AMOUNT])
    scale = BP * BP
    expected = (sum(amounts) * (BP - c_discount) * (BP + w_tax + d_tax) + scale // 2) // scale
    assert total == expected


def test_new_order_rollback_writes_nothing_on_any_replica_or_layout(sim: Sim) -> None:
    w, d = 1, 4
    before = sim.hashes()
    d_next = sim.row(s.DISTRICT, (w, d))[s.D_NEXT_O_ID]
    remote_stock = sim.row(s.STOCK, (2, 500))
    # Clause 2.4.2.3: the last item is unused; one line is remote, so the abort is
    # multi-partition: both partitions run the body and both discard every write.
    status, reason = sim.call(
        "tpcc.new_order", w, d, 7, (100, 500, UNUSED_I_ID), (w, 2, w), (1, 2, 3)
    )
    assert (status, reason) == (ABORTED, ROLLBACK_REASON)
    txn_id, txn = sim.logged("tpcc.new_order")[-1]
    assert txn.participants == (0, 1)
    assert sim.serial.results[txn_id] == (ABORTED, ROLLBACK_REASON)
    assert all(rep.results[txn_id] == (ABORTED, ROLLBACK_REASON) for rep in sim.replicas)
    assert sim.hashes() == before
    assert sim.row(s.DISTRICT, (w, d))[s.D_NEXT_O_ID] == d_next
    assert sim.row(s.ORDERS, (w, d, d_next)) is None
    assert sim.row(s.STOCK, (2, 500)) == remote_stock


def test_new_order_remote_line_updates_stock_on_the_remote_partition(sim: Sim) -> None:
    w, d, remote = 1, 6, 2
    i_ids, supply, qty = (1234, 4321), (w, remote), (3, 4)
    before_remote = sim.row(s.STOCK, (remote, 4321))
    before_local = sim.row(s.STOCK, (w, 1234))
    status, out = sim.call("tpcc.new_order", w, d, 99, i_ids, supply, qty)
    assert status == OK
    o_id = out[0]
    _txn_id, txn = sim.logged("tpcc.new_order")[-1]
    assert txn.participants == (0, 1)  # multi-partition: warehouse 2 is on partition 1
    after = sim.row(s.STOCK, (remote, 4321))
    assert after[s.S_QUANTITY] == _stock_after(before_remote[s.S_QUANTITY], 4)
    assert after[s.S_REMOTE_CNT] == before_remote[s.S_REMOTE_CNT] + 1
    assert after[s.S_ORDER_CNT] == before_remote[s.S_ORDER_CNT] + 1
    assert after[s.S_YTD] == before_remote[s.S_YTD] + 4
    assert sim.row(s.STOCK, (w, 1234))[s.S_REMOTE_CNT] == before_local[s.S_REMOTE_CNT]
    for rep in sim.replicas:  # written where it lives, and only there
        assert rep.parts[1].storage.get(s.STOCK, (remote, 4321)) == after
        assert rep.parts[0].storage.get(s.STOCK, (remote, 4321)) is None
        assert rep.parts[1].storage.get(s.ORDER_LINE, (w, d, o_id, 2)) is None
    line = sim.row(s.ORDER_LINE, (w, d, o_id, 2))
    assert line[s.OL_SUPPLY_W_ID] == remote and line[s.OL_I_ID] == 4321
    assert sim.row(s.ORDERS, (w, d, o_id))[s.O_ALL_LOCAL] == 0


def test_new_order_rejects_malformed_lines_before_the_log(sim: Sim) -> None:
    logged = len(sim.logged("tpcc.new_order"))
    bad = [
        (1, 1, 1, (1, 2), (1,), (1, 1)),  # lengths differ
        (1, 1, 1, (1, 2), (1, 1), (1, 11)),  # quantity > 10
        (1, 1, 1, (1, "x"), (1, 1), (1, 1)),  # not an int
        (1, 1, 1, (), (), ()),  # no lines
    ]
    for args in bad:
        status, value = sim.call("tpcc.new_order", *args)
        assert status == ERROR and value[0] == "bad_arguments", (args, value)
    assert len(sim.logged("tpcc.new_order")) == logged


# --- Payment (clause 2.5) -------------------------------------------------------------------


def _select_by_name(sim: Sim, w: int, d: int, c_last: str) -> int:
    """Clause 2.5.2.2 by brute force: sort by c_first, take position ceil(n/2)."""
    customers = [
        r for (cw, cd, _), r in sim.serial.storage.tables[s.CUSTOMER].items() if (cw, cd) == (w, d)
    ]
    named = sorted((r[s.C_FIRST], r[s.C_ID]) for r in customers if r[s.C_LAST] == c_last)
    return named[(len(named) + 1) // 2 - 1][1]


def test_payment_by_id_with_remote_customer(sim: Sim) -> None:
    w, d, c_w, c_d, c_id, amount = 1, 2, 2, 9, 1500, 123_45
    wh, dist = sim.row(s.WAREHOUSE, (w,)), sim.row(s.DISTRICT, (w, d))
    cust = sim.row(s.CUSTOMER, (c_w, c_d, c_id))
    status, out = sim.call("tpcc.payment", w, d, c_w, c_d, c_id, amount)
    assert status == OK and out[0] == c_id
    txn_id, txn = sim.logged("tpcc.payment")[-1]
    assert txn.participants == (0, 1)
    assert sim.row(s.WAREHOUSE, (w,))[s.W_YTD] == wh[s.W_YTD] + amount
    assert sim.row(s.DISTRICT, (w, d))[s.D_YTD] == dist[s.D_YTD] + amount
    after = sim.row(s.CUSTOMER, (c_w, c_d, c_id))
    assert after[s.C_BALANCE] == cust[s.C_BALANCE] - amount == out[10]
    assert after[s.C_YTD_PAYMENT] == cust[s.C_YTD_PAYMENT] + amount
    assert after[s.C_PAYMENT_CNT] == cust[s.C_PAYMENT_CNT] + 1
    if cust[s.C_CREDIT] == "BC":
        assert after[s.C_DATA].startswith(f"{c_id} {c_d} {c_w} {d} {w} 123.45 ")
    else:
        assert after[s.C_DATA] == cust[s.C_DATA]
    h = sim.row(s.HISTORY, (w, d, s.HISTORY_SEQ_LOADED_MAX + 1 + txn_id))
    assert h == (c_id, c_d, c_w, d, w, out[-1], amount, wh[s.W_NAME] + "    " + dist[s.D_NAME])


def test_payment_by_name_forced_mismatch_restarts_and_succeeds(sim: Sim) -> None:
    """A stale prediction returns Restart(actual) on every replica and layout, writes
    nothing, is re-sequenced by the sequencer and then pays the right customer."""
    w, d, c_w, c_d, amount = 1, 5, 2, 7, 77_00  # remote customer: multi-partition
    c_last = LAST_NAMES[123]
    right = _select_by_name(sim, c_w, c_d, c_last)
    wrong = right % s.CUSTOMERS_PER_DISTRICT + 1
    right_before = sim.row(s.CUSTOMER, (c_w, c_d, right))
    wrong_before = sim.row(s.CUSTOMER, (c_w, c_d, wrong))
    restarts = sim.seq.stats.restarts
    sim.tamper = lambda name, prediction: wrong if name == "tpcc.payment_recon" else prediction
    try:
        status, out = sim.call("tpcc.payment_by_name", w, d, c_w, c_d, c_last, amount)
    finally:
        sim.tamper = None
    assert status == OK and out[0] == right
    assert sim.seq.stats.restarts == restarts + 1
    (first_id, first), (second_id, second) = sim.logged("tpcc.payment_by_name")[-2:]
    assert first.args[-1] == wrong and second.args[-1] == right
    assert first.participants == second.participants == (0, 1)
    # The same Restart(actual) from both replicas (2 partitions) and the serial oracle.
    assert sim.serial.results[first_id] == (RESTART, right)
    assert all(rep.results[first_id] == (RESTART, right) for rep in sim.replicas)
    assert sim.serial.results[second_id][0] == OK
    assert sim.row(s.CUSTOMER, (c_w, c_d, wrong)) == wrong_before
    after = sim.row(s.CUSTOMER, (c_w, c_d, right))
    assert after[s.C_BALANCE] == right_before[s.C_BALANCE] - amount
    # Nothing of the restarted attempt was written: no history row under its txn id.
    assert sim.row(s.HISTORY, (w, d, s.HISTORY_SEQ_LOADED_MAX + 1 + first_id)) is None
    assert sim.row(s.HISTORY, (w, d, s.HISTORY_SEQ_LOADED_MAX + 1 + second_id)) is not None


def test_payment_by_name_without_tamper_needs_no_restart(sim: Sim) -> None:
    restarts = sim.seq.stats.restarts
    c_last = LAST_NAMES[5]
    status, out = sim.call("tpcc.payment_by_name", 2, 1, 2, 1, c_last, 10_00)
    assert status == OK and out[0] == _select_by_name(sim, 2, 1, c_last)
    assert sim.seq.stats.restarts == restarts


def test_payment_by_name_read_committed_variant_trusts_the_prediction(sim: Sim) -> None:
    c_last = LAST_NAMES[321]
    right = _select_by_name(sim, 1, 8, c_last)
    wrong = right % s.CUSTOMERS_PER_DISTRICT + 1
    wrong_before = sim.row(s.CUSTOMER, (1, 8, wrong))
    restarts = sim.seq.stats.restarts
    sim.tamper = lambda name, prediction: wrong
    try:
        status, out = sim.call("tpcc.payment_by_name_rc", 1, 8, 1, 8, c_last, 5_00)
    finally:
        sim.tamper = None
    assert status == OK and out[0] == wrong  # no re-check: the stale pick is paid
    assert sim.seq.stats.restarts == restarts
    assert sim.row(s.CUSTOMER, (1, 8, wrong))[s.C_BALANCE] == wrong_before[s.C_BALANCE] - 5_00
    _txn_id, txn = sim.logged("tpcc.payment_by_name_rc")[-1]
    fp = payment_by_name_rc.footprint(*txn.args)
    assert all(t != s.CUSTOMER_BY_NAME for t, _ in fp.reads)


# --- Delivery (clause 2.7) ------------------------------------------------------------------


def _oldest_new_orders(sim: Sim, w: int) -> list[int | None]:
    keys = sim.serial.storage.tables[s.NEW_ORDER]
    out: list[int | None] = []
    for d in range(1, s.DISTRICTS_PER_WAREHOUSE + 1):
        o_ids = [k[2] for k in keys if k[:2] == (w, d)]
        out.append(min(o_ids) if o_ids else None)
    return out


def test_delivery_stale_prediction_restarts_then_delivers_oldest(sim: Sim) -> None:
    w, carrier = 2, 7
    oldest = _oldest_new_orders(sim, w)
    customers = {}
    for d, o_id in enumerate(oldest, start=1):
        c_id = sim.row(s.ORDERS, (w, d, o_id))[s.O_C_ID]
        customers[d] = (c_id, sim.row(s.CUSTOMER, (w, d, c_id)))
    restarts = sim.seq.stats.restarts

    def stale(name: str, prediction: Any) -> Any:  # predict no customers at all
        return (
            tuple((lo, ()) for lo, _ in prediction) if name == "tpcc.delivery_recon" else prediction
        )

    sim.tamper = stale
    try:
        status, delivered = sim.call("tpcc.delivery", w, carrier)
    finally:
        sim.tamper = None
    assert status == OK and list(delivered) == oldest
    assert sim.seq.stats.restarts == restarts + 1
    (first_id, _first), (second_id, _second) = sim.logged("tpcc.delivery")[-2:]
    assert sim.serial.results[first_id][0] == RESTART
    assert all(rep.results[first_id] == sim.serial.results[first_id] for rep in sim.replicas)
    ts = next(b.timestamp_ms for b in sim.batches if b.first_txn_id <= second_id < b.next_txn_id)
    for d, o_id in enumerate(oldest, start=1):
        assert sim.row(s.NEW_ORDER, (w, d, o_id)) is None
        assert sim.row(s.ORDERS, (w, d, o_id))[s.O_CARRIER_ID] == carrier
        lines = [r for k, r in sim.serial.storage.scan(s.ORDER_LINE, (w, d, o_id))]
        assert lines and all(r[s.OL_DELIVERY_D] == ts for r in lines)
        c_id, before = customers[d]
        after = sim.row(s.CUSTOMER, (w, d, c_id))
        assert after[s.C_BALANCE] == before[s.C_BALANCE] + sum(r[s.OL_AMOUNT] for r in lines)
        assert after[s.C_DELIVERY_CNT] == before[s.C_DELIVERY_CNT] + 1
    # The next Delivery takes the next oldest, with a fresh (correct) prediction.
    status, delivered = sim.call("tpcc.delivery", w, 1)
    assert status == OK and list(delivered) == [o + 1 for o in oldest]
    assert sim.seq.stats.restarts == restarts + 1


def test_delivery_skips_an_empty_district() -> None:
    storage = Storage()
    storage.load(
        [
            (s.DISTRICT, (1, d), (d, 1, "", "", "", "", "", "", 0, 0, 1))
            for d in range(1, s.DISTRICTS_PER_WAREHOUSE + 1)
        ]
    )
    serial = SerialExecutor(storage)
    prediction = delivery_recon.body(_Reader(storage), 1, 1)
    assert prediction == tuple((1, ()) for _ in range(s.DISTRICTS_PER_WAREHOUSE))
    serial.apply(make_batch(1, 0, 5, 5, [("tpcc.delivery", (1, 1, prediction))], 1))
    assert serial.results[0] == (OK, (None,) * s.DISTRICTS_PER_WAREHOUSE)


class _Reader:
    """A read-only context over a Storage (for calling recon bodies directly)."""

    def __init__(self, storage: Storage) -> None:
        self.get, self.scan = storage.get, storage.scan


# --- Order-Status (2.6), Stock-Level (2.8), consistency --------------------------------------


def test_order_status_shows_the_latest_order(sim: Sim) -> None:
    w, d, c = 1, 9, 2222
    status, out = sim.call("tpcc.new_order", w, d, c, (5, 6), (w, w), (1, 2))
    assert status == OK
    o_id = out[0]
    status, st = sim.call("tpcc.order_status", w, d, c, "")
    assert status == OK
    assert st[0] == c and st[5] == o_id and st[7] is None  # not delivered yet
    assert [(line[1], line[2]) for line in st[8]] == [(5, 1), (6, 2)]
    c_last = sim.row(s.CUSTOMER, (w, d, c))[s.C_LAST]
    status, by_name = sim.call("tpcc.order_status", w, d, 0, c_last)
    assert status == OK and by_name[0] == _select_by_name(sim, w, d, c_last)


def test_stock_level_counts_distinct_low_items_of_the_last_20_orders(sim: Sim) -> None:
    w, d, threshold = 2, 3, 60
    status, low = sim.call("tpcc.stock_level", w, d, threshold)
    assert status == OK
    next_o_id = sim.row(s.DISTRICT, (w, d))[s.D_NEXT_O_ID]
    items = {
        r[s.OL_I_ID]
        for o in range(next_o_id - 20, next_o_id)
        for _k, r in sim.serial.storage.scan(s.ORDER_LINE, (w, d, o))
    }
    expected = sum(1 for i in items if sim.row(s.STOCK, (w, i))[s.S_QUANTITY] < threshold)
    assert low == expected and low > 0


def test_standard_mix_partitioned_equals_serial_and_stays_consistent(
    sim: Sim, tmp_path: Path
) -> None:
    """1,500 calls of the standard mix (45/43/4/4/4) through the sequencer: every batch
    gives the same results and state hashes on both 2-partition replicas and on the
    serial oracle (checked by Sim), and consistency conditions 1-12 hold after: on the
    oracle, and on replica 1's partitions written as ``ordo replay state`` writes them
    (Parquet, hive-partitioned by warehouse) and read back by ``tpcc check --dump``."""
    inputs = TpccInputs(WAREHOUSES, PARTITIONS, seed=9, load_seed=SEED, mix="standard")
    terminals = terminals_for(20, WAREHOUSES)
    counts: dict[str, list[int]] = {}
    multi = 0
    for step in range(10):
        calls = [inputs.next(terminals[(step * 150 + i) % 20]) for i in range(150)]
        multi += sum(c.multi_partition for c in calls)
        answers = sim.call_all([(c.proc, c.args) for c in calls])
        for call, (status, _value) in zip(calls, answers, strict=True):
            counts.setdefault(call.kind, [0, 0, 0])[min(status, 2)] += 1
    assert set(counts) == {"new_order", "payment", "order_status", "delivery", "stock_level"}
    assert all(c[2] == 0 for c in counts.values()), counts  # no errors
    assert counts["new_order"][0] > 500 and multi > 50
    for r in range(REPLICAS):
        for w in range(1, WAREHOUSES + 1):
            assert sim.call("tpcc.check_warehouse", w, replica=r) == (OK, ())
    tables = sim.serial.storage.whole_tables()
    assert check_whole(tables, range(1, WAREHOUSES + 1)) == []
    assert sim.seq.stats.determinism_violations == 0
    parts = [part.storage for part in sim.replicas[1].parts]
    for name in NEEDED:
        write_table(parts, table_layout(name), tmp_path / name)
    verdict = check_dump(tmp_path)
    assert verdict["warehouses"] == list(range(1, WAREHOUSES + 1)) and verdict["ok"], verdict
    assert verdict["rows"][s.HISTORY] == len(tables[s.HISTORY])


def test_tpcc_leaves_no_reference_cycles(sim: Sim) -> None:
    """Partitions freeze what outlives a loop turn (storage.settle_turn), so nothing on
    TPC-C's paths may make cycles: the standard mix through the sequencer (recon queries,
    remote reads, rollbacks) and a restarted Payment by name, on both replicas and the
    oracle."""
    inputs = TpccInputs(WAREHOUSES, PARTITIONS, seed=13, load_seed=SEED, mix="standard")
    terminals = terminals_for(20, WAREHOUSES)
    c_last = LAST_NAMES[77]
    right = _select_by_name(sim, 2, 3, c_last)
    restarts = sim.seq.stats.restarts
    with no_cycles():
        for step in range(3):
            calls = [inputs.next(terminals[(step * 100 + i) % 20]) for i in range(100)]
            sim.call_all([(c.proc, c.args) for c in calls])
        sim.tamper = lambda name, p: right % 3000 + 1 if name == "tpcc.payment_recon" else p
        try:
            status, _out = sim.call("tpcc.payment_by_name", 1, 5, 2, 3, c_last, 1_00)
        finally:
            sim.tamper = None
    assert status == OK and sim.seq.stats.restarts == restarts + 1
