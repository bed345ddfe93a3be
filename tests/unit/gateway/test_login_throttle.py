"""The admin login throttle: doubling waits per address, bounded memory, shared through a real Redis,
this replica's memory alone while Redis is away."""

from __future__ import annotations

import os
import time

import pytest
import redis.asyncio as aioredis

from gateway.admin.login_throttle import (
    FORGET_AFTER_S,
    FREE_FAILURES,
    MAX_WAIT_S,
    LoginThrottle,
    client_address,
)
from gateway.redis.client import redis_client
from tests.support import free_port

REDIS = "redis://127.0.0.1:6379/0"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_waits_double_after_the_free_failures_and_other_addresses_are_free() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    waits = [await throttle.failed("10.0.0.1", "console") for _ in range(FREE_FAILURES + 3)]
    assert waits[: FREE_FAILURES - 1] == [0.0] * (FREE_FAILURES - 1)
    assert waits[FREE_FAILURES - 1 :] == [1.0, 2.0, 4.0, 8.0]
    assert (await throttle.check("10.0.0.1")).wait_s == 8.0
    assert (await throttle.check("10.0.0.2")).wait_s == 0.0, "another address is not slowed"
    clock.now += 8.0
    gate = await throttle.check("10.0.0.1")
    assert gate.wait_s == 0.0 and gate.failed_before
    assert await throttle.failed("10.0.0.1", "console") == 16.0, "the count goes on after a wait"
    for _ in range(30):
        clock.now += MAX_WAIT_S
        assert await throttle.failed("10.0.0.1", "admin_api") <= MAX_WAIT_S
    clock.now += MAX_WAIT_S + FORGET_AFTER_S + 1
    assert not (await throttle.check("10.0.0.1")).failed_before, "forgotten after a quiet while"
    assert throttle.failures["console"] == FREE_FAILURES + 4 and throttle.failures["admin_api"] == 30


async def test_a_success_forgets_the_failures() -> None:
    throttle = LoginThrottle(clock=Clock())
    for _ in range(FREE_FAILURES - 1):
        await throttle.failed("10.0.0.1", "console")
    gate = await throttle.check("10.0.0.1")
    await throttle.succeeded("10.0.0.1", gate)
    assert await throttle.failed("10.0.0.1", "console") == 0.0


async def test_memory_is_bounded_however_many_addresses_fail() -> None:
    throttle = LoginThrottle(clock=Clock(), max_addresses=100)
    for i in range(5000):
        await throttle.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", "console")
        assert throttle.addresses <= 100
    for _ in range(FREE_FAILURES):  # the most recent failing address is kept
        await throttle.failed("192.0.2.1", "console")
    assert (await throttle.check("192.0.2.1")).wait_s > 0


def test_an_ipv6_client_counts_by_its_64() -> None:
    assert (
        client_address("2001:db8:1:2:aaaa::1")
        == client_address("2001:db8:1:2:bbbb::2")
        == "2001:db8:1:2::/64"
    )
    assert client_address("2001:db8:1:3::1") != client_address("2001:db8:1:2::1")
    assert client_address("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_address("10.0.0.1") == "10.0.0.1" and client_address(None) == "unknown"


@pytest.mark.parametrize("kind", ["redis", "cluster"])
async def test_replicas_share_the_count_and_the_wait_through_redis(
    kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("cluster_redis").url if kind == "cluster" else REDIS
    client = redis_client(url)
    namespace = "{syt:test-throttle-" + f"{os.getpid()}-{time.monotonic_ns()}" + "}"
    try:
        first, second = LoginThrottle(client, namespace), LoginThrottle(client, namespace)
        for _ in range(FREE_FAILURES - 1):
            await first.failed("10.0.0.9", "console")
        assert await second.failed("10.0.0.9", "admin_api") == 1.0, (
            "the fifth failure, counted on another replica"
        )
        gate = await first.check("10.0.0.9")
        assert 0.5 < gate.wait_s <= 1.0 and gate.failed_before
        await second.succeeded("10.0.0.9", await second.check("10.0.0.9"))
        assert not [k async for k in client.scan_iter(match=namespace + "*")], (
            "a success clears the shared count"
        )
    finally:
        keys = [k async for k in client.scan_iter(match=namespace + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_without_redis_this_replica_still_slows_guessing() -> None:
    unreachable = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    throttle = LoginThrottle(unreachable, "{syt:x}", timeout_s=0.3)
    waits = [await throttle.failed("10.0.0.1", "console") for _ in range(FREE_FAILURES)]
    assert waits[-1] == 1.0
    assert (await throttle.check("10.0.0.1")).wait_s > 0
    await unreachable.aclose()
