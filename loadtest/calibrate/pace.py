"""The server's slow spells, from the sweep's levels (backends/calibrated.py, `Pace`).

Within a level every request has the same shape (prompt, output, the same number of others running), so
the model gives them all one time per output token; what the server gave them spreads around it. Each
request's time per output token over its level's mean is one sample of how fast the server ran while that
request decoded, and the time a request took to decode is how long a spell lasts.

The simulator draws a factor per stretch of its clock, not per step, and a slow stretch holds fewer steps
than a fast one: drawn from the samples as they are, its steps would run faster on average than the
server's. So the factors are the samples' quantiles with each sample counted by its own ratio (the time
it stands for), scaled so their harmonic mean is 1: then the steps, counted one by one, run at the
samples' spread with the fitted mean.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Callable, Sequence

import msgspec

from backends.calibrated import Pace, StepFit
from loadtest.calibrate.levels import Level

QUANTILES = 10
"""Factors kept: the middles of ten equal shares of the samples."""
MIN_LEVEL_REQUESTS = 8
MIN_SAMPLES = 40
"""Fewer samples than this (a sweep cut short by its budget) measure no spread: no `Pace`."""


def with_spells(step: StepFit, levels: Sequence[Level], say: Callable[[str], None]) -> StepFit:
    """`step` with the spells `levels` measured, if they measured any. The step model was fitted to the
    means, which the spells keep."""
    pace = pace_of(levels)
    if pace is None:
        return step
    low, high = pace.factors[0], pace.factors[-1]
    say(f"slow spells: {pace.spell_s * 1000:.0f} ms, step-time factors {low:.2f}-{high:.2f}")
    return msgspec.structs.replace(step, pace=pace)


def pace_of(levels: Sequence[Level]) -> Pace | None:
    ratios: list[float] = []
    decode_times: list[float] = []
    for level in levels:
        if level.kind not in ("prefill", "load") or level.outputs or level.bursty:
            continue  # staggered outputs differ by design; a bursty client timed its own starvation
        samples = [(t.tpot_s, t.e2e_s - t.ttft_s) for t in level.timed if t.tpot_s]
        if len(samples) < MIN_LEVEL_REQUESTS:
            continue
        mean = statistics.fmean(tpot for tpot, _ in samples)
        ratios.extend(tpot / mean for tpot, _ in samples)
        decode_times.extend(decode for _, decode in samples)
    if len(ratios) < MIN_SAMPLES:
        return None
    factors = _time_weighted_quantiles(ratios, QUANTILES)
    spell_s = statistics.median(decode_times)
    if factors[0] <= 0 or spell_s <= 0:
        return None
    scale = statistics.harmonic_mean(factors)
    return Pace(spell_s=round(spell_s, 6), factors=[round(f / scale, 4) for f in factors])


def _time_weighted_quantiles(ratios: list[float], count: int) -> list[float]:
    """The ratios at the middles of `count` equal shares of their total (each ratio weighs itself),
    linear between neighbours."""
    ordered = sorted(ratios)
    total = sum(ordered)
    middles: list[float] = []  # each sample's weight centre on the cumulative scale, 0..1
    below = 0.0
    for r in ordered:
        middles.append((below + r / 2) / total)
        below += r
    factors = []
    for i in range(count):
        q = (i + 0.5) / count
        j = bisect.bisect_left(middles, q)
        if j == 0:
            factors.append(ordered[0])
        elif j == len(ordered):
            factors.append(ordered[-1])
        else:
            share = (q - middles[j - 1]) / (middles[j] - middles[j - 1])
            factors.append(ordered[j - 1] + (ordered[j] - ordered[j - 1]) * share)
    return factors
