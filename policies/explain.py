"""Why a request would go where it goes: the one explanation the admin API and the CLI both print.

`explain` runs the same decision `choose` makes (policies/engine.py) and keeps what it was made from:
the class and what matched it, the route, the backends the filters dropped and why, every candidate with
each scorer's score, and the pick. The result is typed; encoded with msgspec it is the JSON of
`POST /admin/v1/explain` and of `switchyard policy explain --json`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from backends.models import Backend
from policies.engine import DecisionTrace, PolicyEngine
from policies.framework import Router
from policies.predict import predicted_tpot, predicted_ttft, saturation_reason, slo_miss_reason

if TYPE_CHECKING:
    from policies.profile import RequestProfile

TIER_NAMES = ("preferred", "fallback")


class Candidate(msgspec.Struct):
    """One backend that passed the filters, as ranked; `scores` are per scorer, in 0..1."""

    backend: str
    pool: str
    vendor: str
    accelerator: str
    tier: str
    """`preferred` or `fallback`: which of the route's selections its pool is in."""
    scores: dict[str, float]
    total: float
    """The scores weighted by the route's strategy (weights normalised to sum to 1)."""
    can_take_more: bool
    why_not: str | None
    """Why it cannot take more (saturated, or predicted to miss the SLO): tried after the others."""
    inflight: int
    inflight_seqs: int
    """The sequences those requests hold (a request with n choices holds n of vLLM's seats)."""
    waiting: float
    running: float
    kv_cache_usage: float
    predicted_ttft_ms: float
    predicted_tpot_ms: float


class Dropped(msgspec.Struct):
    """A backend serving the model that is not a candidate, and the filter's reason."""

    backend: str
    reason: str


class Explanation(msgspec.Struct, omit_defaults=True):
    """What a policy engine decided from; `candidates` are best first, empty when nothing fits."""

    policy: str
    version: str
    request_class: str
    matched_by: str
    """`header`, `rule N` (the Nth class rule) or `default`."""
    route: dict[str, Any]
    """The class's route as configured (unset options left out)."""
    dropped: list[Dropped]
    decision_us: float
    candidates: list[Candidate] = []
    choice: str | None = None


class Explained(msgspec.Struct):
    """A routing decision and, for a policy engine, its explanation."""

    request_class: str
    route: str
    order: list[str]
    """The backends to try, best first."""
    why_none: str | None
    """When `order` is empty: why, in words a client can act on."""
    explanation: Explanation | None
    """None for a router that is not a policy engine (it decides without scores to show)."""


def explain(router: Router, profile: RequestProfile, serving: Sequence[Backend]) -> Explained:
    """Route the request without sending it, and say why; changes no statistics of the router."""
    if not isinstance(router, PolicyEngine):
        decision = router.choose(profile, serving)
        names = [b.name for b in decision.candidates]
        return Explained(decision.request_class, decision.route, names, decision.why_none, None)
    started = time.perf_counter_ns()
    decision, trace = router.decide_traced(profile, serving)
    explanation = _explanation(router, trace, serving)
    explanation.decision_us = round((time.perf_counter_ns() - started) / 1000, 1)
    names = [b.name for b in decision.candidates]
    return Explained(decision.request_class, decision.route, names, decision.why_none, explanation)


def _explanation(engine: PolicyEngine, trace: DecisionTrace, serving: Sequence[Backend]) -> Explanation:
    route, ctx = trace.route, trace.ctx
    assert route is not None and ctx is not None  # set by every decision
    dropped = [Dropped(b.name, why) for b, why in engine.rejections(ctx, route, serving)]
    candidates = [_candidate(trace, i) for i in trace.order]
    return Explanation(
        policy=engine.name,
        version=engine.version,
        request_class=route.name,
        matched_by=trace.matched_by,
        route=_without_nulls(msgspec.to_builtins(route.config)),
        dropped=dropped,
        decision_us=0.0,
        candidates=candidates,
        choice=candidates[0].backend if candidates else None,
    )


def _candidate(trace: DecisionTrace, i: int) -> Candidate:
    b = trace.kept[i]
    assert trace.route is not None
    config = trace.route.config
    ttfts = trace.ctx.predicted_ttft if trace.ctx is not None else None
    prompt_tokens = trace.ctx.profile.prompt_tokens_estimate if trace.ctx is not None else 0
    return Candidate(
        backend=b.name,
        pool=b.pool.name,
        vendor=b.pool.vendor,
        accelerator=b.pool.accelerator,
        tier=TIER_NAMES[min(trace.tiers[i], 1)],
        scores={name: round(scores[i], 4) for name, scores in trace.scores.items()},
        total=round(trace.totals[i], 4),
        can_take_more=trace.able[i],
        why_not=saturation_reason(b, config.saturation) or slo_miss_reason(b, config, prompt_tokens),
        inflight=b.inflight,
        inflight_seqs=b.inflight_seqs,
        waiting=b.load.waiting,
        running=b.load.running,
        kv_cache_usage=b.load.kv_cache_usage,
        predicted_ttft_ms=round(
            (ttfts[i] if ttfts is not None else predicted_ttft(b, prompt_tokens)) * 1000, 2
        ),
        predicted_tpot_ms=round(predicted_tpot(b) * 1000, 3),
    )


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None and v != []}
    return value
