"""Tiny inline-SVG charts for the HTML report: grouped bars, empirical CDFs, stacked bars over time.

No scripts, no external resources: each function returns one `<svg>` element as a string.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

PALETTE: tuple[str, ...] = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")
VENDOR_COLOURS: dict[str, str] = {"nvidia": "#76b900", "amd": "#ed1c24"}
_W, _H = 560, 260
_L, _R, _T, _B = 56, 12, 28, 44


def _frame(title: str, body: list[str], legend: Sequence[tuple[str, str]] = ()) -> str:
    items = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="#fff"/>',
        f'<text x="{_L}" y="18" font-size="13" font-weight="600">{escape(title)}</text>',
        *body,
    ]
    x = _W - _R
    for label, colour in reversed(legend):
        width = 14 + 7 * len(label)
        x -= width
        items.append(f'<rect x="{x}" y="8" width="10" height="10" fill="{colour}"/>')
        items.append(f'<text x="{x + 13}" y="17" font-size="11">{escape(label)}</text>')
    items.append("</svg>")
    return "".join(items)


def _axes(y_max: float, y_label: str, y_fmt: str = "{:g}") -> list[str]:
    out = [
        f'<line x1="{_L}" y1="{_H - _B}" x2="{_W - _R}" y2="{_H - _B}" stroke="#333"/>',
        f'<line x1="{_L}" y1="{_T}" x2="{_L}" y2="{_H - _B}" stroke="#333"/>',
        f'<text x="12" y="{(_T + _H - _B) / 2}" font-size="11" transform="rotate(-90 12 '
        f'{(_T + _H - _B) / 2})" text-anchor="middle">{escape(y_label)}</text>',
    ]
    for i in range(5):
        value = y_max * i / 4
        y = _H - _B - (_H - _B - _T) * i / 4
        out.append(f'<line x1="{_L - 4}" y1="{y:.1f}" x2="{_W - _R}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        out.append(
            f'<text x="{_L - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{y_fmt.format(value)}</text>"
        )
    return out


def _nice(value: float) -> float:
    if value <= 0:
        return 1.0
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exponent:
            return step * exponent
    return 10 * exponent


def grouped_bars(
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float | None]],
    y_label: str,
    y_max: float | None = None,
    y_fmt: str = "{:g}",
) -> str:
    """One group of bars per entry of `groups`, one bar per series (parallel lists)."""
    values = [v for vs in series.values() for v in vs if v is not None]
    top = y_max if y_max is not None else _nice(max(values, default=1.0) * 1.05)
    body = _axes(top, y_label, y_fmt)
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    group_w = plot_w / max(1, len(groups))
    bar_w = group_w * 0.8 / max(1, len(series))
    legend = []
    for s, (name, vs) in enumerate(series.items()):
        colour = PALETTE[s % len(PALETTE)]
        legend.append((name, colour))
        for g, value in enumerate(vs):
            if value is None:
                continue
            h = plot_h * min(1.0, value / top)
            x = _L + g * group_w + group_w * 0.1 + s * bar_w
            body.append(
                f'<rect x="{x:.1f}" y="{_H - _B - h:.1f}" width="{bar_w - 1:.1f}" height="{h:.1f}" '
                f'fill="{colour}"><title>{escape(name)} {escape(groups[g])}: {value:.4g}</title></rect>'
            )
    for g, label in enumerate(groups):
        x = _L + g * group_w + group_w / 2
        body.append(
            f'<text x="{x:.1f}" y="{_H - _B + 16}" font-size="11" text-anchor="middle">{escape(label)}</text>'
        )
    return _frame(title, body, legend)


def cdf_chart(title: str, samples: dict[str, Sequence[float]], x_label: str, slo: float | None = None) -> str:
    """Empirical CDF per series on a log x axis; a dashed line marks the SLO."""
    values = [v for vs in samples.values() for v in vs if v > 0]
    body: list[str] = []
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    if not values:
        return _frame(title, [f'<text x="{_L + 10}" y="{_T + 30}" font-size="12">no samples</text>'])
    lo = 10 ** math.floor(math.log10(min(values + ([slo] if slo else []))))
    hi = 10 ** math.ceil(math.log10(max(values + ([slo] if slo else []))))
    span = math.log10(hi) - math.log10(lo) or 1.0

    def x_of(v: float) -> float:
        return _L + plot_w * (math.log10(max(v, lo)) - math.log10(lo)) / span

    body += _axes(1.0, "fraction of requests", "{:.2f}")
    decade = lo
    while decade <= hi:
        x = x_of(decade)
        body.append(f'<line x1="{x:.1f}" y1="{_T}" x2="{x:.1f}" y2="{_H - _B}" stroke="#f1f5f9"/>')
        body.append(
            f'<text x="{x:.1f}" y="{_H - _B + 14}" font-size="10" text-anchor="middle">{decade:g}</text>'
        )
        decade *= 10
    body.append(
        f'<text x="{_L + plot_w / 2}" y="{_H - 8}" font-size="11" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    legend = []
    for s, (name, vs) in enumerate(samples.items()):
        colour = PALETTE[s % len(PALETTE)]
        legend.append((name, colour))
        ordered = sorted(v for v in vs if v > 0)
        if not ordered:
            continue
        step = max(1, len(ordered) // 200)
        points = [
            f"{x_of(v):.1f},{_H - _B - plot_h * (i + 1) / len(ordered):.1f}"
            for i, v in enumerate(ordered)
            if i % step == 0 or i == len(ordered) - 1
        ]
        body.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{" ".join(points)}"/>'
        )
    if slo:
        x = x_of(slo)
        body.append(
            f'<line x1="{x:.1f}" y1="{_T}" x2="{x:.1f}" y2="{_H - _B}" stroke="#111" stroke-dasharray="4 3"/>'
        )
        body.append(f'<text x="{x + 3:.1f}" y="{_T + 10}" font-size="10">SLO {slo:g}</text>')
    return _frame(title, body, legend)


def stacked_over_time(title: str, bins: Sequence[dict[str, int]], bin_s: float, keys: Sequence[str]) -> str:
    """Per time slice, one bar stacked by key (vendor)."""
    totals = [sum(b.values()) for b in bins]
    top = _nice(max(totals, default=1) * 1.05)
    body = _axes(top, "requests sent")
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    width = plot_w / max(1, len(bins))
    colours = {k: VENDOR_COLOURS.get(k, PALETTE[i % len(PALETTE)]) for i, k in enumerate(keys)}
    for i, b in enumerate(bins):
        y: float = _H - _B
        for key in keys:
            h = plot_h * b.get(key, 0) / top
            y -= h
            body.append(
                f'<rect x="{_L + i * width + 1:.1f}" y="{y:.1f}" width="{width - 2:.1f}" height="{h:.1f}" '
                f'fill="{colours[key]}"><title>{escape(key)}: {b.get(key, 0)}</title></rect>'
            )
    for i in range(0, len(bins) + 1, max(1, len(bins) // 6)):
        x = _L + i * width
        body.append(
            f'<text x="{x:.1f}" y="{_H - _B + 14}" font-size="10" text-anchor="middle">{i * bin_s:.0f}</text>'
        )
    body.append(
        f'<text x="{_L + plot_w / 2}" y="{_H - 8}" font-size="11" text-anchor="middle">'
        "simulated seconds</text>"
    )
    return _frame(title, body, [(k, colours[k]) for k in keys])


def frontier_chart(
    title: str,
    points: Sequence[tuple[float, float, str, bool]],
    frontier: Sequence[tuple[float, float]],
    target: float,
) -> str:
    """Cost (x, $/hour) against the worst class's SLO attainment (y): every mix tried as a dot (filled if
    it met the target), the frontier as a line, the target dashed."""
    if not points:
        return _frame(title, [f'<text x="{_L + 10}" y="{_T + 30}" font-size="12">no mixes</text>'])
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    x_max = _nice(max(p[0] for p in points) * 1.05)

    def xy(cost: float, met: float) -> tuple[float, float]:
        return _L + plot_w * cost / x_max, _H - _B - plot_h * max(0.0, min(1.0, met))

    body = _axes(1.0, "worst class SLO attainment", "{:.2f}")
    for i in range(5):
        x = _L + plot_w * i / 4
        body.append(
            f'<text x="{x:.1f}" y="{_H - _B + 14}" font-size="10" text-anchor="middle">'
            f"{x_max * i / 4:g}</text>"
        )
    body.append(
        f'<text x="{_L + plot_w / 2}" y="{_H - 8}" font-size="11" text-anchor="middle">'
        "fleet $ per hour</text>"
    )
    _, y = xy(0, target)
    body.append(
        f'<line x1="{_L}" y1="{y:.1f}" x2="{_W - _R}" y2="{y:.1f}" stroke="#111" stroke-dasharray="4 3"/>'
        f'<text x="{_L + 4}" y="{y - 3:.1f}" font-size="10">target {target:.0%}</text>'
    )
    line = " ".join("{:.1f},{:.1f}".format(*xy(c, m)) for c, m in frontier)
    body.append(f'<polyline fill="none" stroke="{PALETTE[0]}" stroke-width="1.8" points="{line}"/>')
    for cost, met, label, passed in points:
        x, y = xy(cost, met)
        fill = PALETTE[2] if passed else "#fff"
        body.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{fill}" stroke="{PALETTE[2]}">'
            f"<title>{escape(label)}: ${cost:.2f}/h, {met:.1%}</title></circle>"
        )
    return _frame(title, body, [("frontier", PALETTE[0]), ("meets target", PALETTE[2])])


def rate_curves(
    title: str, series: Mapping[str, Sequence[tuple[float, float]]], target: float | None = None
) -> str:
    """SLO attainment (0..1) against arrival rate, one line per series; the target as a dashed line."""
    xs = [x for points in series.values() for x, _ in points]
    x_max = _nice(max(xs, default=1.0))
    body = _axes(100.0, "SLO attainment %", "{:.0f}")
    plot_w, plot_h = _W - _L - _R, _H - _B - _T

    def at(x: float, y: float) -> tuple[float, float]:
        return _L + plot_w * x / x_max, _H - _B - plot_h * max(0.0, min(1.0, y))

    for i in range(5):
        value = x_max * i / 4
        x, _ = at(value, 0)
        body.append(
            f'<text x="{x:.1f}" y="{_H - _B + 14}" font-size="10" text-anchor="middle">{value:g}</text>'
        )
    body.append(
        f'<text x="{_L + plot_w / 2}" y="{_H - 8}" font-size="11" text-anchor="middle">'
        "requests per second</text>"
    )
    if target is not None:
        _, y = at(0, target)
        body.append(
            f'<line x1="{_L}" y1="{y:.1f}" x2="{_W - _R}" y2="{y:.1f}" stroke="#111" stroke-dasharray="4 3"/>'
        )
    legend = []
    for i, (name, points) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        legend.append((name, colour))
        coords = [at(x, y) for x, y in sorted(points)]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in coords]
    return _frame(title, body, legend)
