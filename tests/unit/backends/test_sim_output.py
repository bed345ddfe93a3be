"""The simulator honours what applications ask of the output (issue 36): stop strings, log probabilities,
JSON mode and JSON schemas (the SDK's `.parse()`), tool calls, embedding `dimensions` and prompt lists,
through the official OpenAI SDK, streamed and not."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator

import openai
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from backends.sim.app import RunningServer, start_server
from backends.sim.options import SimOptions
from backends.sim.output import minimal_instance
from backends.sim.text import count_tokens, generate

MODEL = "llama-3.1-8b"
FAST = SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=0.2, max_model_len=2048)
ASK = [{"role": "user", "content": "Tell me about the gateway."}]


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningServer]:
    server = await start_server(FAST)
    yield server
    await server.close()


@pytest.fixture
async def client(sim: RunningServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0) as client:
        yield client


async def _plain_text(client: AsyncOpenAI, **kw: object) -> str:
    reply = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, seed=7, **kw)
    return reply.choices[0].message.content or ""


# --- stop ---------------------------------------------------------------------------------------------


async def test_a_stop_string_ends_the_answer_before_it(client: AsyncOpenAI) -> None:
    text = await _plain_text(client)
    stop = text.split()[5]
    reply = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, seed=7, stop=[stop]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == text[: text.index(stop)]
    assert stop not in (choice.message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens < 40
    streamed = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, seed=7, stop=stop, stream=True
    )
    parts, reasons = [], []
    async for chunk in streamed:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert "".join(parts) == choice.message.content and reasons[-1] == "stop"


async def test_a_stop_string_that_never_appears_changes_nothing(client: AsyncOpenAI) -> None:
    assert await _plain_text(client, stop=["§§"]) == await _plain_text(client)


@pytest.mark.parametrize("stop", [[""], ["a", "b", "c", "d", "e"], [1]])
async def test_bad_stop_values_are_refused(client: AsyncOpenAI, stop: object) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, stop=stop)  # type: ignore[arg-type]
    assert "stop" in str(caught.value)


# --- logprobs -----------------------------------------------------------------------------------------


async def test_chat_logprobs_one_entry_per_token_with_top_alternatives(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
        assert bytes(entry.bytes or []) == entry.token.encode()
    streamed = await client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=6, logprobs=True, stream=True
    )
    tokens = [
        entry.token
        async for chunk in streamed
        for c in chunk.choices
        if c.logprobs is not None and c.logprobs.content
        for entry in c.logprobs.content
    ]
    assert len(tokens) == 6


async def test_completion_logprobs_in_the_legacy_shape(client: AsyncOpenAI) -> None:
    reply = await client.completions.create(model=MODEL, prompt="The gateway", max_tokens=5, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and len(logprobs.tokens) == 5
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(5)]
    assert all(len(top) == 2 for top in logprobs.top_logprobs or [])


async def test_top_logprobs_without_logprobs_is_refused(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, top_logprobs=2)


# --- JSON -----------------------------------------------------------------------------------------------


class Address(BaseModel):
    street: str
    number: int


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]
    address: Address
    active: bool


async def test_parse_with_a_pydantic_schema_gets_a_valid_value(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person)
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == count_tokens(reply.choices[0].message.content or "") + 1


async def test_json_object_mode_answers_a_json_object_streamed_too(client: AsyncOpenAI) -> None:
    fmt = {"type": "json_object"}
    reply = await client.chat.completions.create(model=MODEL, messages=ASK, response_format=fmt)  # type: ignore[arg-type]
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    streamed = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        response_format=fmt,
        stream=True,  # type: ignore[arg-type]
    )
    text = "".join([c.delta.content or "" async for chunk in streamed for c in chunk.choices])
    assert json.loads(text) == {}


def test_minimal_instances_follow_the_schema_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 3, "maximum": 9},
            "x": {"type": "number", "exclusiveMinimum": 1},
            "s": {"type": "string", "minLength": 9, "format": "email"},
            "e": {"enum": ["b", "a"]},
            "u": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/T"}]},
            "l": {"type": "array", "items": {"type": "boolean"}, "minItems": 2},
            "k": {"const": 42},
        },
        "required": ["n", "x", "s", "e", "u", "l", "k"],
        "$defs": {"T": {"type": ["string", "null"], "maxLength": 2}},
    }
    value = minimal_instance(schema)
    assert value["n"] == 3 and value["x"] > 1 and len(value["s"]) >= 9 and "@" in value["s"]
    assert value["e"] == "b" and value["u"] == "te" and value["l"] == [False, False] and value["k"] == 42


async def test_a_bad_json_schema_is_a_400(client: AsyncOpenAI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "http://elsewhere/x"}}}
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=ASK, response_format=bad)  # type: ignore[arg-type]


# --- tools ----------------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


async def test_a_required_tool_call_is_well_formed(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice="required",  # type: ignore[list-item]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "text", "days": 1}


async def test_a_named_tool_choice_and_auto_when_the_user_asks(client: AsyncOpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice=named,  # type: ignore[list-item,arg-type]
    )
    assert (reply.choices[0].message.tool_calls or [])[0].function.name == "get_time"
    plain = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])  # type: ignore[list-item]
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    asked = [{"role": "user", "content": "Call get_weather for Paris."}]
    reply = await client.chat.completions.create(model=MODEL, messages=asked, tools=[WEATHER])  # type: ignore[list-item]
    assert (reply.choices[0].message.tool_calls or [])[0].function.name == "get_weather"


async def test_a_streamed_tool_call_reassembles(client: AsyncOpenAI) -> None:
    streamed = await client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        stream=True,  # type: ignore[list-item]
    )
    name, arguments, reasons = "", "", []
    async for chunk in streamed:
        for c in chunk.choices:
            for call in c.delta.tool_calls or []:
                name += (call.function.name if call.function else None) or ""
                arguments += (call.function.arguments if call.function else None) or ""
            reasons.append(c.finish_reason)
    assert name == "get_weather" and json.loads(arguments) == {"city": "text", "days": 1}
    assert reasons[-1] == "tool_calls"


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tool_choice": "required"},
        {"tools": [{"type": "function"}]},
        {"tools": [WEATHER], "tool_choice": "sometimes"},
    ],
)
async def test_bad_tool_requests_are_refused(client: AsyncOpenAI, extra: dict) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **extra)


# --- embeddings and prompt lists ------------------------------------------------------------------------


async def test_embedding_dimensions_shorten_and_renormalise(client: AsyncOpenAI) -> None:
    full = await client.embeddings.create(model=MODEL, input="hello")
    short = await client.embeddings.create(model=MODEL, input="hello", dimensions=16)
    vector = short.data[0].embedding
    assert len(vector) == 16 and len(full.data[0].embedding) == 64
    assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-6)
    with pytest.raises(openai.BadRequestError):
        await client.embeddings.create(model=MODEL, input="hello", dimensions=4096)


async def test_a_prompt_list_answers_each_prompt(client: AsyncOpenAI) -> None:
    prompts = ["The router", "A batch of work", "Kernel"]
    reply = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, n=2, seed=1)
    assert [c.index for c in reply.choices] == list(range(6))
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == sum(count_tokens(p) for p in prompts)
    assert reply.usage.completion_tokens == 18
    alone = await client.completions.create(model=MODEL, prompt=prompts[1], max_tokens=3, n=2, seed=1)
    assert [c.text for c in reply.choices[2:4]] == [c.text for c in alone.choices]
    streamed = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, stream=True)
    indices = {c.index async for chunk in streamed for c in chunk.choices}
    assert indices == {0, 1, 2}


def test_generation_is_unchanged_for_plain_requests() -> None:
    assert generate("m", "k", None, 0, 5, 100).text == generate("m", "k", None, 0, 5, 100).text
