"""Bodies a hostile or careless client sends: invalid UTF-8, deep nesting, values past the gateway's bounds.

Each must be a 400 in OpenAI's shape (a GatewayError), never an exception that becomes a 500, and never a
body that is forwarded unchecked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.config.request_bounds import RequestLimits
from gateway.openai.errors import GatewayError
from gateway.request.parse import DEFAULT_LIMITS, Endpoint, parse

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hello"}]'


def _err(endpoint: Endpoint, body: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(endpoint, body, limits)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", b'{"model":"ll\xffama","messages":[{"role":"user","content":"hello"}]}'),
        ("chat", b'{"model":"m","messages":[{"role":"us\xfer","content":"hello"}]}'),
        ("chat", b'{"model":"m","messages":[{"role":"user","content":"hel\xfflo"}]}'),
        ("chat", b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"\xc3"}]}]}'),
        ("chat", CHAT + b',"max_tokens":4,"x":"\xff"}'),
        ("chat", CHAT + b',"stream":true,"x":"\xed\xa0\x80"}'),
        ("chat", CHAT + b',"metadata":{"\xff":1}}'),
        ("completions", b'{"model":"m","prompt":"hel\xfflo"}'),
        ("completions", b'{"model":"m","prompt":"hello","stream":true,"extra":["\xf8\x88\x80\x80\x80"]}'),
        ("embeddings", b'{"model":"m","input":"hel\xfflo"}'),
        ("embeddings", b'{"model":"m","input":["ok","\xc0\xaf"]}'),
    ],
)
def test_invalid_utf8_anywhere_is_400(endpoint: Endpoint, body: bytes) -> None:
    error = _err(endpoint, body)
    assert error.body.code == "invalid_json"
    assert "UTF-8" in error.body.message


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [1000, 5000, 100_000])
@pytest.mark.parametrize(
    ("endpoint", "template"),
    [
        ("chat", CHAT + b',"x":%s}'),
        ("chat", CHAT + b',"stream":true,"x":%s}'),
        ("chat", b'{"model":"m","messages":[{"role":"user","content":%s}]}'),
        ("chat", CHAT + b',"metadata":{"a":%s}}'),
        ("completions", b'{"model":"m","prompt":%s}'),
        ("completions", b'{"model":"m","prompt":"x","logit_bias":{"1":%s}}'),
        ("embeddings", b'{"model":"m","input":%s}'),
    ],
)
def test_deep_nesting_anywhere_is_400(endpoint: Endpoint, template: bytes, depth: int) -> None:
    error = _err(endpoint, template % _nested(depth))
    assert error.body.code == "invalid_json"
    assert "nested" in error.body.message


def test_moderate_nesting_in_an_unknown_field_is_forwarded() -> None:
    body = CHAT + b',"guided_json":' + b'{"a":' * 50 + b"1" + b"}" * 50 + b"}"
    assert parse("chat", body).body == body


@pytest.fixture
def limits() -> RequestLimits:
    return RequestLimits(
        max_n=4,
        max_tokens=100,
        max_best_of=3,
        max_logprobs=5,
        max_messages=3,
        max_prompt_chars=50,
        max_embedding_inputs=2,
    )


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}).encode()


def _completion(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": "hi", **fields}).encode()


@pytest.mark.parametrize(
    ("endpoint", "at_bound", "past_bound", "param"),
    [
        ("chat", _chat(n=4), _chat(n=5), "n"),
        ("completions", _completion(n=4), _completion(n=5), "n"),
        ("chat", _chat(max_tokens=100), _chat(max_tokens=101), "max_tokens"),
        ("chat", _chat(max_completion_tokens=100), _chat(max_completion_tokens=101), "max_completion_tokens"),
        ("completions", _completion(max_tokens=100), _completion(max_tokens=101), "max_tokens"),
        ("completions", _completion(best_of=3), _completion(best_of=4), "best_of"),
        ("completions", _completion(logprobs=5), _completion(logprobs=6), "logprobs"),
        ("chat", _chat(logprobs=True, top_logprobs=5), _chat(logprobs=True, top_logprobs=6), "top_logprobs"),
        (
            "chat",
            _chat(messages=[{"role": "user", "content": "x"}] * 3),
            _chat(messages=[{"role": "user", "content": "x"}] * 4),
            "messages",
        ),
        (
            "chat",
            _chat(messages=[{"role": "user", "content": "x" * 50}]),
            _chat(messages=[{"role": "user", "content": "x" * 25}, {"role": "user", "content": "x" * 26}]),
            "prompt",
        ),
        ("completions", _completion(prompt="x" * 50), _completion(prompt="x" * 51), "prompt"),
        (
            "embeddings",
            json.dumps({"model": "e", "input": ["a", "b"]}).encode(),
            json.dumps({"model": "e", "input": ["a", "b", "c"]}).encode(),
            "input",
        ),
        (
            "embeddings",
            json.dumps({"model": "e", "input": "x" * 50}).encode(),
            json.dumps({"model": "e", "input": "x" * 51}).encode(),
            "prompt",
        ),
    ],
)
def test_bounds_are_configurable_and_name_the_parameter(
    limits: RequestLimits, endpoint: Endpoint, at_bound: bytes, past_bound: bytes, param: str
) -> None:
    assert parse(endpoint, at_bound, limits).body == at_bound
    error = _err(endpoint, past_bound, limits)
    assert error.body.code == "invalid_value"
    assert error.body.param == param
    assert f"`{param}`" in error.body.message


@pytest.mark.parametrize("field", ["n", "max_tokens", "max_completion_tokens"])
def test_a_number_past_int64_is_refused_by_default(field: str) -> None:
    error = _err("chat", _chat(**{field: 9223372036854775808, "max_tokens": 1} | {field: 2**63}))
    assert error.body.code == "invalid_value"
    assert error.body.param == field


@pytest.mark.parametrize("body", [_completion(logprobs=-1), _completion(best_of=0), _chat(top_logprobs=-1)])
def test_negative_counts_are_invalid_values(body: bytes) -> None:
    endpoint: Endpoint = "chat" if b"messages" in body else "completions"
    assert _err(endpoint, body).body.code == "invalid_value"


def test_empty_embedding_input_list_is_refused() -> None:
    error = _err("embeddings", b'{"model":"e","input":[]}')
    assert error.body.param == "input"
    assert error.body.code == "invalid_value"


def test_default_bounds_allow_ordinary_requests() -> None:
    parse("chat", _chat(n=8, max_tokens=4096, logprobs=True, top_logprobs=20))
    parse("completions", _completion(n=2, best_of=4, logprobs=5, max_tokens=32_000))


@pytest.mark.parametrize("number", [b"9" * 5000, b"1e999999", b"-1e999999"])
def test_a_huge_number_in_an_unknown_field_of_a_stream_is_forwarded_as_sent(number: bytes) -> None:
    # The stream's body is re-encoded to ask for usage; its other fields are copied, never decoded.
    body = CHAT + b',"stream":true,"stream_options":{"continuous_usage_stats":true},"extra":' + number + b"}"
    parsed = parse("chat", body)
    assert b'"extra":' + number in parsed.body
    forwarded = json.loads(parsed.body.replace(number, b"0"))
    assert forwarded["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert forwarded["messages"] == [{"role": "user", "content": "hello"}]
