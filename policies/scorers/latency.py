"""Scorers that read the engine's predicted latency (policies/predict.py), computed once per request:
`fastest-predicted` (how fast a backend is) and `slo-predicted` (how well it meets the route's SLO)."""

from __future__ import annotations

from collections.abc import Sequence

from backends.models import Backend
from policies.framework import RouteContext


class FastestPredicted:
    """The fastest predicted end-to-end time (TTFT plus `max_tokens` times the time per token) scores 1,
    the others their fraction of it, whatever the SLO. Beside `slo-predicted`, which scores every backend
    that meets the SLO alike, it breaks the tie: an idle H100 wins by its speed, not by list order."""

    name = "fastest-predicted"
    scores_in_unit_range = True
    reads_predictions = True

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        ttfts, tpots = ctx.predicted_ttft, ctx.predicted_tpot
        if ttfts is None or tpots is None:
            return [1.0] * len(candidates)
        return self._predicted(ctx, ttfts, tpots)

    def _predicted(self, ctx: RouteContext, ttfts: Sequence[float], tpots: Sequence[float]) -> list[float]:
        tokens = ctx.profile.max_tokens or 256
        times = [ttft + tokens * tpot for ttft, tpot in zip(ttfts, tpots, strict=True)]
        fastest = min(times)
        return [fastest / t if t > 0 else 1.0 for t in times]


class SloPredicted(FastestPredicted):
    """With an SLO: the product of min(1, target / predicted) for TTFT and time per token, so every
    backend predicted to meet it scores 1. Without one: as `fastest-predicted`."""

    name = "slo-predicted"

    def _predicted(self, ctx: RouteContext, ttfts: Sequence[float], tpots: Sequence[float]) -> list[float]:
        slo = ctx.route.slo
        if slo is None or (slo.ttft_ms is None and slo.tpot_ms is None):
            return super()._predicted(ctx, ttfts, tpots)
        ttft_target = slo.ttft_ms / 1000 if slo.ttft_ms is not None else None
        tpot_target = slo.tpot_ms / 1000 if slo.tpot_ms is not None else None
        scores = []
        for ttft, tpot in zip(ttfts, tpots, strict=True):
            value = 1.0
            if ttft_target is not None and ttft > ttft_target:
                value *= ttft_target / ttft
            if tpot_target is not None and tpot > tpot_target:
                value *= tpot_target / tpot
            scores.append(value)
        return scores
