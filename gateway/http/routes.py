"""The OpenAI-compatible HTTP edge: thin handlers that hand the body to the pipeline and send its reply."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, asgi, get
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath

from backends.catalog import Catalog
from gateway.http.asgi_io import (
    ClientGone,
    DisconnectWatch,
    body_at_hand,
    body_sent,
    read_body,
    send_anthropic_error,
    send_body,
    send_error,
    send_stream,
)
from gateway.http.credentials import API_KEY, AUTHORIZATION, authorization, duplicate_header
from gateway.openai.errors import GatewayError, invalid_request, model_not_found
from gateway.openai.responses import Model, ModelList
from gateway.request.classify import Caller
from gateway.request.context import RequestContext
from gateway.request.parse import Endpoint
from gateway.request.pipeline import Pipeline, Reply

if TYPE_CHECKING:
    from gateway.tenants.admission import Tenants

ErrorSender = Callable[[Any, GatewayError, str], Awaitable[None]]

log = logging.getLogger("switchyard")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_FORWARDED_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate"}
_encoder = msgspec.json.Encoder()


def valid_request_id(text: str) -> bool:
    """Whether a client's `x-request-id` may be echoed: the whole value (`fullmatch`, not `$`, which also
    takes a value ending in a newline), as it goes into the head's lines unchecked (reply_headers.py)."""
    return _REQUEST_ID.fullmatch(text) is not None


_ID_HEX = 32
"""128 random bits per request id, in hex."""
_ID_BATCH = 128
_random_hex = ""
_random_at = 0


def new_request_id() -> str:
    """128 random bits from the OS: the ledger counts a request once by this id, so no client may guess
    or choose another request's id (a client's `x-request-id` is only echoed and logged). The bits are
    read from the OS 128 ids at a time (one syscall), and each is used once."""
    global _random_hex, _random_at
    at = _random_at
    if at >= len(_random_hex):
        _random_hex, at = os.urandom(_ID_HEX // 2 * _ID_BATCH).hex(), 0
    _random_at = at + _ID_HEX
    return "req-" + _random_hex[at : at + _ID_HEX]


def _forget_random_bits() -> None:
    """A forked worker must not reuse the bits its parent read."""
    global _random_hex, _random_at
    _random_hex, _random_at = "", 0


os.register_at_fork(after_in_child=_forget_random_bits)


_AUTHORIZATION, _API_KEY, _REQUEST_ID_HEADER, _FORWARDED, _PRIORITY, _CLASS, _TENANT, _SESSION = range(8)
_CALLER_HEADERS: dict[bytes, int] = {
    AUTHORIZATION: _AUTHORIZATION,
    API_KEY: _API_KEY,
    b"x-request-id": _REQUEST_ID_HEADER,
    **dict.fromkeys(_FORWARDED_HEADERS, _FORWARDED),
    b"x-switchyard-priority": _PRIORITY,
    b"x-switchyard-class": _CLASS,
    b"x-switchyard-tenant": _TENANT,
    b"x-session-id": _SESSION,
}
"""The headers `read_caller` reads, by what it does with each: any other costs one dict lookup (an SDK
sends fifteen or so headers, most of them `x-stainless-*`)."""


def read_caller(scope: Any) -> Caller:
    """Read the few request headers the gateway uses straight from the ASGI scope, in one pass; 400 for
    a credential header sent twice (gateway/http/credentials.py)."""
    headers = scope["headers"]
    caller = Caller(request_id=new_request_id(), authorization=None, forwarded={}, headers=headers)
    api_key = False
    read = _CALLER_HEADERS.get
    for name, value in headers:
        kind = read(name)
        if kind is None:
            continue
        if kind == _AUTHORIZATION:
            if caller.authorization is not None:
                raise duplicate_header(name)
            caller.authorization = value.decode("latin-1")
        elif kind == _API_KEY:
            if api_key:
                raise duplicate_header(name)
            api_key = True
        elif kind == _REQUEST_ID_HEADER:
            text = value.decode("latin-1")
            if valid_request_id(text):
                caller.client_request_id = text
        elif kind == _FORWARDED:
            caller.forwarded[_FORWARDED_HEADERS[name]] = value.decode("latin-1")
        elif kind == _PRIORITY:
            caller.priority = value.decode("latin-1")
        elif kind == _CLASS:
            caller.explicit_class = value.decode("latin-1")
        elif kind == _TENANT:
            caller.tenant = value.decode("latin-1")
        else:
            caller.session = value.decode("latin-1")
    caller.forwarded["x-request-id"] = caller.request_id
    return caller


def read_anthropic_caller(scope: Any) -> Caller:
    """As `read_caller`; Anthropic's clients send their key as `x-api-key`, taken as a bearer token. Both
    it and `Authorization` is a 400: a proxy that checks one must not see the gateway bill the other."""
    caller = read_caller(scope)
    for name, value in scope["headers"]:
        if name == API_KEY:
            if caller.authorization is not None:
                raise invalid_request(
                    "The request has both `authorization` and `x-api-key`; send exactly one.",
                    param="x-api-key",
                    code="duplicate_header",
                )
            caller.authorization = "Bearer " + value.decode("latin-1").strip()
            break
    return caller


FAST = "switchyard_fast"
"""The `opt` entry of a forwarding handler that gateway/http/fastpath.py calls instead of the handler."""

_ALLOW = {"allow": "POST"}
_INTERNAL_ERROR = GatewayError(500, "Internal gateway error.", "server_error")


def openai_handlers(
    pipeline: Pipeline,
    catalog: Catalog,
    tenants: Tenants | None,
    max_body_bytes: int,
    responses_handle: Callable[[RequestContext], Awaitable[Reply]] | None = None,
) -> list[BaseRouteHandler]:
    """The `/v1` endpoints, bound to one pipeline and its `tenants` (None in open mode); `/v1/responses`
    through `responses_handle` (the gateway's response store, gateway/responses/api.py) when given."""

    authenticate = tenants.authenticate if tenants is not None and tenants.options.mode == "keys" else None

    async def serve(
        scope: Any,
        receive: Any,
        send: Any,
        endpoint: Endpoint,
        read: Callable[[Any], Caller] = read_caller,
        send_error: ErrorSender = send_error,
        handle: Callable[[RequestContext], Awaitable[Reply]] = pipeline.handle,
    ) -> None:
        try:
            caller = read(scope)
        except GatewayError as error:
            await send_error(send, error, new_request_id())
            return
        if scope["method"] != "POST":
            not_post = GatewayError(
                405, f"Use POST for {scope['path']}.", "invalid_request_error", headers=_ALLOW
            )
            await send_error(send, not_post, caller.client_request_id or caller.request_id)
            return
        ctx = RequestContext(endpoint, caller)
        watch: DisconnectWatch | None = None
        try:
            if authenticate is not None:
                caller.key = await authenticate(caller.authorization)
            body = body_at_hand(scope, receive, max_body_bytes)
            ctx.body = body if body is not None else await read_body(scope, receive, max_body_bytes)
            watch = DisconnectWatch(receive)  # the client leaving cancels the request from here on
            reply = await handle(ctx)
        except GatewayError as error:
            if watch is not None:
                watch.stop()
            if caller.key is not None and tenants is not None:  # a key means tenants authenticated it
                error = tenants.with_rate_headers(error, caller.key, caller.admission)
            pipeline.end(ctx, error)
            await send_error(send, error, caller.client_request_id or caller.request_id)
            return
        except ClientGone:
            return
        except Exception as exc:
            if watch is not None:
                watch.stop()
            log.exception("unhandled error in %s (request %s)", scope["path"], caller.request_id)
            pipeline.end(ctx, exc)
            internal = _INTERNAL_ERROR
            if caller.key is not None and tenants is not None:
                internal = tenants.with_rate_headers(internal, caller.key, caller.admission)
            await send_error(send, internal, caller.client_request_id or caller.request_id)
            return
        except BaseException as exc:  # cancelled: the request still ends
            if watch is not None:
                watch.stop()
                if isinstance(exc, asyncio.CancelledError) and watch.swallow():
                    pipeline.client_left(ctx)  # the backend request was cancelled with this task
                    return
            pipeline.end(ctx, exc)
            raise
        raw, fixed, lines = reply.raw_headers, reply.fixed, reply.lines
        if reply.stream is not None:
            await send_stream(send, watch, reply.headers, reply.content_type, reply.stream, raw, fixed, lines)
            return
        watch.stop()
        try:
            content_type = reply.content_type.encode("latin-1")
            if not body_sent(send, 200, reply.headers, reply.body, content_type, raw, fixed, lines):
                await send_body(send, 200, reply.headers, reply.body, content_type, raw, fixed, lines)
        except asyncio.CancelledError:
            if not watch.swallow():  # the client left as its answer was being sent: it was accounted
                raise

    respond = responses_handle or pipeline.handle
    # `fast`: what gateway/http/fastpath.py calls for the path, `serve` itself with the endpoint bound (no
    # coroutine of the handler's own around it: one frame less each time the request's task resumes).
    chat = partial(serve, endpoint="chat")
    plain = partial(serve, endpoint="completions")
    embed = partial(serve, endpoint="embeddings")
    anthropic = partial(
        serve, endpoint="messages", read=read_anthropic_caller, send_error=send_anthropic_error
    )
    typed = partial(serve, endpoint="responses", handle=respond)

    @asgi("/v1/chat/completions", name="chat-completions", copy_scope=False, opt={FAST: chat})
    async def chat_completions(scope: Any, receive: Any, send: Any) -> None:
        await chat(scope, receive, send)

    @asgi("/v1/completions", name="completions", copy_scope=False, opt={FAST: plain})
    async def completions(scope: Any, receive: Any, send: Any) -> None:
        await plain(scope, receive, send)

    @asgi("/v1/embeddings", name="embeddings", copy_scope=False, opt={FAST: embed})
    async def embeddings(scope: Any, receive: Any, send: Any) -> None:
        await embed(scope, receive, send)

    @asgi("/v1/messages", name="messages", copy_scope=False, opt={FAST: anthropic})
    async def messages(scope: Any, receive: Any, send: Any) -> None:
        await anthropic(scope, receive, send)

    @asgi("/v1/responses", name="responses", copy_scope=False, opt={FAST: typed})
    async def responses(scope: Any, receive: Any, send: Any) -> None:
        await typed(scope, receive, send)

    created = int(time.time())
    cards = [
        Model(id=m, created=created, owned_by="switchyard", max_model_len=catalog.max_model_len(m))
        for m in catalog.models()
    ]
    models_body = _encoder.encode(ModelList(data=cards))
    model_bodies = {card.id: _encoder.encode(card) for card in cards}

    async def usable(request: Request[Any, Any, Any]) -> list[str] | None:
        """The models the caller's key may use (None: all); with `auth.mode: keys` a key is needed."""
        if authenticate is None:
            return None
        tenant = await authenticate(authorization(request.scope["headers"]))
        return tenant.key.models or None

    @get("/v1/models", name="models")
    async def models(request: Request[Any, Any, Any]) -> Response[bytes]:
        allowed = await usable(request)
        if allowed is None:
            return Response(models_body, media_type="application/json")
        own = ModelList(data=[card for card in cards if card.id in allowed])
        return Response(_encoder.encode(own), media_type="application/json")

    # `:path` because model names hold slashes (`meta-llama/Llama-3.1-8B-Instruct`), which the SDK sends
    # as %2F and the ASGI path carries decoded.
    @get("/v1/models/{model:path}", name="model")
    async def model(request: Request[Any, Any, Any], model: FromPath[str]) -> Response[bytes]:
        allowed = await usable(request)
        name = model.removeprefix("/")
        body = model_bodies.get(name)
        if body is None or (allowed is not None and name not in allowed):
            raise model_not_found(name)
        return Response(body, media_type="application/json")

    return [chat_completions, completions, embeddings, messages, responses, models, model]
