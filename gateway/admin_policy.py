"""Admin endpoints for routing: the policy in force, and why a given request would go where it goes."""

from __future__ import annotations

from typing import Any

from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromQuery

from gateway.errors import invalid_request, model_not_found
from gateway.request.classify import classify
from gateway.request.parse import UPSTREAM_PATHS, parse
from gateway.request.pipeline import Pipeline
from gateway.routes import read_caller
from policies.engine import PolicyEngine


def policy_handlers(pipeline: Pipeline) -> list[HTTPRouteHandler]:
    @get("/admin/v1/policy", name="policy")
    async def policy(request: Request[Any, Any, Any]) -> dict[str, Any]:
        router = pipeline.router
        body: dict[str, Any] = {"name": router.name}
        if isinstance(router, PolicyEngine):
            body.update(
                source=router.loaded.source,
                classes=[rule.name for rule in router.loaded.policy.classes] + ["default"],
                warnings=router.warnings,
                decisions=router.decisions,
                mean_decision_us=round(router.mean_decision_us, 2),
            )
        watcher = getattr(request.app.state, "policy_watcher", None)
        if watcher is not None:
            body["reloads"] = watcher.reloads
            body["rejected_reloads"] = watcher.rejected
            body["last_reload_error"] = watcher.last_error
        return body

    @post("/admin/v1/explain", name="explain", status_code=200)
    async def explain(request: Request[Any, Any, Any], endpoint: FromQuery[str] = "chat") -> dict[str, Any]:
        """Route the posted OpenAI request body without sending it: class, candidates, scores, choice."""
        if endpoint not in UPSTREAM_PATHS:
            raise invalid_request(f"`endpoint` must be one of {', '.join(UPSTREAM_PATHS)}.", param="endpoint")
        parsed = parse(endpoint, await request.body())  # type: ignore[arg-type]
        profile = classify(parsed, read_caller(request.scope))
        serving = pipeline.catalog.serving(profile.model)
        if not serving:
            raise model_not_found(profile.model)
        router = pipeline.router
        if isinstance(router, PolicyEngine):
            decision = router.explain(profile, serving)
        else:
            decision = router.choose(profile, serving)
        return {
            "request_class": decision.request_class,
            "route": decision.route,
            "order": [b.name for b in decision.candidates],
            "why_none": decision.why_none,
            "explanation": decision.explanation,
        }

    return [policy, explain]
