"""The server's slow spells, from the sweep's levels (backends/calibrated.py, `Pace`).

Within a level every request has the same shape (prompt, output, the same number of others running), so
the model gives them all one time per output token; what the server gave them spreads around it. Each
request's time per output token over its level's mean is one sample of how fast the server ran while that
request decoded. The samples of every such level, pooled, are the profile's factors (quantiles, their mean
1), and the time a request took to decode is how long a spell lasts.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from backends.calibrated import Pace
from loadtest.calibrate.levels import Level
from loadtest.stats import percentile

QUANTILES = 10
"""Factors kept: the middles of ten equal shares of the samples."""
MIN_LEVEL_REQUESTS = 8
MIN_SAMPLES = 40
"""Fewer samples than this (a sweep cut short by its budget) measure no spread: no `Pace`."""


def pace_of(levels: Sequence[Level]) -> Pace | None:
    ratios: list[float] = []
    decode_times: list[float] = []
    for level in levels:
        if level.kind not in ("prefill", "load") or level.outputs or level.bursty:
            continue  # staggered outputs differ by design; a bursty client timed its own starvation
        timed = [t for t in level.timed if t.tpot_s is not None and t.tpot_s > 0]
        if len(timed) < MIN_LEVEL_REQUESTS:
            continue
        mean = statistics.fmean(t.tpot_s for t in timed if t.tpot_s is not None)
        ratios.extend(t.tpot_s / mean for t in timed if t.tpot_s is not None)
        decode_times.extend(t.e2e_s - t.ttft_s for t in timed)
    if len(ratios) < MIN_SAMPLES:
        return None
    factors = [percentile(ratios, 100.0 * (i + 0.5) / QUANTILES) or 0.0 for i in range(QUANTILES)]
    scale = statistics.fmean(factors)
    spell_s = statistics.median(decode_times)
    if scale <= 0 or factors[0] <= 0 or spell_s <= 0:
        return None
    return Pace(spell_s=round(spell_s, 6), factors=[round(f / scale, 4) for f in factors])
