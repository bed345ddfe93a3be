"""The report as one self-contained HTML page: tables and inline SVG plots, no scripts, no downloads."""

from __future__ import annotations

from html import escape
from typing import Any

from loadtest.svg import cdf_chart, grouped_bars, stacked_over_time

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#111;max-width:1180px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f4f6}
td.l,th.l{text-align:left}.grid{display:flex;flex-wrap:wrap;gap:12px}.note{color:#555;font-size:13px}
"""


def _num(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _summary_table(report: dict[str, Any]) -> str:
    rows = [
        "<tr><th class=l>policy</th><th>requests</th><th>errors</th><th>SLO attainment</th>"
        "<th>goodput req/s</th>"
        "<th>output tok/s</th><th>run s (real)</th><th>paid GPU s</th><th>$/Mtok</th>"
        "<th>$/M tokens that met the SLO</th>"
        "<th>ledger $/Mtok (real clock)</th><th class=l>split by vendor</th></tr>"
    ]
    for policy, data in report["policies"].items():
        m, cost = data["overall"], data["cost"]
        split = ", ".join(f"{escape(k)} {v}" for k, v in data["split"]["vendor"].items())
        rows.append(
            f"<tr><td class=l><b>{escape(policy)}</b></td><td>{m['requests']}</td><td>{m['errors']}</td>"
            f"<td>{_pct(m['slo_attainment'])}</td><td>{m['goodput_rps']:.2f}</td>"
            f"<td>{m['output_tokens_per_s']:.0f}</td><td>{cost['wall_s']:.2f}</td>"
            f"<td>{cost['paid_gpu_s']:.2f}</td><td>{_num(cost['usd_per_mtok'], '.4f')}</td>"
            f"<td>{_num(cost['usd_per_good_mtok'], '.4f')}</td>"
            f"<td>{_num(cost['ledger_usd_per_mtok'], '.5f')}</td><td class=l>{split}</td></tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def _class_table(report: dict[str, Any]) -> str:
    rows = [
        "<tr><th class=l>policy</th><th class=l>class</th><th>requests</th><th>errors</th><th>SLO met</th>"
        "<th>goodput/s</th><th>TTFT p50</th><th>p90</th><th>p99</th><th>TPOT p50</th><th>p90</th><th>p99</th>"
        "<th>E2E p50</th><th>p90</th><th>p99</th><th>tok/s</th></tr>"
    ]
    for policy, data in report["policies"].items():
        for cls, m in data["classes"].items():
            cells = [m["ttft_ms"], m["tpot_ms"], m["e2e_ms"]]
            lat = "".join(f"<td>{_num(c[p], '.0f')}</td>" for c in cells for p in ("p50", "p90", "p99"))
            rows.append(
                f"<tr><td class=l>{escape(policy)}</td><td class=l>{escape(cls)}</td><td>{m['requests']}</td>"
                f"<td>{m['errors']}</td><td>{_pct(m['slo_attainment'])}</td><td>{m['goodput_rps']:.2f}</td>"
                f"{lat}<td>{m['output_tokens_per_s']:.0f}</td></tr>"
            )
    return "<table>" + "".join(rows) + "</table>"


def _where_table(report: dict[str, Any]) -> str:
    backends = sorted({b for d in report["policies"].values() for b in d["split"]["backend"]})
    head = "".join(f"<th>{escape(b)}</th>" for b in backends)
    rows = [f"<tr><th class=l>policy</th>{head}</tr>"]
    for policy, data in report["policies"].items():
        cells = "".join(f"<td>{data['split']['backend'].get(b, 0)}</td>" for b in backends)
        rows.append(f"<tr><td class=l>{escape(policy)}</td>{cells}</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _signed(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:+{spec}}{unit}"


def _whatif_section(report: dict[str, Any]) -> str:
    """`switchyard whatif`: the candidate minus the baseline per class, and what the replay left out."""
    w = report["whatif"]
    rows = "".join(
        f"<tr><td class=l>{escape(cls)}</td><td>{_signed(d['slo_attainment_points'], '.1f', ' pt')}</td>"
        f"<td>{_signed(d['ttft_p50_ms'], '.0f')}</td><td>{_signed(d['goodput_rps'], '.3f')}</td>"
        f"<td>{_signed(d.get('usd_per_mtok'), '.3f')}</td></tr>"
        for cls, d in w["difference"].items()
    )
    limits = "".join(f"<li>{escape(note)}</li>" for note in w["limits"]) or "<li>everything was modelled</li>"
    return (
        f"<h2>Difference: {escape(w['candidate'])} minus {escape(w['baseline'])}</h2>"
        "<table><tr><th class=l>class</th><th>SLO met</th><th>TTFT p50 ms</th><th>goodput/s</th>"
        f"<th>$/Mtok</th></tr>{rows}</table>"
        "<p class=note>A replay of the recorded arrivals on a simulated fleet (virtual clock). Positive SLO "
        "points and goodput favour the candidate; positive TTFT and cost favour the baseline.</p>"
        f"<h3>What the replay could not model</h3><ul>{limits}</ul>"
    )


def render_html(report: dict[str, Any]) -> str:
    scenario = report["scenario"]
    policies = list(report["policies"])
    classes = list(scenario["classes"])
    arrivals = ", ".join(f"{k} {v}" for k, v in scenario["arrivals"].items())
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Switchyard load test: {escape(scenario['name'])}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Switchyard load test: {escape(scenario['name'])}</h1>",
        f"<p class=note>{escape(scenario.get('description') or '')}</p>",
        f"<p class=note>{scenario['requests']} requests over {scenario['duration_s']:g} simulated s "
        f"({escape(arrivals)}), seed {scenario['seed']}, "
        f"time scale {scenario['time_scale']:g} "
        f"(times are simulated; the fleet ran that many times faster than real time). Generated "
        f"{escape(report['generated_at'])}.</p>",
        "<h2>Summary</h2>",
        _summary_table(report),
        _whatif_section(report) if "whatif" in report else "",
        "<p class=note>SLO attainment: answered without error within the class's TTFT, TPOT and end-to-end "
        "bounds. Goodput: requests per simulated second that met their SLO. Paid GPU s: every GPU of the "
        "fleet for the run's real duration. $/Mtok: that paid time's price over tokens served (prompt + "
        "output), scaled by the time scale to the simulated GPUs' speed. The ledger's figure pays from the "
        "gateway's start to its last claim, so it differs on short runs.</p>",
        "<div class=grid>",
        grouped_bars(
            "SLO attainment by class",
            [*classes, "all"],
            {
                p: [
                    *(report["policies"][p]["classes"][c]["slo_attainment"] for c in classes),
                    report["policies"][p]["overall"]["slo_attainment"],
                ]
                for p in policies
            },
            "fraction met",
            y_max=1.0,
            y_fmt="{:.2f}",
        ),
        # Two charts, each on its own axis: goodput (a few req/s) and cost (dollars) share no scale.
        grouped_bars(
            "Goodput per policy",
            ["all classes"],
            {p: [report["policies"][p]["overall"]["goodput_rps"]] for p in policies},
            "requests/s that met the SLO",
        ),
        grouped_bars(
            "Cost per policy",
            ["all tokens", "tokens that met the SLO"],
            {
                p: [
                    report["policies"][p]["cost"]["usd_per_mtok"],
                    report["policies"][p]["cost"]["usd_per_good_mtok"],
                ]
                for p in policies
            },
            "$ per million tokens",
        ),
        "</div>",
        "<h2>Latency distributions</h2><div class=grid>",
    ]
    for cls in classes:
        slo = scenario["classes"][cls]["slo"]
        for metric, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
            samples = {p: report["policies"][p]["samples"][cls][metric] for p in policies}
            parts.append(
                cdf_chart(
                    f"{cls}: {label} (CDF)", samples, f"{label} ms (log scale)", slo.get(f"{metric}_ms")
                )
            )
    parts.append("</div><h2>Traffic split by vendor over time</h2><div class=grid>")
    for p in policies:
        over = report["policies"][p]["split_over_time"]
        parts.append(
            stacked_over_time(f"{p}: requests by vendor", over["bins"], over["bin_s"], over["vendors"])
        )
    parts += [
        "</div><h2>Per class</h2>",
        _class_table(report),
        "<p class=note>Milliseconds, simulated.</p><h2>Where requests went (by backend)</h2>",
        _where_table(report),
        "<h2>Fleet</h2><table><tr><th class=l>pool</th><th class=l>vendor</th><th>backends</th>"
        "<th>GPUs each</th><th>$/GPU-h</th><th class=l>GPU</th><th class=l>model</th></tr>",
        *(
            f"<tr><td class=l>{escape(g['pool'])}</td><td class=l>{escape(g['vendor'])}</td>"
            f"<td>{g['count']}</td>"
            f"<td>{g['gpus_per_backend']}</td><td>{g['price_per_gpu_hour']:.2f}</td>"
            f"<td class=l>{escape(str(g['gpu']))}</td><td class=l>{escape(str(g['model']))}</td></tr>"
            for g in scenario["fleet"]
        ),
        "</table>",
    ]
    if report.get("command"):
        parts.append(f"<p class=note>Reproduce: <code>{escape(report['command'])}</code></p>")
    parts.append("</body></html>")
    return "\n".join(parts)
