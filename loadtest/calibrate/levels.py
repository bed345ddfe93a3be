"""The calibration's levels: what one level measured, the sizes a sweep steps through, and the front-end
and admission terms derived from the levels once the step model is fitted (loadtest/calibrate/fit.py)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from loadtest.calibrate.fit import decode_features, predict
from loadtest.calibrate.measure import Timed


@dataclass(slots=True)
class Level:
    kind: Literal["prefill", "load", "prefix"]
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    timed: list[Timed] = field(default_factory=list)
    engine_ttft_s: float = 0.0
    engine_itl_s: float = 0.0
    wall_s: float = 0.0
    max_running: float = 0.0
    max_waiting: float = 0.0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return sum(t.output_tokens for t in self.timed) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def client_tpot_s(self) -> float:
        tpots = [t.tpot_s for t in self.timed if t.tpot_s is not None]
        return statistics.fmean(tpots) if tpots else 0.0

    @property
    def client_ttft_s(self) -> float:
        return statistics.median(t.ttft_s for t in self.timed) if self.timed else 0.0


def loaded_ttft(coefficients: Sequence[float], admit_busy_s: float, level: Level) -> float:
    """A newcomer's TTFT at a load level, as the simulator times it: half a decode step of the others on
    average before the engine takes it, the busy engine's admission wait, then its prefill step beside
    the others' decode."""
    b, p, o = level.concurrency, level.prompt_tokens, level.output_tokens
    others = b - 1
    decode = predict(coefficients, decode_features(others, p, o)) if others > 0 else 0.0
    prefill = predict(coefficients, (1.0, float(b), float(p), others * (p + o / 2)))
    return decode / 2 + (admit_busy_s if others > 0 else 0.0) + prefill


def front_end(levels: Sequence[Level]) -> tuple[float, float]:
    """The front end's time before the engine sees a request: what the client's TTFT adds to vLLM's
    (median client TTFT minus vLLM's mean, per level) as a line in the other sequences running, fitted
    robustly (Theil-Sen: the median of the slopes between levels), never below zero."""
    points = [
        (lv.concurrency - 1, lv.client_ttft_s - lv.engine_ttft_s)
        for lv in levels
        if lv.kind in ("prefill", "load") and lv.timed and lv.engine_ttft_s > 0
    ]
    if not points:
        return 0.0, 0.0
    slopes = [(y2 - y1) / (x2 - x1) for x1, y1 in points for x2, y2 in points if x2 > x1]
    slope = max(0.0, statistics.median(slopes)) if slopes else 0.0
    intercept = max(0.0, statistics.median(y - slope * x for x, y in points))
    return intercept, slope


def admission(coefficients: Sequence[float], levels: Sequence[Level]) -> float:
    """The busy engine's admission wait that makes the loaded levels' TTFT what vLLM measured (the
    median over the levels, never below zero)."""
    waits = [
        level.engine_ttft_s - loaded_ttft(coefficients, 0.0, level)
        for level in levels
        if level.kind == "load" and level.concurrency > 1 and level.engine_ttft_s > 0
    ]
    return max(0.0, statistics.median(waits)) if waits else 0.0


def extremes_first(sizes: list[int]) -> list[int]:
    """The shortest and the longest first, so a tight budget still measures the whole range."""
    return [*sizes[:1], *sizes[-1:], *sizes[1:-1]] if len(sizes) > 2 else sizes


def concurrencies(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`, and `limit` itself."""
    levels = [1]
    while levels[-1] * 2 <= limit:
        levels.append(levels[-1] * 2)
    if levels[-1] != limit:
        levels.append(limit)
    return levels


def ladder(longest: int) -> list[int]:
    """Prompt sizes from short to `longest`: 16, then doubling, then `longest` itself."""
    sizes: list[int] = []
    size = 16
    while size < longest:
        sizes.append(size)
        size *= 2
    sizes.append(longest)
    return sizes
