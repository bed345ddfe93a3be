"""`/v1/responses`: forwarded like chat, with the conversation state kept by the gateway.

vLLM stores no responses by default, and a follow-up may land on another backend than the response it
continues, so the gateway stores each response (with the whole input it answered) per API key
(gateway/responses/store.py) and forwards every request with `store: false` and `previous_response_id`
expanded into its input items: the stored input, the stored response's output items, then the new
input. `instructions` are not carried over (as in OpenAI's API). `GET` and `DELETE
/v1/responses/{id}` read and remove a key's own stored responses; another key's id is not found.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Controller, Litestar, Request, Response, delete, get
from litestar.params import FromPath

from gateway.config.request_bounds import RequestLimits
from gateway.config.settings import Settings
from gateway.http.controllers import per_app
from gateway.http.credentials import authorization as authorization_of
from gateway.openai.errors import GatewayError, invalid_request
from gateway.openai.requests import ResponsesRequest
from gateway.redis.client import REDIS_ERRORS, redis_client
from gateway.request.classify import Caller, key_id
from gateway.request.context import RequestContext
from gateway.request.parse import DEFAULT_LIMITS, check_expanded_input, response_items_chars
from gateway.request.pipeline import Pipeline, Reply
from gateway.request.relay import RelayedStream
from gateway.request.typed_sse import TypedSseRelay
from gateway.responses.store import MemoryResponseStore, RedisResponseStore, ResponseStore
from gateway.stopping import stop_step

if TYPE_CHECKING:
    from gateway.tenants.admission import Tenant, Tenants

log = logging.getLogger("switchyard")

RESPONSE_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
STORED_HEADER = "x-switchyard-response-stored"


class StoredResponse(msgspec.Struct):
    input: list[Any]
    """The input items the backend answered (earlier turns included)."""
    response: msgspec.Raw
    """The response object as the backend sent it."""


class _Output(msgspec.Struct):
    id: str = ""
    output: list[Any] = []


_stored = msgspec.json.Decoder(StoredResponse)
_output = msgspec.json.Decoder(_Output)
_encoder = msgspec.json.Encoder()
_raw_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])


def owner_of(caller: Caller) -> str:
    """Whose stored responses a request sees: its API key's (`auth.mode: keys`), else its bearer token's."""
    if caller.key is not None:
        return caller.key.key.id
    return key_id(caller.authorization)


def store_unavailable() -> GatewayError:
    return GatewayError(
        503,
        "The response store cannot be reached right now; retry shortly.",
        "server_error",
        code="response_store_unavailable",
        headers={"retry-after": "1"},
    )


def response_not_found(response_id: str, param: str | None = None) -> GatewayError:
    if param is not None:
        return GatewayError(
            400,
            f"Previous response with id '{response_id}' not found.",
            "invalid_request_error",
            code="previous_response_not_found",
            param=param,
        )
    return GatewayError(
        404, f"Response with id '{response_id}' not found.", "invalid_request_error", code="not_found"
    )


class ResponsesApi:
    def __init__(
        self,
        pipeline: Pipeline,
        store: ResponseStore,
        max_response_bytes: int,
        *,
        limits: RequestLimits = DEFAULT_LIMITS,
        tenants: Tenants | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.store = store
        self.max_response_bytes = max_response_bytes
        self.limits = limits
        """The gateway's bounds (`gateway.limits`), checked again on an input grown by its earlier turns."""
        self.tenants = tenants
        """The keys whose responses are kept apart (the pipeline's); None in open mode."""

    async def handle(self, ctx: RequestContext) -> Reply:
        """POST /v1/responses (the request path's steps, with the input expanded before classifying)."""
        pipeline = self.pipeline
        pipeline.parse(ctx)
        parsed = ctx.parsed
        request = parsed.request
        assert isinstance(request, ResponsesRequest)
        owner = owner_of(ctx.caller)
        given = request.input
        items: list[Any] = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        previous = request.previous_response_id
        if previous is not None:
            items = await self.earlier_items(owner, previous) + items
        parsed.prompt_chars = response_items_chars(items) + len(request.instructions or "")
        check_expanded_input(self.limits, parsed.prompt_chars, len(items))
        parsed.body = _forwarded_body(ctx.body, items)
        pipeline.classify(ctx)
        reply = await pipeline.handle(ctx, classified=True)  # past the parse and classify above
        store = request.store is not False
        if not store and previous is None:
            return reply
        if reply.stream is not None:
            sse = ctx.sse
            assert isinstance(sse, TypedSseRelay) and isinstance(reply.stream, RelayedStream)
            saver = self if store else None
            reply.stream = ResponsesStream(reply.stream, sse, saver, owner, items, previous)
            return reply
        if previous is not None:
            reply.body = with_previous_id(reply.body, previous)
        if store:
            stored = await self.save(owner, items, reply.body)
            reply.headers[STORED_HEADER] = "true" if stored else "false"
        return reply

    async def earlier_items(self, owner: str, response_id: str) -> list[Any]:
        if not RESPONSE_ID.match(response_id):
            raise invalid_request(
                "`previous_response_id` is not a response id.",
                param="previous_response_id",
                code="invalid_value",
            )
        try:
            entry = await self.store.get(owner, response_id)
        except REDIS_ERRORS:
            log.warning("response store unreachable reading %s", response_id, exc_info=True)
            raise store_unavailable() from None
        if entry is None:
            raise response_not_found(response_id, "previous_response_id")
        stored = _stored.decode(entry)
        return stored.input + _output.decode(stored.response).output

    async def save(self, owner: str, items: list[Any], response: bytes) -> bool:
        """Store an answered response; False when it is not (too large, no id, the store unreachable)."""
        try:
            response_id = _output.decode(response).id
        except msgspec.DecodeError:
            return False
        entry = _encoder.encode(StoredResponse(input=items, response=msgspec.Raw(response)))
        if not RESPONSE_ID.match(response_id) or len(entry) > self.max_response_bytes:
            return False
        try:
            await self.store.put(owner, response_id, entry)
        except REDIS_ERRORS:
            log.warning("response store unreachable: response %s not stored", response_id, exc_info=True)
            return False
        return True

    async def read(self, owner: str, response_id: str) -> bytes:
        if not RESPONSE_ID.match(response_id):
            raise response_not_found(response_id[:128])
        try:
            entry = await self.store.get(owner, response_id)
        except REDIS_ERRORS:
            log.warning("response store unreachable reading %s", response_id, exc_info=True)
            raise store_unavailable() from None
        if entry is None:
            raise response_not_found(response_id)
        return bytes(_stored.decode(entry).response)

    async def remove(self, owner: str, response_id: str) -> None:
        if not RESPONSE_ID.match(response_id):
            raise response_not_found(response_id[:128])
        try:
            removed = await self.store.delete(owner, response_id)
        except REDIS_ERRORS:
            log.warning("response store unreachable deleting %s", response_id, exc_info=True)
            raise store_unavailable() from None
        if not removed:
            raise response_not_found(response_id)


def _forwarded_body(body: bytes, items: list[Any]) -> bytes:
    """The request as the backend gets it: the whole input, nothing for it to store or look up. The other
    fields are copied as their raw JSON text, never decoded (a 5,000-digit number or `1e999999` in an
    unknown field passes through as it came, as on the other endpoints)."""
    data: dict[str, Any] = _raw_fields.decode(body)
    data["input"] = items
    data["store"] = False
    data.pop("previous_response_id", None)
    return _encoder.encode(data)


_NULL_PREVIOUS = re.compile(rb'"previous_response_id":\s*null')


def with_previous_id(data: bytes, previous: str) -> bytes:
    """The backend's response objects (which saw no `previous_response_id`: the gateway expanded it) with
    the client's; `previous` is a checked id (`RESPONSE_ID`), so it needs no escaping."""
    return _NULL_PREVIOUS.sub(b'"previous_response_id":"' + previous.encode() + b'"', data)


class ResponsesStream:
    """A relayed Responses stream whose response objects name the client's `previous_response_id`, and
    which stores its final response (when `api` is given) before the client sees the event that carries
    it, so a follow-up sent as soon as the stream ends finds it."""

    __slots__ = ("_api", "_inner", "_items", "_owner", "_previous", "_saved", "_sse")

    def __init__(
        self,
        inner: RelayedStream,
        sse: TypedSseRelay,
        api: ResponsesApi | None,
        owner: str,
        items: list[Any],
        previous: str | None,
    ) -> None:
        self._inner = inner
        self._sse = sse
        self._api = api
        self._owner = owner
        self._items = items
        self._previous = previous
        self._saved = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events()

    async def _events(self) -> AsyncIterator[bytes]:
        previous = self._previous
        async for chunk in self._inner:
            final = self._sse.final_response
            if final is not None and not self._saved and self._api is not None:
                self._saved = True
                if previous is not None:
                    final = with_previous_id(final, previous)
                await self._api.save(self._owner, self._items, final)
            yield chunk if previous is None else with_previous_id(chunk, previous)

    @property
    def last(self) -> bool:
        """The piece being yielded ends the backend's answer (its chunks pass through one for one)."""
        return self._inner.last

    def end(self) -> None:
        self._inner.end()

    async def aclose(self) -> None:
        self._inner.end()


def build_responses(settings: Settings, pipeline: Pipeline, tenants: Tenants | None) -> ResponsesApi:
    options = settings.responses
    url = settings.ledger.redis_url
    store: ResponseStore
    if options.store == "redis" or (options.store == "auto" and url):
        if not url:
            raise ValueError("responses.store is redis but ledger.redis_url is not set")
        client = redis_client(url, socket_connect_timeout=2.0, socket_timeout=5.0)
        store = RedisResponseStore(
            client, settings.ledger.key_prefix, options.ttl_s, options.max_bytes_per_key
        )
    else:
        store = MemoryResponseStore(options.ttl_s, options.max_bytes_per_key, options.max_bytes_memory)
    return ResponsesApi(
        pipeline, store, options.response_bytes_bound, limits=settings.server.limits, tenants=tenants
    )


class ResponsesController(Controller):
    """GET and DELETE /v1/responses/{id}, each key reading only its own (POST is on the fast path)."""

    path = "/v1/responses"
    api: ResponsesApi
    authenticate: Callable[[str | None], Awaitable[Tenant]] | None
    """The tenants' authentication in `auth.mode: keys` (the owner is the key), else None (the token)."""

    async def owner_key(self, request: Request[Any, Any, Any]) -> str:
        authorization = authorization_of(request.scope["headers"])
        if self.authenticate is not None:
            return (await self.authenticate(authorization)).key.id
        return key_id(authorization)

    @get("/{response_id:str}", name="response")
    async def read_response(
        self, request: Request[Any, Any, Any], response_id: FromPath[str]
    ) -> Response[bytes]:
        body = await self.api.read(await self.owner_key(request), response_id)
        return Response(body, media_type="application/json")

    @delete("/{response_id:str}", name="delete-response", status_code=200)
    async def delete_response(
        self, request: Request[Any, Any, Any], response_id: FromPath[str]
    ) -> Response[bytes]:
        await self.api.remove(await self.owner_key(request), response_id)
        body = _encoder.encode({"id": response_id, "object": "response", "deleted": True})
        return Response(body, media_type="application/json")


def responses_controller(api: ResponsesApi) -> type[ResponsesController]:
    tenants = api.tenants
    keys = tenants if tenants is not None and tenants.options.mode == "keys" else None
    return per_app(ResponsesController, api=api, authenticate=keys.authenticate if keys is not None else None)


def responses_lifespan(api: ResponsesApi):
    @asynccontextmanager
    async def run(app: Litestar) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await stop_step("the responses store", api.store.close())

    return run
