"""Logging out of the console ends the session on every replica: the old cookie reads no page and runs no
action anywhere, within a second (Redis shared between replicas; this process's memory without Redis)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import redis.asyncio as aioredis
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config.settings import settings_from_text
from gateway.console.session import COOKIE, Revocations, Sessions
from tests.support import clean_redis, free_port

REDIS = "redis://127.0.0.1:6379/0"
ADMIN = "sy-logout-admin-" + "Vq8Rf2Lk9Wx4Tb7Nz1Hm5Pc3Ds6Gy0Ja"
BASE = "https://testserver.local"


def _config(prefix: str | None) -> str:
    ledger = f'ledger: {{redis_url: "{REDIS}", key_prefix: {prefix}, flush_interval: 0.05}}' if prefix else ""
    return f"""
gateway: {{health: {{interval: 60}}}}
{ledger}
telemetry: {{access_log: {{enabled: false}}}}
pools:
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 2.9
    backends:
      - {{name: h100-a, url: "http://127.0.0.1:9", models: [m], max_model_len: 4096}}
"""


@asynccontextmanager
async def _replicas(prefix: str | None, count: int) -> AsyncIterator[list[AsyncTestClient]]:
    try:
        async with AsyncExitStack() as stack:
            clients = []
            for _ in range(count):
                app = create_app(settings_from_text(_config(prefix)))
                clients.append(await stack.enter_async_context(AsyncTestClient(app, base_url=BASE)))
            yield clients
    finally:  # once the apps stopped: what they write as they stop (the ledger's last flush) goes too
        if prefix:
            clean_redis(prefix)


async def _log_in(client: AsyncTestClient) -> str:
    answer = await client.post(
        "/console/login", data={"admin_key": ADMIN}, headers={"origin": BASE}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    match = re.search(COOKIE + r"=([^;]+);", answer.headers["set-cookie"])
    assert match
    client.cookies.clear()  # every request below sends the cookie it names, and only that
    return match.group(1)


async def _csrf(client: AsyncTestClient, token: str) -> str:
    page = await client.get("/console/fleet", headers={"cookie": f"{COOKIE}={token}"})
    assert page.status_code == 200, page.text
    match = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert match
    return match.group(1)


async def _refused_everywhere(clients: list[AsyncTestClient], token: str, csrf: str) -> bool:
    cookie = {"cookie": f"{COOKIE}={token}"}
    for client in clients:
        page = await client.get("/console/fleet", headers=cookie)
        action = await client.post(
            "/console/backends/h100-a/drain", headers={**cookie, "origin": BASE, "x-csrf-token": csrf}
        )
        if page.status_code != 401 or action.status_code != 401:
            return False
        assert "Log in" in page.text and action.json()["error"]["code"] == "no_session"
    return True


@pytest.mark.parametrize("shared", [True, False], ids=["two-replicas-redis", "one-replica-memory"])
async def test_logout_refuses_the_old_cookie_on_every_replica_within_a_second(
    monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", ADMIN)
    prefix = f"test-logout-{os.getpid()}-{time.monotonic_ns()}" if shared else None
    async with _replicas(prefix, 2 if shared else 1) as clients:
        first = clients[0]
        token = await _log_in(first)
        csrf = await _csrf(first, token)
        cookie = {"cookie": f"{COOKIE}={token}"}
        for client in clients:  # the session works on every replica before the logout
            assert (await client.get("/console/fleet", headers=cookie)).status_code == 200
            drained = await client.post(
                "/console/backends/h100-a/drain", headers={**cookie, "origin": BASE, "x-csrf-token": csrf}
            )
            assert drained.status_code == 200, drained.text

        out = await first.post(
            "/console/logout", data={"csrf": csrf}, headers={**cookie, "origin": BASE}, follow_redirects=False
        )
        assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
        logged_out = time.monotonic()
        while not await _refused_everywhere(clients, token, csrf):
            assert time.monotonic() - logged_out < 1.0, "the old cookie still works after the logout"
        assert time.monotonic() - logged_out < 1.0

        fresh = await _log_in(first)  # a new login works again, on every replica
        for client in clients:
            assert (
                await client.get("/console/fleet", headers={"cookie": f"{COOKIE}={fresh}"})
            ).status_code == 200


async def test_sessions_are_refused_while_redis_cannot_say_whether_they_were_ended() -> None:
    unreachable = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    sessions = Sessions("ab" * 32, revocations=Revocations(unreachable, "{syt:x}", timeout_s=0.3))
    token = sessions.issue()
    assert sessions.valid(token), "signed and not expired"
    assert not await sessions.live(token), "but Redis cannot say it was not logged out: refused"
    await unreachable.aclose()
