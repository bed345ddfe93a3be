"""Every error the API promises, in OpenAI's shape, and proof that bad input changes no state."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.conftest import FIRST_BYTE_TIMEOUT, MAX_BODY_BYTES, MODEL, Env

PROMPT = [{"role": "user", "content": "hello"}]


def client(env: Env) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base_url + "/v1", api_key="sk-test", max_retries=0)


def post(env: Env, path: str, content: bytes) -> httpx.Response:
    return httpx.post(env.base_url + path, content=content, headers={"content-type": "application/json"})


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    assert response.headers["x-request-id"]
    return error


def totals(env: Env) -> dict[str, object]:
    return httpx.get(env.base_url + "/admin/v1/usage?by=model").json()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_malformed_json_is_400(env: Env, path: str) -> None:
    before = totals(env)
    assert_openai_error(post(env, path, b'{"model": "x", '), 400, "invalid_json")
    assert_openai_error(post(env, path, b""), 400, "invalid_json")
    assert totals(env) == before


def test_missing_and_wrong_typed_fields_name_the_parameter(env: Env) -> None:
    before = totals(env)
    error = assert_openai_error(post(env, "/v1/chat/completions", b'{"model": "m"}'), 400, "missing_required")
    assert error["param"] == "messages"
    error = assert_openai_error(
        post(env, "/v1/chat/completions", b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}'),
        400,
    )
    assert error["param"] == "model"
    error = assert_openai_error(
        post(
            env, "/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": "9"}'
        ),
        400,
    )
    assert error["param"] == "max_tokens"
    error = assert_openai_error(post(env, "/v1/completions", b'{"model": "m"}'), 400, "missing_required")
    assert error["param"] == "prompt"
    error = assert_openai_error(post(env, "/v1/embeddings", b'{"model": "m", "input": 5}'), 400)
    assert error["param"] == "input"
    assert_openai_error(post(env, "/v1/chat/completions", b"[1, 2]"), 400)
    assert totals(env) == before


def test_sdk_raises_bad_request_with_the_message(env: Env) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(env).chat.completions.create(model=MODEL, messages=[])
    assert caught.value.status_code == 400
    assert "messages" in caught.value.message


def test_unknown_model_is_404(env: Env) -> None:
    before = totals(env)
    with pytest.raises(openai.NotFoundError) as caught:
        client(env).chat.completions.create(model="gpt-17", messages=PROMPT)
    assert caught.value.code == "model_not_found"
    assert "gpt-17" in caught.value.message
    assert totals(env) == before


def test_body_over_the_limit_is_413(env: Env) -> None:
    before = totals(env)
    huge = "x" * (MAX_BODY_BYTES + 10)
    response = post(env, "/v1/chat/completions", f'{{"model": "{MODEL}", "prompt": "{huge}"}}'.encode())
    assert_openai_error(response, 413, "request_too_large")
    with pytest.raises(openai.APIStatusError) as caught:
        client(env).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": huge}])
    assert caught.value.status_code == 413
    assert totals(env) == before


def test_request_longer_than_any_backend_context_is_refused_before_forwarding(env: Env) -> None:
    before = totals(env)
    with pytest.raises(openai.BadRequestError) as caught:
        client(env).chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=100_000)
    assert caught.value.code == "context_length_exceeded"
    assert "16384" in caught.value.message
    assert totals(env) == before


def test_backend_400_comes_back_in_openai_shape(env: Env) -> None:
    # The gateway's estimate lets this through to the 16k MI300X pool; the backend counts exactly and refuses.
    before = totals(env)
    with pytest.raises(openai.BadRequestError) as caught:
        client(env).chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=16380)
    assert "maximum context length" in caught.value.message
    assert totals(env) == before


def test_no_healthy_backend_is_503(env: Env) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        client(env).chat.completions.create(model="down-model", messages=PROMPT)
    assert caught.value.status_code == 503
    assert caught.value.code == "no_healthy_backend"


def test_backend_failure_is_502(env: Env) -> None:
    before = totals(env)
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as caught:
            client(env).chat.completions.create(model="broken-model", messages=PROMPT, stream=stream)
        assert caught.value.status_code == 502
        assert caught.value.code == "upstream_failed"
        assert "broken-0" in caught.value.message
    assert totals(env) == before


@pytest.mark.parametrize("stream", [False, True])
def test_backend_too_slow_is_504(env: Env, stream: bool) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client(env).chat.completions.create(model="slow-model", messages=PROMPT, max_tokens=2, stream=stream)
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert f"{FIRST_BYTE_TIMEOUT:g} s" in caught.value.message


def test_unknown_path_and_wrong_method_use_the_error_shape(env: Env) -> None:
    assert_openai_error(httpx.get(env.base_url + "/v1/nothing"), 404, "unsupported_endpoint")
    assert_openai_error(httpx.get(env.base_url + "/v1/chat/completions"), 405, "method_not_allowed")
    assert_openai_error(httpx.get(env.base_url + "/nothing"), 404, "not_found")


UNSUPPORTED = [
    "/v1/moderations",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/images/generations",
    "/v1/fine_tuning/jobs",
    "/v1/vector_stores",
    "/v1/assistants",
    "/v1/threads/thread_1/runs",
    "/v1/realtime/sessions",
    "/v1/uploads",
    "/v1/something-new",
]


@pytest.mark.parametrize("path", UNSUPPORTED)
def test_unsupported_openai_endpoints_are_404_naming_what_is_served(env: Env, path: str) -> None:
    before = totals(env)
    for method in ("POST", "GET"):
        response = httpx.request(method, env.base_url + path, json={"model": MODEL, "input": "x"})
        error = assert_openai_error(response, 404, "unsupported_endpoint")
        assert path in str(error["message"]) and "/v1/chat/completions" in str(error["message"])
    assert totals(env) == before


def test_sdk_sees_unsupported_endpoint_as_not_found(env: Env) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(env).moderations.create(input="hello")
    assert caught.value.code == "unsupported_endpoint"


def test_admin_usage_rejects_unknown_dimension(env: Env) -> None:
    assert_openai_error(httpx.get(env.base_url + "/admin/v1/usage?by=colour"), 400)
