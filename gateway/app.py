"""Build the gateway app: one plugin wires everything, so `create_app` stays a few lines."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from litestar import Litestar, Request, Response
from litestar.config.app import AppConfig
from litestar.exceptions import HTTPException
from litestar.handlers import ASGIRouteHandler
from litestar.plugins import InitPluginProtocol

from backends.catalog import Catalog
from gateway.admin.login_throttle import LoginThrottle
from gateway.admin.ops import health_controller, metrics_controller
from gateway.admin.policy_reload import PolicyWatcher
from gateway.admin.port import ON_ADMIN_PORT, AdminPortSplit
from gateway.admin.router import admin_router
from gateway.batch.wiring import batch_controllers, batch_lifespan, build_batches
from gateway.config.settings import Settings, load_settings
from gateway.console import console_controller
from gateway.http.credentials import one_credential
from gateway.http.fastpath import FastPath
from gateway.http.routes import FAST, new_request_id, openai_handlers, valid_request_id
from gateway.ledger.factory import build_ledger
from gateway.ledger.records import Ledger
from gateway.lifespan import lifespan
from gateway.openai.errors import GatewayError, body_too_large, unsupported_endpoint
from gateway.request.forward import Upstream
from gateway.request.pipeline import Pipeline
from gateway.request.prompt_size import PromptSizer
from gateway.responses.api import build_responses, responses_controller, responses_lifespan
from gateway.telemetry import AccessLog, Metrics, Telemetry, build_tracing
from gateway.tenants.admission import Tenants
from gateway.tenants.factory import build_tenants, tenants_lifespan
from gateway.upstream.client import KEEPALIVE_SECONDS, BackendClient
from policies.framework import Router
from policies.least_inflight import LeastInflight

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("switchyard")

CONFIG_ENV = "SWITCHYARD_CONFIG"

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
}


_CLIENT_LEFT = "client disconnected prematurely"


def _request_id(request: Request[Any, Any, Any]) -> str:
    given = request.headers.get("x-request-id")
    return given if given and valid_request_id(given) else new_request_id()


def _gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    headers = {"x-request-id": _request_id(request), **exc.headers}
    return Response(exc.to_json(), status_code=exc.status, media_type="application/json", headers=headers)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """Litestar's own errors (unknown route, wrong method, body over the limit) in OpenAI's shape."""
    if exc.status_code == 413:
        limit = request.route_handler.resolve_request_max_body_size() or 0
        return _gateway_error(request, body_too_large(limit))
    status = exc.status_code
    if status == 500 and exc.detail == _CLIENT_LEFT:  # the client closed mid-body: its doing, not ours
        return _gateway_error(
            request,
            GatewayError(
                400, "The request body was cut short.", "invalid_request_error", code="body_cut_short"
            ),
        )
    if status >= 500:
        log.error("%s on %s: %s", status, request.url.path, exc.detail, exc_info=exc)
    kind = _STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    message = exc.detail if status < 500 else "Internal gateway error."
    if status == 404:
        path = request.url.path
        if path == "/v1" or path.startswith("/v1/"):  # an OpenAI endpoint the gateway does not serve
            return _gateway_error(request, unsupported_endpoint(path))
        message = f"Unknown path `{path}`."
    return _gateway_error(request, GatewayError(status, message, kind))


def _unexpected_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return _gateway_error(request, GatewayError(500, "Internal gateway error.", "server_error"))


def default_router(settings: Settings) -> Router:
    """The configured policy (the engine built when the settings were validated); settings built in code
    without one get the built-in least-inflight."""
    return settings.policy if settings.policy is not None else LeastInflight()


def policy_watcher(settings: Settings, pipeline: Pipeline, catalog: Catalog) -> PolicyWatcher | None:
    """What reloads the policy file into `pipeline` as it changes (the lifespan runs it); None for settings
    built in code without one."""
    if settings.policy is None:
        return None
    path = Path(settings.policy.loaded.source)
    return PolicyWatcher(path, pipeline, catalog, settings.policy_options.reload_interval)


def build_telemetry(settings: Settings, catalog: Catalog, ledger: Ledger) -> Telemetry:
    """Metrics and the access log as `settings.telemetry` says; what is off is left out entirely."""
    options = settings.telemetry
    metrics = Metrics(catalog.backends, ledger) if options.metrics else None
    access = options.access_log
    access_log = AccessLog.open(access.destination, access.include_prompts) if access.enabled else None
    return Telemetry(metrics, access_log)


class SwitchyardPlugin(InitPluginProtocol):
    """Everything the gateway adds to a Litestar app: routes, lifespan, error shapes, limits.

    Each part is built from the settings and the parts it needs, then handed to what uses it; nothing is
    set on a part after it is made (docs/internals.md, "Wiring")."""

    def __init__(
        self,
        settings: Settings,
        router: Router | None = None,
        ledger: Ledger | None = None,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        """`span_exporter` (tests) turns tracing on and exports in-process instead of through the child."""
        self.settings = settings
        server = settings.server
        self.catalog = catalog = Catalog(settings.backends)  # built with their breaker options (settings.py)
        transport = BackendClient(server.max_connections_per_backend, KEEPALIVE_SECONDS)
        self.upstream = upstream = Upstream(
            transport, server.timeouts, server.max_connections_per_backend, server.retries
        )
        self.ledger = ledger = ledger or build_ledger(settings.ledger, catalog.backends)
        self.tenants = tenants = build_tenants(settings, ledger)
        self.tracing = tracing = build_tracing(settings.telemetry.tracing, span_exporter)
        self.telemetry = telemetry = build_telemetry(settings, catalog, ledger)
        observed = telemetry.metrics is not None or telemetry.access_log is not None
        self.prompt_sizer = prompt_sizer = PromptSizer()
        self.pipeline = pipeline = Pipeline(
            catalog,
            router or default_router(settings),
            upstream,
            ledger,
            request_limits=server.limits,
            tenants=tenants,
            telemetry=telemetry if observed else None,  # off: the request path skips it with one check
            tracing=tracing,
            clock_scale=settings.policy_options.clock_scale,
            prompt_sizer=prompt_sizer,
        )
        self.policy_watcher = policy_watcher(settings, pipeline, catalog)
        self.batches = build_batches(settings, pipeline, catalog, tenants)
        self.responses = build_responses(settings, pipeline, tenants)

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        pipeline, catalog, ledger, tenants = self.pipeline, self.catalog, self.ledger, self.tenants
        forwarding = openai_handlers(
            pipeline, catalog, tenants, self.settings.server.max_body_bytes, self.responses.handle
        )
        app_config.route_handlers.extend(forwarding)
        self.fast_routes = {
            path: handler.opt.get(FAST, handler.fn)
            for handler in forwarding
            if isinstance(handler, ASGIRouteHandler)
            for path in handler.paths
        }
        # Every other route group is a controller built for this app with its collaborators
        # (gateway/http/controllers.py); the guards that apply to all of them are the app's.
        app_config.guards.insert(0, one_credential)
        throttle = None
        if tenants is not None:
            throttle = LoginThrottle(
                tenants.client, "{syt:" + tenants.prefix + "}", tenants.options.redis_timeout
            )
        admin = admin_router(
            pipeline,
            catalog=catalog,
            upstream=self.upstream,
            ledger=ledger,
            prompt_sizer=self.prompt_sizer,
            policy_watcher=self.policy_watcher,
            tenants=tenants,
            throttle=throttle,
        )
        app_config.route_handlers.extend(
            [
                responses_controller(self.responses),
                health_controller(catalog, ledger),
                admin,
                console_controller(catalog, ledger, tenants, admin, throttle),
            ]
        )
        metrics = self.telemetry.metrics
        if metrics is not None:
            extra = budget_series(tenants, throttle) if tenants is not None else None
            app_config.route_handlers.append(
                metrics_controller(metrics, self.telemetry.flush, pipeline, extra)
            )
        app_config.lifespan.append(responses_lifespan(self.responses))
        app_config.lifespan.append(
            lifespan(
                self.settings,
                pipeline,
                self.upstream,
                catalog,
                self.policy_watcher,
                ledger,
                self.telemetry,
                self.tracing,
            )
        )
        if tenants is not None:
            app_config.lifespan.append(tenants_lifespan(tenants))
        if self.batches is not None:
            app_config.route_handlers.extend(batch_controllers(self.batches))
            app_config.lifespan.append(batch_lifespan(self.batches))
        app_config.exception_handlers.update(
            {GatewayError: _gateway_error, HTTPException: _http_error, Exception: _unexpected_error}
        )
        app_config.openapi_config = None
        return app_config


def budget_series(tenants: Tenants, logins: LoginThrottle | None = None) -> Callable[[Any], str]:
    """The tenants' `/metrics` series and the failed admin logins'; those naming keys and teams only on
    the admin port, unless `auth.public_key_metrics`."""
    public = tenants.options.public_key_metrics

    def render(scope: Any) -> str:
        text = tenants.watch.render(scopes=public or scope.get(ON_ADMIN_PORT) is True)
        text += tenants.admission_series()
        return text + logins.render() if logins is not None else text

    return render


def asgi_entry(app: Litestar, admin_port: int | None = None) -> FastPath | AdminPortSplit:
    """What the server runs: the app, with the forwarding endpoints dispatched ahead of Litestar; with
    `admin_port` (the bound port), admin routes only there and the API only elsewhere."""
    plugin = app.plugins.get(SwitchyardPlugin)
    if admin_port is not None:
        return AdminPortSplit(app, plugin.fast_routes, admin_port)
    return FastPath(app, plugin.fast_routes)


def create_app(settings: Settings | None = None) -> Litestar:
    """The gateway app; without settings, reads the file named by $SWITCHYARD_CONFIG (now, not at import)."""
    if settings is None:
        settings = load_settings(os.environ[CONFIG_ENV])
    return Litestar(plugins=[SwitchyardPlugin(settings)])
