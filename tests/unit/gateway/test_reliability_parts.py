"""Circuit breaker, retry budget and back-pressure queue, in isolation."""

from __future__ import annotations

import asyncio

from backends.breaker import CLOSED, HALF_OPEN, OPEN, BreakerOptions
from backends.models import Backend, Pool
from gateway.config.settings import Retries
from gateway.request.backpressure import ClassQueue
from gateway.request.limits import RetryBudget, retry_after_seconds

POOL = Pool(
    name="p", vendor="amd", accelerator="mi300x", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={}
)


def _backend() -> Backend:
    options = BreakerOptions(failure_threshold=3, open_s=0.05, half_open_probes=1, close_after=2)
    return Backend(
        name="b", url="http://127.0.0.1:1", models=frozenset({"m"}), max_model_len=4096, pool=POOL,
        breaker_options=options,
    )  # fmt: skip


async def test_breaker_opens_half_opens_with_limited_probes_and_closes():
    b = _backend()
    breaker = b.breaker
    breaker.failure("503")
    breaker.failure("503")
    assert breaker.state is CLOSED and b.healthy
    breaker.success()  # a success resets the count
    for _ in range(3):
        breaker.failure("503")
    assert breaker.state is OPEN and not b.healthy
    await asyncio.sleep(0.08)
    assert breaker.state is HALF_OPEN and b.healthy
    assert breaker.allow() and not breaker.allow(), "one probe at a time"
    breaker.success()
    assert breaker.state is HALF_OPEN and breaker.allow()
    breaker.success()
    assert breaker.state is CLOSED and breaker.opened == 1


async def test_half_open_failure_reopens_and_refusal_opens_at_once():
    b = _backend()
    b.breaker.failure("refused", at_once=True)
    assert b.breaker.state is OPEN
    await asyncio.sleep(0.08)
    assert b.breaker.allow()
    b.breaker.failure("503")
    assert b.breaker.state is OPEN and b.breaker.opened == 2 and not b.healthy
    b.breaker.close()


async def test_retry_after_pauses_then_restores_and_drain_is_independent():
    b = _backend()
    b.breaker.pause(0.05)
    assert not b.healthy
    await asyncio.sleep(0.08)
    assert b.healthy
    b.draining = True
    b.breaker.refresh()
    assert not b.healthy
    b.draining = False
    b.health_ok = False
    b.breaker.refresh()
    assert not b.healthy


def test_retry_budget_is_a_ratio_of_requests_plus_a_burst():
    budget = RetryBudget(Retries(budget_ratio=0.2, budget_burst=2))
    assert budget.take() and budget.take() and not budget.take()
    budget.requests += 10  # ten requests earn two retries
    assert budget.take() and budget.take() and not budget.take()
    assert budget.stats()["denied"] == 2
    assert 0 <= budget.backoff(3) <= min(budget.backoff_max, budget.backoff_base * 4)


def test_retry_after_header_values():
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds(None) == 1.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 1.0


async def test_queue_serves_by_priority_then_arrival():
    queue = ClassQueue()
    low = queue.join("batch")
    first = queue.join(None)
    high = queue.join("high")
    second = queue.join(None)
    assert queue.waiters == [high, first, second, low]
    queue.leave(high)
    assert queue.waiters[0] is first and first.event.is_set()
    await queue.turn(first, 1.0)  # already woken: returns at once
    assert not first.event.is_set()


async def test_open_breaker_half_opens_only_once_the_health_check_passes():
    """A backend that refuses new connections must not flap open/half-open/open and count as routable
    in between: the half-open step asks the health check (a fresh connection) first."""
    b = _backend()
    passing = False
    asked = 0

    async def confirm() -> bool:
        nonlocal asked
        asked += 1
        return passing

    b.breaker.confirm = confirm
    b.breaker.failure("refused", at_once=True)
    routable_seen = False
    for _ in range(10):  # four open periods and more
        await asyncio.sleep(0.02)
        routable_seen |= b.healthy
    assert b.breaker.state is OPEN and not routable_seen and asked >= 2
    assert b.breaker.opened == 1, "still the one opening, kept open: not re-opened by a doomed probe"
    passing = True
    await asyncio.sleep(0.08)
    assert b.breaker.state is HALF_OPEN and b.healthy
    b.breaker.close()
