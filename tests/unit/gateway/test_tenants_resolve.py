"""`Tenants.resolve`: a key looked up by id (a batch's lines run as it) is the key as it is now, on the
real Redis (a private prefix) with two replicas sharing the key store."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.config.settings import AuthOptions, LedgerOptions
from gateway.ledger.factory import build_ledger
from gateway.openai.errors import GatewayError
from gateway.tenants.admission import Tenants
from gateway.tenants.keys import KeyRecord, hash_key
from gateway.tenants.store_redis import RedisTenantStore


def _replica(prefix: str, port: int = 6379, admin_hash: str | None = None) -> Tenants:
    client = aioredis.Redis(port=port, socket_timeout=0.3, socket_connect_timeout=0.3)
    options = AuthOptions(mode="keys", redis_timeout=0.3)
    ledger = build_ledger(LedgerOptions(store="memory"), [])
    return Tenants(options, RedisTenantStore(client, prefix), ledger, prefix, admin_hash=admin_hash)


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[Tenants, Tenants]]:
    prefix = "utest-resolve-" + uuid.uuid4().hex[:8]
    a, b = _replica(prefix), _replica(prefix, admin_hash=hash_key("sy-admin"))
    try:
        yield a, b
    finally:
        client = aioredis.Redis()
        names = [k async for k in client.scan_iter(match=f"*{prefix}*")]
        if names:
            await client.delete(*names)
        await client.aclose()
        for replica in (a, b):
            await replica.store.close()


async def _code(tenants: Tenants, key_id: str) -> str:
    with pytest.raises(GatewayError) as refused:
        await tenants.resolve(key_id)
    return str(refused.value.body.code)


async def test_a_key_revoked_on_one_replica_is_refused_on_the_other_after_a_sync(
    replicas: tuple[Tenants, Tenants],
) -> None:
    a, b = replicas
    key = KeyRecord(id="key_1", hash=hash_key("sy-1"), models=["m"])
    a.changed(await a.store.put_key(key))
    assert (await b.resolve("key_1")).key.models == ["m"]
    revoked = KeyRecord(id="key_1", hash=key.hash, models=["m"], revoked=True)
    a.changed(await a.store.put_key(revoked))
    assert await _code(a, "key_1") == "key_revoked"  # the replica that changed it: at once
    assert (await b.resolve("key_1")).key.id == "key_1"  # the other: cached until it reads the version
    await b.sync()
    assert await _code(b, "key_1") == "key_revoked"


async def test_a_key_past_its_expiry_is_refused_without_any_change_in_the_store(
    replicas: tuple[Tenants, Tenants],
) -> None:
    a, _ = replicas
    await a.store.put_key(KeyRecord(id="key_2", hash=hash_key("sy-2"), expires_at=time.time() + 0.2))
    assert (await a.resolve("key_2")).key.id == "key_2"
    await asyncio.sleep(0.25)
    assert await _code(a, "key_2") == "key_expired"


async def test_unknown_keys_and_the_environments_admin_key(replicas: tuple[Tenants, Tenants]) -> None:
    a, b = replicas
    assert await _code(a, "key_nope") == "key_not_found"
    assert await _code(a, "admin") == "key_not_found"  # no admin key in this replica's environment
    admin = await b.resolve("admin")
    assert admin.admin and admin.key.id == "admin"


async def test_an_unreachable_key_store_is_a_503_never_a_key() -> None:
    tenants = _replica("utest-resolve-down", port=9)
    try:
        assert await _code(tenants, "key_1") == "limits_unavailable"
        with pytest.raises(Exception):  # noqa: B017  # whatever the client raises: the caller holds its lines
            await tenants.sync()
    finally:
        await tenants.store.close()
