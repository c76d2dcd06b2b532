"""What scripts/leaderboard.py prints and saves: a table per experiment, the JSON file
(``--out``) and the plot (``--plot``): batches/s of the three ways beside S-Store's
published figures, and batches/s against chain length (PE triggers against client
chaining) when ``--chains`` ran.

Invariant: the JSON holds every figure printed, with the command and conditions that
produced it; nothing here measures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# S-Store (VLDB 2015), Leaderboard Maintenance, input batches/s on one core.
SSTORE = {
    "S-Store": 2200,
    "H-Store ordered": 210,
    "H-Store unordered": 5300,
    "Storm+VoltDB": 600,
    "Esper+VoltDB": 570,
}
# Which of S-Store's rows each way of running the benchmark here corresponds to.
COUNTERPART = {"dataflow": "S-Store", "chained": "H-Store ordered", "async": "H-Store unordered"}
WAY_LABEL = {
    "dataflow": "dataflow (PE triggers)",
    "chained": "client-chained, ordered",
    "async": "async calls, unordered",
}


def _check_text(row: dict[str, Any]) -> str:
    v = row.get("check")
    if v is None:
        return "-"
    if v["ok"]:
        return "ok"
    return "FAILED (expected: no order)" if v["expected_to_fail"] else "FAILED"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _run_line(label: str, row: dict[str, Any]) -> str:
    lat = row["latency_ms"]
    return (
        f"  {label:<34} {row['batches_per_s']:>10,.1f} {_ms(lat['p50']):>8} {_ms(lat['p99']):>8} "
        f"{row['batches']:>9,}  {_check_text(row)}"
    )


HEADER = f"  {'':<34} {'batches/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'batches':>9}  check"


def print_tables(result: dict[str, Any]) -> None:
    if result.get("ways"):
        print("\nLeaderboard Maintenance, three ways (input batches/s; latency per batch)")
        print(HEADER)
        for row in result["ways"]:
            print(_run_line(f"{row['flow']}: {WAY_LABEL[row['way']]}", row))
        print(
            "  S-Store's figures (one core): " + "; ".join(f"{k} {v:,}" for k, v in SSTORE.items())
        )
    for row in result.get("ways") or []:
        if row.get("latency"):
            print_latency(row["flow"], row["latency"], row)
    if result.get("ee"):
        print("\nEE triggers (dataflow way): lb = PE steps only, lbe = EE triggers, lbn = nested")
        print(HEADER)
        for row in result["ee"]:
            print(_run_line(row["flow"], row))
    if result.get("chains"):
        print("\nDataflow length: PE triggers (chain<n>) against client chaining (chainc<n>)")
        print(
            f"  {'n':>3} {'PE b/s':>9} {'p50':>7} {'p99':>7} {'client b/s':>11} {'p50':>7} "
            f"{'p99':>7} {'PE/client':>9}  check"
        )
        for r in result["chains"]:
            pe, cl = r["pe"], r["client"]
            ratio = pe["batches_per_s"] / cl["batches_per_s"] if cl["batches_per_s"] else 0.0
            pl, cll = pe["latency_ms"], cl["latency_ms"]
            print(
                f"  {r['length']:>3} {pe['batches_per_s']:>9,.1f} {_ms(pl['p50']):>7} "
                f"{_ms(pl['p99']):>7} {cl['batches_per_s']:>11,.1f} "
                f"{_ms(cll['p50']):>7} {_ms(cll['p99']):>7} "
                f"{ratio:>9.1f}  {_check_text(pe)}/{_check_text(cl)}"
            )
    rec = result.get("recovery")
    if rec:
        print(f"\nRecovery of {rec['rows'][0]['batches']:,} lb batches (no checkpoint)")
        print(
            f"  {'mode':<7} {'log bytes':>12} {'live after s':>13} {'partition s':>12} "
            f"{'in-process s':>13}  state hash"
        )
        for r in rec["rows"]:
            print(
                f"  {r['dataflow_recovery']:<7} {r['log_bytes']:>12,} {r['restart_to_live_s']:>13} "
                f"{r['partition_logged_live_s']!s:>12} {r['inprocess_replay_s']:>13}  "
                f"{r['state_hash_after']}"
            )
        print(
            f"  weak/strong: log {rec['log_bytes_weak_over_strong']}, recovery "
            f"{rec['recovery_weak_over_strong']}; same state hash: {rec['same_state_hash']}"
        )
    cost = result.get("tpcc_cost")
    if cost:
        a, w = cost["new_order_alone"], cost["new_order_with_dataflow"]
        df, alone = cost.get("dataflow") or {}, cost["dataflow_alone"]
        print(f"\nTPC-C New Order (W=2) beside lb at {cost['rate_per_s']:g} batches/s")
        for label, r in (("alone", a), ("with dataflow", w)):
            print(
                f"  New Order {label:<14} {r['new_order_per_s']:>9,.1f}/s  "
                f"CPU {r['cpu_cores']} cores"
            )
        print(
            f"  lb alone                 {alone['batches_per_s']!s:>9} batches/s  "
            f"CPU {alone['cpu_cores']} cores"
        )
        if df:
            lat = df.get("latency_ms") or {}
            print(
                f"  dataflow beside it       {df.get('batches_per_s', 0):>9,.1f} batches/s, "
                f"p50 {_ms(lat.get('p50'))} ms, p99 {_ms(lat.get('p99'))} ms"
            )
        print(f"  {cost['verdict']}")


def print_latency(flow: str, lat: dict[str, Any], saturated: dict[str, Any]) -> None:
    """The saturating rate found by open-loop probes and latency below it, beside the
    closed loop's figure."""
    rate = lat["saturating_rate_per_s"]
    print(
        f"\n{flow}: saturating rate (open loop, highest sustained of {len(lat['probes'])} "
        f"probes of {lat['probe_s']:g} s) {'-' if rate is None else f'{rate:,.0f}'} batches/s; "
        f"closed loop {saturated['batches_per_s']:,.1f}"
    )
    print(
        f"  {'offered':>14} {'got b/s':>9} {'ack p50':>8} {'ack p99':>8} {'sink p50':>9} "
        f"{'sink p99':>9}  late"
    )
    for row in lat["at"]:
        ack, sink = row.get("ack_latency_ms") or {}, row["latency_ms"]
        offered = f"{row['fraction']:.0%} {row['rate_per_s']:,.0f}"
        print(
            f"  {offered:>14} {row['batches_per_s']:>9,.1f} {_ms(ack.get('p50')):>8} "
            f"{_ms(ack.get('p99')):>8} {_ms(sink['p50']):>9} {_ms(sink['p99']):>9}  "
            f"{row.get('pushes_late', 0)}"
        )


def write_json(result: dict[str, Any], path: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=2))


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("ways", "chains") if result.get(k)]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "ways":
            _plot_ways(ax, result)
        else:
            _plot_chains(ax, result["chains"])
    fig.suptitle(
        f"Ordo, S-Store's Leaderboard Maintenance, {result['when']}\n{result['engine']}",
        fontsize=9,
    )
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)


def _plot_ways(ax: Any, result: dict[str, Any]) -> None:
    """Each way beside its counterpart in S-Store's table, then the rest of the table."""
    from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

    labels, values, colors = [], [], []
    shown = set()
    for row in result["ways"]:
        labels.append(f"Ordo: {WAY_LABEL[row['way']]}")
        values.append(row["batches_per_s"])
        colors.append("tab:blue")
        paper = COUNTERPART[row["way"]]
        labels.append(f"{paper} (paper)")
        values.append(SSTORE[paper])
        colors.append("tab:gray")
        shown.add(paper)
    for name, v in SSTORE.items():
        if name not in shown:
            labels.append(f"{name} (paper)")
            values.append(v)
            colors.append("tab:gray")
    y = list(range(len(labels)))[::-1]
    ax.barh(y, values, color=colors)
    for yi, v in zip(y, values, strict=True):
        ax.text(v, yi, f" {v:,.0f}", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(max(1.0, min(values) / 3), max(values) * 4)
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("input batches/s (log scale)")
    ax.set_title("Three ways beside S-Store's table (gray)")


def _plot_chains(ax: Any, chains: list[dict[str, Any]]) -> None:
    from matplotlib.ticker import NullFormatter, StrMethodFormatter

    n = [r["length"] for r in chains]
    ax.plot(n, [r["pe"]["batches_per_s"] for r in chains], "o-", label="PE triggers (chain<n>)")
    client = [r["client"]["batches_per_s"] for r in chains]
    ax.plot(n, client, "s--", label="client chaining (chainc<n>)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("dataflow length (steps)")
    ax.set_ylabel("input batches/s (log scale)")
    ax.set_xticks(n)
    ax.set_title("Batches/s against dataflow length")
    ax.legend(fontsize=8)
