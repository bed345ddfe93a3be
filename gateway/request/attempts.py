"""Step 4a: send a request to the candidates of its routing decision until one answers.

Retries happen only before anything has reached the client: a refused, broken or timed-out attempt, or
a 5xx or 429 answer, moves the request to the next candidate, after a jittered backoff, while the
request's `max_attempts` and the gateway-wide retry budget allow. A 400 refusing the prompt as longer
than the backend's context window moves it at once to the next candidate with a longer one (routing fits
prompts by an estimate of their tokens; `too_long_for`). A `Retry-After` pauses the backend. An
error answered after several backends were tried names them all (`x-switchyard-backends-tried`, the
message) and says how many (`x-switchyard-attempts`).

Breaker feedback counts only failures that are the backend's (gateway/request/attribution.py): a refused
or broken connection at once; a 5xx or a timeout once a second backend served the same request; never
when a second backend failed it the same way (then failover stops and the client gets that error), nor
a timeout the request's own size explains (a 504 at once, no failover).

Timeouts (per class, gateway/request/limits.py): `connect` bounds opening a connection; `first_byte`
bounds one attempt's wait for the whole answer (non-streaming) or the first chunk (streaming); `total`,
when set, bounds the whole request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from time import monotonic

from backends.breaker import CLOSED, Breaker
from backends.models import Backend
from gateway.openai.errors import (
    GatewayError,
    no_backend,
    normalise_upstream_error,
    upstream_failed,
    upstream_timeout,
)
from gateway.request.attribution import (
    FIVE_XX,
    TIMEOUT,
    size_explains_timeout,
    the_requests_fault,
    too_large_for_timeout,
)
from gateway.request.context import RequestContext
from gateway.request.limits import RETRY_STATUSES, RetryBudget, retry_after_seconds
from gateway.request.parse import UPSTREAM_PATHS
from gateway.upstream.connection import ConnectFailed, ConnectTimeout, UpstreamError
from gateway.upstream.request import BackendHeaders
from gateway.upstream.transport import BackendResponse, Transport


class _Within:
    """`asyncio.timeout(delay)` for one attempt, lighter (every request enters one): a plain context
    manager and one loop timer, no coroutines. When the delay passes, the task is cancelled and the block
    raises TimeoutError, unless something else cancelled the task too (as asyncio.timeout does)."""

    __slots__ = ("_cancelling", "_expired", "_handle", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("_Within is used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._expired = False
        self._handle = loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._handle.cancel()
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


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
        suspect: Breaker | None = None
        """The breaker of an earlier attempt's 5xx or timeout, until a later attempt says whose it was."""
        suspect_kind = suspect_why = ""
        refused_context = 0
        """The longest context window that refused the prompt as too long: shorter ones are skipped."""
        rerouted = False
        """The last attempt was refused for context: the next goes at once, outside the retry budget."""
        candidates = ctx.decision.candidates
        for backend in candidates:
            if backend.max_model_len <= refused_context or not backend.healthy:
                continue  # too short for this prompt; or opened, drained or paused since routing
            breaker = backend.breaker
            if breaker.state is not CLOSED and not breaker.allow():
                continue
            if tries and not rerouted:
                if tries >= limits.max_attempts or not budget.take():
                    breaker.release()
                    break
                await asyncio.sleep(budget.backoff(tries))
            rerouted = False
            wait = limits.first_byte
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    breaker.release()
                    break
            tries += 1
            if tries > 1:
                _tried(ctx, backend)
            ctx.started_at = monotonic()  # latency stamps: uvloop's loop.time() counts whole milliseconds
            ctx.hold(backend)
            response: BackendResponse | None = None
            headers = self.headers.lines(backend, forwarded) + trace.attempt(backend, tries)
            try:
                with _Within(loop, wait):
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
                trace.attempt_done(None, f"timeout: no answer within {wait:g} s")
                prompt = ctx.profile.prompt_tokens_estimate
                predicted = size_explains_timeout(parsed, prompt, backend, wait)
                if predicted is not None:  # the request's own size: not the backend's fault, nor retried
                    breaker.release()
                    _unresolved(suspect, suspect_why)
                    ctx.attempts = tries
                    raise with_attempts(
                        too_large_for_timeout(parsed, prompt, backend, wait, predicted), ctx
                    ) from None
                why = f"no answer within {wait:g} s"
                if suspect is not None and suspect_kind is TIMEOUT:
                    raise self._the_requests(ctx, tries, suspect, breaker, TIMEOUT, 504, b"", wait) from None
                if suspect is not None:
                    suspect.failure(suspect_why)
                suspect, suspect_kind, suspect_why = breaker, TIMEOUT, why
                error = upstream_timeout(backend.name, wait, "its first chunk" if stream else "an answer")
                continue
            except BaseException as exc:
                _close(response)
                ctx.release()
                breaker.release()
                if suspect is not None:
                    suspect.release()  # cancelled: no verdict
                trace.attempt_done(None, exc.__class__.__name__)
                if isinstance(exc, GatewayError):
                    ctx.attempts = tries
                    with_attempts(exc, ctx)
                raise
            trace.attempt_done(status)
            if status == 400 and too_long_for(backend, payload, candidates):
                response.release()
                ctx.release()
                breaker.release()  # the gateway's estimate of the prompt missed: nobody's failure
                refused_context, rerouted = backend.max_model_len, True
                error = upstream_status_error(status, payload, backend)
                continue
            if status >= 500 or status in RETRY_STATUSES:
                response.release()
                ctx.release()
                retry_after = response.header("retry-after")
                if retry_after is not None:
                    breaker.pause(retry_after_seconds(retry_after))
                error = upstream_status_error(status, payload, backend, retry_after)
                if status == 429:
                    breaker.release()  # overloaded, not broken
                    continue
                if suspect is not None and suspect_kind is FIVE_XX:
                    raise self._the_requests(ctx, tries, suspect, breaker, FIVE_XX, status, payload, wait)
                if suspect is not None:
                    suspect.failure(suspect_why)
                suspect, suspect_kind, suspect_why = breaker, FIVE_XX, f"HTTP {status}"
                continue
            if suspect is not None:  # this backend served what the suspect failed: the suspect's fault
                suspect.failure(suspect_why)
                suspect = None
            if breaker.failures or breaker.state is not CLOSED:
                breaker.success()
            ctx.attempts = tries
            if stream and status >= 300:
                response.release()
                ctx.release()
                raise with_attempts(upstream_status_error(status, payload, backend), ctx)
            ctx.status = status
            ctx.concurrency = backend.inflight
            return response, payload
        ctx.attempts = tries
        _unresolved(suspect, suspect_why)
        if error is not None:
            raise with_attempts(error, ctx)
        names = ", ".join(b.name for b in ctx.decision.candidates)
        raise no_backend(
            parsed.model, f"every candidate ({names}) is out of routing (circuit open or draining)"
        )

    @staticmethod
    def _the_requests(
        ctx: RequestContext,
        tries: int,
        suspect: Breaker,
        breaker: Breaker,
        kind: str,
        status: int,
        payload: bytes,
        waited: float,
    ) -> GatewayError:
        """Two backends failed the request the same way: the request's fault; neither breaker counts it."""
        suspect.release()
        breaker.release()
        ctx.attempts = tries
        backend = ctx.backend
        assert backend is not None
        return the_requests_fault(kind, ctx.tried_names(), status, payload, backend, waited)


CONTEXT_REFUSALS = (b"maximum context length", b"maximum model length", b"context_length_exceeded")
"""How vLLM (and the simulator) say a prompt is longer than the backend's context window."""


def too_long_for(backend: Backend, payload: bytes, candidates: Sequence[Backend]) -> bool:
    """A 400 refusing the prompt as longer than this backend's context, when a longer candidate is left.

    Routing fits prompts by an estimate of their tokens (gateway/request/prompt_size.py); when it
    undercounts, the backend refuses the request before doing any work, and the request goes to a
    candidate with a longer context window, at once, outside the retry budget and `max_attempts` (each
    such step is to a strictly longer window, so there are few)."""
    text = payload[:2048].lower()
    if not any(marker in text for marker in CONTEXT_REFUSALS):
        return False
    return any(b.max_model_len > backend.max_model_len for b in candidates)


def _unresolved(suspect: Breaker | None, why: str) -> None:
    """A suspect failure no later attempt could check: counted, after the backend's health check agrees."""
    if suspect is not None:
        suspect.suspect(why)


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
