"""``ordo status --watch``: a live view of a cluster for a person at a terminal.

Every second (``--interval``) it asks the cluster what ``ordo status`` asks (the
leading sequencer's status; every sequencer's when replicated; every reader's) and
draws one screen: throughput since the previous screen (calls sequenced and
transactions applied per second), how far each partition and reader is behind the
leader's epoch, and each process's state (live, catching up, DOWN). On a terminal each
screen replaces the last; into a file or a pipe the screens follow each other,
separated by a blank line, so a log of them reads in order.

``snapshot`` asks, ``render`` draws: render is a pure function of two snapshots (so
tests draw screens without a cluster). A snapshot that got no answer says so and the
watch goes on: a cluster that restarts comes back on the screen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cluster.config import ClusterConfig

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen
STATUS_TIMEOUT_S = 1.0


@dataclass
class Snapshot:
    at: float  # time.monotonic() when taken
    wall: str  # the wall clock, as shown
    leader: dict | None  # the leading sequencer's status report, None: no leader answered
    sequencers: list[dict | None] = field(default_factory=list)  # replicated: each one's
    readers: list[dict | None] = field(default_factory=list)
    error: str = ""


def snapshot(cfg: ClusterConfig) -> Snapshot:
    """Ask the cluster, each question bounded by STATUS_TIMEOUT_S."""
    from cluster.launcher import leader_status, reader_reports, sequencer_statuses
    from txn_library.errors import OrdoError

    at, wall = time.monotonic(), datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    try:
        if cfg.replicated:
            seqs = sequencer_statuses(cfg, STATUS_TIMEOUT_S)
            leaders = [s for s in seqs if s is not None and s.get("role") == "leader"]
            leader = max(leaders, key=lambda s: s["term"]) if leaders else None
        else:
            seqs, leader = [], leader_status(cfg, STATUS_TIMEOUT_S)
        readers = reader_reports(cfg, timeout_s=STATUS_TIMEOUT_S / 2)
    except OrdoError as e:  # no answer in time: the screen says so, the watch goes on
        return Snapshot(at, wall, None, error=f"no answer: {e}")
    return Snapshot(at, wall, leader, seqs, readers)


def _rate(now: float | None, before: float | None, seconds: float) -> str:
    if now is None or before is None or seconds <= 0:
        return "-"
    return f"{max(0.0, now - before) / seconds:,.0f}"


def render(cfg: ClusterConfig, snap: Snapshot, prev: Snapshot | None) -> str:
    """One screen, from this snapshot and the one before (for rates)."""
    dt = snap.at - prev.at if prev is not None else 0.0
    lines = [f"ordo status --watch  {cfg.data_dir}  {snap.wall}  (Ctrl-C to stop)", ""]
    st, old = snap.leader, prev.leader if prev is not None else None
    if cfg.replicated:
        lines += _sequencer_lines(cfg, snap, st)
    if st is None:
        lines.append(snap.error or "no sequencer leads now (or none answered)")
        return "\n".join(lines)

    def delta(key: str) -> str:
        return _rate(st.get(key), old.get(key) if old else None, dt)

    lines.append(
        f"epoch {st['epoch']} ({delta('epoch')}/s)   calls sequenced {st['txns_sequenced']:,} "
        f"({delta('txns_sequenced')}/s)   rejected {delta('calls_rejected')}/s   "
        f"determinism violations {st['determinism_violations']}"
    )
    lines.append(
        f"pending {st['pending']}   in flight {st['in_flight']}   "
        f"intake {st.get('intake_slices_queued', 0)}   "
        f"retry cache {st.get('retry_cache_entries', 0)}"
    )
    lines.append("")
    lines.append(
        f"{'replica':>7} {'partition':>9} {'pid':>7} {'epoch':>8} {'lag':>5} "
        f"{'txns/s':>8} {'active':>6} {'blocked':>7} {'checkpoint':>10}  state"
    )
    before = {(p["replica"], p["partition"]): p for p in (old or {}).get("partitions", [])}
    for p in st["partitions"]:
        was = before.get((p["replica"], p["partition"]))
        state = "DOWN" if p["down"] else ("catching up" if p["catching_up"] else "live")
        rate = _rate(p["txns_applied"], was["txns_applied"] if was else None, dt)
        lines.append(
            f"{p['replica']:>7} {p['partition']:>9} {p['pid']:>7} {p['last_epoch']:>8} "
            f"{max(0, st['epoch'] - p['last_epoch']):>5} {rate:>8} {p['active']:>6} "
            f"{p.get('blocked', 0):>7} {p['newest_checkpoint_epoch']:>10}  {state}"
        )
    lines += _reader_lines(snap, prev, st["epoch"], dt)
    return "\n".join(lines)


def _sequencer_lines(cfg: ClusterConfig, snap: Snapshot, leader: dict | None) -> list[str]:
    committed = leader["epoch"] if leader else None
    out = [f"{'sequencer':>9} {'pid':>7} {'role':>9} {'term':>5} {'epoch':>8} {'lag':>5}  address"]
    for m, s in enumerate(snap.sequencers):
        addr = cfg.client_addr_of(m)
        if s is None:
            out.append(f"{m:>9} {'-':>7} {'DOWN':>9} {'-':>5} {'-':>8} {'-':>5}  {addr}")
            continue
        local = s.get("local_last_epoch", s.get("epoch", 0))
        lag = "-" if committed is None else str(max(0, committed - local))
        out.append(
            f"{m:>9} {s.get('pid', '-'):>7} {s.get('role', '?'):>9} {s.get('term', 0):>5} "
            f"{local:>8} {lag:>5}  {addr}"
        )
    return [*out, ""]


def _reader_lines(snap: Snapshot, prev: Snapshot | None, epoch: int, dt: float) -> list[str]:
    if not snap.readers:
        return []
    out = [
        "",
        f"{'reader':>7} {'pid':>7} {'epoch':>8} {'lag':>5} {'txns/s':>8} {'queries/s':>9}  state",
    ]
    old = prev.readers if prev is not None else []
    for i, r in enumerate(snap.readers):
        if r is None:
            out.append(f"{i:>7} {'-':>7} {'-':>8} {'-':>5} {'-':>8} {'-':>9}  DOWN")
            continue
        was = old[i] if i < len(old) else None
        txns = _rate(r["txns_applied"], was["txns_applied"] if was else None, dt)
        queries = _rate(r["queries_served"], was["queries_served"] if was else None, dt)
        out.append(
            f"{i:>7} {r['pid']:>7} {r['applied_epoch']:>8} "
            f"{max(0, epoch - r['applied_epoch']):>5} {txns:>8} {queries:>9}  "
            f"{'live' if r['live'] else 'catching up'}"
        )
    return out


def watch(
    cfg: ClusterConfig,
    interval_s: float = 1.0,
    count: int | None = None,
    tty: bool = True,
    write: Callable[[str], Any] = print,
    take: Callable[[ClusterConfig], Snapshot] = snapshot,
) -> None:
    """Draw a screen every ``interval_s`` until Ctrl-C (or ``count`` screens)."""
    prev: Snapshot | None = None
    shown = 0
    try:
        while count is None or shown < count:
            snap = take(cfg)
            screen = render(cfg, snap, prev)
            write(CLEAR + screen if tty else ("\n" if shown else "") + screen)
            prev, shown = snap, shown + 1
            if count is not None and shown >= count:
                break
            time.sleep(max(0.0, interval_s - (time.monotonic() - snap.at)))
    except KeyboardInterrupt:
        pass
