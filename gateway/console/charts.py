"""Line charts as inline SVG, drawn on the server: one polyline and one circle per data point per series.

No script and no style attribute (the console's Content-Security-Policy allows neither inline): colours
come from the `series-N` classes in console.css.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 14, 28


def line_chart(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    unit: str = "",
    value_format: str = ".2f",
) -> str:
    """`labels` along x; `series` name -> one value per label (None: no point there)."""
    values = [v for points in series.values() for v in points if v is not None]
    top = max(values, default=0.0) or 1.0
    count = max(len(labels), 2)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + plot_w * i / (count - 1)

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for frac in (0, 0.5, 1):
        gy = y(top * frac)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>')
        parts.append(
            f'<text class="axis" x="{LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
            f"{format(top * frac, value_format)}{escape(unit)}</text>"
        )
    step = max(1, len(labels) // 6)
    for i in range(0, len(labels), step):
        parts.append(
            f'<text class="axis" x="{x(i):.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
            f"{escape(labels[i])}</text>"
        )
    for n, (name, points) in enumerate(series.items()):
        cls = f"series-{n % 6}"
        coords = [(x(i), y(v), v) for i, v in enumerate(points) if v is not None]
        if len(coords) > 1:
            path = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy, _ in coords)
            parts.append(f'<polyline class="line {cls}" points="{path}"/>')
        for (cx, cy, v), i in zip(coords, [i for i, v in enumerate(points) if v is not None], strict=True):
            parts.append(
                f'<circle class="point {cls}" cx="{cx:.1f}" cy="{cy:.1f}" r="3">'
                f"<title>{escape(name)} {escape(labels[i])}: {format(v, value_format)}{escape(unit)}</title>"
                "</circle>"
            )
    parts.append("</svg>")
    legend = "".join(
        f'<span class="legend series-{n % 6}">{escape(name)}</span>' for n, name in enumerate(series)
    )
    caption = f'<figcaption><b class="chart-title">{escape(title)}</b> {legend}</figcaption>'
    return f'<figure class="chart-box">{caption}{"".join(parts)}</figure>'
