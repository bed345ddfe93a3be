"""Admin endpoints for routing: the policy in force, and why a given request would go where it goes."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromQuery

from backends.catalog import Catalog
from gateway.admin.policy_reload import PolicyWatcher
from gateway.http.controllers import per_app
from gateway.http.routes import read_caller
from gateway.openai.errors import invalid_request, model_not_found
from gateway.request.classify import classify
from gateway.request.parse import UPSTREAM_PATHS, parse
from gateway.request.pipeline import Pipeline
from gateway.request.prompt_size import PromptSizer
from policies.engine import PolicyEngine
from policies.explain import Explained, explain
from policies.framework import Router


class PolicyState(msgspec.Struct):
    """`GET /admin/v1/policy`: the router in force. The policy fields are null for a router that is not
    a policy engine, the reload fields when the policy file is not watched."""

    name: str
    version: str | None = None
    """The policy text's hash: it changes exactly when a reload applies a different file."""
    source: str | None = None
    classes: list[str] | None = None
    rules: list[dict[str, Any]] | None = None
    """The class rules in the order they are tried: `rule N` in an explanation's `matched_by` is the Nth
    (`n`), with its class, condition (`when`) and description."""
    warnings: list[str] | None = None
    decisions: int | None = None
    mean_decision_us: float | None = None
    reloads: int | None = None
    rejected_reloads: int | None = None
    last_reload_error: str | None = None


def policy_state(router: Router, watcher: PolicyWatcher | None) -> PolicyState:
    state = PolicyState(name=router.name)
    if isinstance(router, PolicyEngine):
        state.version = router.version
        state.source = router.loaded.source
        state.classes = [rule.name for rule in router.loaded.policy.classes] + ["default"]
        tried = [rule for rule in router.loaded.policy.classes if rule.when is not None]
        state.rules = [
            {
                "n": n,
                "class": rule.name,
                "when": msgspec.to_builtins(rule.when),
                "description": rule.description,
            }
            for n, rule in enumerate(tried, 1)
        ]
        state.warnings = router.warnings
        state.decisions = router.decisions
        state.mean_decision_us = round(router.mean_decision_us, 2)
    if watcher is not None:
        state.reloads = watcher.reloads
        state.rejected_reloads = watcher.rejected
        state.last_reload_error = watcher.last_error
    return state


class PolicyController(Controller):
    """`GET /admin/v1/policy` and `POST /admin/v1/explain` over the app's pipeline (its router in force)."""

    path = "/admin/v1"
    pipeline: Pipeline
    """Read for the policy serving now (a reload swaps it)."""
    catalog: Catalog
    prompt_sizer: PromptSizer
    """The pipeline's: what it has learned of prompt sizes, so an explanation estimates as routing does."""
    watcher: PolicyWatcher | None
    """What reloads the policy file; None when no file is watched."""

    @get("/policy", name="policy")
    async def policy(self, request: Request[Any, Any, Any]) -> PolicyState:
        return policy_state(self.pipeline.router, self.watcher)

    @post("/explain", name="explain", status_code=200)
    async def explain_request(
        self, request: Request[Any, Any, Any], endpoint: FromQuery[str] = "chat"
    ) -> Explained:
        """Route the posted OpenAI request body without sending it: class, candidates, scores, choice."""
        if endpoint not in UPSTREAM_PATHS:
            raise invalid_request(f"`endpoint` must be one of {', '.join(UPSTREAM_PATHS)}.", param="endpoint")
        parsed = parse(endpoint, await request.body(), self.pipeline.request_limits)
        profile = classify(parsed, read_caller(request.scope), self.prompt_sizer)
        serving = self.catalog.serving(profile.model)
        if not serving:
            raise model_not_found(profile.model)
        return explain(self.pipeline.router, profile, serving)


def policy_controller(
    pipeline: Pipeline, catalog: Catalog, prompt_sizer: PromptSizer, watcher: PolicyWatcher | None
) -> type[PolicyController]:
    return per_app(
        PolicyController, pipeline=pipeline, catalog=catalog, prompt_sizer=prompt_sizer, watcher=watcher
    )
