"""Parsing Messages and Responses API bodies: what routing reads (prompt size, max tokens), forwarded
byte for byte, and hostile bodies refused with the parameter named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.config.request_bounds import RequestLimits
from gateway.openai.errors import GatewayError
from gateway.request.classify import Caller, classify, key_id
from gateway.request.parse import Endpoint, ParsedRequest
from gateway.request.parse import parse as parse_within

SMALL = RequestLimits(max_prompt_chars=1000, max_tokens=500, max_messages=4)


def parse(endpoint: Endpoint, raw: bytes) -> ParsedRequest:
    """Parsed within bounds small enough to reach in a test."""
    return parse_within(endpoint, raw, SMALL)


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def refused(endpoint: Endpoint, raw: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(endpoint, raw)
    assert caught.value.status == 400
    return caught.value


def test_messages_prompt_counts_system_and_every_text_block() -> None:
    raw = body(
        model="m",
        max_tokens=7,
        system=[{"type": "text", "text": "be brief"}],
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi!"}]},
        ],
        stream=True,
        metadata={"user_id": "u-1"},
    )
    parsed = parse("messages", raw)
    assert (parsed.model, parsed.max_tokens, parsed.stream, parsed.typed) == ("m", 7, True, True)
    assert parsed.prompt_chars == len("be brief") + len("hello") + len("hi!")
    assert parsed.body == raw  # forwarded untouched: the stream always carries its usage
    assert parsed.user == "u-1"
    assert parsed.prompt_prefix(7) == "hello\nh"


def test_responses_prompt_counts_instructions_and_items() -> None:
    raw = body(
        model="m",
        instructions="sys",
        input=[
            {"role": "user", "content": "hello"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
            {"type": "function_call_output", "call_id": "c", "output": "42"},
        ],
        max_output_tokens=9,
    )
    parsed = parse("responses", raw)
    assert parsed.prompt_chars == len("sys") + len("hello") + len("yo") + len("42")
    assert parsed.max_tokens == 9 and parsed.body == raw and not parsed.stream
    assert parse("responses", body(model="m", input="abc")).prompt_chars == 3


@pytest.mark.parametrize(
    ("endpoint", "raw", "param"),
    [
        ("messages", body(model="m", messages=[{"role": "user", "content": "x"}]), "max_tokens"),
        ("messages", body(model="m", max_tokens=4, messages=[]), "messages"),
        (
            "messages",
            body(model="m", max_tokens=0, messages=[{"role": "user", "content": "x"}]),
            "max_tokens",
        ),
        (
            "messages",
            body(model="m", max_tokens=501, messages=[{"role": "user", "content": "x"}]),
            "max_tokens",
        ),
        (
            "messages",
            body(model="m", max_tokens=4, messages=[{"role": "user", "content": 5}]),
            "messages[0].content",
        ),
        (
            "messages",
            body(model="m", max_tokens=4, messages=[{"role": "user", "content": "x"}] * 5),
            "messages",
        ),
        (
            "messages",
            body(model="m", max_tokens=4, messages=[{"role": "user", "content": "x" * 1001}]),
            "prompt",
        ),
        ("responses", body(model="m"), "input"),
        ("responses", body(model="m", input=[]), "input"),
        ("responses", body(model="m", input=7), "input"),
        ("responses", body(model="m", input="x" * 1001), "prompt"),
        ("responses", body(model="m", input="x", max_output_tokens=501), "max_output_tokens"),
        ("responses", body(model="m", input="x", previous_response_id=5), "previous_response_id"),
        ("responses", body(model="", input="x"), "model"),
    ],
)
def test_hostile_bodies_name_their_parameter(endpoint: Endpoint, raw: bytes, param: str) -> None:
    error = refused(endpoint, raw)
    assert error.body.param == param
    assert isinstance(error.body.code, str)


def test_invalid_json_and_utf8() -> None:
    assert refused("messages", b'{"model": ').body.code == "invalid_json"
    assert refused("responses", b'{"model":"m","input":"\xff"}').body.code == "invalid_json"


def test_messages_and_responses_classify_like_chat() -> None:
    chat = parse("chat", body(model="m", messages=[{"role": "user", "content": "x" * 400}], max_tokens=50))
    messages = parse(
        "messages", body(model="m", messages=[{"role": "user", "content": "x" * 400}], max_tokens=50)
    )
    responses = parse("responses", body(model="m", input="x" * 400, max_output_tokens=50, user="u"))
    caller = Caller("req-1", "Bearer sk-1", {}, session="s-1")
    profiles = [classify(parsed, caller) for parsed in (chat, messages, responses)]
    assert {(p.prompt_tokens_estimate, p.max_tokens, p.context_needed, p.n) for p in profiles} == {
        (100, 50, 150, 1)
    }
    assert {p.key_id for p in profiles} == {key_id("Bearer sk-1")}
    assert (
        classify(responses, Caller("req-2", None, {})).session == "u"
    )  # the request's `user` without a header
