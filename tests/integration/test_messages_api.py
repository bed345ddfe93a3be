"""Anthropic's Messages API through the gateway, spoken by Anthropic's own SDK: routed and accounted like
chat, every error in Anthropic's shape."""

from __future__ import annotations

import secrets
import time
from typing import Any

import anthropic
import httpx
import pytest

from gateway.request.classify import key_id
from tests.integration.conftest import MODEL, Env

PROMPT = [{"role": "user", "content": "hello there"}]


def client(env: Env, api_key: str | None = None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env.base_url, api_key=api_key or new_key(), max_retries=0)


def new_key() -> str:
    return "sk-msg-" + secrets.token_hex(8)


def usage_of(env: Env, api_key: str, requests: int, timeout: float = 10.0) -> dict[str, Any]:
    """The ledger's totals for `api_key` once it has counted `requests` of its requests."""
    name = key_id(f"Bearer {api_key}")
    deadline = time.monotonic() + timeout
    while True:
        rows = httpx.get(env.base_url + "/admin/v1/usage?by=key").json()["data"]
        row = next((r for r in rows if r["name"] == name), None)
        if row is not None and row["requests"] >= requests:
            return row
        assert time.monotonic() < deadline, f"the ledger did not count {requests} requests of {name}: {row}"
        time.sleep(0.05)


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}
    assert body["error"]["type"] == kind and set(body["error"]) == {"type", "message"}
    assert body["error"]["message"]
    assert response.headers["x-request-id"]
    return str(body["error"]["message"])


def test_create_is_routed_and_accounted_in_the_ledger(env: Env) -> None:
    key = new_key()
    raw = client(env, key).messages.with_raw_response.create(model=MODEL, max_tokens=8, messages=PROMPT)
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8
    assert raw.headers["x-switchyard-backend"]
    assert raw.headers["x-switchyard-class"]
    row = usage_of(env, key, 1)
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
        1,
        message.usage.input_tokens,
        message.usage.output_tokens,
    )


def test_stream_relays_anthropics_events_and_accounts_their_usage(env: Env) -> None:
    key = new_key()
    with client(env, key).messages.stream(model=MODEL, max_tokens=12, messages=PROMPT) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    row = usage_of(env, key, 1)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        final.usage.input_tokens,
        final.usage.output_tokens,
    )


def test_x_api_key_and_bearer_are_the_same_key(env: Env) -> None:
    key = new_key()
    body = {"model": MODEL, "max_tokens": 4, "messages": PROMPT}
    by_header = httpx.post(env.base_url + "/v1/messages", json=body, headers={"x-api-key": key})
    by_bearer = httpx.post(
        env.base_url + "/v1/messages", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert by_header.status_code == by_bearer.status_code == 200
    assert usage_of(env, key, 2)["requests"] == 2
    both = {"x-api-key": key, "authorization": f"Bearer {new_key()}"}
    message = assert_anthropic_error(
        httpx.post(env.base_url + "/v1/messages", json=body, headers=both), 400, "invalid_request_error"
    )
    assert "x-api-key" in message
    twice = [("x-api-key", key), ("x-api-key", new_key())]
    assert_anthropic_error(
        httpx.post(env.base_url + "/v1/messages", json=body, headers=twice), 400, "invalid_request_error"
    )
    assert usage_of(env, key, 2)["requests"] == 2


def test_gateway_errors_come_in_anthropics_shape(env: Env) -> None:
    key = new_key()
    url = env.base_url + "/v1/messages"
    headers = {"x-api-key": key}
    assert_anthropic_error(
        httpx.post(url, content=b'{"model": ', headers=headers), 400, "invalid_request_error"
    )
    message = assert_anthropic_error(
        httpx.post(url, json={"model": MODEL, "messages": PROMPT}, headers=headers),
        400,
        "invalid_request_error",
    )
    assert "max_tokens" in message
    assert_anthropic_error(
        httpx.post(url, json={"model": MODEL, "max_tokens": 4, "messages": []}, headers=headers),
        400,
        "invalid_request_error",
    )
    assert_anthropic_error(
        httpx.post(url, json={"model": "claude-17", "max_tokens": 4, "messages": PROMPT}, headers=headers),
        404,
        "not_found_error",
    )
    assert_anthropic_error(httpx.get(url, headers=headers), 405, "invalid_request_error")
    assert_anthropic_error(
        httpx.post(url, json={"model": "down-model", "max_tokens": 4, "messages": PROMPT}, headers=headers),
        503,
        "overloaded_error",
    )
    assert_anthropic_error(
        httpx.post(url, json={"model": "broken-model", "max_tokens": 4, "messages": PROMPT}, headers=headers),
        502,
        "api_error",
    )
    rows = httpx.get(env.base_url + "/admin/v1/usage?by=key").json()["data"]
    assert key_id(f"Bearer {key}") not in {r["name"] for r in rows}  # no error changed the ledger


def test_backend_4xx_keeps_its_message_in_anthropics_shape(env: Env) -> None:
    # Past the H100s' 4k context the gateway lets it through to the 16k MI300X, whose count refuses it.
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(env).messages.create(model=MODEL, max_tokens=16380, messages=PROMPT)
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "context length" in caught.value.message


def test_sdk_raises_its_own_error_classes(env: Env) -> None:
    with pytest.raises(anthropic.NotFoundError):
        client(env).messages.create(model="claude-17", max_tokens=4, messages=PROMPT)
    with pytest.raises(anthropic.BadRequestError):
        client(env).messages.create(model=MODEL, max_tokens=4, messages=[])
    with pytest.raises(anthropic.InternalServerError) as caught:
        client(env).messages.create(model="broken-model", max_tokens=4, messages=PROMPT, stream=True)
    assert caught.value.status_code == 502
