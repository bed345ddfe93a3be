"""Gateway errors: OpenAI's error shape, SSE framing, and how backend errors are normalised."""

from __future__ import annotations

import json

import pytest

from gateway.openai.errors import (
    GatewayError,
    body_too_large,
    invalid_request,
    model_not_found,
    no_backend,
    normalise_upstream_error,
    upstream_failed,
    upstream_timeout,
)


def test_json_shape_has_exactly_four_fields():
    error = GatewayError(418, "short and stout", "teapot_error", code="teapot", param="tea")
    data = json.loads(error.to_json())
    assert data == {
        "error": {"message": "short and stout", "type": "teapot_error", "param": "tea", "code": "teapot"}
    }
    assert error.status == 418
    assert str(error) == "short and stout"
    assert error.headers == {}


def test_json_shape_keeps_null_param_and_a_code_from_the_status():
    data = json.loads(GatewayError(500, "m", "t").to_json())
    assert data == {"error": {"message": "m", "type": "t", "param": None, "code": "server_error"}}


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, "invalid_request"),
        (401, "invalid_api_key"),
        (404, "not_found"),
        (405, "method_not_allowed"),
        (418, "invalid_request"),
        (499, "client_closed_request"),
        (502, "upstream_failed"),
        (599, "server_error"),
    ],
)
def test_every_error_has_a_string_code(status: int, code: str):
    assert json.loads(GatewayError(status, "m", "t").to_json())["error"]["code"] == code


def test_to_sse_framing():
    error = upstream_timeout("b1", 2.5, "a chunk")
    frame = error.to_sse()
    assert frame.startswith(b"data: ")
    assert frame.endswith(b"\n\n")
    assert frame.count(b"\n") == 2
    assert json.loads(frame[len(b"data: ") : -2]) == json.loads(error.to_json())


@pytest.mark.parametrize(
    ("error", "status", "type_", "code", "param"),
    [
        (invalid_request("bad", param="x", code="c"), 400, "invalid_request_error", "c", "x"),
        (model_not_found("gpt-9"), 404, "invalid_request_error", "model_not_found", "model"),
        (body_too_large(1024), 413, "invalid_request_error", "request_too_large", None),
        (no_backend("m", "all unhealthy"), 503, "service_unavailable", "no_healthy_backend", None),
        (upstream_failed("b1", "boom"), 502, "upstream_error", "upstream_failed", None),
        (upstream_timeout("b1", 3, "an answer"), 504, "timeout", "upstream_timeout", None),
    ],
)
def test_constructors(error: GatewayError, status: int, type_: str, code: str, param: str | None):
    assert (error.status, error.body.type, error.body.code, error.body.param) == (status, type_, code, param)


def test_constructor_messages():
    assert "`gpt-9`" in model_not_found("gpt-9").body.message
    assert "1024 bytes" in body_too_large(1024).body.message
    assert no_backend("m", "all unhealthy").body.message.endswith("all unhealthy.")
    assert upstream_failed("b1", "boom").body.message == "Backend `b1` failed: boom."
    assert (
        upstream_timeout("b1", 0.25, "a chunk").body.message
        == "Backend `b1` did not send a chunk within 0.25 s."
    )


def test_vllm_openai_shape():
    payload = json.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 4096 tokens.",
                "type": "BadRequestError",
                "param": "messages",
                "code": 400,
            }
        }
    ).encode()
    error = normalise_upstream_error(400, payload, "b1")
    assert error.status == 400
    assert error.body.message == "This model's maximum context length is 4096 tokens."
    assert error.body.type == "invalid_request_error"
    assert error.body.param == "messages"
    assert error.body.code == "context_length_exceeded"


def test_old_flat_vllm_shape():
    payload = (
        b'{"object":"error","message":"max_tokens must be at least 1","type":"BadRequestError",'
        b'"param":null,"code":400}'
    )
    error = normalise_upstream_error(400, payload, "b1")
    assert error.status == 400
    assert error.body.message == "max_tokens must be at least 1"
    assert error.body.type == "invalid_request_error"
    assert error.body.param is None
    assert error.body.code == "backend_error"
    assert json.loads(error.to_json())["error"]["message"] == "max_tokens must be at least 1"


def test_message_only_uses_defaults():
    error = normalise_upstream_error(422, b'{"message":"nope"}', "b1")
    assert (error.body.message, error.body.type, error.body.code, error.body.param) == (
        "nope",
        "invalid_request_error",
        "backend_error",
        None,
    )


def test_plain_text_body():
    error = normalise_upstream_error(404, b"  Not Found\n", "b1")
    assert error.status == 404
    assert error.body.message == "Backend `b1` answered HTTP 404: Not Found"
    assert error.body.type == "invalid_request_error"
    assert error.body.code == "not_found"


def test_json_without_message_falls_back_to_text():
    error = normalise_upstream_error(404, b'{"detail":"Not Found"}', "b1")
    assert error.body.message == 'Backend `b1` answered HTTP 404: {"detail":"Not Found"}'


def test_empty_body():
    error = normalise_upstream_error(400, b"", "b1")
    assert error.body.message == "Backend `b1` answered HTTP 400"
    assert error.body.code == "backend_error"


def test_long_plain_text_is_truncated():
    error = normalise_upstream_error(400, b"x" * 5000, "b1")
    assert len(error.body.message) < 400


def test_5xx_is_upstream_error():
    error = normalise_upstream_error(503, b"Service Unavailable", "b1")
    assert error.status == 503
    assert error.body.type == "upstream_error"
    assert error.body.code == "upstream_failed"
    assert "HTTP 503" in error.body.message


def test_5xx_json_shape():
    payload = b'{"object":"error","message":"engine dead","type":"InternalServerError","code":500}'
    error = normalise_upstream_error(500, payload, "b1")
    assert error.body.message == "engine dead"
    assert error.body.type == "upstream_error"
    assert error.body.code == "upstream_failed"


# Recorded from vLLM 0.32 (/tmp/vprobe): its 4xx carry a class name as type and the status as an integer code.
@pytest.mark.parametrize(
    ("status", "payload", "code", "param"),
    [
        (
            400,
            b'{"error":{"message":"max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)",'
            b'"type":"BadRequestError","param":"max_tokens","code":400}}',
            "invalid_value",
            "max_tokens",
        ),
        (
            400,
            b"{\"error\":{\"message\":\"1 validation error: {'type': 'missing', 'loc': 'body.max_tokens', "
            b'\'msg\': \'Field required\'}","type":"Bad Request","param":"body.max_tokens","code":400}}',
            "missing_required",
            "max_tokens",
        ),
        (
            404,
            b'{"error":{"message":"The model `nope` does not exist. Valid aliases: tiny-llama.",'
            b'"type":"NotFoundError","param":"model","code":404}}',
            "model_not_found",
            "model",
        ),
        (
            400,
            b'{"type":"error","error":{"type":"BadRequestError","message":"max_completion_tokens=50000 '
            b"cannot be greater than max_model_len=512. Please request fewer output tokens. "
            b'(parameter=max_completion_tokens, value=50000)"}}',
            "invalid_value",
            "max_completion_tokens",
        ),
        (
            400,
            b'{"error":{"message":"This model\'s maximum context length is 512 tokens. However, you '
            b'requested 900 tokens.","type":"BadRequestError","param":null,"code":400}}',
            "context_length_exceeded",
            None,
        ),
        (
            404,
            b'{"error":{"message":"Response with id \'resp_x\' not found.","type":"invalid_request_error",'
            b'"param":"response_id","code":404}}',
            "not_found",
            "response_id",
        ),
    ],
)
def test_vllm_4xx_become_openai_types_with_string_codes(
    status: int, payload: bytes, code: str, param: str | None
):
    error = normalise_upstream_error(status, payload, "b1")
    assert error.status == status
    assert error.body.type == "invalid_request_error"
    assert error.body.code == code
    assert error.body.param == param
    assert error.body.message == json.loads(payload)["error"]["message"]


def test_a_backends_string_code_is_kept():
    payload = b'{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"too_fast"}}'
    error = normalise_upstream_error(429, payload, "b1")
    assert (error.body.type, error.body.code) == ("rate_limit_error", "too_fast")
