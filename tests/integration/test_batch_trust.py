"""A batch runs as its key as the key is now: two gateway apps (replicas) on the shared Redis (a private
prefix per test) and a simulated fleet. A $0 budget refuses every line; a key revoked right after
`batches.create` (a model-restricted one too) gets no line sent and nothing is billed to `anonymous`; a key
revoked or expired mid-run stops its batch's lines on both replicas within a second, the batch ending
`failed` with the finished lines kept and an error line per unfinished one; while the key store cannot be
read no line is handed out; the admin key lists and cancels any tenant's batch.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml
from litestar import Litestar
from litestar.testing import AsyncTestClient

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from gateway.app import create_app
from gateway.batch.runner import BatchRunner
from gateway.config.settings import settings_from_text
from tests.integration.tcp_proxy import CuttableProxy
from tests.support import two_pool_fleet

MODEL = "llama-3.1-8b"
FLEET = two_pool_fleet(MODEL)
REDIS = "redis://127.0.0.1:6379/0"
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
STOP_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    spec = parse_fleet_spec(FLEET, "<batch trust fleet>")
    with Fleet(spec, log_dir=tmp_path_factory.mktemp("trust-fleet")) as running:
        yield running


@dataclass
class Replicas:
    """Each app runs in a thread and event loop of its own (the test client's portal): what the test
    does to an app's objects it does through `call`, in that app's loop."""

    clients: list[AsyncTestClient]

    @property
    def a(self) -> AsyncTestClient:
        return self.clients[0]

    @property
    def b(self) -> AsyncTestClient:
        return self.clients[1]

    def runner(self, i: int) -> BatchRunner:
        return self.clients[i].app.state.batch_runner  # type: ignore[no-any-return]

    def call(self, i: int, func: Callable[[], Any]) -> Any:
        """`func()` (awaited when it returns a coroutine) in replica `i`'s event loop."""
        return self.clients[i].blocking_portal.call(func)

    async def create_key(self, **fields: Any) -> tuple[str, str]:
        made = await self.a.post("/admin/v1/keys", json={"name": "batcher", **fields}, headers=ADMIN)
        assert made.status_code == 201, made.text
        return made.json()["key"], made.json()["id"]

    async def revoke(self, key_id: str) -> None:
        answer = await self.a.post(f"/admin/v1/keys/{key_id}/revoke", headers=ADMIN)
        assert answer.status_code == 200, answer.text

    async def records(self, batch_id: str) -> list[dict[str, Any]]:
        """The ledger's records of the batch's lines (request ids `<batch id>-<line>`), from both replicas
        (each shares its latest when asked)."""
        found: dict[str, dict[str, Any]] = {}
        for client in self.clients:
            rows = (await client.get("/admin/v1/requests", params={"limit": 1000}, headers=ADMIN)).json()
            found.update((r["request_id"], r) for r in rows["data"] if r["request_id"].startswith(batch_id))
        return list(found.values())

    async def billed_keys(self) -> set[str]:
        rows = (await self.a.get("/admin/v1/usage", params={"by": "key"}, headers=ADMIN)).json()["data"]
        return {r["name"] for r in rows if r["requests"]}

    def running_lines(self, batch_id: str, i: int | None = None) -> int:
        """The batch's lines in flight on replica `i` (both: None) right now."""
        count = 0
        for n in range(2) if i is None else [i]:
            running = self.runner(n).running
            count += self.call(n, lambda r=running: sum(owner == batch_id for owner, _ in r))
        return count


def _config(fleet: Fleet, prefix: str, files: Path, keys_redis: str) -> str:
    config: dict[str, Any] = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
    config["ledger"] = {"redis_url": REDIS, "key_prefix": prefix, "flush_interval": 0.05}
    config["auth"] = {"mode": "keys", "redis_url": keys_redis}
    config["telemetry"] = {"access_log": {"enabled": False}}
    config["batches"] = {"directory": str(files), "lease_s": 1.5, "per_backend": 3}
    return yaml.safe_dump(config, sort_keys=False)


def _app(config: str) -> Litestar:
    """The app, with the admin key in its environment (read when the app is built)."""
    previous = os.environ.get("SWITCHYARD_ADMIN_KEY")
    os.environ["SWITCHYARD_ADMIN_KEY"] = ADMIN_KEY
    try:
        return create_app(settings_from_text(config, "<batch trust>"))
    finally:
        if previous is None:
            os.environ.pop("SWITCHYARD_ADMIN_KEY", None)
        else:
            os.environ["SWITCHYARD_ADMIN_KEY"] = previous


@asynccontextmanager
async def _replicas(fleet: Fleet, files: Path, keys_redis: str = REDIS) -> AsyncIterator[Replicas]:
    """Two apps; their keys and limits in the Redis at `keys_redis` (a proxy the test can cut)."""
    prefix = f"itest-trust-{uuid.uuid4().hex[:10]}"
    try:
        async with AsyncExitStack() as stack:
            clients = []
            for _ in range(2):
                config = _config(fleet, prefix, files, keys_redis)
                clients.append(await stack.enter_async_context(AsyncTestClient(_app(config), timeout=30)))
            yield Replicas(clients)
    finally:
        client = aioredis.Redis.from_url(REDIS)
        for pattern in (f"*syb:{prefix}*", f"*syt:{prefix}*", f"*sy:{prefix}*"):
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
        await client.aclose()


@pytest.fixture
async def replicas(fleet: Fleet, tmp_path: Path) -> AsyncIterator[Replicas]:
    async with _replicas(fleet, tmp_path / "files") as running:
        yield running


def _line(custom_id: str, max_tokens: int = 8, model: str = MODEL) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": f"hi {custom_id}"}],
            "max_tokens": max_tokens,
        },
    }


async def _batch(client: AsyncTestClient, key: str, lines: list[dict[str, Any]]) -> str:
    auth = {"authorization": f"Bearer {key}"}
    text = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = await client.post(
        "/v1/files", files={"file": ("in.jsonl", text)}, data={"purpose": "batch"}, headers=auth
    )
    assert uploaded.status_code == 200, uploaded.text
    body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions"}
    created = await client.post("/v1/batches", json={**body, "completion_window": "24h"}, headers=auth)
    assert created.status_code == 200, created.text
    return str(created.json()["id"])


async def _get(client: AsyncTestClient, batch_id: str) -> dict[str, Any]:
    """The batch as the admin key sees it (its key may be revoked by now)."""
    answer = await client.get(f"/v1/batches/{batch_id}", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def _wait(
    client: AsyncTestClient, batch_id: str, statuses: set[str], within: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        batch = await _get(client, batch_id)
        if batch["status"] in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch['status']}: {batch}"
        await asyncio.sleep(0.05)


async def _until(check: Callable[[], Awaitable[bool]], within: float) -> float:
    """Seconds until `check` holds; fails past `within`."""
    start = time.monotonic()
    while not await check():
        assert time.monotonic() - start < within, f"not within {within} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def _jsonl(replicas: Replicas, file_id: str | None) -> list[dict[str, Any]]:
    """A result file's lines, read from the store (its key may be revoked, so it cannot download it)."""
    if file_id is None:
        return []
    service = replicas.runner(0).service

    async def read() -> bytes | None:
        stored = await service.state.get_file(file_id)
        return await service.files.get(stored.path) if stored is not None else None

    data = replicas.call(0, read)
    assert data is not None
    return [json.loads(line) for line in data.decode().splitlines() if line]


async def _done_lines(client: AsyncTestClient, batch_id: str, at_least: int) -> int:
    async def enough() -> bool:
        return int((await _get(client, batch_id))["request_counts"]["completed"]) >= at_least

    await _until(enough, 60)
    return int((await _get(client, batch_id))["request_counts"]["completed"])


def _pause(replicas: Replicas) -> None:
    """Both schedulers stop (as at a restart): what happens next happens before either sees a batch."""
    for i in range(2):
        replicas.call(i, replicas.runner(i).stop)


def _resume(replicas: Replicas) -> None:
    for i in range(2):
        replicas.call(i, replicas.runner(i).start)


def _assert_stopped(batch: dict[str, Any], errors: list[dict[str, Any]], code: str, total: int) -> None:
    """Ended `failed` for `code`, the finished lines kept and an error line for every other one."""
    assert batch["status"] == "failed" and batch["failed_at"] is not None, batch
    assert [e["code"] for e in batch["errors"]["data"]] == [code]
    counts = batch["request_counts"]
    assert counts["total"] == total and counts["completed"] + counts["failed"] == total, counts
    assert len(errors) == counts["failed"]
    for e in errors:
        assert e["response"] is None and e["error"]["code"] == code, e
        assert isinstance(e["custom_id"], str)


# --- the cases of issue 33 ---------------------------------------------------------------------------


async def test_a_zero_budget_key_gets_every_line_refused(replicas: Replicas) -> None:
    key, _ = await replicas.create_key(budget_usd=0.0)
    batch_id = await _batch(replicas.a, key, [_line(f"z-{i}") for i in range(6)])
    done = await _wait(replicas.a, batch_id, {"completed", "failed"})
    assert done["status"] == "completed" and done["request_counts"]["failed"] == 6, done
    errors = await _jsonl(replicas, done["error_file_id"])
    assert {e["response"]["body"]["error"]["code"] for e in errors} == {"insufficient_quota"}
    assert await replicas.records(batch_id) == []


async def test_a_key_revoked_right_after_create_gets_no_line_sent(replicas: Replicas) -> None:
    key, key_id = await replicas.create_key(budget_usd=10.0)
    warm = await _batch(replicas.a, key, [_line(f"w-{i}") for i in range(8)])  # the key known everywhere
    assert (await _wait(replicas.a, warm, {"completed"}))["request_counts"]["completed"] == 8
    _pause(replicas)
    batch_id = await _batch(replicas.a, key, [_line(f"r-{i}") for i in range(20)])
    await replicas.revoke(key_id)
    _resume(replicas)
    done = await _wait(replicas.b, batch_id, {"completed", "failed", "cancelled"})
    _assert_stopped(done, await _jsonl(replicas, done["error_file_id"]), "key_revoked", 20)
    assert done["request_counts"]["completed"] == 0 and done["output_file_id"] is None
    assert await replicas.records(batch_id) == [], "no line sent"
    assert "anonymous" not in await replicas.billed_keys()


async def test_a_model_restricted_key_revoked_right_after_create_gets_no_line_sent(
    replicas: Replicas,
) -> None:
    key, key_id = await replicas.create_key(models=["another-model"])
    allowed = await _batch(replicas.a, key, [_line("m-0"), _line("m-1")])
    done = await _wait(replicas.a, allowed, {"completed"})  # while the key lives: refused per line
    refused = await _jsonl(replicas, done["error_file_id"])
    assert [e["response"]["body"]["error"]["code"] for e in refused] == ["model_not_allowed"] * 2
    _pause(replicas)
    batch_id = await _batch(replicas.a, key, [_line(f"n-{i}") for i in range(10)])
    await replicas.revoke(key_id)
    _resume(replicas)
    done = await _wait(replicas.b, batch_id, {"completed", "failed", "cancelled"})
    _assert_stopped(done, await _jsonl(replicas, done["error_file_id"]), "key_revoked", 10)
    assert await replicas.records(allowed) == [] and await replicas.records(batch_id) == []
    assert "anonymous" not in await replicas.billed_keys()


async def test_a_key_revoked_mid_run_stops_its_lines_on_both_replicas_within_a_second(
    replicas: Replicas,
) -> None:
    total = 150
    key, key_id = await replicas.create_key(budget_usd=10.0)
    batch_id = await _batch(replicas.a, key, [_line(f"m-{i}", max_tokens=150) for i in range(total)])
    await _done_lines(replicas.a, batch_id, 12)

    async def running_on_both() -> bool:
        return all(replicas.running_lines(batch_id, i) > 0 for i in range(2))

    await _until(running_on_both, 10)
    await replicas.revoke(key_id)  # through replica A: B learns it from the shared store
    revoked_at = time.time()

    async def stopped() -> bool:
        return replicas.running_lines(batch_id) == 0

    took = await _until(stopped, STOP_WITHIN_S)
    await asyncio.sleep(0.3)
    assert replicas.running_lines(batch_id) == 0, "no line started after the stop"
    done = await _wait(replicas.b, batch_id, {"completed", "failed", "cancelled"}, within=10)
    errors = await _jsonl(replicas, done["error_file_id"])
    _assert_stopped(done, errors, "key_revoked", total)
    output = await _jsonl(replicas, done["output_file_id"])
    assert len(output) == done["request_counts"]["completed"] >= 12
    assert done["request_counts"]["completed"] < total - 12
    assert {o["custom_id"] for o in output}.isdisjoint(e["custom_id"] for e in errors)
    records = await replicas.records(batch_id)
    assert {r["key"] for r in records} == {key_id}
    assert max(r["finished_at"] for r in records) <= revoked_at + STOP_WITHIN_S, took
    assert "anonymous" not in await replicas.billed_keys()


async def test_a_key_expiring_mid_run_stops_its_lines_on_both_replicas_within_a_second(
    replicas: Replicas,
) -> None:
    total = 600
    expires_at = time.time() + 5.0
    key, _ = await replicas.create_key(budget_usd=10.0, expires_at=expires_at)
    batch_id = await _batch(replicas.a, key, [_line(f"x-{i}", max_tokens=60) for i in range(total)])
    await _done_lines(replicas.a, batch_id, 8)
    assert time.time() < expires_at - 0.5, "the machine is too slow for this test's timing"
    await asyncio.sleep(expires_at - time.time())

    async def stopped() -> bool:
        return replicas.running_lines(batch_id) == 0

    await _until(stopped, STOP_WITHIN_S)
    done = await _wait(replicas.b, batch_id, {"completed", "failed", "cancelled"}, within=10)
    _assert_stopped(done, await _jsonl(replicas, done["error_file_id"]), "key_expired", total)
    assert 8 <= done["request_counts"]["completed"] < total
    records = await replicas.records(batch_id)
    assert max(r["finished_at"] for r in records) <= expires_at + STOP_WITHIN_S
    assert "anonymous" not in await replicas.billed_keys()


async def test_the_admin_key_lists_and_cancels_any_tenants_batch(replicas: Replicas) -> None:
    key, _ = await replicas.create_key(budget_usd=10.0)
    other, _ = await replicas.create_key(budget_usd=10.0)
    batch_id = await _batch(replicas.a, key, [_line(f"c-{i}", max_tokens=150) for i in range(80)])
    others = await _batch(replicas.a, other, [_line("o-0")])
    listed = (await replicas.b.get("/v1/batches", params={"limit": 100}, headers=ADMIN)).json()
    assert {batch_id, others} <= {b["id"] for b in listed["data"]}
    tenant = {"authorization": f"Bearer {other}"}
    mine = (await replicas.b.get("/v1/batches", headers=tenant)).json()["data"]
    assert [b["id"] for b in mine] == [others], "a tenant key still sees only its own"
    assert (await replicas.b.post(f"/v1/batches/{batch_id}/cancel", headers=tenant)).status_code == 404
    await _done_lines(replicas.a, batch_id, 4)
    cancelled = await replicas.b.post(f"/v1/batches/{batch_id}/cancel", headers=ADMIN)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelling"
    done = await _wait(replicas.a, batch_id, {"cancelled"}, within=10)
    assert 4 <= done["request_counts"]["completed"] < 80
    seen = await replicas.a.get(f"/v1/batches/{batch_id}", headers={"authorization": f"Bearer {key}"})
    assert seen.json()["status"] == "cancelled"


async def test_no_line_is_handed_out_while_the_key_store_cannot_be_read(fleet: Fleet, tmp_path: Path) -> None:
    proxy = CuttableProxy(6379)
    try:
        async with _replicas(fleet, tmp_path / "files", f"redis://127.0.0.1:{proxy.port}/0") as replicas:
            total = 100
            key, _ = await replicas.create_key()  # no budget: admission alone would go on from a local share
            batch_id = await _batch(replicas.a, key, [_line(f"h-{i}", max_tokens=100) for i in range(total)])
            await _done_lines(replicas.a, batch_id, 5)
            proxy.set_cut(True)

            async def idle() -> bool:
                return replicas.running_lines(batch_id) == 0

            await _until(idle, STOP_WITHIN_S)  # the lines in flight finish; no other starts
            held = (await _get(replicas.a, batch_id))["request_counts"]
            for _ in range(15):
                await asyncio.sleep(0.1)
                assert replicas.running_lines(batch_id) == 0
            assert (await _get(replicas.a, batch_id))["request_counts"] == held
            assert held["completed"] < total
            proxy.set_cut(False)
            done = await _wait(replicas.a, batch_id, {"completed", "failed"})
            assert done["status"] == "completed" and done["request_counts"]["completed"] == total, done
    finally:
        proxy.close()
