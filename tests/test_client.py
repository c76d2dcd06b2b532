"""Client library: many calls in flight from a tight loop, timeouts with a clear error."""

from __future__ import annotations

import time

import pytest
import zmq

from cluster.launcher import free_base_port
from txn_library.client import Client
from txn_library.errors import CallTimeout


def test_tight_submit_loop_does_not_overflow_and_timeouts_are_clear() -> None:
    # A ROUTER that never answers: every call must time out cleanly, none may raise
    # at submit time however fast they are submitted.
    ctx = zmq.Context.instance()
    sink = ctx.socket(zmq.ROUTER)
    sink.setsockopt(zmq.LINGER, 0)
    port = free_base_port(1)
    sink.bind(f"tcp://127.0.0.1:{port}")
    try:
        with Client(f"tcp://127.0.0.1:{port}", timeout_s=1.0, retry_s=0.3) as c:
            t0 = time.monotonic()
            futures = [c.submit("kv.get", f"k{i}") for i in range(5_000)]
            for f in futures:
                with pytest.raises(CallTimeout, match="no answer within"):
                    f.result(timeout=10)
            assert time.monotonic() - t0 < 10
            with pytest.raises(CallTimeout):
                c.call("kv.get", "x", timeout_s=0.5)
    finally:
        sink.close()
