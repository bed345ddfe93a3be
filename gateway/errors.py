"""Every error the gateway returns, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

    GatewayError                       status  type                   code
    ├── invalid_request(...)           400     invalid_request_error  (given)
    ├── model_not_found(model)         404     invalid_request_error  model_not_found
    ├── body_too_large(limit)          413     invalid_request_error  request_too_large
    ├── no_backend(model, why)         503     service_unavailable    no_healthy_backend
    ├── upstream_failed(backend, why)  502     upstream_error         upstream_failed
    └── upstream_timeout(backend, s)   504     timeout                upstream_timeout

Errors a backend itself returns with a 4xx status (vLLM's 400 for a too-long request, say) are passed on
with their status, normalised into the same shape by `normalise_upstream_error`.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ErrorBody(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


_encoder = msgspec.json.Encoder()


class GatewayError(Exception):
    """An error to return to the client; raising it anywhere on the request path ends the request."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        code: str | int | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, param=param, code=code)
        self.headers = headers or {}

    def to_json(self) -> bytes:
        return _encoder.encode(ErrorEnvelope(error=self.body))

    def to_sse(self) -> bytes:
        """The error as a final server-sent event, for a stream that has already started."""
        return b"data: " + self.to_json() + b"\n\n"


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


def normalise_upstream_error(status: int, payload: bytes, backend: str) -> GatewayError:
    """Wrap a backend's error answer (vLLM's old flat shape, the OpenAI shape, or plain text)."""
    message: str | None = None
    err_type = "invalid_request_error" if status < 500 else "upstream_error"
    param: str | None = None
    code: str | int | None = status
    try:
        data: Any = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        nested = data.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else data
        if isinstance(inner.get("message"), str):
            message = inner["message"]
            kind = inner.get("type")
            err_type = kind if isinstance(kind, str) else err_type
            param = inner.get("param") if isinstance(inner.get("param"), str) else None
            code = inner.get("code") if isinstance(inner.get("code"), str | int) else code
    if message is None:
        text = payload[:300].decode("utf-8", "replace").strip()
        message = f"Backend `{backend}` answered HTTP {status}" + (f": {text}" if text else "")
    return GatewayError(status, message, err_type, code=code, param=param)
