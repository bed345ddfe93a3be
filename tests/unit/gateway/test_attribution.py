"""Issue 15, items 2 and 3: failures a request causes do not open breakers, and a request that times out
because of its own size is not failed over. Over an in-memory transport (no sockets)."""

from __future__ import annotations

import asyncio
import json

import pytest

from backends.breaker import CLOSED, OPEN, BreakerOptions
from backends.models import Backend
from gateway.config.settings import Retries
from gateway.openai.errors import GatewayError
from gateway.request.classify import classify
from gateway.request.context import RequestContext
from gateway.request.forward import Upstream
from gateway.request.parse import parse
from gateway.upstream.connection import ConnectFailed
from tests.memory_transport import MemoryResponse, MemoryTransport, Scripted
from tests.unit.gateway.test_attempts import OK, backend, routed, upstream_of

MARKER = "poison-marker"
FAILED_500 = Scripted(status=500, chunks=[b'{"error": {"message": "Internal Server Error"}}'])


class MarkerTransport(MemoryTransport):
    """Every backend answers 500 to a body holding MARKER and 200 otherwise (a backend bug one client
    can trigger); `broken` backends answer 500 to everything."""

    def __init__(self, broken: frozenset[str] = frozenset()) -> None:
        super().__init__({})
        self.broken = broken

    async def send(
        self, base_url: str, path: str, headers: bytes, body: bytes, connect_timeout: float
    ) -> MemoryResponse:
        self.sent.append((base_url, path, headers, body))
        poisoned = MARKER.encode() in body or base_url in self.broken
        response = MemoryResponse(FAILED_500 if poisoned else OK)
        self.responses.append(response)
        return response


def fleet(count: int = 4) -> list[Backend]:
    options = BreakerOptions(failure_threshold=5, open_s=12.0)
    return [backend(f"b{i}", breaker=options) for i in range(count)]


def request(upstream: Upstream, candidates: list[Backend], content: str = "hi", **extra: object):
    ctx = routed(upstream, *candidates)
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    ctx.parsed = parse("chat", json.dumps(body).encode())
    ctx.profile = classify(ctx.parsed, ctx.caller)
    return ctx


def rotated(backends: list[Backend], i: int) -> list[Backend]:
    """The candidates as a spreading policy orders them: request i starts on backend i mod len."""
    k = i % len(backends)
    return backends[k:] + backends[:k]


async def send(upstream: Upstream, ctx: RequestContext) -> GatewayError | None:
    try:
        await upstream.complete(ctx)
    except GatewayError as error:
        return error
    finally:
        ctx.release()
    return None


def close(backends: list[Backend]) -> None:
    for b in backends:
        b.breaker.close()


async def test_bodies_that_make_every_backend_answer_500_open_no_breaker() -> None:
    """Item 2: 20 such requests (5 first landing on each backend) opened all four breakers; the next valid
    requests got 503 no_healthy_backend for the breakers' open_s."""
    backends = fleet()
    transport = MarkerTransport()
    upstream = upstream_of(transport)
    for i in range(20):
        error = await send(upstream, request(upstream, rotated(backends, i), f"hello {MARKER}"))
        assert error is not None and error.status == 502
        assert error.headers["x-switchyard-attempts"] == "2"  # a second opinion, then no more failover
        assert "takes the request as the cause" in error.body.message
    assert len(transport.sent) == 40
    assert all(b.breaker.state is CLOSED and b.breaker.failures == 0 and b.healthy for b in backends)
    for i in range(20):
        ctx = request(upstream, rotated(backends, i))
        assert await send(upstream, ctx) is None
        assert ctx.status == 200 and ctx.attempts == 1
    close(backends)


async def test_a_backend_answering_500_to_everything_still_opens_its_breaker() -> None:
    backends = fleet(2)
    sick, well = backends
    upstream = upstream_of(MarkerTransport(broken=frozenset({sick.url})))
    for _ in range(5):
        ctx = request(upstream, [sick, well])
        assert await send(upstream, ctx) is None
        assert ctx.backend is well  # failed over: the other backend served what `sick` failed
    assert sick.breaker.state is OPEN and not sick.healthy
    assert well.breaker.state is CLOSED
    close(backends)


async def test_a_refused_connection_still_counts_at_once() -> None:
    a, b = fleet(2)
    upstream = upstream_of(MemoryTransport({a.url: [ConnectFailed], b.url: [FAILED_500]}))
    assert await send(upstream, request(upstream, [a, b])) is not None
    assert a.breaker.state is OPEN
    close([a, b])


async def test_with_no_second_backend_the_health_check_decides() -> None:
    """A poison body on a model with one backend: the failure that would open the breaker asks /health."""
    (only,) = fleet(1)
    probes: list[str] = []

    async def passes() -> bool:
        probes.append(only.name)
        return True

    only.breaker.confirm = passes
    upstream = upstream_of(MarkerTransport())
    for _ in range(12):
        assert await send(upstream, request(upstream, [only], MARKER)) is not None
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert only.breaker.state is CLOSED and probes  # asked, and the backend answers: not sick

    async def fails() -> bool:
        return False

    only.breaker.confirm = fails
    for _ in range(5):
        await send(upstream, request(upstream, [only], MARKER))
    await asyncio.sleep(0.01)
    assert only.breaker.state is OPEN
    close([only])


SLOW = Scripted(delay=1.0)  # first_byte is 0.2 s in these tests


async def test_a_timeout_the_requests_size_explains_is_not_failed_over_nor_counted() -> None:
    """Item 3: `n` x `max_tokens` (within the bounds parse.py allows) far beyond what a backend does
    within first_byte timed out on each of three backends in turn, counting against each breaker."""
    backends = fleet(3)
    transport = MemoryTransport({b.url: [SLOW] for b in backends})
    upstream = upstream_of(transport)
    ctx = request(upstream, backends, n=128, max_tokens=32000)
    error = await send(upstream, ctx)
    assert error is not None and error.status == 504
    assert error.body.code == "request_too_large_for_timeout"
    assert "max_tokens=32000" in error.body.message and "n=128" in error.body.message
    assert transport.urls() == [backends[0].url]
    assert all(b.breaker.failures == 0 and b.inflight == 0 for b in backends)
    close(backends)


async def test_a_small_request_that_times_out_still_fails_over_and_counts() -> None:
    hanging, well = fleet(2)
    transport = MemoryTransport({hanging.url: [SLOW], well.url: [OK]})
    upstream = upstream_of(transport)
    ctx = request(upstream, [hanging, well], max_tokens=1)
    assert await send(upstream, ctx) is None
    assert ctx.backend is well
    assert hanging.breaker.failures == 1
    close([hanging, well])


async def test_a_request_timing_out_on_two_backends_is_the_requests_fault() -> None:
    backends = fleet(3)
    transport = MemoryTransport({b.url: [SLOW] for b in backends})
    upstream = upstream_of(transport)
    error = await send(upstream, request(upstream, backends, max_tokens=1))
    assert error is not None and error.status == 504
    assert transport.urls() == [backends[0].url, backends[1].url]
    assert all(b.breaker.failures == 0 for b in backends)
    close(backends)


@pytest.mark.parametrize("retries", [Retries(max_attempts=1, backoff_ms=0, backoff_max_ms=0)])
async def test_an_unchecked_500_without_a_health_check_counts_as_before(retries: Retries) -> None:
    (only,) = fleet(1)
    upstream = upstream_of(MarkerTransport(), retries)
    for _ in range(5):
        await send(upstream, request(upstream, [only], MARKER))
    assert only.breaker.state is OPEN
    close([only])
