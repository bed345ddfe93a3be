"""The admin API (`/admin/v1/...`): its controllers, built for one app, behind the admin guard."""

from __future__ import annotations

from litestar import Controller, Router

from backends.catalog import Catalog
from gateway.admin.costs import costs_controller
from gateway.admin.keys import admin_guard, keys_controller
from gateway.admin.login_throttle import LoginThrottle
from gateway.admin.ops import backends_controller, usage_controller
from gateway.admin.policy import policy_controller
from gateway.admin.policy_reload import PolicyWatcher
from gateway.ledger.records import Ledger
from gateway.request.forward import Upstream
from gateway.request.pipeline import Pipeline
from gateway.request.prompt_size import PromptSizer
from gateway.tenants.admission import Tenants


def admin_router(
    pipeline: Pipeline,
    *,
    catalog: Catalog,
    upstream: Upstream,
    ledger: Ledger,
    prompt_sizer: PromptSizer,
    policy_watcher: PolicyWatcher | None,
    tenants: Tenants | None,
    throttle: LoginThrottle | None,
) -> Router:
    """Usage, costs, backends and the policy; with `tenants`, the keys and teams too and the admin guard
    in front of all of them (without, the admin API is open, as auth is off). The guard runs after the
    app's `one_credential`, as app guards run before a router's. `pipeline` is read for what changes as
    the gateway runs (the policy serving now, the back-pressure queues)."""
    controllers: list[type[Controller]] = [
        usage_controller(ledger),
        costs_controller(ledger),
        backends_controller(catalog, upstream, pipeline),
        policy_controller(pipeline, catalog, prompt_sizer, policy_watcher),
    ]
    if tenants is None:
        return Router(path="/", route_handlers=controllers)
    controllers.append(keys_controller(tenants))
    return Router(path="/", route_handlers=controllers, guards=[admin_guard(tenants, throttle)])
