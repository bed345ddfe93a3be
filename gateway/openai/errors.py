"""Every error the gateway returns, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

    GatewayError                       status  type                   code
    ├── invalid_request(...)           400     invalid_request_error  (given)
    ├── model_not_found(model)         404     invalid_request_error  model_not_found
    ├── body_too_large(limit)          413     invalid_request_error  request_too_large
    ├── no_backend(model, why)         503     service_unavailable    no_healthy_backend
    ├── upstream_failed(backend, why)  502     upstream_error         upstream_failed
    ├── upstream_timeout(backend, s)   504     timeout                upstream_timeout
    └── unsupported_endpoint(path)     404     invalid_request_error  unsupported_endpoint

On `/v1/messages` the same errors are sent in Anthropic's shape (`anthropic_error_json`).

Every error has a string `code`: one not given is the status's (`CODE_BY_STATUS`). Errors a backend
itself returns with a 4xx status (vLLM's 400 for a too-long request, say) are passed on with their
status and message, normalised into the same shape by `normalise_upstream_error` (vLLM's own types such
as `BadRequestError` and its integer codes become OpenAI's type and a string code).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec


class ErrorBody(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None = None
    code: str = "error"


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


_encoder = msgspec.json.Encoder()

CODE_BY_STATUS = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    422: "invalid_request",
    429: "rate_limit_exceeded",
    499: "client_closed_request",
    500: "server_error",
    502: "upstream_failed",
    503: "service_unavailable",
    504: "upstream_timeout",
}
"""The code of an error made without one."""


def code_for_status(status: int) -> str:
    return CODE_BY_STATUS.get(status) or ("invalid_request" if status < 500 else "server_error")


class GatewayError(Exception):
    """An error to return to the client; raising it anywhere on the request path ends the request."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, param=param, code=code or code_for_status(status))
        self.headers = headers or {}

    def to_json(self) -> bytes:
        return _encoder.encode(ErrorEnvelope(error=self.body))

    def to_sse(self) -> bytes:
        """The error as a final server-sent event, for a stream that has already started."""
        return b"data: " + self.to_json() + b"\n\n"


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
"""The `/v1/messages` route answers every error in Anthropic's shape, its type from the status."""


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")


def anthropic_error_json(error: GatewayError) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}`: Anthropic's envelope of a gateway error."""
    inner = {"type": anthropic_error_type(error.status), "message": error.body.message}
    return _encoder.encode({"type": "error", "error": inner})


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", code=code, param=param)


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model `{model}` does not exist or is not served by any configured pool.",
        "invalid_request_error",
        code="model_not_found",
        param="model",
    )


def body_too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"Request body is larger than the gateway's limit of {limit} bytes.",
        "invalid_request_error",
        code="request_too_large",
    )


def no_backend(model: str, why: str) -> GatewayError:
    return GatewayError(
        503,
        f"No backend can serve model `{model}` right now: {why}.",
        "service_unavailable",
        code="no_healthy_backend",
    )


def ledger_unavailable(why: str) -> GatewayError:
    return GatewayError(
        503,
        f"The usage ledger cannot be read right now ({why}); requests are still served and their usage "
        "is buffered. Retry shortly.",
        "server_error",
        code="ledger_unavailable",
        headers={"retry-after": "1"},
    )


def upstream_failed(backend: str, why: str) -> GatewayError:
    return GatewayError(502, f"Backend `{backend}` failed: {why}.", "upstream_error", code="upstream_failed")


def upstream_timeout(backend: str, seconds: float, what: str) -> GatewayError:
    return GatewayError(
        504,
        f"Backend `{backend}` did not send {what} within {seconds:g} s.",
        "timeout",
        code="upstream_timeout",
    )


SERVED_ENDPOINTS = (
    "POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /v1/responses "
    "(GET and DELETE /v1/responses/{id}), POST /v1/messages (Anthropic), GET /v1/models, and /v1/batches "
    "and /v1/files when batches are enabled"
)


def unsupported_endpoint(path: str) -> GatewayError:
    return GatewayError(
        404,
        f"`{path}` is not served by this gateway. It serves {SERVED_ENDPOINTS}.",
        "invalid_request_error",
        code="unsupported_endpoint",
    )


_OPENAI_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "rate_limit_error",
    }
)
_TYPE_BY_STATUS = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
_PARAM_IN_MESSAGE = re.compile(r"\(parameter=([A-Za-z0-9_.\[\]]+)")
_CONTEXT_MARKERS = ("maximum context length", "maximum model length", "context_length_exceeded")


def _upstream_code(status: int, message: str, param: str | None) -> str:
    """A string code for a backend's 4xx, recognised from its status, message and parameter."""
    text = message.lower()
    if any(marker in text for marker in _CONTEXT_MARKERS) or ("max_model_len" in text and "prompt" in text):
        return "context_length_exceeded"
    if status == 404 and (param == "model" or ("model" in text and "does not exist" in text)):
        return "model_not_found"
    if status == 404:
        return "not_found"
    if "field required" in text or "'missing'" in text:
        return "missing_required"
    if status == 429:
        return "rate_limit_exceeded"
    if param is not None and status in (400, 422):
        return "invalid_value"
    return "backend_error"


def normalise_upstream_error(status: int, payload: bytes, backend: str) -> GatewayError:
    """Wrap a backend's error answer (OpenAI's shape, vLLM's flat or Anthropic-shaped errors, plain text)
    in OpenAI's shape: its message and parameter kept, its type one of OpenAI's, its code a string (the
    backend's own string code, else one recognised from the answer, else `backend_error`)."""
    message: str | None = None
    err_type: str | None = None
    param: str | None = None
    code: str | None = None
    try:
        data: Any = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        nested = data.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else data
        if isinstance(inner.get("message"), str):
            message = inner["message"]
            err_type = inner.get("type") if isinstance(inner.get("type"), str) else None
            param = inner.get("param") if isinstance(inner.get("param"), str) else None
            given = inner.get("code")
            code = given if isinstance(given, str) and given and not given.isdigit() else None
    if message is None:
        text = payload[:300].decode("utf-8", "replace").strip()
        message = f"Backend `{backend}` answered HTTP {status}" + (f": {text}" if text else "")
    if param is not None:
        param = param.removeprefix("body.")
    else:
        named = _PARAM_IN_MESSAGE.search(message)
        param = named.group(1) if named else None
    if status >= 500:
        return GatewayError(status, message, "upstream_error", code=code or "upstream_failed", param=param)
    if err_type not in _OPENAI_TYPES:
        err_type = _TYPE_BY_STATUS.get(status, "invalid_request_error")
    return GatewayError(
        status, message, err_type, code=code or _upstream_code(status, message, param), param=param
    )
