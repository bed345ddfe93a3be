"""The OpenAI-compatible HTTP edge: thin handlers that hand the body to the pipeline and send its reply."""

from __future__ import annotations

import itertools
import logging
import os
import re
import time
from typing import Any

import msgspec
from litestar import Response, asgi, get
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath

from backends.catalog import Catalog
from gateway.asgi_io import ClientGone, read_body, send_body, send_error, send_stream
from gateway.errors import GatewayError, model_not_found
from gateway.openai.responses import Model, ModelList
from gateway.request.classify import Caller
from gateway.request.parse import Endpoint
from gateway.request.pipeline import Pipeline

log = logging.getLogger("switchyard")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_FORWARDED_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate"}
_encoder = msgspec.json.Encoder()


def valid_request_id(text: str) -> bool:
    return _REQUEST_ID.match(text) is not None


_ID_PREFIX = "req-" + os.urandom(6).hex()
_id_counter = itertools.count(1)


def new_request_id() -> str:
    """Unique per process (a random prefix) and across its requests (a counter): no syscall per request."""
    return f"{_ID_PREFIX}{next(_id_counter):012x}"


def read_caller(scope: Any) -> Caller:
    """Read the few request headers the gateway uses straight from the ASGI scope, in one pass."""
    request_id: str | None = None
    caller = Caller(request_id="", authorization=None, forwarded={}, headers=scope["headers"])
    for name, value in scope["headers"]:
        if name == b"authorization":
            caller.authorization = value.decode("latin-1")
        elif not name.startswith(b"x-") and name not in _FORWARDED_HEADERS:
            continue
        elif name == b"x-request-id":
            text = value.decode("latin-1")
            if valid_request_id(text):
                request_id = text
        elif name in _FORWARDED_HEADERS:
            caller.forwarded[_FORWARDED_HEADERS[name]] = value.decode("latin-1")
        elif name == b"x-switchyard-priority":
            caller.priority = value.decode("latin-1")
        elif name == b"x-switchyard-class":
            caller.explicit_class = value.decode("latin-1")
        elif name == b"x-switchyard-tenant":
            caller.tenant = value.decode("latin-1")
        elif name == b"x-session-id":
            caller.session = value.decode("latin-1")
    caller.request_id = request_id or new_request_id()
    caller.forwarded["x-request-id"] = caller.request_id
    return caller


_ALLOW = {"allow": "POST"}
_INTERNAL_ERROR = GatewayError(500, "Internal gateway error.", "server_error")


def openai_handlers(pipeline: Pipeline, catalog: Catalog, max_body_bytes: int) -> list[BaseRouteHandler]:
    """The `/v1` endpoints, bound to one pipeline."""

    tenants = pipeline.tenants
    authenticate = tenants.authenticate if tenants is not None and tenants.options.mode == "keys" else None

    async def serve(scope: Any, receive: Any, send: Any, endpoint: Endpoint) -> None:
        caller = read_caller(scope)
        if scope["method"] != "POST":
            error = GatewayError(
                405, f"Use POST for {scope['path']}.", "invalid_request_error", headers=_ALLOW
            )
            await send_error(send, error, caller.request_id)
            return
        body = b""
        try:
            if authenticate is not None:
                caller.key = await authenticate(caller.authorization)
            body = await read_body(scope, receive, max_body_bytes)
            reply = await pipeline.handle(endpoint, body, caller)
        except GatewayError as error:
            if caller.key is not None:
                error = tenants.with_rate_headers(error, caller.key, caller.admission)  # type: ignore[union-attr]
            if pipeline.telemetry is not None:
                pipeline.telemetry.failed(
                    caller.request_id, endpoint, error.status, error.body.code, error.body.message, body
                )
            await send_error(send, error, caller.request_id)
            return
        except ClientGone:
            return
        except Exception:
            log.exception("unhandled error in %s (request %s)", scope["path"], caller.request_id)
            error = _INTERNAL_ERROR
            if caller.key is not None:
                error = tenants.with_rate_headers(error, caller.key, caller.admission)  # type: ignore[union-attr]
            if pipeline.telemetry is not None:
                pipeline.telemetry.failed(
                    caller.request_id, endpoint, 500, error.body.code, error.body.message, body
                )
            await send_error(send, error, caller.request_id)
            return
        if reply.stream is not None:
            await send_stream(send, receive, reply.headers, reply.content_type, reply.stream)
        else:
            await send_body(send, 200, reply.headers, reply.body, reply.content_type.encode("latin-1"))

    @asgi("/v1/chat/completions", name="chat-completions", copy_scope=False)
    async def chat_completions(scope: Any, receive: Any, send: Any) -> None:
        await serve(scope, receive, send, "chat")

    @asgi("/v1/completions", name="completions", copy_scope=False)
    async def completions(scope: Any, receive: Any, send: Any) -> None:
        await serve(scope, receive, send, "completions")

    @asgi("/v1/embeddings", name="embeddings", copy_scope=False)
    async def embeddings(scope: Any, receive: Any, send: Any) -> None:
        await serve(scope, receive, send, "embeddings")

    created = int(time.time())
    cards = [
        Model(id=m, created=created, owned_by="switchyard", max_model_len=catalog.max_model_len(m))
        for m in catalog.models()
    ]
    models_body = _encoder.encode(ModelList(data=cards))
    model_bodies = {card.id: _encoder.encode(card) for card in cards}

    @get("/v1/models", name="models")
    async def models() -> Response[bytes]:
        return Response(models_body, media_type="application/json")

    # `:path` because model names hold slashes (`meta-llama/Llama-3.1-8B-Instruct`), which the SDK sends
    # as %2F and the ASGI path carries decoded.
    @get("/v1/models/{model:path}", name="model")
    async def model(model: FromPath[str]) -> Response[bytes]:
        name = model.removeprefix("/")
        body = model_bodies.get(name)
        if body is None:
            raise model_not_found(name)
        return Response(body, media_type="application/json")

    return [chat_completions, completions, embeddings, models, model]
