"""Step 4: send the request to a backend and bring its answer back.

The hop itself is gateway/request/backend_http.py: pooled keep-alive HTTP/1.1 connections, parsed by
httptools, as cheap per request as we could make it (`make bench-clients`; figures in the README's design
notes). One aiohttp `ClientSession` lives beside it for the calls off the request path (health checks,
`/metrics` scrapes, `/tokenize`).

Timeouts (per class, gateway/request/limits.py): `connect` bounds opening a connection; `first_byte`
bounds one attempt's wait for the whole answer (non-streaming) or the first chunk (streaming);
`between_chunks` bounds each later gap in a stream; `total`, when set, bounds the whole request.

Retries happen only before anything has reached the client: a refused, broken or timed-out attempt, or
an answer of 429, 502, 503 or 504, moves the request to the next candidate of the routing decision, after
a jittered backoff, while the request's `max_attempts` and the gateway-wide retry budget allow. Every
outcome feeds the backend's circuit breaker (backends/breaker.py); a `Retry-After` pauses the backend.
Once the first chunk of a stream has been relayed there is no retry: a failure ends the stream with an
error event, and the usage produced so far is still accounted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import msgspec

from backends.breaker import CLOSED
from backends.models import Backend
from gateway.errors import (
    GatewayError,
    no_backend,
    normalise_upstream_error,
    upstream_failed,
    upstream_timeout,
)
from gateway.request.backend_http import (
    BackendClient,
    ConnectFailed,
    ConnectTimeout,
    Response,
    UpstreamError,
)
from gateway.request.limits import RETRY_STATUSES, Limits, RetryBudget, resolve_limits, retry_after_seconds
from gateway.request.parse import UPSTREAM_PATHS, ParsedRequest
from gateway.request.sse import SseRelay
from gateway.settings import Retries, Timeouts

if TYPE_CHECKING:
    from gateway.telemetry.tracing import RequestTrace

_KEEPALIVE_SECONDS = 4.0
"""Shorter than uvicorn's default of 5 s (vLLM's server), so we never reuse a connection it is closing."""


@dataclass(slots=True)
class Answer:
    """A complete non-streaming answer."""

    backend: Backend
    concurrency: int
    """Requests the backend was serving, this one included, when it was sent."""
    status: int
    body: bytes
    content_type: str
    started_at: float
    first_byte_at: float
    attempts: int = 1
    """Backends tried, this one included."""


@dataclass(slots=True)
class OpenStream:
    """A streaming answer whose status is 200 and whose first chunk has arrived."""

    backend: Backend
    concurrency: int
    response: Response
    first_chunk: bytes
    started_at: float
    first_byte_at: float
    attempts: int = 1
    """Backends tried, this one included."""


class _GapWatchdog:
    """Closes the upstream response when one read waits longer than the gap allowed.

    One timer per gap period instead of one per chunk; time spent waiting for a slow client does not
    count, since only the span of an upstream read is watched.
    """

    __slots__ = (
        "_deadline",
        "_handle",
        "_limit",
        "_loop",
        "_response",
        "fired",
        "past_total",
        "waiting_since",
    )

    def __init__(
        self,
        response: Response,
        limit: float,
        loop: asyncio.AbstractEventLoop,
        deadline: float | None = None,
    ) -> None:
        self._loop = loop
        self._response = response
        self._limit = limit
        self._deadline = deadline
        """Loop time at which the request's `total` timeout ends the stream, if it has one."""
        self.waiting_since: float | None = None
        self.fired = False
        self.past_total = False
        self._handle = self._loop.call_at(self._next(self._loop.time()), self._check)

    def _next(self, at: float) -> float:
        at += self._limit
        return at if self._deadline is None or at < self._deadline else self._deadline

    def _check(self) -> None:
        now = self._loop.time()
        since = self.waiting_since
        if self._deadline is not None and now >= self._deadline:
            self.fired = self.past_total = True
            self._response.close()
            return
        if since is not None and now - since >= self._limit:
            self.fired = True
            self._response.close()
            return
        self._handle = self._loop.call_at(self._next(since if since is not None else now), self._check)

    def cancel(self) -> None:
        self._handle.cancel()


class _Attempt:
    """The backend a request is being sent to, holding one of its in-flight slots until released."""

    __slots__ = ("_backend", "_holding")

    def __init__(self) -> None:
        self._backend: Backend | None = None
        self._holding = False

    def hold(self, backend: Backend) -> None:
        self._backend = backend
        backend.inflight += 1
        self._holding = True

    def release(self) -> None:
        if self._holding and self._backend is not None:
            self._backend.inflight -= 1
            self._holding = False

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("no backend was attempted")
        return self._backend

    @property
    def name(self) -> str:
        return self._backend.name if self._backend is not None else "none"


ABANDONED_DRAIN_S = 2.0
"""How long the connection of a stream whose client left stays half-closed, so the tokens the backend
had already sent (in flight, in socket buffers) are counted before it takes the disconnect."""


class Upstream:
    """The gateway's HTTP client towards backends."""

    def __init__(
        self, timeouts: Timeouts, max_connections_per_backend: int, retries: Retries | None = None
    ) -> None:
        self._timeouts = timeouts
        self._max_per_backend = max_connections_per_backend
        self.retries = retries = retries or Retries()
        self.timeouts = timeouts
        self.defaults = resolve_limits(timeouts, retries)
        """The limits of a request whose class sets none of its own."""
        self.budget = RetryBudget(retries)
        self._session: aiohttp.ClientSession | None = None
        self._client = BackendClient(max_connections_per_backend, _KEEPALIVE_SECONDS)
        self._base_headers: dict[str, bytes] = {}
        self._draining: set[asyncio.Task[None]] = set()
        """Abandoned streams still counting what their backend sent (see RelayedStream.end)."""

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream used before start()")
        return self._session

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=self._max_per_backend,
            keepalive_timeout=_KEEPALIVE_SECONDS,
            ttl_dns_cache=300,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def count_prompt_tokens(self, backend: Backend, parsed: ParsedRequest) -> int | None:
        """The backend's own count of a request's prompt tokens (vLLM's `POST /tokenize`), or None.

        For streams that ended before their usage chunk; runs after the request, never on its path.
        """
        try:
            request = msgspec.json.decode(parsed.body)
        except msgspec.DecodeError:
            return None
        body: dict[str, object] = {"model": parsed.model}
        if parsed.endpoint == "chat" and isinstance(request.get("messages"), list):
            body["messages"] = request["messages"]
        elif parsed.endpoint == "completions" and isinstance(request.get("prompt"), str):
            body["prompt"] = request["prompt"]
        else:
            return None
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        try:
            async with self.session.post(
                backend.url + "/tokenize",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=2.0),
            ) as response:
                if response.status != 200:
                    return None
                count = (await response.json()).get("count")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return count if isinstance(count, int) and count >= 0 else None

    async def close(self) -> None:
        if self._draining:
            await asyncio.wait(set(self._draining), timeout=ABANDONED_DRAIN_S + 1)
        self._client.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, backend: Backend, forwarded: dict[str, str]) -> bytes:
        """The request's header lines for `backend` (Host and Content-Length are the client's)."""
        base = self._base_headers.get(backend.name)
        if base is None:
            lines = "Content-Type: application/json\r\n"
            if backend.api_key:
                lines += f"Authorization: Bearer {backend.api_key}\r\n"
            base = self._base_headers[backend.name] = lines.encode("latin-1")
        if not forwarded:
            return base
        return base + "".join([f"{k}: {v}\r\n" for k, v in forwarded.items()]).encode("latin-1")

    async def _exchange(
        self,
        candidates: Sequence[Backend],
        parsed: ParsedRequest,
        forwarded: dict[str, str],
        limits: Limits,
        attempt: _Attempt,
        trace: RequestTrace | None = None,
    ) -> tuple[Response, bytes, float, int, int]:
        """Send to the candidates in order until one gives an answer worth passing on.

        Returns (response, body or first chunk, started, concurrency, attempts). `attempt` holds the
        in-flight slot of the backend that answered; the caller gives it back. A non-2xx answer that is
        not retried comes back as is for a non-streaming request and as a GatewayError for a stream.
        With a `trace`, each attempt is a span whose context the backend receives (`traceparent`).
        """
        loop = asyncio.get_running_loop()
        client = self._client
        url_path = UPSTREAM_PATHS[parsed.endpoint]
        stream = parsed.stream
        budget = self.budget
        budget.requests += 1
        deadline = None if limits.total is None else loop.time() + limits.total
        tries = 0
        error: GatewayError | None = None
        for backend in candidates:
            if not backend.healthy:
                continue  # opened, drained or paused since routing
            breaker = backend.breaker
            if breaker.state is not CLOSED and not breaker.allow():
                continue
            if tries:
                if tries >= limits.max_attempts or not budget.take():
                    breaker.release()
                    break
                await asyncio.sleep(budget.backoff(tries))
            tries += 1
            wait = limits.first_byte
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    breaker.release()
                    break
            started = loop.time()
            attempt.hold(backend)
            response: Response | None = None
            headers = self._headers(backend, forwarded)
            if trace is not None:
                headers += trace.attempt(backend, tries)
            try:
                async with asyncio.timeout(wait):
                    response = await client.post(backend.url, url_path, headers, parsed.body, limits.connect)
                    status = response.status
                    if status < 300 and stream:
                        if response.content_type != "text/event-stream":
                            why = f"it answered a stream request with {response.content_type}, not events"
                            raise upstream_failed(backend.name, why)
                        payload = await response.readany()
                    else:
                        payload = await response.read()
            except (ConnectFailed, ConnectTimeout) as exc:
                attempt.release()
                refused = isinstance(exc, ConnectFailed)
                why = f"connection to {backend.url} failed ({exc.__class__.__name__}: {exc})"
                breaker.failure(why, at_once=refused)
                error = upstream_failed(backend.name, why)
                if trace is not None:
                    trace.attempt_done(None, f"{exc.__class__.__name__}: {why}")
                continue
            except UpstreamError as exc:
                _close(response)
                attempt.release()
                why = f"{exc.__class__.__name__}: {exc}"
                breaker.failure(why)
                error = upstream_failed(backend.name, why)
                if trace is not None:
                    trace.attempt_done(None, why)
                continue
            except TimeoutError:
                _close(response)
                attempt.release()
                breaker.failure(f"no answer within {wait:g} s")
                error = upstream_timeout(backend.name, wait, "its first chunk" if stream else "an answer")
                if trace is not None:
                    trace.attempt_done(None, f"timeout: no answer within {wait:g} s")
                continue
            except BaseException as exc:
                _close(response)
                attempt.release()
                breaker.release()
                if trace is not None:
                    trace.attempt_done(None, exc.__class__.__name__)
                raise
            if trace is not None:
                trace.attempt_done(status)
            if status in RETRY_STATUSES:
                response.release()
                attempt.release()
                retry_after = response.headers.get("retry-after")
                if retry_after is not None:
                    breaker.pause(retry_after_seconds(retry_after))
                if status == 429:
                    breaker.release()  # overloaded, not broken
                else:
                    breaker.failure(f"HTTP {status}")
                error = upstream_status_error(status, payload, backend, retry_after)
                continue
            if status >= 500:
                breaker.failure(f"HTTP {status}")
            elif breaker.failures or breaker.state is not CLOSED:
                breaker.success()
            if stream and status >= 300:
                response.release()
                attempt.release()
                raise upstream_status_error(status, payload, backend)
            return response, payload, started, backend.inflight, tries
        if error is not None:
            raise error
        names = ", ".join(b.name for b in candidates)
        raise no_backend(
            parsed.model, f"every candidate ({names}) is out of routing (circuit open or draining)"
        )

    async def complete(
        self,
        candidates: Sequence[Backend],
        parsed: ParsedRequest,
        forwarded: dict[str, str],
        limits: Limits | None = None,
        trace: RequestTrace | None = None,
    ) -> Answer:
        """Send a non-streaming request; the caller must decrement `answer.backend.inflight`."""
        attempt = _Attempt()
        response, body, started, concurrency, tries = await self._exchange(
            candidates, parsed, forwarded, limits or self.defaults, attempt, trace
        )
        response.release()
        return Answer(
            backend=attempt.backend,
            concurrency=concurrency,
            status=response.status,
            body=body,
            content_type=response.headers.get("content-type", "application/json"),
            started_at=started,
            first_byte_at=asyncio.get_running_loop().time(),
            attempts=tries,
        )

    async def open_stream(
        self,
        candidates: Sequence[Backend],
        parsed: ParsedRequest,
        forwarded: dict[str, str],
        limits: Limits | None = None,
        trace: RequestTrace | None = None,
    ) -> OpenStream:
        """Send a streaming request and wait for its first chunk; errors before it become HTTP errors."""
        attempt = _Attempt()
        response, first, started, concurrency, tries = await self._exchange(
            candidates, parsed, forwarded, limits or self.defaults, attempt, trace
        )
        return OpenStream(
            attempt.backend, concurrency, response, first, started, asyncio.get_running_loop().time(), tries
        )

    def relay(
        self,
        stream: OpenStream,
        sse: SseRelay,
        finish: Callable[[float], None],
        limits: Limits | None = None,
    ) -> RelayedStream:
        """The client's side of an open stream; see RelayedStream."""
        limits = limits or self.defaults
        deadline = None if limits.total is None else stream.started_at + limits.total
        return RelayedStream(stream, sse, finish, limits.between_chunks, deadline, self._draining)


def _close(response: Response | None) -> None:
    if response is not None:
        response.close()


class RelayedStream:
    """Async-iterates the bytes to send the client, as they arrive from the backend.

    A failing backend ends the iteration with an OpenAI-style error event. `end()` runs once, when
    iteration stops for any reason (the HTTP layer calls it again in its own `finally`, so a client gone
    before the first chunk is accounted too): a completed answer's connection goes back to the pool; a
    stream whose client left is half-closed, which makes vLLM abort the request, and read to its end in
    a background task so every token the backend sent is counted; then `finish(ended_at)` is called.
    """

    __slots__ = (
        "_between_chunks",
        "_completed",
        "_draining",
        "_ended",
        "_finish",
        "_first_fed",
        "_loop",
        "_sse",
        "_stream",
        "_watchdog",
    )

    def __init__(
        self,
        stream: OpenStream,
        sse: SseRelay,
        finish: Callable[[float], None],
        between_chunks: float,
        deadline: float | None = None,
        draining: set[asyncio.Task[None]] | None = None,
    ) -> None:
        self._stream = stream
        self._sse = sse
        self._draining = draining if draining is not None else set()
        self._finish = finish
        self._between_chunks = between_chunks
        self._loop = asyncio.get_running_loop()
        self._watchdog = _GapWatchdog(stream.response, between_chunks, self._loop, deadline)
        self._completed = False
        self._first_fed = False
        self._ended = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events()

    async def _events(self) -> AsyncIterator[bytes]:
        stream, sse, watchdog, loop = self._stream, self._sse, self._watchdog, self._loop
        try:
            out = sse.feed(stream.first_chunk)
            self._first_fed = True
            if out:
                yield out
            read = stream.response.readany
            while True:
                watchdog.waiting_since = loop.time()
                try:
                    data = await read()
                except UpstreamError as exc:
                    name = stream.backend.name
                    if watchdog.past_total:
                        error = upstream_timeout(name, 0, "the whole answer within its total timeout")
                    elif watchdog.fired:
                        error = upstream_timeout(name, self._between_chunks, "a chunk")
                        stream.backend.breaker.failure("a stream stalled")
                    else:
                        error = upstream_failed(name, f"stream broke ({exc.__class__.__name__})")
                        stream.backend.breaker.failure("a stream broke")
                    sse.failed = error
                    yield error.to_sse()
                    return
                watchdog.waiting_since = None
                if not data:
                    self._completed = True
                    tail = sse.flush()
                    if tail:
                        yield tail
                    return
                out = sse.feed(data)
                if out:
                    yield out
        finally:
            self.end()

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._watchdog.cancel()
        response = self._stream.response
        ended_at = self._loop.time()
        if not self._first_fed:  # the client left before the stream was relayed: its first chunk counts
            self._first_fed = True
            self._sse.feed(self._stream.first_chunk)
        if self._completed:
            response.release()
        elif self._sse.failed is None and response.half_close():
            task = self._loop.create_task(self._count_the_rest(ended_at))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
            return
        else:
            self._sse.feed(response.take_buffered())  # sent by the backend, so generated: counted
            response.close()
        self._finish(ended_at)

    async def _count_the_rest(self, ended_at: float) -> None:
        response, sse = self._stream.response, self._sse
        try:
            async with asyncio.timeout(ABANDONED_DRAIN_S):
                while data := await response.readany():
                    sse.feed(data)
        except (UpstreamError, TimeoutError):
            pass
        finally:
            response.close()
            self._finish(ended_at)

    async def aclose(self) -> None:
        self.end()


def upstream_status_error(
    status: int, payload: bytes, backend: Backend, retry_after: str | None = None
) -> GatewayError:
    """The error the client sees for a backend's non-2xx answer: 4xx passed on (a 429 with its
    `Retry-After`), 5xx as a 502."""
    error = normalise_upstream_error(status, payload, backend.name)
    if status >= 500:
        error = upstream_failed(backend.name, f"HTTP {status}: {error.body.message}")
    elif retry_after is not None:
        error.headers["retry-after"] = retry_after
    error.headers.update(
        {
            "x-switchyard-backend": backend.name,
            "x-switchyard-pool": backend.pool.name,
            "x-switchyard-vendor": backend.pool.vendor,
        }
    )
    return error
