"""The policy engine: one scheduling cycle per request (classify, filter, score, pick; see framework.py).

Everything that does not depend on the request is resolved when the policy is loaded: class rules become
predicates, each route's pools become a backend → tier map, plugin names become instances. What is left
per request is a loop over the backends serving the model.

`load_engine` is the one way a policy file becomes an engine: validating a policy is building it, so the
engine that passed `switchyard policy check`, the gateway's start or a hot reload is the one that runs.
Explanations of a decision are in policies/explain.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from backends.models import Backend
from policies.classes import Predicate, compile_condition
from policies.config import LoadedPolicy, Route, load_policy
from policies.filters import ContextFits, Healthy
from policies.framework import Decision, Filter, Picker, RouteContext, Scorer
from policies.hints import HeaderHints
from policies.plugins import PolicyPlugins
from policies.predict import RecentSends, decoding_slowly, idle, saturation_reason
from policies.profile import DEFAULT_CLASS, RequestProfile
from policies.selectors import each_selector, selects


@dataclass(slots=True)
class CompiledRoute:
    name: str
    label: str
    config: Route
    tiers: dict[Backend, int]
    filters: list[Filter]
    """All filters, the always-on `healthy` and `context-fits` first (these two are inlined when routing)."""
    extra_filters: list[Filter]
    scorers: list[tuple[Scorer, float, bool]]
    """Each scorer, its weight (the route's weights normalised to sum 1) and whether its scores are clamped
    into 0..1 (it does not declare `scores_in_unit_range`)."""
    picker: Picker
    predicts: bool
    """Whether latency predictions are needed (an SLO, or a scorer that reads them)."""
    shed: bool
    """The route's class may be held and refused under overload (`shed: true`)."""
    ttft_limit: float
    tpot_limit: float
    """The SLO in seconds (infinite when the route sets none)."""
    members: dict[int, tuple[Sequence[Backend], list[Backend]]] = field(default_factory=dict)
    """Per list of backends serving a model (keyed by identity, the list kept to make the key safe): those
    in this route's pools, computed once."""


@dataclass(slots=True)
class DecisionTrace:
    """What one decision was made from, kept only when asked (policies/explain.py reads it)."""

    matched_by: str = ""  # what decided the class: `header`, `rule N` or `default`
    route: CompiledRoute | None = None
    ctx: RouteContext | None = None
    kept: list[Backend] = field(default_factory=list)  # left after the filters; the lists below are parallel
    tiers: list[int] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    able: list[bool] = field(default_factory=list)
    scores: dict[str, Sequence[float]] = field(default_factory=dict)
    """Each scorer's scores (clamped to 0..1), by scorer name."""
    order: list[int] = field(default_factory=list)


class PolicyEngine:
    """A loaded policy bound to the gateway's backends; implements `policies.framework.Router`."""

    def __init__(self, loaded: LoadedPolicy, backends: Sequence[Backend]) -> None:
        self.loaded = loaded
        self.name = loaded.policy.name
        self.version = loaded.version
        self.warnings: list[str] = []
        self.decisions = 0
        self.decision_ns = 0
        self._plugins = PolicyPlugins(loaded)
        self._rules: list[tuple[str, Predicate]] = [
            (rule.name, compile_condition(rule.when))
            for rule in loaded.policy.classes
            if rule.when is not None
        ]
        self._routes = {
            name: self._compile_route(name, route, backends) for name, route in loaded.policy.routes.items()
        }
        self._headers: dict[bytes, tuple[int, dict[str, str]]] = {
            name.encode("latin-1"): (order, values)
            for order, (name, values) in enumerate(loaded.policy.headers.items())
        }
        """The `headers:` mapping by header name: (its place in the policy, the classes by value)."""
        self.hints = HeaderHints(loaded.policy)  # the headers it reads (gateway/request/allowance.py)
        self.recent = RecentSends()
        """What this engine routed to each backend since its last scrape (policies/predict.py)."""

    # --- loading -------------------------------------------------------------------------------------

    def _compile_route(self, name: str, route: Route, backends: Sequence[Backend]) -> CompiledRoute:
        tiers: dict[Backend, int] = {}
        for backend in backends:
            if selects(route.prefer, backend.pool):
                tiers[backend] = 0
            elif selects(route.fallback, backend.pool):
                tiers[backend] = 1
        if backends and not tiers:
            where = f"{self.loaded.source}:{self.loaded.line('routes', name)}"
            self.warnings.append(f"{where}: route `{name}` selects no configured pool")
        elif backends:
            self._warn_unmatched_selectors(name, route, backends)
        extra: list[Filter] = [
            self._plugins.get(f, "filter", "routes", name, "filters", i) for i, f in enumerate(route.filters)
        ]
        filters: list[Filter] = [Healthy(), ContextFits(), *extra]
        chosen = [
            (self._plugins.scorer(s, "routes", name, "strategy", s), weight)
            for s, weight in route.strategy.items()
        ]
        total = sum(weight for _, weight in chosen) or 1.0
        scorers = [(scorer, weight / total, not scorer.scores_in_unit_range) for scorer, weight in chosen]
        picker = self._plugins.get(route.picker, "picker", "routes", name, "picker")
        predicts = route.slo is not None or any(scorer.reads_predictions for scorer, _ in chosen)
        slo = route.slo
        ttft_limit = slo.ttft_ms / 1000 if slo is not None and slo.ttft_ms is not None else float("inf")
        tpot_limit = slo.tpot_ms / 1000 if slo is not None and slo.tpot_ms is not None else float("inf")
        label = f"{self.name}/{name}"
        predicts = predicts or route.shed  # shedding decides by the same predictions
        args = (tiers, filters, extra, scorers, picker, predicts, route.shed, ttft_limit, tpot_limit)
        return CompiledRoute(name, label, route, *args)

    def _warn_unmatched_selectors(self, name: str, route: Route, backends: Sequence[Backend]) -> None:
        """A selector no pool matches is a typo or a pool that is gone: the route can never use it."""
        pools = {b.pool.name: b.pool for b in backends}
        known = ", ".join(f"{p.name} ({p.vendor} {p.accelerator})" for p in pools.values())
        for field_name, selection in (("prefer", route.prefer), ("fallback", route.fallback)):
            for path, selector in each_selector(selection):
                if any(selects(selector, pool) for pool in pools.values()):
                    continue
                line = self.loaded.line("routes", name, field_name, *path)
                shown = ", ".join(f"{k}: {v}" for k, v in msgspec.to_builtins(selector).items())
                self.warnings.append(
                    f"{self.loaded.source}:{line}: route `{name}`: {field_name} {{{shown}}} matches no pool "
                    f"(pools: {known})"
                )

    # --- routing -------------------------------------------------------------------------------------

    def classify(self, profile: RequestProfile) -> tuple[str, str]:
        """The class and what decided it: `header`, `rule N`, or `default`."""
        explicit = profile.explicit_class
        if explicit is not None and explicit in self._routes:
            return explicit, "header"
        if self._headers and profile.headers:
            mapped = self._mapped_header(profile.headers)
            if mapped is not None:
                return mapped, "header"
        for index, (name, predicate) in enumerate(self._rules):
            if predicate(profile):
                return name, f"rule {index + 1}"
        return DEFAULT_CLASS, "default"

    def _mapped_header(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The class a `headers:` mapping of the policy gives these request headers, if any: of the
        mapped headers whose value names a class, the one the policy lists first (the first such
        header of that name). One pass over the request's headers, a dict lookup each (hot path)."""
        mapping = self._headers
        found: str | None = None
        found_at = len(mapping)
        for key, raw in headers:
            entry = mapping.get(key)
            if entry is not None and entry[0] < found_at:
                cls = entry[1].get(raw.decode("latin-1").split(",", 1)[0].strip().lower())
                if cls is not None:
                    found, found_at = cls, entry[0]
        return found

    def choose(self, profile: RequestProfile, serving: Sequence[Backend]) -> Decision:
        started = time.perf_counter_ns()
        decision = self._decide(profile, serving, None)
        self.decision_ns += time.perf_counter_ns() - started
        self.decisions += 1
        return decision

    def decide_traced(
        self, profile: RequestProfile, serving: Sequence[Backend]
    ) -> tuple[Decision, DecisionTrace]:
        """The decision `choose` would make, with what it was made from (not counted in the statistics)."""
        trace = DecisionTrace()
        return self._decide(profile, serving, trace), trace

    def _decide(
        self, profile: RequestProfile, serving: Sequence[Backend], trace: DecisionTrace | None
    ) -> Decision:
        cls, matched_by = self.classify(profile)
        profile.request_class = cls
        route = self._routes[cls]
        ctx = RouteContext(profile, cls, route.config, route.tiers)
        tiers = route.tiers
        need = profile.context_needed
        extra_filters = route.extra_filters
        limits = route.config.saturation
        max_waiting, max_kv, max_inflight = limits.max_waiting, limits.max_kv_cache_usage, limits.max_inflight
        max_seqs = limits.max_seqs  # sequences: a request holds one per choice
        marked = limits.max_tpot_ms is not None or limits.max_slowdown is not None
        predicts, ttft_limit, tpot_limit = route.predicts, route.ttft_limit, route.tpot_limit
        in_route = route.members.get(id(serving))
        if in_route is None or in_route[0] is not serving:
            in_route = (serving, [b for b in serving if b in tiers])
            route.members[id(serving)] = in_route
        kept = [b for b in in_route[1] if b.healthy and b.max_model_len >= need]
        if extra_filters:
            kept = [b for b in kept if all(f.keep(ctx, b) is None for f in extra_filters)]
        kept_tiers = [tiers[b] for b in kept]
        # Whether each can take more work: not saturated, and (below) not predicted to miss the SLO. The
        # queue counts what this engine sent since the last scrape (policies/predict.py).
        # One pass, inlining policies/predict.py's queue_estimate, ttft_estimate and saturation_reason (hot
        # path); tests/unit/policies/test_engine_formulas.py holds the copy equal to them on random states.
        recent = self.recent
        sent_to = recent.by_backend
        speeds = recent.speeds
        prompt = profile.prompt_tokens_estimate
        able: list[bool] = []
        ttfts: list[float] = []
        tpots: list[float] = []
        for b in kept:
            load = b.load
            r = sent_to.get(b)
            if r is not None and r.scraped_at != load.scraped_at:
                r = None
            queue = load.waiting
            if r is not None and (queue > 0 or load.kv_cache_usage > max_kv):
                queue += r.requests
            ok = (
                queue <= max_waiting
                and load.kv_cache_usage <= max_kv
                and (max_inflight is None or b.inflight < max_inflight)
                and (max_seqs is None or b.inflight_seqs < max_seqs)
                and not (marked and decoding_slowly(b, limits))
            )
            if predicts:
                observed, pool = b.observed, b.pool
                speed = speeds.get(pool.name) or recent.prefill_speed(b)
                base = observed.ttft if observed.ttft is not None else pool.prior_ttft_s
                pending = prompt + r.prompt_tokens if r is not None else prompt
                ttft = base * (1.0 + queue * 0.5) + pending / speed
                tpot = observed.tpot if observed.tpot is not None else pool.prior_tpot_s
                ok = ok and ttft <= ttft_limit and tpot <= tpot_limit
                ttfts.append(ttft)
                tpots.append(tpot)
            able.append(ok)
        if predicts:
            ctx.predicted_ttft = ttfts
            ctx.predicted_tpot = tpots
            if route.shed and not any(able):
                # A class held on predictions alone would send nothing to refresh them: an idle backend
                # within its limits takes the request (a measurement taken under a load that has gone).
                able = [idle(b) and saturation_reason(b, limits, recent) is None for b in kept]
        if trace is not None:
            trace.matched_by, trace.route, trace.ctx = matched_by, route, ctx
        if not kept:
            return self._nothing_fits(ctx, route, serving)
        totals: list[float] | None = None
        per_plugin: dict[str, Sequence[float]] = {}
        for scorer, weight, clamp in route.scorers:
            scores = scorer.score(ctx, kept)
            if clamp:
                scores = [0.0 if s < 0 else 1.0 if s > 1 else s for s in scores]
            if trace is not None:
                per_plugin[scorer.name] = scores
            if totals is None:
                totals = [weight * s for s in scores]
            else:
                totals = [t + weight * s for t, s in zip(totals, scores, strict=True)]
        if totals is None:
            totals = [0.0] * len(kept)
        order = route.picker.order(ctx, kept, kept_tiers, totals, able)
        if trace is not None:
            trace.kept, trace.tiers, trace.totals, trace.able = kept, kept_tiers, totals, able
            trace.scores, trace.order = per_plugin, order
        any_able = any(able)
        hold = route.shed and not any_able
        if any_able or route.config.backpressure is None:
            # Counted as sent unless it may wait for room (re-routed then, and counted when it goes).
            counted = kept[order[0]]
            recent.sent(counted, profile.prompt_tokens_estimate)
        else:
            counted = None
        return Decision(
            [kept[i] for i in order],
            route.label,
            request_class=cls,
            hold=hold,
            counted=counted,
            pending=recent,
        )

    def rejections(
        self, ctx: RouteContext, route: CompiledRoute, serving: Sequence[Backend]
    ) -> list[tuple[Backend, str]]:
        """Why each backend serving the model is not a candidate (for explanations and errors; not hot)."""
        dropped = []
        for backend in serving:
            if backend not in route.tiers:
                dropped.append((backend, f"its pool `{backend.pool.name}` is not in route `{route.name}`"))
                continue
            for f in route.filters:
                reason = f.keep(ctx, backend)
                if reason is not None:
                    dropped.append((backend, reason))
                    break
        return dropped

    def _nothing_fits(self, ctx: RouteContext, route: CompiledRoute, serving: Sequence[Backend]) -> Decision:
        profile = ctx.profile
        in_route = [b for b in serving if b in route.tiers]
        cls = route.name
        if not in_route:
            why = f"no pool of route `{cls}` serves this model"
            return Decision([], route.label, request_class=cls, why_none=why)
        too_short = [b for b in in_route if b.max_model_len < profile.context_needed]
        if len(too_short) == len(in_route):
            longest = max(b.max_model_len for b in in_route)
            why = (
                f"the request needs about {profile.context_needed} tokens of context (estimated prompt plus "
                f"max_tokens) but the longest any backend of route `{cls}` serves is {longest}"
            )
            return Decision([], route.label, request_class=cls, why_none=why, rejected_for_context=True)
        reasons = sorted({why for _, why in self.rejections(ctx, route, serving)})
        why = f"all {len(in_route)} backends of route `{cls}` are unavailable ({'; '.join(reasons)})"
        return Decision([], route.label, request_class=cls, why_none=why)

    @property
    def mean_decision_us(self) -> float:
        return self.decision_ns / self.decisions / 1000 if self.decisions else 0.0


def load_engine(path: str | Path, backends: Sequence[Backend]) -> PolicyEngine:
    """Read, validate and build a policy file against these backends: the one way a policy is loaded.

    Validation is building: the engine that passed is the engine to run (`policy check`, the gateway's
    start and its hot reload all call this). Raises ConfigError naming the file and line.
    """
    return PolicyEngine(load_policy(path), backends)
