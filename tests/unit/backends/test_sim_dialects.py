"""The simulator's Responses API and Messages API, through the official `openai` and `anthropic` SDKs, in the
shapes vLLM 0.32 answers (tests/vllm checks the same calls against a real server)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anthropic
import httpx
import openai
import pytest
from openai import AsyncOpenAI

from backends.sim.app import RunningServer, start_server
from backends.sim.options import SimOptions

MODEL = "llama-3.1-8b"
FAST = SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=0.2, max_model_len=1024)


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningServer]:
    server = await start_server(FAST)
    yield server
    await server.close()


@pytest.fixture
async def client(sim: RunningServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture
async def claude(sim: RunningServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=sim.url, api_key="x", max_retries=0) as client:
        yield client


# --- Responses ------------------------------------------------------------------------------------------


async def test_a_response_has_its_text_usage_and_status(client: AsyncOpenAI) -> None:
    response = await client.responses.create(model=MODEL, input="Hello there", max_output_tokens=5)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.output_text and response.usage is not None
    assert response.usage.output_tokens == 5
    assert response.usage.total_tokens == response.usage.input_tokens + 5
    natural = await client.responses.create(model=MODEL, input="Hello there", instructions="Be terse.")
    assert natural.status == "completed" and natural.incomplete_details is None


async def test_a_streamed_response_sends_the_typed_events_in_order(client: AsyncOpenAI) -> None:
    stream = await client.responses.create(model=MODEL, input="Hello there", max_output_tokens=4, stream=True)
    kinds, text, final = [], "", None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            final = event.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final is not None and final.output_text == text and final.usage is not None
    assert final.usage.output_tokens == 4


async def test_input_items_tools_and_a_json_format(client: AsyncOpenAI) -> None:
    items = [
        {"role": "developer", "content": "Be terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "What's the weather?"}]},
    ]
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    called = await client.responses.create(model=MODEL, input=items, tools=[tool], tool_choice="required")  # type: ignore[arg-type,list-item]
    (call,) = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "text"}
    fmt = {"format": {"type": "json_schema", "name": "x", "schema": tool["parameters"]}}
    shaped = await client.responses.create(model=MODEL, input="Weather?", text=fmt)  # type: ignore[arg-type]
    assert json.loads(shaped.output_text) == {"city": "text"}


async def test_nothing_is_stored_as_in_vllm(client: AsyncOpenAI) -> None:
    first = await client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model=MODEL, input="And?", previous_response_id=first.id)


@pytest.mark.parametrize(
    "body", [{"input": 5}, {"input": []}, {"input": [{"role": "robot", "content": "x"}]}]
)
async def test_bad_response_requests_are_400s(sim: RunningServer, body: dict) -> None:
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False) as http:
        reply = await http.post("/v1/responses", json={"model": MODEL, **body})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input"


# --- Messages -------------------------------------------------------------------------------------------


async def test_a_message_has_content_usage_and_stop_reason(claude: anthropic.AsyncAnthropic) -> None:
    message = await claude.messages.create(
        model=MODEL, max_tokens=5, system="Be terse.", messages=[{"role": "user", "content": "Hello there"}]
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5
    (block,) = message.content
    assert block.type == "text" and block.text


async def test_a_streamed_message_reassembles(claude: anthropic.AsyncAnthropic) -> None:
    async with claude.messages.stream(
        model=MODEL, max_tokens=6, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.output_tokens == 6 and final.usage.input_tokens > 0
    assert final.stop_reason == "max_tokens"


async def test_stop_sequences_and_tool_use(claude: anthropic.AsyncAnthropic) -> None:
    plain = await claude.messages.create(
        model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Hi"}]
    )
    text = plain.content[0].text  # type: ignore[union-attr]
    stop = text.split()[3]
    cut = await claude.messages.create(
        model=MODEL, max_tokens=40, stop_sequences=[stop], messages=[{"role": "user", "content": "Hi"}]
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    tool = {
        "name": "lookup",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    }
    used = await claude.messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Find it"}],
    )
    assert used.stop_reason == "tool_use"
    (block,) = used.content
    assert block.type == "tool_use" and block.name == "lookup" and block.input == {"q": "text"}


async def test_message_errors_have_anthropics_shape(
    claude: anthropic.AsyncAnthropic, sim: RunningServer
) -> None:
    with pytest.raises(anthropic.NotFoundError):
        await claude.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False) as http:
        reply = await http.post(
            "/v1/messages", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        )
    assert reply.status_code == 400
    body = reply.json()
    assert body["type"] == "error" and "max_tokens" in body["error"]["message"]
