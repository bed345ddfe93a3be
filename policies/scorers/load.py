"""Scorers for how busy a backend is: outstanding work and KV-cache headroom."""

from __future__ import annotations

from collections.abc import Sequence

from backends.models import Backend
from policies.framework import RouteContext


def fewest_first(work: Sequence[float]) -> list[float]:
    """The least work scores 1; k more scores (1 + least) / (1 + k + least)."""
    top = 1.0 + min(work)
    return [top / (1.0 + w) for w in work]


class LeastOutstanding:
    """Fewest requests ahead scores 1; a backend with k more scores (1 + least) / (1 + k + least). The
    requests ahead are this gateway's in flight, or the engine's own count if larger (it includes other
    gateway replicas' requests)."""

    name = "least-outstanding"
    scores_in_unit_range = True
    reads_predictions = False

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        work: list[float] = []
        for b in candidates:  # a loop, not max() per candidate: this scorer runs in most routes
            load = b.load
            queued = load.running + load.waiting
            work.append(b.inflight if b.inflight > queued else queued)
        return fewest_first(work)


class KvHeadroom:
    """Free KV cache in absolute terms: (1 - usage) x the accelerator memory behind the backend,
    relative to the roomiest candidate. An MI300X at 50% has more room than an H100 at 20%."""

    name = "kv-headroom"
    scores_in_unit_range = True
    reads_predictions = False

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        room = [(1.0 - min(1.0, b.load.kv_cache_usage)) * b.pool.memory_gb for b in candidates]
        most = max(room)
        if most <= 0:
            return [0.0] * len(room)
        return [r / most for r in room]


class ClassOutstanding:
    """Like `least-outstanding`, counting only this gateway's requests of the request's own class in flight.

    Spreads a class's work evenly whatever else a backend runs: requests of one class cost alike (a
    long-context request's prefill slows every sequence decoding beside it), while a count of all requests
    treats an n=4 batch job as one and a scrape's running sequences count it four times, so a class
    balanced by the total piles onto one backend.
    """

    name = "class-outstanding"
    scores_in_unit_range = True
    reads_predictions = False

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        cls = ctx.request_class
        return fewest_first([b.inflight_by_class.get(cls, 0) for b in candidates])


class ClassTokens:
    """Fewest prompt tokens of the request's own class in flight scores 1 (in thousands, as
    `least-outstanding` counts requests). Long prompts differ threefold in what they cost a backend (the
    prefill, then the KV cache read at every decode step), so a count of requests leaves one backend with
    the longer ones.
    """

    name = "class-tokens"
    scores_in_unit_range = True
    reads_predictions = False

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        cls = ctx.request_class
        return fewest_first([b.prompt_tokens_by_class.get(cls, 0) / 1000 for b in candidates])


class PromptTokens:
    """Fewest prompt tokens in flight, of every class, scores 1 (in thousands). Prompts are what a backend
    prefills and then reads at every decode step, so a backend busy with long ones scores low for a short
    request, while a burst of short ones spreads evenly; a count of requests treats a 20k-token prompt as
    a 200-token one.
    """

    name = "prompt-tokens"
    scores_in_unit_range = True
    reads_predictions = False

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        return fewest_first([sum(b.prompt_tokens_by_class.values()) / 1000 for b in candidates])
