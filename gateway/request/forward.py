"""Step 4: send the request to a backend and bring its answer back.

    attempts.py          retries, failover, breaker feedback, the retry budget
    relay.py             a stream's chunks to the client; draining a stream whose client left
    backend_request.py   the headers a backend receives (its auth, the passed-on ones)
    transport.py         the seam: `Transport.send`; backend_http.py is the socket client behind it
    prompt_count.py      `/tokenize`, for streams that ended without their usage

`Upstream` puts them together. The transport on the request path is gateway/upstream/client.py:
pooled keep-alive HTTP/1.1 connections, parsed by httptools, as cheap per request as we could make it
(`make bench-clients`; figures in docs/internals.md). One aiohttp `ClientSession` lives beside it
for the calls off the request path (health checks, `/metrics` scrapes, `/tokenize`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic

import aiohttp

from backends.models import Backend
from gateway.config.settings import Retries, Timeouts
from gateway.request.attempts import Attempts, upstream_status_error, with_attempts
from gateway.request.context import RequestContext
from gateway.request.limits import RetryBudget, resolve_limits
from gateway.request.parse import ParsedRequest
from gateway.request.prompt_count import count_prompt_tokens
from gateway.request.relay import ABANDONED_DRAIN_S, OpenStream, RelayedStream
from gateway.request.sse import SseRelay
from gateway.upstream.client import KEEPALIVE_SECONDS
from gateway.upstream.transport import BackendResponse, Transport

__all__ = [
    "ABANDONED_DRAIN_S",
    "Answer",
    "OpenStream",
    "RelayedStream",
    "Upstream",
    "upstream_status_error",
    "with_attempts",
]


@dataclass(slots=True)
class Answer:
    """A complete non-streaming answer (its backend, timing and status are on the request's context)."""

    body: bytes
    content_type: str


class Upstream:
    """The gateway's client towards backends: requests go through `transport` (the socket client,
    `BackendClient`, in the gateway; an in-memory one in tests), the calls off the request path through
    an aiohttp session opened by `start`."""

    def __init__(
        self,
        transport: Transport,
        timeouts: Timeouts,
        max_connections_per_backend: int,
        retries: Retries | None = None,
    ) -> None:
        self._max_per_backend = max_connections_per_backend
        self.retries = retries = retries or Retries()
        self.timeouts = timeouts
        self.defaults = resolve_limits(timeouts, retries)
        """The limits of a request whose class sets none of its own."""
        self.budget = RetryBudget(retries)
        self.transport = transport
        self.attempts = Attempts(self.transport, self.budget)
        self._session: aiohttp.ClientSession | None = None
        self._draining: set[asyncio.Task[None]] = set()
        """Abandoned streams still counting what their backend sent (gateway/request/relay.py)."""

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream used before start()")
        return self._session

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=self._max_per_backend,
            keepalive_timeout=KEEPALIVE_SECONDS,
            ttl_dns_cache=300,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def complete(self, ctx: RequestContext) -> Answer:
        """Send a non-streaming request; the end of the request gives back the backend's in-flight slot."""
        response, body = await self.attempts.send(ctx)
        return self.answered(ctx, response, body)

    @staticmethod
    def answered(ctx: RequestContext, response: BackendResponse, body: bytes) -> Answer:
        """What `complete` returns, from `attempts.send`'s answer (its connection goes back to its pool)."""
        response.release()
        ctx.first_byte_at = monotonic()
        return Answer(body, response.header("content-type") or "application/json")

    async def open_stream(self, ctx: RequestContext) -> OpenStream:
        """Send a streaming request and wait for its first chunk; errors before it become HTTP errors."""
        response, first = await self.attempts.send(ctx)
        ctx.first_byte_at = monotonic()
        backend = ctx.backend
        assert backend is not None  # the attempt that answered set it
        return OpenStream(backend, response, first)

    def relay(
        self,
        ctx: RequestContext,
        stream: OpenStream,
        sse: SseRelay,
        finish: Callable[[RequestContext], object],
    ) -> RelayedStream:
        """The client's side of an open stream; see RelayedStream."""
        limits = ctx.limits
        # the watchdog runs on the loop's clock; the request's stamps are on time.monotonic's
        left = None if limits.total is None else limits.total - (monotonic() - ctx.started_at)
        deadline = None if left is None else asyncio.get_running_loop().time() + left
        return RelayedStream(ctx, stream, sse, finish, limits.between_chunks, deadline, self._draining)

    async def count_prompt_tokens(self, backend: Backend, parsed: ParsedRequest) -> int | None:
        """See gateway/request/prompt_count.py."""
        return await count_prompt_tokens(self.session, backend, parsed)

    async def close(self) -> None:
        if self._draining:
            await asyncio.wait(set(self._draining), timeout=ABANDONED_DRAIN_S + 1)
        self.transport.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
