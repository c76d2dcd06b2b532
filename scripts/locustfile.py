"""Locust load test: TPC-C terminals calling Ordo stored procedures.

Each locust user is one TPC-C terminal (home warehouse and district fixed, clause
2.8.1.1) with its own ZeroMQ DEALER (zmq.green, so it cooperates with gevent) and
txn_library.client.ClientProtocol for the wire encoding. A user sends one call,
waits for its answer and fires a locust request event with the measured latency;
no think time (closed loop), as in ``ordo tpcc run``. A logical abort (the 1%
New-Order rollback) is a success; an ERROR result or a timeout is a failure.

Start a TPC-C cluster, then run locust headless against it (ports on 127.0.0.1):

    .venv/bin/ordo tpcc up --fresh --data-dir ordo-data --warehouses 2 --replicas 1
    ORDO_DATA_DIR=ordo-data .venv/bin/locust -f scripts/locustfile.py --headless \\
        -u 20 -r 20 -t 30s --web-host 127.0.0.1 --only-summary

Environment: ORDO_DATA_DIR (default ordo-data), ORDO_TPCC_MIX (standard | new-order,
default standard), ORDO_TPCC_SEED (default 1), ORDO_CALL_TIMEOUT_S (default 30).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

import zmq.green as zmq
from locust import User, constant, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.config import ClusterConfig  # noqa: E402
from tpcc.inputs import Terminal, TpccInputs  # noqa: E402
from tpcc.schema import DISTRICTS_PER_WAREHOUSE  # noqa: E402
from txn_library.client.protocol import ClientProtocol  # noqa: E402
from txn_library.errors import ERROR, CallFailed, CallTimeout  # noqa: E402
from txn_library.wire import sequencer as wire  # noqa: E402

DATA_DIR = os.environ.get("ORDO_DATA_DIR", "ordo-data")
MIX = os.environ.get("ORDO_TPCC_MIX", "standard")
SEED = int(os.environ.get("ORDO_TPCC_SEED", "1"))
TIMEOUT_S = float(os.environ.get("ORDO_CALL_TIMEOUT_S", "30"))

_user_numbers = itertools.count()


def _cluster() -> tuple[ClusterConfig, int, int]:
    cfg = ClusterConfig.load(DATA_DIR)
    if cfg.genesis != "tpcc.loader:genesis":
        raise RuntimeError(f"{DATA_DIR} is not a TPC-C cluster: start one with `ordo tpcc up`")
    return cfg, int(cfg.genesis_args["warehouses"]), int(cfg.genesis_args.get("seed", 1))


class TpccTerminal(User):
    """One terminal: one DEALER, one call in flight."""

    wait_time = constant(0)

    def on_start(self) -> None:
        cfg, warehouses, load_seed = _cluster()
        n = next(_user_numbers)
        self.terminal = Terminal(
            n % warehouses + 1, (n // warehouses) % DISTRICTS_PER_WAREHOUSE + 1
        )
        self.inputs = TpccInputs(
            warehouses, cfg.partitions, seed=SEED * 1_000_003 + n, load_seed=load_seed, mix=MIX
        )
        self.proto = ClientProtocol()
        self.ctx: zmq.Context = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(cfg.client_addr)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    def on_stop(self) -> None:
        self.sock.close(linger=0)

    @task
    def transaction(self) -> None:
        call = self.inputs.next(self.terminal)
        req_id = self.proto.next_req_id()
        started = time.perf_counter()
        self.sock.send(self.proto.encode_calls([(req_id, call.proc, call.args)]))
        exception: Exception | None = None
        length = 0
        try:
            status, value, length = self._await(req_id, started + TIMEOUT_S)
            if status == ERROR:
                code, message = value
                exception = CallFailed(code, message)
        except CallTimeout as e:
            exception = e
        self.environment.events.request.fire(
            request_type="ordo",
            name=call.proc,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=length,
            exception=exception,
            context={"kind": call.kind, "multi_partition": call.multi_partition},
        )

    def _await(self, req_id: int, deadline: float) -> tuple[int, Any, int]:
        while True:
            left_ms = int((deadline - time.perf_counter()) * 1000)
            if left_ms <= 0 or not self.poller.poll(left_ms):
                raise CallTimeout(f"no answer to request {req_id}")
            frame = self.sock.recv()
            kind, body = ClientProtocol.decode_reply(frame)
            if kind != wire.REP_RESULTS:
                continue
            for rid, status, value in body:
                if rid == req_id:
                    return status, value, len(frame)
