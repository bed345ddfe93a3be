"""Built-in filters. `healthy` and `context-fits` always run first; routes may add others by name."""

from __future__ import annotations

import time

from backends.models import Backend
from policies.framework import RouteContext
from policies.predict import saturation_reason


class Healthy:
    """Only backends routing may use: health checks pass, circuit not open, not drained or paused."""

    name = "healthy"

    def keep(self, ctx: RouteContext, backend: Backend) -> str | None:
        if backend.healthy:
            return None
        if backend.draining:
            return "drained by an operator"
        if backend.health_ok and backend.breaker.state != "closed":
            return f"circuit breaker {backend.breaker.state}"
        if backend.health_ok and backend.breaker.paused_until > time.monotonic():
            return "paused after it asked to retry later"
        return "failed its health check"


class ContextFits:
    """Only backends whose `max_model_len` holds the request: its estimated prompt tokens plus
    `max_tokens` (1 without it; policies/profile.py `context_needed`)."""

    name = "context-fits"

    def keep(self, ctx: RouteContext, backend: Backend) -> str | None:
        need = ctx.profile.context_needed
        if backend.max_model_len >= need:
            return None
        return f"max_model_len {backend.max_model_len} < about {need} tokens needed"


class ExcludeSaturated:
    """Drops backends past the route's `saturation` limits outright (by default they are only tried last)."""

    name = "exclude-saturated"

    def keep(self, ctx: RouteContext, backend: Backend) -> str | None:
        return saturation_reason(backend, ctx.route.saturation)
