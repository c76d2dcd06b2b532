"""The serial oracle: what a replica must equal.

``SerialExecutor`` holds one Storage and runs transactions one at a time in txn id
order, with no locks and no partitions. Invariant: after the same log, its state hash
equals the sum of a replica's partition hashes and its results equal the replica's
(a dataflow's derived transactions run here too, and, as at a replica, report no
result; a procedure deployed through the log runs in the version in force at the
batch's epoch); both run bodies and validate write sets with executor.core.execution.run_txn.
"""

from __future__ import annotations

from typing import Any

from executor.core.context import TxnContext, cover_set
from executor.core.execution import run_txn
from executor.core.storage import Storage
from txn_library.deployed import install_batch
from txn_library.deployed import reset as reset_deployed
from txn_library.procedure import lookup_at
from txn_library.streams import DERIVED_CLIENT, batch_txns
from txn_library.wire.sequencer import FLAG_DEPLOY, Batch


class SerialExecutor:
    def __init__(self, storage: Storage | None = None) -> None:
        if storage is None:  # a history from genesis: its deploys are met in its log
            reset_deployed()
        self.storage = storage if storage is not None else Storage()
        self.results: dict[int, tuple[int, Any]] = {}
        self.last_epoch = 0

    def apply(self, batch: Batch) -> None:
        txn_id = batch.first_txn_id
        ts, seed = batch.timestamp_ms, batch.seed
        s = self.storage
        epoch = batch.epoch
        if batch.flags & FLAG_DEPLOY:  # procedures deployed through the log, from epoch + 1
            install_batch(epoch, batch.txns)
        for txn in batch_txns(batch, 1):  # one partition: no participant matters here
            proc = lookup_at(txn.proc, epoch)
            args = txn.args
            fp = proc.footprint(*args)
            ctx = TxnContext(
                txn_id, ts, seed, cover_set(fp.reads), cover_set(fp.writes), s.get, s.scan
            )
            status, value, _, writes = run_txn(proc, args, ctx, s)
            s.apply(writes)
            if txn.client_id != DERIVED_CLIENT:
                self.results[txn_id] = (status, value)
            txn_id += 1
        self.last_epoch = batch.epoch

    @property
    def state_hash(self) -> int:
        return self.storage.state_hash
