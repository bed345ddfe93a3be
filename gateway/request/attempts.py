"""Step 4a: send a request to the candidates of its routing decision until one answers.

Retries happen only before anything has reached the client: a refused, broken or timed-out attempt, or
an answer of 429, 502, 503 or 504, moves the request to the next candidate, after a jittered backoff,
while the request's `max_attempts` and the gateway-wide retry budget allow. Every outcome feeds the
backend's circuit breaker (backends/breaker.py); a `Retry-After` pauses the backend. An error answered
after several backends were tried names them all (`x-switchyard-backends-tried`, the message) and says
how many (`x-switchyard-attempts`).

Timeouts (per class, gateway/request/limits.py): `connect` bounds opening a connection; `first_byte`
bounds one attempt's wait for the whole answer (non-streaming) or the first chunk (streaming); `total`,
when set, bounds the whole request.
"""

from __future__ import annotations

import asyncio

from backends.breaker import CLOSED
from backends.models import Backend
from gateway.errors import (
    GatewayError,
    no_backend,
    normalise_upstream_error,
    upstream_failed,
    upstream_timeout,
)
from gateway.request.backend_connection import ConnectFailed, ConnectTimeout, UpstreamError
from gateway.request.backend_request import BackendHeaders
from gateway.request.context import RequestContext
from gateway.request.limits import RETRY_STATUSES, RetryBudget, retry_after_seconds
from gateway.request.parse import UPSTREAM_PATHS
from gateway.request.transport import BackendResponse, Transport


class Attempts:
    """Sends requests through `transport`, with retries, failover and breaker feedback."""

    __slots__ = ("budget", "headers", "transport")

    def __init__(self, transport: Transport, budget: RetryBudget) -> None:
        self.transport = transport
        self.budget = budget
        self.headers = BackendHeaders()

    async def send(self, ctx: RequestContext) -> tuple[BackendResponse, bytes]:
        """The answer worth passing on and its body (non-streaming) or first chunk (streaming).

        Fills the context's backend (holding an in-flight slot the end of the request gives back),
        concurrency, attempts, tried, started_at and status. A non-2xx answer that is not retried comes
        back as is for a non-streaming request and as a GatewayError for a stream.
        """
        loop = asyncio.get_running_loop()
        send = self.transport.send
        parsed, limits, trace = ctx.parsed, ctx.limits, ctx.trace
        forwarded = ctx.caller.forwarded
        url_path = UPSTREAM_PATHS[parsed.endpoint]
        stream = parsed.stream
        budget = self.budget
        budget.requests += 1
        deadline = None if limits.total is None else loop.time() + limits.total
        tries = 0
        error: GatewayError | None = None
        for backend in ctx.decision.candidates:
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
            wait = limits.first_byte
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    breaker.release()
                    break
            tries += 1
            if tries > 1:
                _tried(ctx, backend)
            started = loop.time()
            ctx.hold(backend)
            response: BackendResponse | None = None
            headers = self.headers.lines(backend, forwarded) + trace.attempt(backend, tries)
            try:
                async with asyncio.timeout(wait):
                    response = await send(backend.url, url_path, headers, parsed.body, limits.connect)
                    status = response.status
                    if status < 300 and stream:
                        if response.content_type != "text/event-stream":
                            why = f"it answered a stream request with {response.content_type}, not events"
                            raise upstream_failed(backend.name, why)
                        payload = await response.readany()
                    else:
                        payload = await response.read()
            except (ConnectFailed, ConnectTimeout) as exc:
                ctx.release()
                why = f"connection to {backend.url} failed ({exc.__class__.__name__}: {exc})"
                breaker.failure(why, at_once=isinstance(exc, ConnectFailed))
                error = upstream_failed(backend.name, why)
                trace.attempt_done(None, f"{exc.__class__.__name__}: {why}")
                continue
            except UpstreamError as exc:
                _close(response)
                ctx.release()
                why = f"{exc.__class__.__name__}: {exc}"
                breaker.failure(why)
                error = upstream_failed(backend.name, why)
                trace.attempt_done(None, why)
                continue
            except TimeoutError:
                _close(response)
                ctx.release()
                breaker.failure(f"no answer within {wait:g} s")
                error = upstream_timeout(backend.name, wait, "its first chunk" if stream else "an answer")
                trace.attempt_done(None, f"timeout: no answer within {wait:g} s")
                continue
            except BaseException as exc:
                _close(response)
                ctx.release()
                breaker.release()
                trace.attempt_done(None, exc.__class__.__name__)
                if isinstance(exc, GatewayError):
                    ctx.attempts = tries
                    with_attempts(exc, ctx)
                raise
            trace.attempt_done(status)
            if status in RETRY_STATUSES:
                response.release()
                ctx.release()
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
            ctx.attempts = tries
            if stream and status >= 300:
                response.release()
                ctx.release()
                raise with_attempts(upstream_status_error(status, payload, backend), ctx)
            ctx.status = status
            ctx.started_at = started
            ctx.concurrency = backend.inflight
            return response, payload
        ctx.attempts = tries
        if error is not None:
            raise with_attempts(error, ctx)
        names = ", ".join(b.name for b in ctx.decision.candidates)
        raise no_backend(
            parsed.model, f"every candidate ({names}) is out of routing (circuit open or draining)"
        )


def _tried(ctx: RequestContext, backend: Backend) -> None:
    tried = ctx.tried
    if tried is None:
        tried = ctx.tried = [ctx.backend.name] if ctx.backend is not None else []
    tried.append(backend.name)


def _close(response: BackendResponse | None) -> None:
    if response is not None:
        response.close()


def with_attempts(error: GatewayError, ctx: RequestContext) -> GatewayError:
    """An error answered after more than one backend was tried says so: how many, and which."""
    if ctx.attempts > 1 and ctx.tried is not None:
        names = ctx.tried
        error.headers["x-switchyard-attempts"] = str(len(names))
        error.headers["x-switchyard-backends-tried"] = ",".join(names)
        error.body.message = f"{error.body.message} Backends tried: {', '.join(names)}."
    return error


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
