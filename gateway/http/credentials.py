"""Where every route reads the caller's credentials: one `Authorization` value, and never two.

A request carrying `Authorization` (or `x-api-key`) twice answers 400 `duplicate_header` on every route:
behind a proxy that checks one of the two, the gateway must not bill the other. The `/v1` fast path
reads its headers in one pass of its own (gateway/http/routes.py `read_caller`) with the same rule and error;
every other route goes through `authorization` (the app's guard `one_credential`, then the handlers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.openai.errors import GatewayError, invalid_request

AUTHORIZATION = b"authorization"
API_KEY = b"x-api-key"


def duplicate_header(name: bytes) -> GatewayError:
    header = name.decode("latin-1")
    return invalid_request(
        f"The request has more than one `{header}` header; send exactly one.",
        param=header,
        code="duplicate_header",
    )


def authorization(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The request's `Authorization` value (ASGI headers); 400 when a credential header comes twice."""
    value: str | None = None
    api_key = False
    for name, raw in headers:
        if name == AUTHORIZATION:
            if value is not None:
                raise duplicate_header(name)
            value = raw.decode("latin-1")
        elif name == API_KEY:
            if api_key:
                raise duplicate_header(name)
            api_key = True
    return value


async def one_credential(connection: Any, _: Any) -> None:
    """Litestar guard for every route: refuse a request with two credential headers before anything."""
    authorization(connection.scope["headers"])
