"""The gateway through the official OpenAI SDK, sync and async, against the simulated fleet."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from tests.integration.conftest import MODEL, Env
from tests.support import metric, sim_metrics

PROMPT = [{"role": "user", "content": "Tell me about HBM bandwidth on MI300X."}]


def client(env: Env, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url + "/v1", api_key="sk-test-client", max_retries=0, **kwargs)


def aclient(env: Env) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=env.base_url + "/v1", api_key="sk-test-client", max_retries=0)


def ledger_record(env: Env, request_id: str) -> dict[str, object]:
    for _ in range(50):
        for record in httpx.get(env.base_url + "/admin/v1/requests?limit=1000").json()["data"]:
            if record["request_id"] == request_id:
                return record
        time.sleep(0.02)
    raise AssertionError(f"{request_id} not in the ledger")


def usage_totals(env: Env) -> dict[str, dict[str, object]]:
    data = httpx.get(env.base_url + "/admin/v1/usage?by=backend").json()["data"]
    return {row["name"]: row for row in data}


def test_chat_non_streaming_returns_backend_answer_usage_and_routing_headers(env: Env) -> None:
    raw = client(env).chat.completions.with_raw_response.create(model=MODEL, messages=PROMPT, max_tokens=12)
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 12
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 12
    backend = raw.headers["x-switchyard-backend"]
    assert raw.headers["x-switchyard-pool"] in {"h100", "mi300x"}
    assert (
        raw.headers["x-switchyard-vendor"]
        == {"h100": "nvidia", "mi300x": "amd"}[raw.headers["x-switchyard-pool"]]
    )
    assert raw.headers["x-request-id"].startswith("req-")
    assert float(raw.headers["x-switchyard-cost-usd"]) > 0
    record = ledger_record(env, raw.headers["x-request-id"])
    assert record["backend"] == backend
    assert record["prompt_tokens"] == completion.usage.prompt_tokens
    assert record["completion_tokens"] == 12
    assert record["usage_source"] == "backend"


def test_client_request_id_is_kept(env: Env) -> None:
    raw = client(env).chat.completions.with_raw_response.create(
        model=MODEL, messages=PROMPT, max_tokens=2, extra_headers={"x-request-id": "my-trace-0001"}
    )
    assert raw.headers["x-request-id"] == "my-trace-0001"
    # the ledger keys the request on an id the gateway made; the client's is only kept alongside
    ledger_id = raw.headers["x-switchyard-request-id"]
    assert ledger_id.startswith("req-") and len(ledger_id) == 4 + 32
    assert ledger_record(env, ledger_id)["client_request_id"] == "my-trace-0001"


def test_stream_reassembles_to_the_non_streaming_content_and_hides_usage_unless_asked(env: Env) -> None:
    sdk = client(env)
    args = {"model": MODEL, "messages": PROMPT, "max_tokens": 20, "seed": 7}
    whole = sdk.chat.completions.create(**args)
    raw = sdk.chat.completions.with_raw_response.create(stream=True, **args)
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert all(c.usage is None for c in chunks), "usage chunk must not reach a client that did not ask"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    record = ledger_record(env, raw.headers["x-request-id"])
    assert record["usage_source"] == "backend"
    assert record["completion_tokens"] == whole.usage.completion_tokens
    assert record["prompt_tokens"] == whole.usage.prompt_tokens


def test_stream_with_include_usage_ends_with_the_usage_chunk(env: Env) -> None:
    sdk = client(env)
    whole = sdk.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=9)
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=9, stream=True, stream_options={"include_usage": True}
        )
    )
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert chunks[-1].choices == []
    usage = chunks[-1].usage.model_dump()
    cost = usage.pop("switchyard_cost_usd")  # the request's cost estimate, as x-switchyard-cost-usd
    assert usage == whole.usage.model_dump() and 0 < cost < 1


async def test_async_client_chat_and_stream(env: Env) -> None:
    sdk = aclient(env)
    completion = await sdk.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5)
    assert completion.usage.completion_tokens == 5
    stream = await sdk.chat.completions.create(
        model=MODEL, messages=PROMPT, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage.completion_tokens == 5
    await sdk.close()


async def test_concurrent_requests_spread_over_backends(env: Env) -> None:
    sdk = aclient(env)
    replies = await asyncio.gather(
        *(
            sdk.chat.completions.with_raw_response.create(model=MODEL, messages=PROMPT, max_tokens=30)
            for _ in range(16)
        )
    )
    used = {r.headers["x-switchyard-backend"] for r in replies}
    assert used == {"h100-0", "h100-1", "mi300x-0", "mi300x-1"}
    await sdk.close()


def test_completions_non_streaming_and_streaming(env: Env) -> None:
    sdk = client(env)
    whole = sdk.completions.create(model=MODEL, prompt="The KV cache holds", max_tokens=8, seed=3)
    assert whole.usage.completion_tokens == 8
    chunks = list(
        sdk.completions.create(
            model=MODEL,
            prompt="The KV cache holds",
            max_tokens=8,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_embeddings(env: Env) -> None:
    result = client(env).embeddings.create(model=MODEL, input=["first text", "second text"])
    assert [d.index for d in result.data] == [0, 1]
    assert len(result.data[0].embedding) > 0
    assert result.usage.prompt_tokens > 0


def test_models_lists_every_served_model(env: Env) -> None:
    ids = {m.id for m in client(env).models.list()}
    assert {MODEL, "slow-model", "broken-model", "down-model", "echo-model"} == ids


def test_unknown_parameters_pass_through_and_backend_key_is_sent(env: Env) -> None:
    sdk = client(env)
    sdk.chat.completions.create(
        model="echo-model",
        messages=PROMPT,
        extra_body={"top_k": 5, "guided_json": {"type": "object"}, "repetition_penalty": 1.1},
        extra_headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    )
    path, headers, body = env.recorder.requests[-1]
    assert path == "/v1/chat/completions"
    assert (
        body["top_k"] == 5 and body["guided_json"] == {"type": "object"} and body["repetition_penalty"] == 1.1
    )
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered["authorization"] == "Bearer sk-backend-secret", "backend key from the environment"
    assert "sk-test-client" not in json.dumps(headers), "the client's key is never forwarded"
    assert lowered["traceparent"].startswith("00-0af7651916cd43dd")
    assert lowered["x-request-id"].startswith("req-")


def test_stream_body_forwarded_with_usage_requested_and_other_fields_intact(env: Env) -> None:
    sdk = client(env)
    with pytest.raises(openai.APIError):
        # The recording backend answers JSON to a stream request; what matters is the body it saw.
        list(
            sdk.chat.completions.create(
                model="echo-model", messages=PROMPT, stream=True, extra_body={"top_k": 2}
            )
        )
    _, _, body = env.recorder.requests[-1]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["top_k"] == 2


def test_client_disconnect_mid_stream_cancels_the_upstream_request(env: Env) -> None:
    async def scenario() -> str:
        sdk = aclient(env)
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=2000, stream=True
        )
        stream = raw.parse()
        received = 0
        async for _chunk in stream:
            received += 1
            if received == 3:
                break
        await stream.close()
        await sdk.close()
        return raw.headers["x-switchyard-backend"]

    before = {b.name: sim_metrics(b.url) for b in env.fleet.backends if b.model == MODEL}
    backend = asyncio.run(scenario())
    url = env.backend_url(backend)
    deadline = time.monotonic() + 5
    while True:
        values = sim_metrics(url)
        if metric(values, "vllm:num_requests_running") == 0:
            break
        assert time.monotonic() < deadline, "the backend kept generating after the client left"
        time.sleep(0.05)
    aborted = metric(values, "vllm:request_success_total", finished_reason="abort")
    assert aborted == metric(before[backend], "vllm:request_success_total", finished_reason="abort") + 1
    generated = metric(values, "vllm:generation_tokens_total") - metric(
        before[backend], "vllm:generation_tokens_total"
    )
    assert 2 <= generated < 2000


def test_health_and_ready(env: Env) -> None:
    assert httpx.get(env.base_url + "/health").json() == {"status": "ok"}
    ready = httpx.get(env.base_url + "/ready")
    assert ready.status_code == 200
    assert ready.json()["backends_healthy"] >= 4
