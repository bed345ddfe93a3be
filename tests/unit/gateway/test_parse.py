"""Request parsing: what is forwarded, what the gateway reads from the body, and every 400."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.openai.errors import GatewayError
from gateway.request.parse import UPSTREAM_PATHS, parse

MSG = [{"role": "user", "content": "hello"}]


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


# --- what is forwarded ------------------------------------------------------------------------------------


def test_non_streaming_body_is_forwarded_byte_identical():
    # Odd spacing, key order and vLLM extras must survive untouched.
    body = (
        b'{ "model" : "llama",  "messages": [{"role":"user","content":"hi"}],'
        b' "top_k": 40, "guided_json": {"type": "object"}, "temperature": 0.70, "stream": false }'
    )
    parsed = parse("chat", body)
    assert parsed.body == body
    assert parsed.stream is False
    assert parsed.model == "llama"
    assert parsed.endpoint == "chat"


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("completions", b'{"model":"m","prompt":"x","top_k":5,"repetition_penalty":1.1}'),
        ("embeddings", b'{"model":"e","input":["a","b"],"encoding_format":"float"}'),
    ],
)
def test_other_endpoints_forward_body_unchanged(endpoint: str, body: bytes):
    assert parse(endpoint, body).body == body  # type: ignore[arg-type]


def test_streaming_body_requests_usage_and_keeps_everything_else():
    original = {
        "model": "llama",
        "messages": MSG,
        "stream": True,
        "stream_options": {"continuous_usage_stats": False},
        "top_k": 40,
        "guided_json": {"type": "object", "properties": {"a": {"type": "string"}}},
        "temperature": 0.5,
    }
    parsed = parse("chat", _body(**original))
    assert parsed.stream is True
    assert parsed.client_wants_usage is False
    sent = json.loads(parsed.body)
    assert sent["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert {k: v for k, v in sent.items() if k != "stream_options"} == {
        k: v for k, v in original.items() if k != "stream_options"
    }


@pytest.mark.parametrize("options", [None, "absent", {"include_usage": False}, {"include_usage": None}])
def test_streaming_without_usage_request_gets_include_usage(options: Any):
    fields: dict[str, Any] = {"model": "m", "messages": MSG, "stream": True}
    if options != "absent":
        fields["stream_options"] = options
    parsed = parse("chat", _body(**fields))
    assert parsed.client_wants_usage is False
    assert json.loads(parsed.body)["stream_options"]["include_usage"] is True


def test_streaming_client_that_asked_for_usage_is_forwarded_unchanged():
    body = _body(model="m", messages=MSG, stream=True, stream_options={"include_usage": True}, top_k=3)
    parsed = parse("chat", body)
    assert parsed.client_wants_usage is True
    assert parsed.body == body


def test_streaming_completions_request_usage():
    parsed = parse("completions", _body(model="m", prompt="abc", stream=True, best_of=2))
    sent = json.loads(parsed.body)
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["best_of"] == 2
    assert parsed.client_wants_usage is False


def test_embeddings_never_stream_and_body_untouched():
    body = _body(model="e", input="abc", stream=True)
    parsed = parse("embeddings", body)
    assert parsed.stream is False
    assert parsed.body == body


def test_upstream_paths():
    assert UPSTREAM_PATHS == {
        "chat": "/v1/chat/completions",
        "completions": "/v1/completions",
        "embeddings": "/v1/embeddings",
        "messages": "/v1/messages",
        "responses": "/v1/responses",
    }


# --- what the gateway reads -----------------------------------------------------------------------------


def test_prompt_chars_string_content():
    msgs = [{"role": "system", "content": "abcd"}, {"role": "user", "content": "efghij"}]
    assert parse("chat", _body(model="m", messages=msgs)).prompt_chars == 10


def test_prompt_chars_list_content_parts():
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "abc"},
                {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
                {"type": "text", "text": "de"},
            ],
        },
        {"role": "assistant", "content": None},
        {"role": "user", "content": "fg"},
    ]
    assert parse("chat", _body(model="m", messages=msgs)).prompt_chars == 7


def test_prompt_chars_completions_prompt_string_and_lists():
    assert parse("completions", _body(model="m", prompt="hello")).prompt_chars == 5
    assert parse("completions", _body(model="m", prompt=["ab", "cde"])).prompt_chars == 5
    # token-id prompts: each id counts as four characters
    assert parse("completions", _body(model="m", prompt=[[1, 2, 3]])).prompt_chars == 12


def test_prompt_chars_embeddings_input():
    assert parse("embeddings", _body(model="e", input="abcdef")).prompt_chars == 6
    assert parse("embeddings", _body(model="e", input=["ab", "c"])).prompt_chars == 3


def test_max_tokens_and_precedence():
    assert parse("chat", _body(model="m", messages=MSG)).max_tokens is None
    assert parse("chat", _body(model="m", messages=MSG, max_tokens=50)).max_tokens == 50
    assert parse("chat", _body(model="m", messages=MSG, max_completion_tokens=70)).max_tokens == 70
    both = _body(model="m", messages=MSG, max_tokens=50, max_completion_tokens=70)
    assert parse("chat", both).max_tokens == 70
    assert parse("completions", _body(model="m", prompt="x", max_tokens=9)).max_tokens == 9
    assert parse("embeddings", _body(model="e", input="x")).max_tokens is None


def test_n_defaults_to_one():
    assert parse("chat", _body(model="m", messages=MSG)).n == 1
    assert parse("chat", _body(model="m", messages=MSG, n=None)).n == 1
    assert parse("chat", _body(model="m", messages=MSG, n=3)).n == 3
    assert parse("completions", _body(model="m", prompt="x", n=2)).n == 2


# --- errors ---------------------------------------------------------------------------------------------


def _err(endpoint: str, body: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse(endpoint, body)  # type: ignore[arg-type]
    error = info.value
    assert error.status == 400
    assert error.body.type == "invalid_request_error"
    return error


@pytest.mark.parametrize("endpoint", ["chat", "completions", "embeddings"])
def test_empty_body(endpoint: str):
    error = _err(endpoint, b"")
    assert error.body.code == "invalid_json"
    assert error.body.param is None
    assert "empty" in error.body.message


@pytest.mark.parametrize("body", [b"{", b"not json", b'{"model": "m",}', b"\xff\xfe"])
def test_invalid_json(body: bytes):
    error = _err("chat", body)
    assert error.body.code == "invalid_json"
    assert "not valid JSON" in error.body.message


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"42", b"null"])
def test_non_object_json(body: bytes):
    error = _err("chat", body)
    assert error.body.code == "invalid_type"
    assert error.body.param is None
    assert "Expected `object`" in error.body.message


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", _body(messages=MSG), "model"),
        ("chat", _body(model="m"), "messages"),
        ("completions", _body(model="m"), "prompt"),
        ("completions", _body(prompt="x"), "model"),
        ("embeddings", _body(model="e"), "input"),
        ("chat", _body(model="m", messages=[{"content": "x"}]), "messages[0].role"),
    ],
)
def test_missing_required(endpoint: str, body: bytes, param: str):
    error = _err(endpoint, body)
    assert error.body.code == "missing_required"
    assert error.body.param == param
    assert f"`{param}`" in error.body.message


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", _body(model=1, messages=MSG), "model"),
        ("chat", _body(model="m", messages="hi"), "messages"),
        ("chat", _body(model="m", messages=MSG, stream="yes"), "stream"),
        ("chat", _body(model="m", messages=MSG, max_tokens="10"), "max_tokens"),
        ("chat", _body(model="m", messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (
            "chat",
            _body(model="m", messages=MSG, stream=True, stream_options={"include_usage": "y"}),
            "stream_options.include_usage",
        ),
        ("completions", _body(model="m", prompt=5), "prompt"),
        ("embeddings", _body(model="e", input=3), "input"),
    ],
)
def test_wrong_types(endpoint: str, body: bytes, param: str):
    error = _err(endpoint, body)
    out_of_range = b'": 0' in body or b"-5" in body or b'"messages": []' in body
    assert error.body.code == ("invalid_value" if out_of_range else "invalid_type")
    assert error.body.param == param
    assert f"`{param}`" in error.body.message


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat", _body(model="m", messages=[]), "messages"),
        ("chat", _body(model="m", messages=MSG, max_tokens=0), "max_tokens"),
        ("chat", _body(model="m", messages=MSG, max_tokens=-5), "max_tokens"),
        ("chat", _body(model="m", messages=MSG, max_completion_tokens=0), "max_completion_tokens"),
        ("chat", _body(model="m", messages=MSG, n=0), "n"),
        ("completions", _body(model="m", prompt="x", n=0), "n"),
        ("completions", _body(model="m", prompt="x", max_tokens=0), "max_tokens"),
        ("embeddings", _body(model="e", input=[]), "input"),
        ("embeddings", _body(model="e", input=""), "input"),
    ],
)
def test_wrong_values(endpoint: str, body: bytes, param: str):
    """The right type, a value out of range: `invalid_value`, as docs/api.md's error table says."""
    error = _err(endpoint, body)
    assert error.body.code == "invalid_value"
    assert error.body.param == param
    assert f"`{param}`" in error.body.message


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", _body(model="", messages=MSG)),
        ("completions", _body(model="", prompt="x")),
        ("embeddings", _body(model="", input="x")),
    ],
)
def test_empty_model(endpoint: str, body: bytes):
    error = _err(endpoint, body)
    assert error.body.param == "model"
    assert error.body.code == "invalid_value"
