"""Percentiles and summaries of latency samples."""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES: tuple[int, ...] = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default);
    None for no values."""
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """{"p50", "p90", "p99", "mean"} of the values (None when there are none)."""
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    return out
