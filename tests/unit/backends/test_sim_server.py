"""The simulated vLLM server, exercised over loopback with the official OpenAI SDK and raw HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import select
import socket
import struct
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from backends.sim.app import RunningServer, start_server
from backends.sim.options import SimOptions
from backends.sim.text import count_tokens

MODEL = "llama-3.1-8b"
FAST = SimOptions(models=(MODEL, "alias"), ttft_ms=2, tpot_ms=0.5, max_model_len=512)
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello, world!"}]
# system and user have 4 tokens each ("Hello" "," "world" "!"), plus 4 framing tokens each and 3 for the reply
CHAT_PROMPT_TOKENS = 4 + 4 + 4 + 4 + 3


@pytest.fixture
async def sim() -> AsyncIterator[RunningServer]:
    server = await start_server(FAST)
    yield server
    await server.close()


@pytest.fixture
async def client(sim: RunningServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture
async def http(sim: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False) as http:
        yield http


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        match = re.fullmatch(r"([^{\s]+)\{([^}]*)\} (\S+)", line)
        if match and match.group(1) == name:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(match.group(3))
    raise AssertionError(f"metric {name} {labels} not exposed")


def sse_events(body: str) -> list[str]:
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(event.startswith("data: ") for event in events)
    return [event.removeprefix("data: ") for event in events]


async def test_health_version_and_models(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    health = await http.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert (await http.get("/version")).json() == {"version": "sim-0.1"}
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL, "alias"]
    raw = (await http.get("/v1/models")).json()
    card = raw["data"][0]
    assert raw["object"] == "list"
    assert card["owned_by"] == "vllm" and card["root"] == MODEL and card["parent"] is None
    assert card["max_model_len"] == 512 and card["permission"][0]["object"] == "model_permission"


async def test_chat_non_streaming_shape_and_usage(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    result = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=7)  # type: ignore[arg-type]
    choice = result.choices[0]
    assert result.id.startswith("chatcmpl-") and result.object == "chat.completion" and result.model == MODEL
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert count_tokens(choice.message.content or "") == 7
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (CHAT_PROMPT_TOKENS, 7)
    assert result.usage.total_tokens == CHAT_PROMPT_TOKENS + 7
    raw = (
        await http.post("/v1/chat/completions", json={"messages": CHAT, "max_completion_tokens": 3})
    ).json()
    assert set(raw) == {
        *("id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage"),
        *("prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params"),
        "metrics",
    }
    assert raw["model"] == MODEL  # the default model when none is named
    assert "tool_calls" not in raw["choices"][0]["message"]  # vLLM omits it when there are none
    assert raw["choices"][0]["stop_reason"] is None and raw["usage"]["completion_tokens"] == 3
    assert raw["usage"]["prompt_tokens_details"] is None


async def test_natural_length_stops(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.create(model=MODEL, messages=CHAT)  # type: ignore[arg-type]
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None and 16 <= result.usage.completion_tokens <= 64
    # the end-of-sequence token counts as a completion token but has no text, as in vLLM
    assert count_tokens(result.choices[0].message.content or "") == result.usage.completion_tokens - 1


async def test_same_request_same_text_and_seed_matters(client: AsyncOpenAI) -> None:
    async def text(**kwargs: object) -> str:
        result = await client.completions.create(model=MODEL, prompt="Once upon a time", **kwargs)  # type: ignore[call-overload]
        return str(result.choices[0].text)

    assert await text(seed=1) == await text(seed=1)
    assert await text(seed=1) != await text(seed=2)
    assert await text(seed=1, temperature=0) == await text(seed=2, temperature=0)


@pytest.mark.parametrize("max_tokens", [None, 5])
async def test_chat_stream_matches_non_streaming(client: AsyncOpenAI, max_tokens: int | None) -> None:
    full = await client.chat.completions.create(model=MODEL, messages=CHAT, seed=7, max_tokens=max_tokens)  # type: ignore[arg-type]
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        seed=7,
        max_tokens=max_tokens,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert full.usage is not None and len(chunks) == 1 + full.usage.completion_tokens


async def test_chat_stream_wire_format_and_usage_chunk(http: httpx.AsyncClient) -> None:
    body = {"messages": CHAT, "max_tokens": 2, "stream": True}
    plain = await http.post("/v1/chat/completions", json=body)
    assert plain.headers["content-type"].startswith("text/event-stream")
    events = sse_events(plain.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": chunks[1]["choices"][0]["delta"]["content"]},
        {"content": chunks[2]["choices"][0]["delta"]["content"]},
    ]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    with_usage = await http.post(
        "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}}
    )
    events = sse_events(with_usage.text)
    usage_chunk = json.loads(events[-2])
    assert events[-1] == "[DONE]" and usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": CHAT_PROMPT_TOKENS,
        "total_tokens": CHAT_PROMPT_TOKENS + 2,
        "completion_tokens": 2,
    }
    assert all("usage" not in json.loads(e) for e in events[:-2])


async def test_completions_streaming_and_not(client: AsyncOpenAI) -> None:
    full = await client.completions.create(model="alias", prompt="The quick brown fox", max_tokens=9)
    assert full.id.startswith("cmpl-") and full.object == "text_completion" and full.model == "alias"
    assert full.usage is not None and (full.usage.prompt_tokens, full.usage.completion_tokens) == (4, 9)
    stream = await client.completions.create(
        model="alias",
        prompt="The quick brown fox",
        max_tokens=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9
    text_chunks = chunks[:-1]
    assert len(text_chunks) == 9 and all(c.object == "text_completion" for c in text_chunks)
    assert "".join(c.choices[0].text for c in text_chunks) == full.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"


async def test_n_choices(client: AsyncOpenAI) -> None:
    full = await client.chat.completions.create(model=MODEL, messages=CHAT, n=3, max_tokens=4)  # type: ignore[arg-type]
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert len({c.message.content for c in full.choices}) == 3
    assert full.usage is not None and full.usage.completion_tokens == 12
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        n=3,
        max_tokens=4,
        stream=True,  # type: ignore[arg-type]
    )
    texts = ["", "", ""]
    async for chunk in stream:
        texts[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    assert texts == [c.message.content for c in full.choices]


async def test_embeddings(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    result = await client.embeddings.create(model=MODEL, input=["hello world", "goodbye", "hello world"])
    vectors = [d.embedding for d in result.data]
    assert [d.index for d in result.data] == [0, 1, 2] and all(len(v) == 64 for v in vectors)
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6) for v in vectors)
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert result.usage.prompt_tokens == 5 and result.usage.total_tokens == 5
    raw = (await http.post("/v1/embeddings", json={"input": [1, 2, 3]})).json()
    assert raw["object"] == "list" and raw["data"][0]["object"] == "embedding"
    assert raw["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 3,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }
    b64 = await client.embeddings.create(model=MODEL, input="hello world", encoding_format="base64")
    packed = base64.b64decode(str(b64.data[0].embedding))
    assert list(struct.unpack("<64f", packed)) == pytest.approx(vectors[0], abs=1e-6)


def assert_error(response: httpx.Response, status: int, error_type: str) -> dict[str, object]:
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == error_type and body["error"]["code"] == status
    return dict(body["error"])


async def test_errors(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        await client.chat.completions.create(model="nope", messages=CHAT)  # type: ignore[arg-type]
    assert not_found.value.status_code == 404
    error = assert_error(
        await http.post("/v1/completions", json={"model": "nope", "prompt": "x"}), 404, "NotFoundError"
    )
    assert error["message"] == "The model `nope` does not exist."
    bad_json = await http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(bad_json, 400, "BadRequestError")
    assert_error(await http.post("/v1/chat/completions", json={"model": MODEL}), 400, "BadRequestError")
    assert_error(await http.post("/v1/completions", json={"model": MODEL}), 400, "BadRequestError")
    assert_error(await http.post("/v1/embeddings", json={"model": MODEL}), 400, "BadRequestError")
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=600)
    over_window = assert_error(
        await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 600}), 400, "BadRequestError"
    )
    assert over_window["param"] == "max_tokens"
    assert over_window["message"] == (
        "max_tokens=600 cannot be greater than max_model_len=512. Please request fewer output tokens. "
        "(parameter=max_tokens, value=600)"
    )
    too_long = await http.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 510})
    error = assert_error(too_long, 400, "BadRequestError")
    assert str(error["message"]).startswith(
        "This model's maximum context length is 512 tokens. However, you requested 510 output tokens and "
        "your prompt contains 3 input tokens, for a total of 513 tokens."
    )


async def test_fail_status() -> None:
    server = await start_server(SimOptions(models=(MODEL,), fail_status=503))
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
            for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
                assert_error(await http.post(path, json={"prompt": "x"}), 503, "ServiceUnavailableError")
            assert (await http.get("/health")).status_code == 200
    finally:
        await server.close()


async def test_metrics_move(client: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    before = (await http.get("/metrics")).text
    assert 'engine="0"' in before and f'model_name="{MODEL}"' in before
    await client.completions.create(model=MODEL, prompt="one two three", max_tokens=5)
    stream = await client.completions.create(model=MODEL, prompt="one two three", max_tokens=4, stream=True)
    _ = [chunk async for chunk in stream]
    after = (await http.get("/metrics")).text

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:prompt_tokens_total") == 6
    assert delta("vllm:prefix_cache_queries_total") == 6
    assert delta("vllm:generation_tokens_total") == 9
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:inter_token_latency_seconds_count") == 7
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    assert metric(after, "vllm:e2e_request_latency_seconds_bucket", le="+Inf") == metric(
        after, "vllm:e2e_request_latency_seconds_count"
    )
    assert metric(after, "vllm:num_requests_running") == 0
    assert metric(after, "vllm:num_requests_waiting") == 0
    assert metric(after, "vllm:kv_cache_usage_perc") == 0


async def test_running_gauge_and_kv_usage_while_generating() -> None:
    slow = await start_server(SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=20, kv_capacity_tokens=1000))
    try:
        async with httpx.AsyncClient(base_url=slow.url, trust_env=False) as slow_http:
            task = asyncio.create_task(
                slow_http.post("/v1/completions", json={"prompt": "a b", "max_tokens": 10})
            )
            await asyncio.sleep(0.08)
            text = (await slow_http.get("/metrics")).text
            assert metric(text, "vllm:num_requests_running") == 1
            assert 0 < metric(text, "vllm:kv_cache_usage_perc") <= 12 / 1000
            assert (await task).status_code == 200
            assert metric((await slow_http.get("/metrics")).text, "vllm:num_requests_running") == 0
    finally:
        await slow.close()


@pytest.mark.parametrize("handler_cancellation", [True, False])
async def test_client_disconnect_aborts_stream(handler_cancellation: bool) -> None:
    options = SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=10)
    server = await start_server(options, handler_cancellation=handler_cancellation)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
            body = {"prompt": "tell me a long story", "max_tokens": 500, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as response:
                seen = 0
                async for line in response.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 3:
                        break
            assert server.stats.running in (0, 1)
            for _ in range(300):
                if not server.stats.running:
                    break
                await asyncio.sleep(0.01)
            text = (await http.get("/metrics")).text
        assert metric(text, "vllm:num_requests_running") == 0
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1
        assert metric(text, "vllm:request_success_total", finished_reason="length") == 0
        assert 3 <= metric(text, "vllm:generation_tokens_total") < 100
        assert metric(text, "vllm:kv_cache_usage_perc") == 0
    finally:
        await server.close()


async def test_pacing_follows_timing() -> None:
    server = await start_server(SimOptions(models=(MODEL,), ttft_ms=60, tpot_ms=10))
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
            started = time.monotonic()
            response = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 5})
            elapsed = time.monotonic() - started
        assert response.status_code == 200
        assert 0.1 <= elapsed < 0.5  # 60 ms to the first token, then 4 gaps of 10 ms
    finally:
        await server.close()


async def test_client_giving_up_on_non_streaming_request_aborts_it() -> None:
    server = await start_server(SimOptions(models=(MODEL,), ttft_ms=20, tpot_ms=10))
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=0.1) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 100})
            for _ in range(300):
                if not server.stats.running:
                    break
                await asyncio.sleep(0.01)
            text = (await http.get("/metrics")).text
        assert metric(text, "vllm:num_requests_running") == 0
        assert metric(text, "vllm:request_success_total", finished_reason="abort") == 1
        assert 1 <= metric(text, "vllm:generation_tokens_total") < 100  # what it produced before the abort
    finally:
        await server.close()


async def test_a_burst_of_new_connections_is_queued_not_dropped(sim: RunningServer) -> None:
    # 600 connections opened while the server's loop is busy (it accepts none of them until this returns
    # control): the kernel completes each handshake into the listen backlog, as uvicorn's 2,048 does for
    # vLLM. With aiohttp's default of 128, all but ~129 SYNs were dropped and those clients saw connection
    # errors after retrying: the gateway's burst of new streams was measuring the simulator, not the policy.
    sockets = []
    try:
        for _ in range(600):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((sim.host, sim.port))
            sockets.append(s)
        connected: set[socket.socket] = set()
        deadline = time.monotonic() + 0.5
        while len(connected) < len(sockets) and time.monotonic() < deadline:
            _, writable, _ = select.select([], [s for s in sockets if s not in connected], [], 0.1)
            connected.update(s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
        assert len(connected) == len(sockets)
    finally:
        for s in sockets:
            s.close()
