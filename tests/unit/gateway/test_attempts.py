"""Retries, failover, breaker feedback and the retry budget, over an in-memory transport (no sockets)."""

from __future__ import annotations

import asyncio
import json

import pytest

from backends.breaker import CLOSED, OPEN, BreakerOptions
from backends.models import Backend, Pool
from gateway.config.settings import Retries, Timeouts
from gateway.openai.errors import GatewayError
from gateway.request.attempts import _Within
from gateway.request.classify import Caller, classify
from gateway.request.context import RequestContext
from gateway.request.forward import Upstream
from gateway.request.parse import parse
from gateway.upstream.connection import ConnectFailed
from policies.framework import Decision
from tests.memory_transport import SSE, MemoryTransport, Scripted

POOL = Pool(
    name="p", vendor="nvidia", accelerator="h100", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={}
)
TIMEOUTS = Timeouts(connect=1.0, first_byte=0.2, between_chunks=0.15)
NO_BACKOFF = Retries(backoff_ms=0, backoff_max_ms=0)
OK = Scripted(chunks=[b'{"usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}'])
FAILED_502 = Scripted(status=502, chunks=[b'{"error": {"message": "bad gateway"}}'])


def backend(name: str, api_key: str | None = None, breaker: BreakerOptions | None = None) -> Backend:
    return Backend(
        name=name,
        url=f"mem://{name}",
        models=frozenset({"m"}),
        max_model_len=4096,
        pool=POOL,
        api_key=api_key,
        breaker_options=breaker,
    )


def routed(upstream: Upstream, *candidates: Backend, stream: bool = False) -> RequestContext:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    parsed = parse("chat", json.dumps(body).encode())
    ctx = RequestContext("chat", Caller(request_id="req-1", authorization=None, forwarded={}))
    ctx.parsed = parsed
    ctx.profile = classify(parsed, ctx.caller)
    ctx.decision = Decision(candidates=list(candidates), route="r")
    ctx.limits = upstream.defaults
    return ctx


def upstream_of(transport: MemoryTransport, retries: Retries = NO_BACKOFF) -> Upstream:
    return Upstream(transport, TIMEOUTS, 8, retries)


async def test_a_503_moves_the_request_to_the_next_candidate() -> None:
    a, b = backend("a"), backend("b")
    transport = MemoryTransport({a.url: [Scripted(status=503)], b.url: [OK]})
    upstream = upstream_of(transport)
    ctx = routed(upstream, a, b)
    answer = await upstream.complete(ctx)
    assert (ctx.status, ctx.backend, ctx.attempts, ctx.tried) == (200, b, 2, ["a", "b"])
    assert answer.body == OK.chunks[0]
    assert transport.urls() == [a.url, b.url]
    assert (a.inflight, b.inflight, ctx.holding) == (0, 1, True)  # the end of the request gives b's back
    assert (a.breaker.failures, b.breaker.failures) == (1, 0)
    assert transport.responses[0].released  # the 503's connection was kept, not dropped
    ctx.release()
    assert b.inflight == 0


async def test_a_refused_connection_opens_the_breaker_at_once_and_fails_over() -> None:
    a, b = backend("a"), backend("b")
    transport = MemoryTransport({a.url: [ConnectFailed], b.url: [OK]})
    upstream = upstream_of(transport)
    ctx = routed(upstream, a, b)
    await upstream.complete(ctx)
    assert ctx.backend is b
    assert a.breaker.state is OPEN and a.healthy is False
    assert b.breaker.state is CLOSED
    a.breaker.close()


async def test_a_429_pauses_the_backend_without_counting_it_broken() -> None:
    a, b = backend("a"), backend("b")
    busy = Scripted(status=429, headers={"retry-after": "2"}, chunks=[b"{}"])
    transport = MemoryTransport({a.url: [busy], b.url: [OK]})
    upstream = upstream_of(transport)
    ctx = routed(upstream, a, b)
    await upstream.complete(ctx)
    assert ctx.backend is b
    assert a.breaker.failures == 0 and a.breaker.state is CLOSED
    assert a.healthy is False  # paused for its Retry-After
    a.breaker.close()


async def test_a_success_clears_the_breakers_failure_count() -> None:
    a = backend("a")
    a.breaker.failures = 3
    upstream = upstream_of(MemoryTransport({a.url: [OK]}))
    await upstream.complete(routed(upstream, a))
    assert a.breaker.failures == 0


async def test_max_attempts_bounds_the_backends_tried() -> None:
    a, b, c = backend("a"), backend("b"), backend("c")
    transport = MemoryTransport({x.url: [FAILED_502] for x in (a, b, c)})
    upstream = upstream_of(transport, Retries(max_attempts=2, backoff_ms=0, backoff_max_ms=0))
    with pytest.raises(GatewayError):
        await upstream.complete(routed(upstream, a, b, c))
    assert transport.urls() == [a.url, b.url]
    assert (a.inflight, b.inflight, c.inflight) == (0, 0, 0)


async def test_an_empty_retry_budget_stops_retrying() -> None:
    a, b = backend("a"), backend("b")
    transport = MemoryTransport({a.url: [FAILED_502], b.url: [OK]})
    upstream = upstream_of(transport, Retries(budget_burst=0, budget_ratio=0, backoff_ms=0))
    with pytest.raises(GatewayError) as info:
        await upstream.complete(routed(upstream, a, b))
    assert info.value.status == 502
    assert transport.urls() == [a.url]
    assert upstream.budget.denied == 1
    assert "x-switchyard-attempts" not in info.value.headers  # one backend tried: nothing to add


async def test_an_error_after_two_backends_names_both_and_counts_the_attempts() -> None:
    """Defect 5: the 502 carried no `x-switchyard-attempts` and named only the last backend."""
    a, b = backend("gpu-a"), backend("gpu-b")
    upstream = upstream_of(MemoryTransport({a.url: [FAILED_502], b.url: [FAILED_502]}))
    with pytest.raises(GatewayError) as info:
        await upstream.complete(routed(upstream, a, b))
    error = info.value
    assert error.status == 502
    assert error.headers["x-switchyard-attempts"] == "2"
    assert error.headers["x-switchyard-backends-tried"] == "gpu-a,gpu-b"
    assert "`gpu-b`" in error.body.message and "gpu-a" in error.body.message


async def test_a_stream_refused_then_served_names_both_when_its_second_backend_fails() -> None:
    a, b = backend("a"), backend("b")
    not_events = Scripted(status=200, chunks=[b"{}"])  # a stream answered with JSON: not retried
    upstream = upstream_of(MemoryTransport({a.url: [ConnectFailed], b.url: [not_events]}))
    with pytest.raises(GatewayError) as info:
        await upstream.open_stream(routed(upstream, a, b, stream=True))
    assert info.value.headers["x-switchyard-backends-tried"] == "a,b"
    assert (a.inflight, b.inflight) == (0, 0)
    a.breaker.close()


async def test_the_backend_gets_its_auth_and_the_passed_on_headers() -> None:
    a = backend("a", api_key="sk-a")
    transport = MemoryTransport({a.url: [Scripted(headers=dict(SSE), chunks=[b"data: {}\n\n"])]})
    upstream = upstream_of(transport)
    ctx = routed(upstream, a, stream=True)
    ctx.caller.forwarded["x-request-id"] = "req-1"
    opened = await upstream.open_stream(ctx)
    assert opened.first_chunk == b"data: {}\n\n"
    _, path, headers, body = transport.sent[0]
    assert path == "/v1/chat/completions"
    assert b"Authorization: Bearer sk-a\r\n" in headers and b"x-request-id: req-1\r\n" in headers
    assert body == ctx.parsed.body


async def test_an_attempts_time_limit_raises_timeout_error_out_of_the_block() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError), _Within(loop, 0.01):
        await asyncio.sleep(1)
    with _Within(loop, 0.05):  # done in time: nothing raised, and no cancel left behind
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def test_a_cancel_from_elsewhere_within_an_attempts_time_limit_stays_a_cancel() -> None:
    async def attempt() -> None:
        with _Within(asyncio.get_running_loop(), 0.02):
            await asyncio.sleep(1)

    task = asyncio.create_task(attempt())
    await asyncio.sleep(0.005)
    task.cancel()  # the client left (DisconnectWatch), before the time limit
    with pytest.raises(asyncio.CancelledError):
        await task

    async def both() -> None:
        within = _Within(asyncio.get_running_loop(), 10)
        with within:
            within._expire()  # the time limit passes, and the client leaves, before the attempt resumes
            current = asyncio.current_task()
            assert current is not None
            current.cancel()
            await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(both())
