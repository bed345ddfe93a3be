"""Schemathesis over the gateway's HTTP API, described by the OpenAPI document below (the gateway's
forwarding endpoints are raw ASGI handlers, so Litestar cannot derive one).

Positive and negative cases for every operation: no 5xx, every error in OpenAI's shape, refused requests
not counted, no breaker opened.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.fuzz.conftest import MODEL, FuzzGateway, assert_openai_error, wait_for_count

_COUNT = {"type": "integer", "minimum": 1, "maximum": 2}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["system", "user", "assistant"]},
        "content": {"type": "string", "maxLength": 40},
    },
}
_COMMON = {
    "model": {"enum": [MODEL]},
    "stream": {"type": "boolean"},
    "n": _COUNT,
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 8},
    "user": {"type": "string", "maxLength": 10},
}
_CHAT = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **_COMMON,
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1, "maxItems": 4},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 2},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 8},
    },
}
_COMPLETION = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **_COMMON,
        "prompt": {"type": "string", "maxLength": 60},
        "best_of": _COUNT,
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 2},
    },
}
_EMBEDDING = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"enum": [MODEL]},
        "input": {
            "oneOf": [
                {"type": "string", "maxLength": 60},
                {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 4},
            ]
        },
    },
}


def _post(schema: dict[str, Any], query: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {"200": {"description": "OK"}, "default": {"description": "OpenAI-shaped error"}},
    }
    if query:
        operation["parameters"] = query
    return {"post": operation}


def _get(query: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"get": {"parameters": query or [], "responses": {"200": {"description": "OK"}}}}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "switchyard", "version": "1"},
    "paths": {
        "/v1/chat/completions": _post(_CHAT),
        "/v1/completions": _post(_COMPLETION),
        "/v1/embeddings": _post(_EMBEDDING),
        "/admin/v1/explain": _post(
            _CHAT, [_query("endpoint", {"enum": ["chat", "completions", "embeddings"]})]
        ),
        "/v1/models": _get(),
        "/admin/v1/usage": _get([_query("by", {"enum": ["key", "model", "backend", "pool", "vendor"]})]),
        "/admin/v1/requests": _get([_query("limit", {"type": "integer", "minimum": 1, "maximum": 1000})]),
        "/admin/v1/costs": _get([_query("by", {"type": "string"}), _query("window", {"type": "string"})]),
    },
}
SCHEMA = schemathesis.openapi.from_dict(OPENAPI)
OPERATIONS = [(path, method.upper()) for path, item in OPENAPI["paths"].items() for method in item]


def _content_type(response: schemathesis.Response) -> str:
    values = response.headers.get("content-type") or [""]
    return values[0] if isinstance(values, list) else str(values)


FORWARDED = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}


CASES = [
    (path, method, mode)
    for path, method in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or OPENAPI["paths"][path][method.lower()].get("parameters") != []
]


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=[f"{m} {p} {g.value}" for p, m, g in CASES])
def test_schemathesis(fuzz_gateway: FuzzGateway, path: str, method: str, mode: GenerationMode) -> None:
    before = fuzz_gateway.requests_counted()
    served = 0
    session = requests.Session()

    @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=SCHEMA[path][method].as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        nonlocal served
        response = case.call(base_url=fuzz_gateway.base_url, session=session, timeout=15)
        if response.status_code >= 300:
            assert_openai_error(response.status_code, _content_type(response), response.content)
        else:
            assert response.status_code == 200, response.text
            served += path in FORWARDED

    try:
        check()
    finally:
        session.close()
    wait_for_count(fuzz_gateway, before + served)
    assert set(fuzz_gateway.breakers().values()) == {"closed"}
