"""The response store on memory and on the real Redis (a private prefix): per-key isolation, the TTL, and
the per-key size quota (oldest dropped first), with its byte count kept exact."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from gateway.openai.errors import GatewayError
from gateway.responses.api import ResponsesApi
from gateway.responses.store import MemoryResponseStore, RedisResponseStore

QUOTA = 3000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[MemoryResponseStore | RedisResponseStore]:
    if request.param == "memory":
        yield MemoryResponseStore(ttl_s=60, max_bytes_per_key=QUOTA)
        return
    prefix = f"utest-resp-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis()
    redis_store = RedisResponseStore(client, prefix, ttl_s=60, max_bytes_per_key=QUOTA)
    try:
        yield redis_store
    finally:
        keys = [k async for k in client.scan_iter(match=f"*syr:{prefix}*")]
        if keys:
            await client.delete(*keys)
        await redis_store.close()


async def bytes_of(store: MemoryResponseStore | RedisResponseStore, owner: str) -> int:
    if isinstance(store, MemoryResponseStore):
        return store.bytes_of(owner)
    return await store.bytes_of(owner)


async def test_a_key_reads_and_deletes_only_its_own(store: MemoryResponseStore | RedisResponseStore) -> None:
    await store.put("key-a", "resp_1", b"A" * 10)
    assert await store.get("key-a", "resp_1") == b"A" * 10
    assert await store.get("key-b", "resp_1") is None
    assert not await store.delete("key-b", "resp_1")
    assert await store.get("key-a", "resp_1") == b"A" * 10
    assert await store.delete("key-a", "resp_1")
    assert await store.get("key-a", "resp_1") is None
    assert not await store.delete("key-a", "resp_1")
    assert await bytes_of(store, "key-a") == 0


async def test_the_quota_drops_the_oldest_and_counts_bytes_exactly(
    store: MemoryResponseStore | RedisResponseStore,
) -> None:
    for n in range(1, 4):
        await store.put("key-a", f"resp_{n}", bytes([48 + n]) * 1200)
        if not isinstance(store, MemoryResponseStore):
            await asyncio.sleep(0.002)  # distinct expiry scores: the order is the age
    assert await store.get("key-a", "resp_1") is None  # 3 x 1200 > 3000: the oldest made room
    assert await store.get("key-a", "resp_2") is not None and await store.get("key-a", "resp_3") is not None
    assert await bytes_of(store, "key-a") == 2400
    await store.put("key-a", "resp_3", b"x" * 100)  # replaced: its old size no longer counts
    assert await bytes_of(store, "key-a") == 1300
    await store.put("key-b", "resp_9", b"y" * 2900)  # another key's quota is its own
    assert await store.get("key-a", "resp_2") is not None
    assert await bytes_of(store, "key-b") == 2900


async def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    memory = MemoryResponseStore(ttl_s=10, max_bytes_per_key=QUOTA, clock=clock)
    await memory.put("key-a", "resp_1", b"a" * 100)
    clock.now += 5
    await memory.put("key-a", "resp_2", b"b" * 100)
    clock.now += 6
    assert await memory.get("key-a", "resp_1") is None
    assert await memory.get("key-a", "resp_2") == b"b" * 100
    assert memory.bytes_of("key-a") == 100
    clock.now += 5
    assert await memory.get("key-a", "resp_2") is None and memory.bytes_of("key-a") == 0

    prefix = f"utest-resp-{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis()
    store = RedisResponseStore(client, prefix, ttl_s=0.3, max_bytes_per_key=QUOTA)
    try:
        await store.put("key-a", "resp_1", b"a" * 100)
        assert await store.get("key-a", "resp_1") == b"a" * 100
        await asyncio.sleep(0.4)
        assert await store.get("key-a", "resp_1") is None
        assert not await store.delete("key-a", "resp_1")
        assert [k async for k in client.scan_iter(match=f"*syr:{prefix}*")] == []  # nothing left behind
    finally:
        keys = [k async for k in client.scan_iter(match=f"*syr:{prefix}*")]
        if keys:
            await client.delete(*keys)
        await store.close()


async def test_the_api_stores_a_response_with_its_input_within_the_size_bound() -> None:
    memory = MemoryResponseStore(ttl_s=60, max_bytes_per_key=QUOTA)
    api = ResponsesApi(None, memory, max_response_bytes=2000)  # type: ignore[arg-type]  # no request path
    answer = b'{"id": "resp_1", "output": [{"type": "message", "role": "assistant", "content": "hi"}]}'
    assert await api.save("key-a", [{"role": "user", "content": "hello"}], answer)
    assert await api.read("key-a", "resp_1") == answer
    assert not await api.save(
        "key-a", [{"role": "user", "content": "x" * 2000}], answer.replace(b"_1", b"_2")
    )
    assert not await api.save("key-a", [], b'{"id": "../x", "output": []}')
    assert not await api.save("key-a", [], b"not json")
    assert await memory.get("key-a", "resp_2") is None and memory.bytes_of("key-a") < 2000
    with pytest.raises(GatewayError) as caught:
        await api.read("key-b", "resp_1")
    assert (caught.value.status, caught.value.body.code) == (404, "not_found")


async def test_the_memory_store_bounds_all_keys_together() -> None:
    memory = MemoryResponseStore(ttl_s=60, max_bytes_per_key=QUOTA, max_bytes_total=5000)
    for n in range(6):  # six keys, 1000 bytes each: the first key's entry goes
        await memory.put(f"key-{n}", "resp_1", b"z" * 1000)
    assert memory.total_bytes == 5000
    assert await memory.get("key-0", "resp_1") is None and memory.bytes_of("key-0") == 0
    assert all([await memory.get(f"key-{n}", "resp_1") == b"z" * 1000 for n in range(1, 6)])


class UnreachableStore:
    """A store whose Redis is away: every call fails as redis-py does."""

    async def put(self, owner: str, response_id: str, entry: bytes) -> None:
        raise redis.exceptions.ConnectionError("Connection refused")

    async def get(self, owner: str, response_id: str) -> bytes | None:
        raise redis.exceptions.ConnectionError("Connection refused")

    async def delete(self, owner: str, response_id: str) -> bool:
        raise redis.exceptions.TimeoutError("Timeout reading from socket")

    async def close(self) -> None:
        return None


async def test_an_unreachable_store_answers_unstored_and_refuses_reads_with_503() -> None:
    api = ResponsesApi(None, UnreachableStore(), max_response_bytes=2000)  # type: ignore[arg-type]
    assert not await api.save("key-a", [], b'{"id": "resp_1", "output": []}')
    for call in (
        api.read("key-a", "resp_1"),
        api.remove("key-a", "resp_1"),
        api.earlier_items("key-a", "resp_1"),
    ):
        with pytest.raises(GatewayError) as caught:
            await call
        assert (caught.value.status, caught.value.body.code) == (503, "response_store_unavailable")
        assert caught.value.headers["retry-after"] == "1"
