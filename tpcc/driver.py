"""The TPC-C driver behind ``ordo tpcc run`` and ``ordo tpcc check``.

It starts an embedded local cluster whose partitions load their own warehouses at
startup (genesis ``tpcc.loader:genesis``; nothing goes through the log), or attaches
to a running one, then drives TPC-C terminals against it and reports throughput
(txn/s, tpmC), rollbacks, dependent-transaction restarts, the multi-partition share
and latency percentiles per transaction type; finally it checks consistency
conditions 1-4 on every warehouse of every replica and compares the replicas' state
hashes.

Load model: ``terminals`` terminals, each bound to a home warehouse. Closed loop
(default): a terminal submits its next transaction as soon as the previous one
answers; there are no keying or think times (clause 5.2.5 is not modelled), so the
numbers are engine capacity, not a compliant tpmC. Open loop: transactions are
submitted at a fixed rate whatever the answers (bounded in flight).

The load loop is single-threaded over one ZeroMQ DEALER (txn_library.client's
ClientProtocol encoding): replies are drained, the answering terminals' next calls
are generated and sent in one frame. Measurement counts answers that arrive inside
the window [warmup, warmup + duration]; the sequencer's restart counter is read at
both ends of the window.

Invariant: the driver never decides anything the database should: every outcome it
reports is a result returned by the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import zmq

from cluster.config import ClusterConfig
from tpcc.inputs import KINDS, NEW_ORDER, Call, Terminal, TpccInputs, terminals_for
from txn_library import limits, wire
from txn_library.client import ClientProtocol
from txn_library.errors import ABORTED, ERROR, OK

GENESIS = "tpcc.loader:genesis"
PROCEDURE_MODULES = ("txn_library.builtin", "tpcc.procedures")
FRAME_CALLS_MAX = 1000  # calls per client frame (well under limits.calls_per_frame_max)
DRAIN_S = 30.0  # after the window, wait this long for calls still in flight
LOAD_S_PER_WAREHOUSE = 2.0  # rough, for the load progress bar's patience
QUANTILES = (0.50, 0.95, 0.99)


@dataclass
class RunOptions:
    warehouses: int = 2
    partitions: int = 2
    replicas: int = 1
    fsync: bool = True
    epoch_ms: int = 10
    mix: str = "new-order"
    duration_s: float = 30.0
    warmup_s: float = 5.0
    remote_pct: float = 1.0
    terminals: int = 200
    open_loop: bool = False
    rate: float = 0.0
    seed: int = 1
    load_seed: int = 1
    payment_rc: bool = False
    check: bool = True
    attach: str | None = None
    data_dir: str | None = None
    keep_data: bool = False
    out: str | None = "results/tpcc_run.json"
    progress: bool = True


@dataclass
class KindStats:
    ok: int = 0
    aborted: int = 0
    errors: int = 0
    multi_partition: int = 0
    latencies_s: list[float] = field(default_factory=list)


@dataclass
class Window:
    """What was answered inside the measurement window."""

    kinds: dict[str, KindStats] = field(default_factory=lambda: {k: KindStats() for k in KINDS})
    errors: Counter = field(default_factory=Counter)
    restarts_start: int | None = None
    restarts_end: int | None = None
    status_start: dict | None = None
    status_end: dict | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    skipped: int = 0  # open loop: not sent because of the in-flight bound
    unanswered: int = 0


# --- Cluster -----------------------------------------------------------------------------


def embedded_config(opts: RunOptions, data_dir: str, base_port: int) -> ClusterConfig:
    return ClusterConfig(
        replicas=opts.replicas,
        partitions=opts.partitions,
        base_port=base_port,
        data_dir=data_dir,
        epoch_duration_ms=opts.epoch_ms,
        fsync=opts.fsync,
        procedure_modules=PROCEDURE_MODULES,
        genesis=GENESIS,
        genesis_args={
            "warehouses": opts.warehouses,
            "seed": opts.load_seed,
            "load_ts_ms": int(time.time() * 1000),
        },
    )


def start_cluster(cfg: ClusterConfig, progress: bool, log: Callable[[str], None]) -> Any:
    """Start sequencer + partitions; show a progress bar while partitions load."""
    from tqdm import tqdm

    from cluster.launcher import LocalCluster
    from txn_library.client import Client

    lc = LocalCluster(cfg)
    cfg.save()
    lc.start_sequencer()
    for r in range(cfg.replicas):
        for p in range(cfg.partitions):
            lc.start_partition(r, p)
    want = cfg.replicas * cfg.partitions
    per_part = cfg.genesis_args["warehouses"] / cfg.partitions
    patience = 60.0 + 4 * LOAD_S_PER_WAREHOUSE * per_part * want
    deadline = time.monotonic() + patience
    log(
        f"loading {cfg.genesis_args['warehouses']} warehouses into {cfg.replicas} replica(s) "
        f"x {cfg.partitions} partitions (each partition generates its own rows)"
    )
    try:
        with (
            Client(cfg.client_addr, timeout_s=5) as c,
            tqdm(total=want, desc="partitions loaded", unit="part", disable=not progress) as bar,
        ):
            while True:
                lc.check_alive()
                try:
                    n = len(c.status(timeout_s=2)["partitions"])
                except Exception:
                    n = 0
                bar.update(n - bar.n)
                if n >= want:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"partitions not loaded after {patience:.0f}s")
                time.sleep(0.2)
    except BaseException:
        lc.stop()
        raise
    return lc


# --- Load loop ---------------------------------------------------------------------------


class LoadLoop:
    """One DEALER, many terminals. Not thread-safe; run() blocks for the whole run."""

    def __init__(
        self,
        address: str,
        inputs: TpccInputs,
        terminals: list[Terminal],
        log: Callable[[str], None],
    ) -> None:
        self.inputs = inputs
        self.terminals = terminals
        self.log = log
        self.proto = ClientProtocol()
        self.ctx: zmq.Context = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(address)
        # req_id -> (terminal index, call, sent at)
        self.in_flight: dict[int, tuple[int, Call, float]] = {}
        self._outbox: list[tuple] = []
        self._status_waiting: list[str] = []
        self.window = Window()
        # Called with "start" / "end" at the window's edges (CPU accounting).
        self.on_edge: Callable[[str], None] = lambda _edge: None

    def close(self) -> None:
        self.sock.close(linger=0)

    # Sending ------------------------------------------------------------------------
    def _issue(self, t: int, now: float) -> None:
        call = self.inputs.next(self.terminals[t])
        req_id = self.proto.next_req_id()
        self.in_flight[req_id] = (t, call, now)
        self._outbox.append((req_id, call.proc, call.args))

    def _flush(self) -> None:
        out = self._outbox
        for i in range(0, len(out), FRAME_CALLS_MAX):
            self.sock.send(self.proto.encode_calls(out[i : i + FRAME_CALLS_MAX]))
        self._outbox = []

    def _ask_status(self, tag: str) -> None:
        self._status_waiting.append(tag)
        self.sock.send(wire.pack((wire.REQ_STATUS,)))

    # Receiving ----------------------------------------------------------------------
    def _on_frame(self, frame: bytes, now: float, measuring: bool, answered: list[int]) -> None:
        kind, body = ClientProtocol.decode_reply(frame)
        if kind == wire.REP_STATUS:
            tag = self._status_waiting.pop(0) if self._status_waiting else ""
            w = self.window
            if tag == "start":
                w.status_start, w.restarts_start = body, body["restarts"]
            elif tag == "end":
                w.status_end, w.restarts_end = body, body["restarts"]
            return
        kinds = self.window.kinds
        for req_id, status, value in body:
            entry = self.in_flight.pop(req_id, None)
            if entry is None:
                continue
            t, call, sent = entry
            answered.append(t)
            if not measuring:
                continue
            k = kinds[call.kind]
            if status == OK:
                k.ok += 1
            elif status == ABORTED:
                k.aborted += 1
            else:
                k.errors += 1
                code = value[0] if status == ERROR and value else str(status)
                self.window.errors[f"{call.proc}: {code}"] += 1
                continue
            k.latencies_s.append(now - sent)
            if call.multi_partition:
                k.multi_partition += 1

    # Running ------------------------------------------------------------------------
    def run(self, warmup_s: float, duration_s: float, *, rate: float | None = None) -> Window:
        """Closed loop (rate None) or open loop at ``rate`` txn/s; returns the window."""
        n = len(self.terminals)
        start = time.perf_counter()
        window_start = start + warmup_s
        window_end = window_start + duration_s
        w = self.window
        measuring = False
        next_report = start + 1.0
        last_report_counts = (0, 0)
        sent = 0
        rr = 0
        if rate is None:
            for t in range(n):
                self._issue(t, start)
            self._flush()
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        answered: list[int] = []
        while True:
            now = time.perf_counter()
            if not measuring and now >= window_start and now < window_end:
                measuring = True
                w.started_at = now
                self._ask_status("start")
                self.on_edge("start")
            if now >= window_end:
                break
            timeout_ms = 1 if rate is not None else max(1, int((next_report - now) * 1000))
            if poller.poll(timeout_ms):
                now = time.perf_counter()
                while True:
                    try:
                        frame = self.sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_frame(frame, now, measuring and now < window_end, answered)
            if rate is None:
                for t in answered:
                    self._issue(t, now)
            else:
                due = int((now - start) * rate) - sent
                for _ in range(max(0, due)):
                    sent += 1
                    if len(self.in_flight) >= limits.client_in_flight_max:
                        if measuring:
                            w.skipped += 1
                        continue
                    self._issue(rr, now)
                    rr = (rr + 1) % n
            answered.clear()
            if self._outbox:
                self._flush()
            if now >= next_report:
                last_report_counts = self._report(now - start, measuring, last_report_counts)
                next_report += 1.0
        w.ended_at = time.perf_counter()
        self.on_edge("end")
        self._ask_status("end")
        self._drain(window_end)
        return w

    def _report(self, elapsed: float, measuring: bool, last: tuple[int, int]) -> tuple[int, int]:
        ks = self.window.kinds
        total = sum(k.ok + k.aborted for k in ks.values())
        new_orders = ks[NEW_ORDER].ok
        if measuring:
            self.log(
                f"[{elapsed:6.1f}s] measuring: {total - last[0]:6d} txn/s  "
                f"{new_orders - last[1]:6d} new-order/s  in flight {len(self.in_flight):5d}  "
                f"errors {sum(k.errors for k in ks.values())}"
            )
        else:
            self.log(f"[{elapsed:6.1f}s] warming up: in flight {len(self.in_flight)}")
        return total, new_orders

    def _drain(self, window_end: float) -> None:
        """Wait for calls still in flight (not counted) and the end-of-window status."""
        deadline = time.perf_counter() + DRAIN_S
        answered: list[int] = []
        while (self.in_flight or self._status_waiting) and time.perf_counter() < deadline:
            if self.sock.poll(100):
                while True:
                    try:
                        frame = self.sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_frame(frame, time.perf_counter(), False, answered)
        self.window.unanswered = len(self.in_flight)


# --- CPU accounting ----------------------------------------------------------------------


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), None if unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by each cluster process and by the driver inside the window."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start: dict[str, float | None] = {}
        self.used: dict[str, float] = {}

    def edge(self, edge: str) -> None:
        now = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        now["driver"] = time.process_time()
        if edge == "start":
            self.start = now
            return
        for name, value in now.items():
            before = self.start.get(name)
            if value is not None and before is not None:
                self.used[name] = round(value - before, 2)


# --- Results -----------------------------------------------------------------------------


def percentiles_ms(latencies_s: list[float]) -> dict[str, float | None]:
    xs = sorted(latencies_s)
    out: dict[str, float | None] = {}
    for q in QUANTILES:
        key = f"p{int(q * 100)}"
        out[key] = round(1000.0 * xs[min(len(xs) - 1, int(q * len(xs)))], 2) if xs else None
    return out


def summarize(w: Window, opts: RunOptions, partitions: int, replicas: int) -> dict[str, Any]:
    seconds = max(1e-9, w.ended_at - w.started_at)
    completed = sum(k.ok + k.aborted for k in w.kinds.values())
    sequenced = sum(k.ok + k.aborted for name, k in w.kinds.items() if name in _SEQUENCED)
    multi = sum(k.multi_partition for k in w.kinds.values())
    no = w.kinds[NEW_ORDER]
    restarts = None
    if w.restarts_start is not None and w.restarts_end is not None:
        restarts = w.restarts_end - w.restarts_start
    per_kind = {}
    for name, k in w.kinds.items():
        if k.ok + k.aborted + k.errors == 0:
            continue
        per_kind[name] = {
            "ok": k.ok,
            "aborted": k.aborted,
            "errors": k.errors,
            "per_s": round((k.ok + k.aborted) / seconds, 1),
            "multi_partition": k.multi_partition,
            "latency_ms": percentiles_ms(k.latencies_s),
        }
    epochs = None
    if w.status_start and w.status_end:
        epochs = w.status_end["epoch"] - w.status_start["epoch"]
    return {
        "measured_s": round(seconds, 2),
        "txn_per_s": round(completed / seconds, 1),
        "new_order_per_s": round(no.ok / seconds, 1),
        "tpmC": round(no.ok / seconds * 60.0),
        "new_order_rollbacks": no.aborted,
        "dependent_restarts": restarts,
        "multi_partition_share": round(multi / sequenced, 4) if sequenced else 0.0,
        "errors": dict(w.errors),
        "unanswered_after_drain": w.unanswered,
        "open_loop_skipped": w.skipped,
        "epochs": epochs,
        "txns_per_epoch": round(sequenced / epochs, 1) if epochs else None,
        "per_type": per_kind,
        "determinism_violations": (w.status_end or {}).get("determinism_violations"),
    }


_SEQUENCED = ("new_order", "payment", "delivery")


# --- Checks ------------------------------------------------------------------------------


def check_cluster(
    cfg: ClusterConfig, warehouses: int, log: Callable[[str], None], timeout_s: float = 120.0
) -> dict[str, Any]:
    """Consistency conditions 1-4 on every warehouse at every replica, and equal state
    hashes per partition across replicas once the cluster is quiescent."""
    from cluster.launcher import wait_quiescent
    from txn_library.client import Client

    with Client(cfg.client_addr, timeout_s=timeout_s) as c:
        st = wait_quiescent(c, cfg.replicas, cfg.partitions, timeout_s=timeout_s)
        violations: dict[str, list[str]] = {}
        for r in range(cfg.replicas):
            for w_id in range(1, warehouses + 1):
                res = c.call("tpcc.check_warehouse", w_id, replica=r, timeout_s=timeout_s)
                found = list(res.value) if res.ok else [f"check failed: {res.value}"]
                if found:
                    violations[f"replica {r} warehouse {w_id}"] = found
        st = wait_quiescent(c, cfg.replicas, cfg.partitions, timeout_s=timeout_s)
    hashes: dict[int, dict[int, str]] = {}
    for p in st["partitions"]:
        hashes.setdefault(p["partition"], {})[p["replica"]] = p["state_hash"]
    equal = all(len(set(h.values())) == 1 for h in hashes.values())
    ok = not violations and equal and st["determinism_violations"] == 0
    verdict = {
        "consistent": not violations,
        "violations": violations,
        "state_hashes_equal": equal,
        "state_hashes": {str(p): h for p, h in sorted(hashes.items())},
        "determinism_violations": st["determinism_violations"],
        "epoch": st["epoch"],
        "ok": ok,
    }
    log(
        f"check: consistency conditions 1-4 on {warehouses} warehouse(s) x {cfg.replicas} "
        f"replica(s): {'hold' if not violations else 'VIOLATED'}; state hashes per partition "
        f"{'equal' if equal else 'DIFFER'} across replicas; determinism violations "
        f"{st['determinism_violations']} -> {'OK' if ok else 'FAILED'}"
    )
    for where, found in violations.items():
        for v in found[:10]:
            log(f"  {where}: {v}")
    return verdict


def warehouses_of(cfg: ClusterConfig) -> int:
    if cfg.genesis != GENESIS:
        raise ValueError(
            f"the cluster in {cfg.data_dir} was not started with genesis {GENESIS} "
            f"(it has {cfg.genesis!r}); start one with `ordo tpcc run` or a tpcc config"
        )
    return int(cfg.genesis_args["warehouses"])


# --- Run ---------------------------------------------------------------------------------


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(opts: RunOptions, log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """A whole ``ordo tpcc run``: cluster, load loop, summary, checks, JSON file."""
    from cluster.launcher import free_base_port
    from txn_library.procedure import load_modules

    load_modules(PROCEDURE_MODULES)
    if opts.open_loop and opts.rate <= 0:
        raise ValueError("--open-loop needs --rate > 0")
    lc = None
    tmp_dir = None
    if opts.attach:
        cfg = ClusterConfig.load(opts.attach)
        opts.warehouses = warehouses_of(cfg)
        opts.partitions, opts.replicas = cfg.partitions, cfg.replicas
        opts.load_seed = int(cfg.genesis_args.get("seed", opts.load_seed))
        opts.fsync, opts.epoch_ms = cfg.fsync, cfg.epoch_duration_ms
    else:
        data_dir = opts.data_dir
        if data_dir is None:
            data_dir = tmp_dir = tempfile.mkdtemp(prefix="ordo-tpcc-")
        elif Path(data_dir).exists():
            shutil.rmtree(data_dir)
        cfg = embedded_config(opts, data_dir, free_base_port())
    load_before = os.getloadavg()
    try:
        if not opts.attach:
            lc = start_cluster(cfg, opts.progress, log)
        inputs = TpccInputs(
            opts.warehouses,
            cfg.partitions,
            opts.seed,
            load_seed=opts.load_seed,
            mix=opts.mix,
            remote_line_pct=opts.remote_pct,
            payment_by_name_proc=(
                "tpcc.payment_by_name_rc" if opts.payment_rc else "tpcc.payment_by_name"
            ),
        )
        loop = LoadLoop(
            cfg.client_addr, inputs, terminals_for(opts.terminals, opts.warehouses), log
        )
        mode = f"open loop at {opts.rate:g} txn/s" if opts.open_loop else "closed loop"
        log(
            f"driving {opts.terminals} terminals, {mode}, no keying/think times, mix "
            f"{opts.mix}, {opts.warmup_s:g}s warm-up + {opts.duration_s:g}s measured"
        )
        pids = {} if lc is None else {name: p.pid for name, p in lc.procs.items()}
        meter = CpuMeter(pids)
        loop.on_edge = meter.edge
        try:
            window = loop.run(
                opts.warmup_s, opts.duration_s, rate=opts.rate if opts.open_loop else None
            )
        finally:
            loop.close()
        load_after = os.getloadavg()
        summary = summarize(window, opts, cfg.partitions, cfg.replicas)
        summary["cpu_s_in_window"] = meter.used
        sequenced = sum(k.ok + k.aborted for name, k in window.kinds.items() if name in _SEQUENCED)
        if sequenced:
            summary["cpu_us_per_sequenced_txn"] = {
                name: round(1e6 * used / sequenced, 1) for name, used in meter.used.items()
            }
        result: dict[str, Any] = {
            "options": asdict(opts),
            "cluster": {
                "warehouses": opts.warehouses,
                "partitions": cfg.partitions,
                "replicas": cfg.replicas,
                "fsync": cfg.fsync,
                "epoch_ms": cfg.epoch_duration_ms,
            },
            "summary": summary,
            "machine": {
                "cpus": os.cpu_count(),
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in load_after],
            },
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        print_summary(summary, log)
        if opts.check:
            result["check"] = check_cluster(cfg, opts.warehouses, log)
        if lc is not None:
            lc.check_alive()
    finally:
        if lc is not None:
            lc.stop()
        if tmp_dir and not opts.keep_data:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.out).write_text(json.dumps(result, indent=2))
        log(f"results written to {opts.out}")
    return result


def print_summary(s: dict[str, Any], log: Callable[[str], None]) -> None:
    log(
        f"committed {s['txn_per_s']:.0f} txn/s over {s['measured_s']}s; "
        f"New-Order {s['new_order_per_s']:.0f}/s = tpmC {s['tpmC']} "
        f"(rollbacks {s['new_order_rollbacks']})"
    )
    log(
        f"dependent restarts {s['dependent_restarts']}, multi-partition share "
        f"{100 * s['multi_partition_share']:.1f}%, errors {sum(s['errors'].values())}, "
        f"epochs {s['epochs']} ({s['txns_per_epoch']} txns/epoch)"
    )
    for name, k in s["per_type"].items():
        lat = k["latency_ms"]
        log(
            f"  {name:13s} {k['per_s']:8.1f}/s  ok {k['ok']:7d}  aborted {k['aborted']:5d}  "
            f"errors {k['errors']:3d}  p50 {lat['p50']} ms  p95 {lat['p95']} ms  "
            f"p99 {lat['p99']} ms"
        )
    for what, n in s["errors"].items():
        log(f"  error {what}: {n}")
    if s.get("cpu_s_in_window"):
        used = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(s["cpu_s_in_window"].items()))
        log(f"  CPU used in the window: {used} (of {s['measured_s']}s x {os.cpu_count()} cores)")
