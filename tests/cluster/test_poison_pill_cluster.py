"""A poison write on a live 2x2 cluster: an error everywhere, and replayed after kill -9."""

from __future__ import annotations

import pytest

import txn_library.workloads.builtin  # noqa: F401  (registers the bank)
from cluster.launcher import partition_status, wait_live_again, wait_quiescent
from tests.cluster_checks import replicas_agree_with_serial_replay
from tests.unit.test_poison_pill import BIG, FIRST
from txn_library import placement
from txn_library.client import Client
from txn_library.errors import ERR_PROCEDURE_FAILED, OK, CallFailed


def test_live_cluster_survives_the_overflow_and_replays_it_after_kill9(make_cluster) -> None:  # type: ignore[no-untyped-def]
    lc = make_cluster(replicas=2, partitions=2)
    cfg = lc.config
    holder = placement.partition_of("account", (FIRST + 1,), 2)
    with Client(cfg.client_addr) as c:
        assert c.call("bank.open", FIRST, 3, BIG).value == 3
        assert c.call("bank.transfer", FIRST, FIRST + 1, BIG).value == 0
        with pytest.raises(CallFailed) as err:
            c.call("bank.transfer", FIRST + 2, FIRST + 1, BIG)
        assert err.value.code == ERR_PROCEDURE_FAILED
        assert "account(3000001,): integer out of range for msgpack" in err.value.message
        # A query whose answer does not fit msgpack (2**64 - 2 + 2**63 - 1) fails too.
        with pytest.raises(CallFailed) as err:
            c.call("bank.total", FIRST, 3)
        assert err.value.code == ERR_PROCEDURE_FAILED
        lc.check_alive()
        assert c.call("kv.put", "after", "poison").ok
        for r in range(2):
            assert c.call("bank.balance", FIRST + 2, replica=r).value == BIG
            assert c.call("bank.balance", FIRST + 1, replica=r).value == 2 * BIG
        old = partition_status(c, 1, holder)
        assert old is not None
        lc.kill(f"r1p{holder}")  # SIGKILL; no checkpoint: it replays the whole log
        epoch = c.status()["epoch"]
        lc.start_partition(1, holder)
        wait_live_again(c, 1, holder, old["pid"], epoch)
        assert c.call("kv.put", "after", "restart").ok
        st = wait_quiescent(c, 2, 2, timeout_s=60)
        assert c.call("kv.get", "after", replica=1).value == "restart"
    lc.check_alive()
    serial = replicas_agree_with_serial_replay(cfg, st)
    # The poison transfer (and bank.total, if it was sequenced) failed, nothing else.
    failed = [v for s, v in serial.results.values() if s != OK]
    assert failed and all(v[0] == ERR_PROCEDURE_FAILED for v in failed), failed
    log_text = (lc.logs_dir / f"replica-1-partition-{holder}.log").read_text()
    assert "live: caught up" in log_text
