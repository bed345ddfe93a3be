"""Operational endpoints: liveness, readiness, the usage the ledger has recorded, and backend state
(list, drain, undrain)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from backends.catalog import Catalog
from backends.models import Backend
from gateway.admin.keys import visible_rows
from gateway.http.controllers import per_app
from gateway.ledger.records import DIMENSIONS, Dimension, Ledger
from gateway.openai.errors import GatewayError, invalid_request
from gateway.request.forward import Upstream
from gateway.request.pipeline import Pipeline
from gateway.telemetry.metrics import CONTENT_TYPE, GatewayState, Metrics

log = logging.getLogger("switchyard")
_METRICS_HEADERS = {"content-type": CONTENT_TYPE}


class HealthController(Controller):
    """`GET /health` and `GET /ready` (served on both ports, no key needed)."""

    path = "/"
    catalog: Catalog
    ledger: Ledger

    @get("/health", name="health")
    async def health(self) -> dict[str, str]:
        return {"status": "ok"}

    @get("/ready", name="ready")
    async def ready(self, state: State) -> Response[dict[str, Any]]:
        backends = self.catalog.backends
        fleet = state.get("fleet")
        serving = sum(b.healthy for b in backends)
        body: dict[str, Any] = {
            "status": "ready" if serving else "not ready",
            "backends_serving": serving,
            "backends_healthy": sum(b.health_ok for b in backends),
            "backends_drained": sum(b.draining for b in backends),
            "backends_total": len(backends),
            "ledger": self.ledger.stats(),
            "fleet": fleet.summary() if fleet is not None else {"sync": "off"},
        }
        if not serving:
            body["reason"] = not_serving_reason(backends)
        return Response(body, status_code=200 if serving else 503)


class UsageController(Controller):
    """`GET /admin/v1/usage` and `GET /admin/v1/requests`: what the ledger has recorded."""

    path = "/admin/v1"
    ledger: Ledger

    @get("/usage", name="usage")
    async def usage(self, request: Request[Any, Any, Any], by: FromQuery[str] = "backend") -> dict[str, Any]:
        if by not in DIMENSIONS:
            raise invalid_request(f"`by` must be one of {', '.join(DIMENSIONS)}.", param="by")
        dimension: Dimension = by
        totals = await self.ledger.read_totals(dimension)
        rows = [
            {"name": name, **asdict(t), "total_tokens": t.total_tokens} for name, t in sorted(totals.items())
        ]
        return {"by": dimension, "data": visible_rows(request, rows)}

    @get("/requests", name="recent-requests")
    async def recent_requests(self, state: State, limit: FromQuery[int] = 100) -> dict[str, Any]:
        if not 1 <= limit <= 1000:
            raise invalid_request("`limit` must be between 1 and 1000.", param="limit")
        fleet = state.get("fleet")
        shared = await fleet.recent(limit) if fleet is not None else None
        if shared is not None:
            return {"data": shared, "scope": "fleet"}
        return {"data": [asdict(record) for record in self.ledger.recent(limit)]}


def not_serving_reason(backends: Sequence[Backend]) -> str:
    """Why no backend can take a request (`/ready` answers 503 with it)."""
    passing = [b for b in backends if b.health_ok]
    if not backends:
        return "no backends configured"
    if not passing:
        return "no backend passes its health check"
    if all(b.draining for b in passing):
        return (
            f"all drained: {len(passing)} of {len(backends)} backends pass their health check, "
            "every one of them drained by an operator"
        )
    return "every backend that passes its health check is drained, paused or has its circuit breaker open"


def backend_state(backend: Backend) -> dict[str, Any]:
    breaker = backend.breaker
    load = backend.load
    return {
        "name": backend.name,
        "pool": backend.pool.name,
        "vendor": backend.pool.vendor,
        "accelerator": backend.pool.accelerator,
        "accelerator_guess": backend.pool.accelerator_guess,
        "url": backend.url,
        "routable": backend.healthy,
        "healthy": backend.health_ok,
        "breaker": breaker.state,
        "breaker_failures": breaker.failures,
        "breaker_opened": breaker.opened,
        "breaker_opened_at": breaker.opened_at,
        "breaker_reason": breaker.reason or None,
        "health_failing_since": breaker.health_failing_since,
        "paused_s": round(max(0.0, breaker.paused_until - time.monotonic()), 3),
        "draining": backend.draining,
        "inflight": backend.inflight,
        "inflight_seqs": backend.inflight_seqs,
        "prompt_tokens_by_class": {c: n for c, n in backend.prompt_tokens_by_class.items() if n},
        "load": {"running": load.running, "waiting": load.waiting, "kv_cache_usage": load.kv_cache_usage},
        "load_age_s": None if load.scraped_at is None else round(time.monotonic() - load.scraped_at, 3),
        "price_per_gpu_hour": backend.pool.price_per_gpu_hour,
        "gpus_per_backend": backend.pool.gpus_per_backend,
    }


async def share_drain(state: State, backend: Backend) -> dict[str, Any]:
    """Tell the other replicas (gateway/fleet_sync.py); `fleet` says whether they have been told."""
    fleet = state.get("fleet")
    shared = await fleet.set_drain(backend.name, backend.draining) if fleet is not None else None
    return {**backend_state(backend), "fleet": "off" if shared is None else ("shared" if shared else "local")}


class BackendsController(Controller):
    """`GET /admin/v1/backends`; `POST /admin/v1/backends/{name}/drain` and `/undrain`."""

    path = "/admin/v1/backends"
    catalog: Catalog
    upstream: Upstream
    pipeline: Pipeline
    """Read for its back-pressure queues, one made for each class when its first request waits."""

    def find(self, name: str) -> Backend:
        by_name = {b.name: b for b in self.catalog.backends}  # an operator's action: no hurry
        backend = by_name.get(name)
        if backend is None:
            known = ", ".join(sorted(by_name))
            raise GatewayError(404, f"No backend `{name}` (known: {known}).", "invalid_request_error")
        return backend

    @get("/", name="backends")
    async def backends(self, state: State) -> dict[str, Any]:
        fleet = state.get("fleet")
        return {
            "fleet": fleet.fleet_view() if fleet is not None else {"sync": "off"},
            "data": [backend_state(b) for b in self.catalog.backends],
            "retry_budget": self.upstream.budget.stats(),
            "queues": {
                name: {"waiting": len(q), "served": q.served, "refused": q.refused}
                for name, q in sorted(self.pipeline.queues.items())
            },
        }

    @post("/{name:str}/drain", name="drain", status_code=200)
    async def drain(self, name: FromPath[str], state: State) -> dict[str, Any]:
        """No new requests; those in flight finish. Lasts until undrained (or the gateway restarts)."""
        backend = self.find(name)
        if not backend.draining:
            log.warning("backend %s drained by an operator (%d in flight)", name, backend.inflight)
        backend.draining = True
        backend.breaker.refresh()
        return await share_drain(state, backend)

    @post("/{name:str}/undrain", name="undrain", status_code=200)
    async def undrain(self, name: FromPath[str], state: State) -> dict[str, Any]:
        backend = self.find(name)
        if backend.draining:
            log.warning("backend %s undrained by an operator", name)
        backend.draining = False
        backend.breaker.refresh()
        return await share_drain(state, backend)


class MetricsController(Controller):
    """`GET /metrics`: Prometheus text format (gateway/telemetry/metrics.py) with `gateway`'s gauges, plus
    `extra` series (given the request's ASGI scope: which ones may depend on the port it came in on)."""

    path = "/metrics"
    metrics: Metrics
    flush: Callable[[], None]
    """Counts the request records still batched (`Telemetry.flush`): called first thing at every scrape."""
    gateway: GatewayState
    extra: Callable[[Any], str] | None

    @get("/", name="metrics", media_type=CONTENT_TYPE)
    async def prometheus(self, state: State, request: Request[Any, Any, Any]) -> Response[bytes]:
        self.flush()
        text = self.metrics.render(self.gateway)
        if self.extra is not None:
            text += self.extra(request.scope).encode()
        fleet = state.get("fleet")
        if fleet is not None:
            text += fleet.metrics_text().encode()
        # The header is given whole: from a `text/` media type alone, Litestar would add a second charset.
        return Response(text, headers=_METRICS_HEADERS)


def health_controller(catalog: Catalog, ledger: Ledger) -> type[HealthController]:
    return per_app(HealthController, catalog=catalog, ledger=ledger)


def usage_controller(ledger: Ledger) -> type[UsageController]:
    return per_app(UsageController, ledger=ledger)


def backends_controller(catalog: Catalog, upstream: Upstream, pipeline: Pipeline) -> type[BackendsController]:
    return per_app(BackendsController, catalog=catalog, upstream=upstream, pipeline=pipeline)


def metrics_controller(
    metrics: Metrics,
    flush: Callable[[], None],
    gateway: GatewayState,
    extra: Callable[[Any], str] | None = None,
) -> type[MetricsController]:
    return per_app(MetricsController, metrics=metrics, flush=flush, gateway=gateway, extra=extra)
