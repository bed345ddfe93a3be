"""Line charts as inline SVG, drawn on the server: one polyline and one circle per data point per series.

No script and no style attribute (the console's Content-Security-Policy allows neither inline): colours
come from the `series-N` classes in console.css. The chart is as wide as its panel (the SVG scales to
100% of it); `partial_last` draws the last point, a bucket still filling, hollow and joined by a dashed
segment, so a dip there reads as "not finished yet" rather than as a fall.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 1200, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 30
LABELS = 8
"""About how many time labels along x."""


def time_labels(starts: Sequence[int], step: int) -> list[str]:
    """A label per bucket start, `Nov 26 14:00` (HH:00 for hours); the last, still-filling bucket says
    `now`. Along the axis the date is shown only on the first label and where the day changes."""
    labels = []
    for start in starts:
        moment = time.localtime(start)
        labels.append(time.strftime("%b %d %H:00" if step >= 3600 else "%b %d %H:%M", moment))
    if labels:
        labels[-1] += " (now)"
    return labels


_DATED = re.compile(r"^([A-Z][a-z]{2} \d\d) (.+)$")


def _axis_texts(labels: Sequence[str], shown: Sequence[int]) -> dict[int, str]:
    """The shown labels, each dated label's date left out when the label before it has the same day."""
    texts, day = {}, None
    for i in shown:
        match = _DATED.match(labels[i])
        if match is None:
            texts[i] = labels[i]
            continue
        texts[i] = labels[i] if match.group(1) != day else match.group(2)
        day = match.group(1)
    return texts


def line_chart(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    unit: str = "",
    value_format: str = ".2f",
    partial_last: bool = False,
) -> str:
    """`labels` along x; `series` name -> one value per label (None: no point there)."""
    values = [v for points in series.values() for v in points if v is not None]
    top = max(values, default=0.0) or 1.0
    count = max(len(labels), 2)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    last = len(labels) - 1

    def x(i: int) -> float:
        return LEFT + plot_w * i / (count - 1)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="xMinYMin meet" '
        f'role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for frac in (0, 0.5, 1):
        gy = y(top * frac)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>')
        parts.append(
            f'<text class="axis" x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{format(top * frac, value_format)}{escape(unit)}</text>"
        )
    step = max(1, -(-len(labels) // LABELS))
    shown = sorted(set(range(last, -1, -step)))  # counted back from the last: `now` is always labelled
    for i, text in _axis_texts(labels, shown).items():
        anchor = "end" if i == last and last > 0 else "start" if i == 0 else "middle"
        parts.append(
            f'<text class="axis x-label" x="{x(i):.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">'
            f"{escape(text)}</text>"
        )
    for n, (name, points) in enumerate(series.items()):
        cls = f"series-{n % 6}"
        coords = [(i, x(i), y(v), v) for i, v in enumerate(points) if v is not None]
        whole = [c for c in coords if not (partial_last and c[0] == last)]
        if len(whole) > 1:
            path = " ".join(f"{cx:.1f},{cy:.1f}" for _, cx, cy, _ in whole)
            parts.append(f'<polyline class="line {cls}" points="{path}"/>')
        if partial_last and whole and coords and coords[-1][0] == last and len(coords) > len(whole):
            _, px, py, _ = whole[-1]
            _, lx, ly, _ = coords[-1]
            parts.append(
                f'<line class="line partial {cls}" x1="{px:.1f}" y1="{py:.1f}" x2="{lx:.1f}" y2="{ly:.1f}"/>'
            )
        for i, cx, cy, v in coords:
            partial = partial_last and i == last
            note = " (so far: this bucket is still filling)" if partial else ""
            parts.append(
                f'<circle class="point {cls}{" partial" if partial else ""}" cx="{cx:.1f}" cy="{cy:.1f}" '
                f'r="3"><title>{escape(name)} {escape(labels[i])}: {format(v, value_format)}'
                f"{escape(unit)}{note}</title></circle>"
            )
    parts.append("</svg>")
    legend = "".join(
        f'<span class="legend series-{n % 6}">{escape(name)}</span>' for n, name in enumerate(series)
    )
    caption = f'<figcaption><b class="chart-title">{escape(title)}</b> {legend}</figcaption>'
    return f'<figure class="chart-box">{caption}{"".join(parts)}</figure>'
