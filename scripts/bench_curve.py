"""Benchmark: what CURVE (cluster/security/) costs on a ZeroMQ link, against plain text.

A DEALER client and a ROUTER echo server in another process, over tcp://127.0.0.1,
with CURVE (keys from ``create_keys``, the server's ZAP authenticator running) and
without. Payloads are msgpack: a small call (~200 B) and a batch of calls (~64 KiB,
a realistic published batch or client frame). For each payload:

  round trips   one message in flight (ping-pong): round trips per second
  pipelined     ``--window`` messages in flight: messages and MB per second

and CPU per MB: the CPU time of both processes (every thread, zmq's I/O threads too)
over the bytes that crossed the link (each byte is encrypted once and decrypted once
with CURVE). Plain and CURVE alternate within each round, in the same run, and the
medians over rounds are reported. Writes bench_curve.json and .png to the scratch
directory (scripts/bench_outputs.py), or with ``--publish`` to results/curve/.

    .venv/bin/python scripts/bench_curve.py --rounds 5 --seconds 1.5 --publish
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import msgpack
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_outputs import BenchParser, wrote  # noqa: E402

from cluster.security.keys import (  # noqa: E402
    create_keys,
    load_client_identity,
    load_identity,
    load_role_public,
)
from cluster.security.sockets import secure_client, secure_server  # noqa: E402
from cluster.security.zap import start_authenticator  # noqa: E402

SERVER_ROLE = "sequencer-0"
CLIENT = "bench"
START, STOP = b"start", b"stop"  # markers: the server reads its CPU clock at each
WAIT_MS = 30_000


def small_payload() -> bytes:
    """One call as a client frames it: ~200 B of msgpack."""
    return msgpack.packb([[1, 7, "bank.transfer", [12345, 67890, 25, "x" * 150]]])


def batch_payload(target: int = 64 << 10) -> bytes:
    """A batch of such calls, about ``target`` bytes."""
    calls = []
    size = 0
    i = 0
    while size < target:
        call = [i, 7, "bank.transfer", [i, i + 1, 25, "x" * 150]]
        calls.append(call)
        size += len(msgpack.packb(call))
        i += 1
    return msgpack.packb([9, 1, calls])


def serve(data_dir: str, curve: bool, conn: Connection) -> None:
    """Echo every message back; answer STOP with the CPU seconds since START."""
    ctx = zmq.Context()
    auth = start_authenticator(ctx, data_dir, [SERVER_ROLE]) if curve else None
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    if curve:
        secure_server(sock, load_identity(data_dir, SERVER_ROLE))
    conn.send(sock.bind_to_random_port("tcp://127.0.0.1"))
    cpu0 = time.process_time()
    try:
        while True:
            ident, body = sock.recv_multipart(copy=False)
            if len(body) == len(START) and body.bytes == START:
                cpu0 = time.process_time()
            elif len(body) == len(STOP) and body.bytes == STOP:
                cpu = time.process_time() - cpu0
                sock.send_multipart([ident, msgpack.packb(cpu)])
                if conn.poll(0):  # the parent says the run is over
                    break
                continue
            sock.send_multipart([ident, body], copy=False)
    finally:
        sock.close()
        if auth is not None:
            auth.stop()
        ctx.term()


def measure(sock: zmq.Socket, payload: bytes, window: int, seconds: float) -> dict:
    """Echo ``payload`` with ``window`` in flight for ``seconds``; rates and CPU."""
    sock.send(START)
    if not sock.poll(WAIT_MS):
        raise RuntimeError("the echo server does not answer")
    sock.recv()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    sent = done = 0
    while sent < window:
        sock.send(payload, copy=False)
        sent += 1
    while True:
        if not sock.poll(WAIT_MS):
            raise RuntimeError("an echo did not come back")
        sock.recv(copy=False)
        done += 1
        if time.perf_counter() < deadline:
            sock.send(payload, copy=False)
            sent += 1
        elif done == sent:
            break
    wall = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    sock.send(STOP)
    if not sock.poll(WAIT_MS):
        raise RuntimeError("the echo server does not report its CPU time")
    server_cpu = float(msgpack.unpackb(sock.recv()))
    moved_mb = 2 * done * len(payload) / 1e6  # each message crosses twice
    return {
        "messages_per_s": done / wall,
        "mb_per_s": moved_mb / 2 / wall,  # one way, as payload
        "cpu_s_per_mb": (client_cpu + server_cpu) / moved_mb,
        "client_cpu_s": client_cpu,
        "server_cpu_s": server_cpu,
        "wall_s": wall,
    }


def run_mode(data_dir: str, curve: bool, workloads: dict, seconds: float) -> dict[str, dict]:
    mpc = mp.get_context("spawn")
    parent, child = mpc.Pipe()
    proc = mpc.Process(target=serve, args=(data_dir, curve, child), daemon=True)
    proc.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    try:
        if not parent.poll(WAIT_MS / 1000):
            raise RuntimeError("the echo server did not start")
        port = parent.recv()
        if curve:
            secure_client(
                sock,
                load_client_identity(data_dir, CLIENT),
                load_role_public(data_dir, SERVER_ROLE),
            )
        sock.connect(f"tcp://127.0.0.1:{port}")
        out = {}
        for name, (payload, window) in workloads.items():
            measure(sock, payload, window, min(0.2, seconds))  # warm up, handshake done
            out[name] = measure(sock, payload, window, seconds)
        parent.send(None)
        sock.send(STOP)  # lets the server see the parent's word and leave
        sock.poll(WAIT_MS)
        return out
    finally:
        sock.close()
        ctx.term()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def parser() -> BenchParser:
    ap = BenchParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    ap.add_argument("--window", type=int, default=32, help="messages in flight, pipelined")
    ap.output("--out", "results/curve/bench_curve.json", "JSON; the PNG beside it")
    return ap


def main() -> None:
    args = parser().parse()

    small, batch = small_payload(), batch_payload()
    workloads = {
        f"{len(small)} B round trips": (small, 1),
        f"{len(small)} B pipelined": (small, args.window),
        f"{len(batch) >> 10} KiB round trips": (batch, 1),
        f"{len(batch) >> 10} KiB pipelined": (batch, args.window),
    }
    runs: dict[str, list[dict]] = {"plain": [], "curve": []}
    with tempfile.TemporaryDirectory() as tmp:
        create_keys(tmp, [SERVER_ROLE], [CLIENT])
        for r in range(args.rounds):
            order = ["plain", "curve"] if r % 2 == 0 else ["curve", "plain"]
            for mode in order:
                res = run_mode(tmp, mode == "curve", workloads, args.seconds)
                runs[mode].append(res)
                for name, m in res.items():
                    print(
                        f"round {r} {mode:<5} {name:<22} {m['messages_per_s']:>10.0f} msg/s "
                        f"{m['mb_per_s']:>8.1f} MB/s {m['cpu_s_per_mb'] * 1e3:>7.2f} ms CPU/MB",
                        flush=True,
                    )
    summary = {}
    for name in workloads:
        row: dict[str, float] = {}
        for mode in ("plain", "curve"):
            for key in ("messages_per_s", "mb_per_s", "cpu_s_per_mb"):
                row[f"{mode}_{key}"] = statistics.median(x[name][key] for x in runs[mode])
        row["curve_throughput_ratio"] = row["curve_messages_per_s"] / row["plain_messages_per_s"]
        row["curve_extra_cpu_ms_per_mb"] = 1e3 * (
            row["curve_cpu_s_per_mb"] - row["plain_cpu_s_per_mb"]
        )
        summary[name] = row
    print(json.dumps(summary, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": " ".join(sys.argv),
                "zmq": zmq.zmq_version(),
                "pyzmq": zmq.__version__,
                "payload_bytes": {"small": len(small), "batch": len(batch)},
                "window": args.window,
                "seconds": args.seconds,
                "summary": summary,
                "runs": runs,
            },
            indent=2,
        )
    )
    plot(summary, out.with_suffix(".png"))
    wrote(out, out.with_suffix(".png"))


def plot(summary: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    xs = range(len(names))
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    w = 0.38
    for i, mode in enumerate(("plain", "curve")):
        a.bar(
            [x + (i - 0.5) * w for x in xs],
            [summary[n][f"{mode}_messages_per_s"] for n in names],
            w,
            label=mode,
        )
        b.bar(
            [x + (i - 0.5) * w for x in xs],
            [1e3 * summary[n][f"{mode}_cpu_s_per_mb"] for n in names],
            w,
            label=mode,
        )
    a.set_yscale("log")
    a.set_ylabel("messages / s (log)")
    a.set_title("echo over tcp://127.0.0.1 (median of rounds)")
    b.set_yscale("log")
    b.set_ylabel("CPU ms per MB crossing the link, both ends (log)")
    b.set_title("CPU cost")
    for ax in (a, b):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=15, fontsize=8)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
