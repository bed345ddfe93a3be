"""A backend that refuses a prompt as longer than its context window: the request goes at once to a
candidate with a longer one (routing fits prompts by an estimate of their tokens, which can undercount)."""

from __future__ import annotations

import json

import pytest

from backends.models import Backend
from gateway.config.settings import Retries
from gateway.openai.errors import GatewayError
from tests.memory_transport import SSE, MemoryTransport, Scripted
from tests.unit.gateway.test_attempts import OK, POOL, routed, upstream_of

# What vLLM answers (the simulator says the same, backends/sim/protocol.py)
TOO_LONG = Scripted(
    status=400,
    chunks=[
        b'{"object": "error", "message": "This model\'s maximum context length is 4096 tokens. However, '
        b"you requested 5200 tokens (5000 in the messages, 200 in the completion). Please reduce the "
        b'length of the messages or completion.", "type": "BadRequestError", "param": null, "code": 400}'
    ],
)
BAD_PARAM = Scripted(
    status=400,
    chunks=[
        b'{"error": {"message": "temperature must be at most 2", "type": "BadRequestError", "code": 400}}'
    ],
)
NO_RETRIES = Retries(max_attempts=1, budget_burst=0, budget_ratio=0, backoff_ms=0, backoff_max_ms=0)


def backend(name: str, max_model_len: int) -> Backend:
    return Backend(
        name=name, url=f"mem://{name}", models=frozenset({"m"}), max_model_len=max_model_len, pool=POOL
    )


async def test_a_prompt_too_long_for_the_first_backend_is_served_by_a_longer_one_at_once() -> None:
    short, also_short, long = backend("short", 4096), backend("also-short", 4096), backend("long", 32768)
    transport = MemoryTransport({short.url: [TOO_LONG], also_short.url: [TOO_LONG], long.url: [OK]})
    upstream = upstream_of(transport, NO_RETRIES)  # neither max_attempts nor the budget allows a retry
    ctx = routed(upstream, short, also_short, long)
    answer = await upstream.complete(ctx)
    assert (ctx.status, ctx.backend, ctx.attempts, ctx.tried) == (200, long, 2, ["short", "long"])
    assert answer.body == OK.chunks[0]
    assert transport.urls() == [short.url, long.url]  # the other 4k backend would refuse it too: skipped
    assert short.breaker.failures == 0  # the estimate missed, not the backend
    assert upstream.budget.denied == 0 and upstream.budget.retries == 0
    assert (short.inflight, long.inflight) == (0, 1)
    assert transport.responses[0].released
    ctx.release()


async def test_a_stream_too_long_for_the_first_backend_streams_from_a_longer_one() -> None:
    short, long = backend("short", 8192), backend("long", 131072)
    streamed = Scripted(headers=dict(SSE), chunks=[b"data: {}\n\n"])
    transport = MemoryTransport({short.url: [TOO_LONG], long.url: [streamed]})
    upstream = upstream_of(transport)
    ctx = routed(upstream, short, long, stream=True)
    opened = await upstream.open_stream(ctx)
    assert (ctx.status, ctx.backend, ctx.attempts) == (200, long, 2)
    assert opened.first_chunk == b"data: {}\n\n"
    assert short.breaker.failures == 0
    ctx.release()


async def test_with_no_longer_candidate_the_refusal_reaches_the_client_as_it_was() -> None:
    a, b = backend("a", 4096), backend("b", 4096)
    transport = MemoryTransport({a.url: [TOO_LONG], b.url: [OK]})
    upstream = upstream_of(transport)
    ctx = routed(upstream, a, b)
    answer = await upstream.complete(ctx)
    assert (ctx.status, ctx.attempts) == (400, 1)
    assert "maximum context length is 4096" in json.loads(answer.body)["message"]
    assert transport.urls() == [a.url]
    assert a.breaker.failures == 0
    ctx.release()


async def test_when_the_longer_candidates_cannot_be_tried_the_client_gets_the_refusal() -> None:
    short, long = backend("short", 4096), backend("long", 32768)
    long.breaker.failure("test: out of routing", at_once=True)
    transport = MemoryTransport({short.url: [TOO_LONG], long.url: [OK]})
    upstream = upstream_of(transport)
    with pytest.raises(GatewayError) as info:
        await upstream.complete(routed(upstream, short, long))
    assert info.value.status == 400
    assert "maximum context length is 4096" in info.value.body.message
    assert info.value.headers["x-switchyard-backend"] == "short"
    assert transport.urls() == [short.url]
    long.breaker.close()


async def test_any_other_400_is_the_clients_and_is_not_sent_elsewhere() -> None:
    short, long = backend("short", 4096), backend("long", 32768)
    transport = MemoryTransport({short.url: [BAD_PARAM], long.url: [OK]})
    upstream = upstream_of(transport)
    ctx = routed(upstream, short, long)
    await upstream.complete(ctx)
    assert (ctx.status, ctx.backend) == (400, short)
    assert transport.urls() == [short.url]
    ctx.release()
