"""Two gateway apps sharing one Redis see one fleet: drains, the recent-requests log, breaker hints,
and a replica that cannot reach Redis keeps serving on its own view and says so."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import redis.asyncio as aioredis
from litestar.testing import AsyncTestClient

from gateway.app import SwitchyardPlugin, create_app
from gateway.config.settings import settings_from_text
from gateway.fleet_sync import VIEW_TTL
from tests.support import RecordingBackend, clean_redis

REDIS = "redis://127.0.0.1:6379/0"


def _config(prefix: str, redis_url: str = REDIS, backend_url: str = "http://127.0.0.1:9") -> str:
    return f"""
gateway: {{health: {{interval: 60}}}}
ledger: {{redis_url: "{redis_url}", key_prefix: {prefix}, flush_interval: 0.05}}
telemetry: {{access_log: {{enabled: false}}}}
pools:
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 2.9
    backends:
      - {{name: h100-a, url: "{backend_url}", models: [m], max_model_len: 4096}}
      - {{name: h100-b, url: "http://127.0.0.1:9", models: [m], max_model_len: 4096}}
"""


@asynccontextmanager
async def _replicas(
    prefix: str, count: int, redis_url: str = REDIS, backend_url: str = "http://127.0.0.1:9"
) -> AsyncIterator[list[AsyncTestClient]]:
    try:
        async with AsyncExitStack() as stack:
            clients = []
            for i in range(count):
                os.environ["SWITCHYARD_REPLICA"] = f"r{i}"
                app = create_app(settings_from_text(_config(prefix, redis_url, backend_url)))
                clients.append(await stack.enter_async_context(AsyncTestClient(app)))
            os.environ.pop("SWITCHYARD_REPLICA", None)
            yield clients
    finally:  # once the apps stopped: what they write as they stop (the ledger's last flush) goes too
        clean_redis(prefix)


async def _until(check, within: float) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > within:
            raise AssertionError(f"not within {within} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def _prefix() -> str:
    return f"test-fleet-{os.getpid()}-{time.monotonic_ns()}"


async def test_drain_on_one_replica_reaches_the_others_within_a_second() -> None:
    async with _replicas(_prefix(), 3) as (a, b, c):
        await _until(lambda: _replicas_seen(a, 3), 5)
        response = await a.post("/admin/v1/backends/h100-a/drain")
        assert response.json()["fleet"] == "shared"

        async def drained_everywhere() -> bool:
            rows = [(await x.get("/admin/v1/backends")).json()["data"] for x in (b, c)]
            return all(next(r for r in d if r["name"] == "h100-a")["draining"] for d in rows)

        assert await _until(drained_everywhere, 1.0) < 1.0

        # The merged view on any replica names every replica draining it (after their next heartbeat).
        async def merged() -> bool:
            fleet = (await c.get("/admin/v1/backends")).json()["fleet"]
            return sorted(fleet["backends"]["h100-a"]["draining_on"]) == ["r0", "r1", "r2"]

        await _until(merged, 3)
        await c.post("/admin/v1/backends/h100-a/undrain")

        async def undrained_on_a() -> bool:
            rows = (await a.get("/admin/v1/backends")).json()["data"]
            return not next(r for r in rows if r["name"] == "h100-a")["draining"]

        assert await _until(undrained_on_a, 1.0) < 1.0


async def test_a_replica_started_late_catches_up_on_drains() -> None:
    prefix = _prefix()
    async with _replicas(prefix, 1) as (a,):
        await a.post("/admin/v1/backends/h100-b/drain")
        async with _replicas(prefix, 1) as (late,):

            async def drained() -> bool:
                rows = (await late.get("/admin/v1/backends")).json()["data"]
                return next(r for r in rows if r["name"] == "h100-b")["draining"]

            await _until(drained, 1.0)


async def test_the_replica_list_lapses_with_the_last_heartbeat() -> None:
    """A replica killed before it could take itself out of the list is not kept there for ever."""
    prefix = _prefix()
    async with _replicas(prefix, 1) as (a,):
        await _until(lambda: _replicas_seen(a, 1), 5)
        client = aioredis.Redis.from_url(REDIS)
        try:
            left_ms = await client.pttl("{sy:" + prefix + "}:fleet:replicas")
        finally:
            await client.aclose()
        assert 0 < left_ms <= VIEW_TTL * 1000


async def test_recent_requests_and_breaker_hints_are_fleet_wide() -> None:
    with RecordingBackend("m") as backend:
        async with _replicas(_prefix(), 2, backend_url=backend.url) as (a, b):
            await _check_recent_and_hints(a, b)


async def _check_recent_and_hints(a: AsyncTestClient, b: AsyncTestClient) -> None:
    await _until(lambda: _replicas_seen(b, 2), 5)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    response = await a.post("/v1/chat/completions", json=body, headers={"x-request-id": "fleet-rec-1"})
    assert response.status_code == 200, response.text

    async def seen_on_b() -> bool:
        rows = (await b.get("/admin/v1/requests")).json()
        return any(r.get("client_request_id") == "fleet-rec-1" and r["replica"] == "r0" for r in rows["data"])

    await _until(seen_on_b, 2)
    # A breaker opening on replica a (here: as a refused connection opens it) is a hint b shows.
    pipeline = a.app.plugins.get(SwitchyardPlugin).pipeline
    next(x for x in pipeline.catalog.backends if x.name == "h100-b").breaker.failure("test", at_once=True)

    async def hinted() -> bool:
        fleet = (await b.get("/admin/v1/backends")).json()["fleet"]
        return fleet["backends"]["h100-b"]["breaker_hints"] == ["r0"]

    await _until(hinted, 2)


async def _replicas_seen(client: AsyncTestClient, n: int) -> bool:
    return (await client.get("/ready")).json()["fleet"]["replicas_seen"] >= n


async def test_without_redis_a_replica_serves_on_its_own_view_and_says_so() -> None:
    async with _replicas(_prefix(), 1, redis_url="redis://127.0.0.1:1/0") as (a,):
        await asyncio.sleep(0.3)
        ready = (await a.get("/ready")).json()
        assert ready["fleet"]["sync"] == "unreachable"
        response = await a.post("/admin/v1/backends/h100-a/drain")
        assert response.status_code == 200
        assert response.json() | {"draining": True} == response.json()
        assert response.json()["fleet"] == "local"
        metrics = (await a.get("/metrics")).text
        assert "switchyard_fleet_sync_connected 0" in metrics
