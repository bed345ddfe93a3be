"""The capacity report as one self-contained HTML page: a table per round and the attainment curves."""

from __future__ import annotations

from html import escape
from typing import Any

from loadtest.svg import rate_curves


def capacity_text(found: dict[str, Any]) -> str:
    """A capacity the search never saw fail is only a lower bound: `>=320.00`."""
    unbounded = not found["bracketed"] and found["capacity_rps"] > 0
    return f"{'>=' if unbounded else ''}{found['capacity_rps']:.2f}"


def render_capacity(report: dict[str, Any]) -> str:
    target = report["settings"]["target"]
    parts = [
        "<!doctype html><meta charset='utf-8'><title>capacity</title>",
        "<style>body{font:14px sans-serif;margin:24px}td,th{padding:3px 8px;text-align:right}</style>",
        f"<h1>Capacity at SLO: {escape(report['scenario'])}</h1>",
        f"<p>fleet {escape(', '.join(report['fleet']))}; a rate passes when every class meets its SLO on "
        f"{target:.0%} of its requests; {report['duration_s']:g} simulated s per point.</p>",
    ]
    for i, rnd in enumerate(report["rounds"]):
        parts.append(f"<h2>Round {i + 1} (order: {escape(', '.join(rnd['order']))})</h2>")
        parts.append("<table><tr><th>policy</th><th>capacity/s</th><th>$/Mtok there</th></tr>")
        for policy, found in rnd["policies"].items():
            cost = found["usd_per_mtok_at_capacity"]
            parts.append(
                f"<tr><td>{escape(policy)}</td><td>{escape(capacity_text(found))}</td>"
                f"<td>{'-' if cost is None else f'{cost:.4f}'}</td></tr>"
            )
        parts.append("</table>")
        worst = {p: [(pt["rate"], pt["worst"]) for pt in f["points"]] for p, f in rnd["policies"].items()}
        parts.append(rate_curves("Worst class's SLO attainment vs rate", worst, target))
        for policy, found in rnd["policies"].items():
            classes = sorted({c for pt in found["points"] for c in pt["attainment"]})
            series = {
                c: [(pt["rate"], pt["attainment"][c]) for pt in found["points"] if c in pt["attainment"]]
                for c in classes
            }
            parts.append(rate_curves(f"{policy}: SLO attainment by class", series, target))
    return "\n".join(parts)
