"""The gateway's parts are built with what they use (gateway/app.py `SwitchyardPlugin`): the pipeline is
handed its request limits, telemetry, tracing and clock when made, so two gateways in one process keep their
own, and `/metrics` reads the pipeline's gauges when scraped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from litestar import Controller, Litestar
from litestar.testing import AsyncTestClient

from gateway.app import SwitchyardPlugin
from gateway.config.settings import settings_from_text
from gateway.openai.errors import GatewayError
from gateway.request.classify import Caller
from gateway.request.context import RequestContext
from gateway.request.pipeline import Pipeline
from gateway.telemetry import Metrics
from tests.support import ONE_POOL as POOLS
from tests.unit.telemetry.test_logs_and_tracing import record

QUIET = "telemetry: {access_log: {enabled: false}}\n"


def _context(n: int) -> RequestContext:
    ctx = RequestContext("chat", Caller(request_id="req-1", authorization=None, forwarded={}))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": n}
    ctx.body = json.dumps(body).encode()
    return ctx


def test_each_gateway_in_a_process_enforces_its_own_request_limits() -> None:
    strict = SwitchyardPlugin(settings_from_text(QUIET + "gateway: {limits: {max_n: 2}}\n" + POOLS))
    default = SwitchyardPlugin(settings_from_text(QUIET + POOLS))  # built second: must not loosen `strict`
    default.pipeline.parse(ctx := _context(3))
    assert ctx.parsed.n == 3
    with pytest.raises(GatewayError) as refused:
        strict.pipeline.parse(_context(3))
    assert refused.value.body.param == "n"
    strict.pipeline.parse(ctx := _context(2))
    assert ctx.parsed.n == 2


def test_the_pipeline_is_given_the_parts_built_beside_it() -> None:
    plugin = SwitchyardPlugin(settings_from_text(QUIET + "policy: {clock_scale: 2}\n" + POOLS))
    pipeline = plugin.pipeline
    assert pipeline.request_limits is plugin.settings.server.limits
    assert pipeline.catalog is plugin.catalog and pipeline.ledger is plugin.ledger
    assert pipeline.telemetry is plugin.telemetry  # metrics are on by default
    assert pipeline.recorded is not None and pipeline.tracing is None and pipeline.tenants is None
    assert pipeline.clock_scale == 2.0
    assert plugin.responses.limits is pipeline.request_limits


def test_with_metrics_and_the_access_log_off_no_telemetry_is_wired_in() -> None:
    plugin = SwitchyardPlugin(
        settings_from_text("telemetry: {metrics: false, access_log: {enabled: false}}\n" + POOLS)
    )
    assert plugin.pipeline.telemetry is None and plugin.pipeline.recorded is None


class _State:
    """A gateway's state as a scrape reads it (what `Pipeline` offers)."""

    def __init__(self, queued: int) -> None:
        self.router: object = object()
        self.queued = queued
        self.tracing: object | None = None


def test_a_scrape_reads_the_gateways_gauges_as_they_are_then() -> None:
    metrics = Metrics([])
    assert "switchyard_queued_requests" not in metrics.render().decode()  # no gateway: no gateway gauges
    state = _State(queued=3)
    assert "switchyard_queued_requests 3" in metrics.render(state).decode()
    state.queued = 0
    assert "switchyard_queued_requests 0" in metrics.render(state).decode()


def test_the_pipelines_gauges_reach_metrics() -> None:
    plugin = SwitchyardPlugin(settings_from_text(QUIET + POOLS))
    pipeline: Pipeline = plugin.pipeline
    metrics = plugin.telemetry.metrics
    assert metrics is not None
    pipeline.queued = 5  # as if five requests waited for room
    assert "switchyard_queued_requests 5" in metrics.render(pipeline).decode()


def test_each_backend_is_built_with_the_configured_breaker_options() -> None:
    plugin = SwitchyardPlugin(
        settings_from_text(QUIET + "gateway: {breaker: {failure_threshold: 7, open_s: 2.5}}\n" + POOLS)
    )
    options = plugin.settings.server.breaker
    assert (options.failure_threshold, options.open_s) == (7, 2.5)
    assert plugin.catalog.backends, "the pool has a backend"
    assert all(b.breaker.options is options for b in plugin.catalog.backends)


def _controllers(app: Litestar) -> dict[str, Controller]:
    """The controller instances an app serves from, by class name."""
    found: dict[str, Controller] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            owner = getattr(handler.fn, "__self__", None)
            if isinstance(owner, Controller):
                found[type(owner).__name__] = owner
    return found


def test_route_groups_are_given_the_parts_the_app_built_not_read_off_the_pipeline(tmp_path: Path) -> None:
    batches = f"batches: {{enabled: true, directory: '{tmp_path}'}}\n"
    plugin = SwitchyardPlugin(settings_from_text(QUIET + batches + POOLS))
    served: dict[str, Any] = _controllers(Litestar(plugins=[plugin]))
    backends, policy, console = (
        served["BackendsController"],
        served["PolicyController"],
        served["ConsoleController"],
    )
    assert backends.catalog is plugin.catalog and backends.upstream is plugin.upstream
    assert policy.catalog is plugin.catalog and policy.prompt_sizer is plugin.prompt_sizer
    assert policy.watcher is plugin.policy_watcher is not None  # the preset's file is watched
    assert plugin.pipeline.prompt_sizer is plugin.prompt_sizer, "the explanation estimates as routing does"
    assert console.console.catalog is plugin.catalog
    assert plugin.batches is not None
    assert plugin.batches.catalog is plugin.catalog and plugin.batches.tenants is plugin.tenants


async def test_the_policy_endpoint_reports_the_watcher_the_app_was_given() -> None:
    plugin = SwitchyardPlugin(settings_from_text(QUIET + POOLS))
    watcher = plugin.policy_watcher
    assert watcher is not None
    async with AsyncTestClient(Litestar(plugins=[plugin])) as client:
        watcher.rejected, watcher.last_error = 1, "a bad edit"  # as if a reload had been refused
        state = (await client.get("/admin/v1/policy")).json()
    assert (state["reloads"], state["rejected_reloads"], state["last_reload_error"]) == (0, 1, "a bad edit")


async def test_an_explanation_checks_the_request_against_the_gateways_own_limits() -> None:
    plugin = SwitchyardPlugin(settings_from_text(QUIET + "gateway: {limits: {max_n: 2}}\n" + POOLS))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with AsyncTestClient(Litestar(plugins=[plugin])) as client:
        refused = await client.post("/admin/v1/explain", json={**body, "n": 3})
        explained = await client.post("/admin/v1/explain", json={**body, "n": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
    assert explained.status_code == 200, explained.text


async def test_a_scrape_counts_the_requests_the_telemetry_still_has_batched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gateway.telemetry.BATCH_S", 3600.0)  # only the scrape may count them
    plugin = SwitchyardPlugin(settings_from_text(QUIET + POOLS))
    metrics = plugin.telemetry.metrics
    assert metrics is not None
    async with AsyncTestClient(Litestar(plugins=[plugin])) as client:
        plugin.telemetry.recorded(record(), None)  # type: ignore[arg-type]  # the access log is off
        assert "switchyard_requests_total{" not in metrics.render().decode(), "batched, not counted yet"
        scraped = (await client.get("/metrics")).text
    assert 'switchyard_requests_total{model="m",class="interactive"' in scraped
