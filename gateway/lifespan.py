"""What lives as long as the app: the upstream connection pool, the health checker and the ledger.

Shutdown (SIGTERM or Ctrl-C): uvicorn stops accepting connections and waits up to
`gateway.shutdown_grace` seconds for in-flight requests (streams included) to finish; only then does the
code after `yield` run, which stops the background tasks and flushes the ledger.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar

from backends.catalog import Catalog
from backends.health import HealthChecker
from backends.scraper import MetricsScraper
from gateway.admin.policy_reload import PolicyWatcher
from gateway.config.settings import Settings
from gateway.fleet_sync import start_fleet_sync
from gateway.ledger.records import Ledger
from gateway.request.context import Tracer
from gateway.request.forward import Upstream
from gateway.request.pipeline import Pipeline
from gateway.stopping import STEP_LIMIT_S, stop_step
from gateway.telemetry import Telemetry

log = logging.getLogger("switchyard")

YOUNG_GC_THRESHOLD = 20_000
"""Net new container objects between young-generation GC passes once the app is up (Python: 700)."""

LEDGER_LIMIT_S = 2 * STEP_LIMIT_S
"""The ledger bounds its own flush and its spill; this only catches a close that hangs past both."""


def lifespan(
    settings: Settings,
    pipeline: Pipeline,
    upstream: Upstream,
    catalog: Catalog,
    policy_watcher: PolicyWatcher | None,
    ledger: Ledger,
    telemetry: Telemetry,
    tracing: Tracer | None,
):
    """Start and stop what `pipeline` (the request path) and the parts built beside it need running: its
    connection pool (`upstream`), the health checks and scrapes of `catalog`'s backends, `policy_watcher`
    (when a policy file is watched), `ledger`; at the end the last lines of `telemetry` and the last
    spans of `tracing` are written out."""

    @asynccontextmanager
    async def run(app: Litestar) -> AsyncIterator[None]:
        await upstream.start()
        health = settings.server.health
        checker = HealthChecker(
            catalog.backends,
            plans={pool.name: health.plan(pool.name) for pool in settings.pools},
            default=health.plan(),
        )
        await checker.start()
        scraper = MetricsScraper(
            upstream.session,
            catalog.backends,
            interval=settings.server.scrape.interval,
            timeout=settings.server.scrape.timeout,
        )
        await scraper.start()
        if policy_watcher is not None:
            policy_watcher.start()
        await ledger.start()
        fleet = start_fleet_sync(
            settings.ledger.redis_url, settings.ledger.key_prefix, pipeline, catalog, ledger
        )
        app.state.fleet = fleet
        healthy = sum(b.healthy for b in catalog.backends)
        log.info(
            "switchyard ready: %d pools, %d backends (%d healthy), models %s",
            len(settings.pools),
            len(catalog.backends),
            healthy,
            ", ".join(catalog.models()),
        )
        # Everything made at start-up (app, policies, catalog, imported modules) moves to a permanent GC
        # generation, so the collector's full passes stop re-scanning it: they used to stall the event
        # loop for tens of ms (p99 of 8 concurrent streams 16-28 ms -> 5-6 ms in one A/B run).
        gc.collect()
        gc.freeze()
        # A young-generation pass every 700 net allocations ran ~190 times a second under load and took
        # 3-4% of the CPU, though requests free nearly everything they make by reference counting; every
        # 20,000 still bounds what reference cycles can leave behind (+4% throughput, paired A/B).
        thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_GC_THRESHOLD, *thresholds[1:])
        try:
            yield
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()  # an app stopped inside a longer-lived process (tests) can be collected
            if policy_watcher is not None:
                await stop_step("the policy watcher", policy_watcher.stop())
            await stop_step("the metrics scraper", scraper.stop())
            if fleet is not None:
                await stop_step("the fleet view", fleet.stop())
            await stop_step("the health checker", checker.stop())
            for backend in catalog.backends:
                backend.breaker.close()
            # streams cut short, still asking their backend for a count
            await stop_step("the settling of streams", pipeline.settle_pending())
            await stop_step("the upstream pool", upstream.close())
            # flushes what is still buffered (spilling what Redis will not take), logs what it could not
            await stop_step("the ledger", ledger.close(), limit=LEDGER_LIMIT_S)
            telemetry.close()  # the access log's last lines
            if tracing is not None:
                tracing.shutdown()  # exports the last spans
            log.info("switchyard stopped")

    return run
