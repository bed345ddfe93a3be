"""The request path end to end: start → parse → classify → route → forward → end, one call per step.

Each step fills the request's context (gateway/request/context.py). A request ends in one place,
`Pipeline.end`, whatever happened (answered, streamed, cut short, failed, cancelled): it gives back the
backend's in-flight slot, accounts what was served, feeds the backend's latency averages and tells the
observers (metrics and the access log through `recorded`/`telemetry`, the trace through `ctx.trace`).
The HTTP layer (gateway/http/routes.py) ends the requests that raised; answers end here, streams when their
relay ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from time import monotonic, time_ns
from typing import TYPE_CHECKING

from backends.catalog import Catalog
from gateway.config.request_bounds import RequestLimits
from gateway.ledger.records import Ledger, UsageRecord
from gateway.openai.errors import GatewayError, invalid_request, model_not_found, no_backend
from gateway.openai.responses import answer_usage
from gateway.request.account import Served, account, stream_cost_of
from gateway.request.backpressure import ClassQueue, no_room, overloaded
from gateway.request.classify import classify
from gateway.request.context import Observer, RequestContext, Tracer
from gateway.request.drift import observe
from gateway.request.forward import Answer, Upstream, upstream_status_error, with_attempts
from gateway.request.limits import Limits, resolve_limits
from gateway.request.parse import DEFAULT_LIMITS, ParsedRequest, parse, prompt_param
from gateway.request.prompt_size import PromptSizer
from gateway.request.relay import EventStream
from gateway.request.reply_headers import Fixed, reply_headers
from gateway.request.sse import SseRelay
from gateway.request.typed_sse import TypedSseRelay, typed_usage
from gateway.tenants.reservation import charged_cost
from policies.engine import PolicyEngine
from policies.framework import Decision, Router
from policies.profile import RequestProfile

if TYPE_CHECKING:
    from gateway.tenants.admission import Tenants


CLIENT_CLOSED_REQUEST = 499
"""The status recorded for a request whose client left before its answer (nginx's, which vLLM logs too)."""


def client_closed_request() -> GatewayError:
    return GatewayError(CLIENT_CLOSED_REQUEST, "The client closed the request.", "client_closed_request")


@dataclass(slots=True)
class Reply:
    """What the HTTP layer sends back: a whole body, or a stream of server-sent events."""

    headers: dict[str, str]
    body: bytes = b""
    content_type: str = "application/json"
    stream: EventStream | None = None
    raw_headers: list[tuple[bytes, bytes]] | None = None
    """More headers, already as bytes (an API key's `x-ratelimit-*`)."""
    fixed: Fixed = ()
    """The backend's, pool's, vendor's, route's and class's headers (gateway/request/reply_headers.py)."""
    lines: bytes = b""
    """Header lines the gateway formats from its own numbers and ids (the request ids, the cost, an API
    key's `x-ratelimit-*`), sent as they are: nothing from outside goes in them unchecked."""


class Pipeline:
    """The request path, given all it works with when made (gateway/app.py builds each part first)."""

    def __init__(
        self,
        catalog: Catalog,
        router: Router,
        upstream: Upstream,
        ledger: Ledger,
        *,
        request_limits: RequestLimits = DEFAULT_LIMITS,
        tenants: Tenants | None = None,
        telemetry: Observer | None = None,
        tracing: Tracer | None = None,
        clock_scale: float = 1.0,
        prompt_sizer: PromptSizer | None = None,
    ) -> None:
        self.catalog = catalog
        self.router = router
        """The policy serving now; the policy watcher (gateway/admin/policy_reload.py) swaps in a reloaded
        one, so readers take it from here each time."""
        self.upstream = upstream
        self.ledger = ledger
        self.request_limits = request_limits
        """The bounds `parse` enforces (`gateway.limits`)."""
        self._limits_router: Router | None = None
        self._limits: dict[str, Limits] = {}
        self.queues: dict[str, ClassQueue] = {}
        self.queued = 0
        """Requests waiting for room (back-pressure), all classes."""
        self._settling: set[asyncio.Task[None]] = set()
        self.telemetry = telemetry
        """Metrics and the access log, told of every ledger record and every request that ends in an error;
        None when both are off."""
        self.recorded: Callable[[UsageRecord, ParsedRequest], None] | None = (
            telemetry.recorded if telemetry is not None else None
        )
        self.tracing = tracing
        """OpenTelemetry tracing; None when off (then no span is ever made)."""
        self.tenants = tenants
        """Keys, limits and budgets (gateway/tenants/); None when `auth.mode` is open."""
        self.prompt_sizer = prompt_sizer if prompt_sizer is not None else PromptSizer()
        """Prompt tokens from characters, learned from what the backends count (`_account` teaches it)."""
        self.clock_scale = clock_scale
        """Backend seconds per gateway second (`policy.clock_scale`): what observe() feeds routing and
        the back-pressure wait are scaled by it, so both stay on the clock the SLOs are written for."""

    def switch_telemetry(self, telemetry: Observer | None, tracing: Tracer | None) -> None:
        """Observe the requests from now on with `telemetry` and `tracing` instead.

        Not for the gateway, which is given its telemetry once, when built: for a benchmark that compares
        telemetry modes inside one process (loadtest/bench/switchable_gateway.py). Requests already past
        `parse` keep the trace they started with."""
        self.telemetry, self.tracing = telemetry, tracing
        self.recorded = telemetry.recorded if telemetry is not None else None

    async def handle(self, ctx: RequestContext, classified: bool = False) -> Reply:
        """Serve one request whose body has been read (`classified`: parsed and classified already); an
        error raised here is ended by the caller. An API key's request has its hints capped by the key, is
        routed, then admitted by the key's and its team's limits and budget (one Redis round trip); `end`
        settles or releases the admission. All in this one coroutine: each coroutine between the HTTP
        layer and the backend's socket is one frame more every time the request's task resumes."""
        if not classified:
            self.parse(ctx)
            self.classify(ctx)
        caller, tenants = ctx.caller, self.tenants
        key = caller.key
        if key is not None:
            assert tenants is not None  # a key is set only when the tenants seam is on
            tenants.check(key, ctx.profile)
        self.route(ctx)
        if self.must_wait(ctx):
            await self.wait_for_room(ctx)
        if key is not None and tenants is not None:
            ignored = caller.hints_ignored or []
            caller.admission = await tenants.admit(key, ctx.profile, ctx.decision.candidates, ignored)
        if ctx.parsed.stream:
            return await self.stream(ctx)
        upstream = self.upstream
        response, body = await upstream.attempts.send(ctx)
        return self.completed(ctx, upstream.answered(ctx, response, body))

    def parse(self, ctx: RequestContext) -> None:
        """The request starts (its trace context, with tracing on) and its body is read."""
        tracing = self.tracing
        if tracing is not None:
            ctx.started_ns = time_ns()
            ctx.trace = tracing.start(ctx.endpoint, ctx.caller)
        ctx.parsed = parse(ctx.endpoint, ctx.body, self.request_limits)

    def classify(self, ctx: RequestContext) -> None:
        router = self.router  # with a key, the profile holds only the hints it may give (allowance.py)
        if ctx.caller.key is not None and isinstance(router, PolicyEngine):
            ctx.profile = classify(ctx.parsed, ctx.caller, self.prompt_sizer, router.hints, router.classify)
        else:
            ctx.profile = classify(ctx.parsed, ctx.caller, self.prompt_sizer)
        ctx.classified_ns = time_ns()

    def route(self, ctx: RequestContext) -> None:
        """The policy's decision and the limits of the class it chose."""
        ctx.decision = decision = self.decide(ctx.profile)
        ctx.limits = self.limits(decision.request_class)
        ctx.routed_ns = time_ns()

    async def complete(self, ctx: RequestContext) -> Reply:
        """Forward a non-streaming request; its answer ends it."""
        return self.completed(ctx, await self.upstream.complete(ctx))

    def completed(self, ctx: RequestContext, answer: Answer) -> Reply:
        """A non-streaming request's answer: the request ends with it."""
        backend = ctx.backend
        assert backend is not None
        if not 200 <= ctx.status < 300:
            raise with_attempts(upstream_status_error(ctx.status, answer.body, backend), ctx)
        ctx.usage = typed_usage(answer.body) if ctx.parsed.typed else answer_usage(answer.body)
        ctx.ended_at = ctx.first_byte_at
        record = self.end(ctx)
        headers, fixed, lines = reply_headers(ctx, backend)
        if record is not None:
            lines += b"x-switchyard-cost-usd: %.10f\r\n" % record.cost_usd
        raw, lines = _admitted_headers(ctx, lines)
        return Reply(headers, answer.body, answer.content_type, None, raw, fixed, lines)

    async def stream(self, ctx: RequestContext) -> Reply:
        """Open a stream; the relay ends the request when the stream ends."""
        opened = await self.upstream.open_stream(ctx)
        ctx.decision.answered(ctx.profile.prompt_tokens_estimate)  # prefilled: out of the TTFT estimate
        parsed = ctx.parsed
        ctx.sse = sse = TypedSseRelay(ctx.endpoint) if parsed.typed else SseRelay(parsed.client_wants_usage)
        if ctx.parsed.client_wants_usage:
            sse.cost_of = stream_cost_of(self.ledger, ctx)
        stream = self.upstream.relay(ctx, opened, sse, self.end)
        headers, fixed, lines = reply_headers(ctx, opened.backend)
        raw, lines = _admitted_headers(ctx, lines)
        return Reply(headers, b"", "text/event-stream", stream, raw, fixed, lines)

    # --- the end of every request ---------------------------------------------------------------------

    def end(self, ctx: RequestContext, error: BaseException | None = None) -> UsageRecord | None:
        """The request is over: give back the in-flight slot, account, observe. Runs once per request."""
        if ctx.ended:
            return None
        ctx.ended = True
        ctx.release()
        if ctx.decision is not None:  # a whole answer, or none: its prompt leaves the prefill estimate
            ctx.decision.answered(ctx.profile.prompt_tokens_estimate)
        if self.queued:
            self._room_made()
        if error is not None:
            self._failed(ctx, error)
            return None
        sse = ctx.sse
        if sse is None:
            status, usage, events = ctx.status, ctx.usage, 0
        else:
            status = sse.failed.status if sse.failed is not None else 200
            usage = sse.usage
            events = sse.events if usage is None else 0  # counted only when accounting needs them
        backend = ctx.backend
        assert backend is not None  # no error: a backend answered
        served = Served(
            backend, ctx.concurrency, status, usage, events, ctx.started_at, ctx.first_byte_at, ctx.ended_at
        )
        if usage is None and (sse is not None or status == CLIENT_CLOSED_REQUEST):
            served.first_byte_at = ctx.first_byte_at or None
            self._settle_later(ctx, served)  # cut short: ask the backend for the prompt's count
            return None
        return self._account(ctx, served, True)

    def client_left(self, ctx: RequestContext) -> None:
        """A non-streaming client left before its answer (gateway/http/routes.py saw `http.disconnect` and
        cancelled the request, which aborted the backend's connection): recorded as 499 with the prompt
        the backend counts and no completion tokens, since none reached the gateway; nothing to record
        when no backend had the request yet."""
        if ctx.backend is None or ctx.ended:
            self.end(ctx, client_closed_request())
            return
        ctx.status = CLIENT_CLOSED_REQUEST
        ctx.usage = None
        ctx.ended_at = monotonic()
        self.end(ctx)

    def _account(self, ctx: RequestContext, served: Served, observe_latency: bool) -> UsageRecord:
        ctx.accounting_ns = time_ns()
        parsed = ctx.parsed
        record = account(self.ledger, ctx.caller, parsed, ctx.profile, ctx.decision.route, served)
        record.queued_s = ctx.queued_s
        admission = ctx.caller.admission
        if admission is not None:
            tenants = self.tenants
            assert tenants is not None  # an admission comes from the tenants seam
            tenants.settle(admission, record.prompt_tokens, record.completion_tokens, charged_cost(record))
        if observe_latency:
            observe(served.backend, record, self.clock_scale)
        if record.usage_source == "backend" or served.prompt_tokens_counted is not None:
            self.prompt_sizer.learn(parsed.model, record.key, parsed.prompt_chars, record.prompt_tokens)
        if self.recorded is not None:
            self.recorded(record, parsed)
        ctx.trace.finish(ctx, record)
        return record

    def _failed(self, ctx: RequestContext, error: BaseException) -> None:
        if isinstance(error, GatewayError):
            status, code, message = error.status, error.body.code, error.body.message
        else:
            status, code, message = 500, "server_error", error.__class__.__name__
        admission = ctx.caller.admission
        if admission is not None:
            tenants = self.tenants
            assert tenants is not None  # an admission comes from the tenants seam
            tenants.release(admission)  # nothing was served: no record
        ctx.trace.fail(ctx, status, code, message)
        telemetry = self.telemetry
        if telemetry is not None and isinstance(error, Exception):
            if not isinstance(error, GatewayError):
                message = "Internal gateway error."
            telemetry.failed(ctx.caller.request_id, ctx.endpoint, status, code, message, ctx.body)

    def _settle_later(self, ctx: RequestContext, served: Served) -> None:
        task = asyncio.get_running_loop().create_task(self._settle(ctx, served))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self, ctx: RequestContext, served: Served) -> None:
        try:
            served.prompt_tokens_counted = await self.upstream.count_prompt_tokens(served.backend, ctx.parsed)
        finally:
            self._account(ctx, served, False)

    async def settle_pending(self) -> None:
        """Wait for streams still being settled (at shutdown, before the ledger is flushed)."""
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    # --- routing ------------------------------------------------------------------------------------------

    def limits(self, request_class: str) -> Limits:
        """The class's timeouts, retries and back-pressure; resolved once per policy and class."""
        router = self.router
        if router is not self._limits_router:
            self._limits = {}
            self._limits_router = router
        limits = self._limits.get(request_class)
        if limits is None:
            route = (
                router.loaded.policy.routes.get(request_class) if isinstance(router, PolicyEngine) else None
            )
            limits = resolve_limits(self.upstream.timeouts, self.upstream.retries, route)
            self._limits[request_class] = limits
        return limits

    def must_wait(self, ctx: RequestContext) -> bool:
        """Whether `wait_for_room` may hold the request (waiters, or no room); if not, it is skipped."""
        limits, cls = ctx.limits, ctx.decision.request_class
        if limits.backpressure is None:
            return False
        assert limits.saturation is not None
        queue = self.queues.get(cls)
        if queue is None:
            queue = self.queues[cls] = ClassQueue()
        return bool(queue.waiters) or no_room(ctx.decision, limits.saturation)

    async def wait_for_room(self, ctx: RequestContext) -> None:
        """Back-pressure: queue while every candidate is saturated (see gateway/request/backpressure.py)."""
        began = monotonic()
        decision = await self._room(ctx.profile, ctx.decision, ctx.limits)
        if decision is not ctx.decision:  # it waited, then was routed again
            ctx.queued_s = monotonic() - began
        ctx.decision = decision
        ctx.routed_ns = time_ns()

    async def _room(self, profile: RequestProfile, decision: Decision, limits: Limits) -> Decision:
        options, saturation = limits.backpressure, limits.saturation
        assert options is not None and saturation is not None
        cls = decision.request_class
        queue = self.queues.get(cls)
        if queue is None:
            queue = self.queues[cls] = ClassQueue()
        if not queue.waiters and not no_room(decision, saturation):
            return decision
        if len(queue) >= options.max_queued:
            queue.refused += 1
            raise overloaded(cls, options.retry_after_s, f"{len(queue)} requests already queued")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options.max_wait_ms / 1000.0 / self.clock_scale
        waiter = queue.join(profile.priority)
        self.queued += 1
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    queue.refused += 1
                    raise overloaded(cls, options.retry_after_s, f"waited {options.max_wait_ms:g} ms")
                if queue.waiters[0] is waiter:
                    decision = self.decide(profile)
                    if not no_room(decision, saturation):
                        queue.served += 1
                        return decision
                await queue.turn(waiter, remaining)
        finally:
            self.queued -= 1
            queue.leave(waiter)

    def _room_made(self) -> None:
        for queue in self.queues.values():
            queue.wake_head()

    def decide(self, profile: RequestProfile) -> Decision:
        """The policy's choice of candidates; an error when none can serve."""
        serving = self.catalog.serving(profile.model)
        if not serving:
            raise model_not_found(profile.model)
        decision = self.router.choose(profile, serving)
        if decision.candidates:
            return decision
        why = decision.why_none or "no backend fits"
        if decision.rejected_for_context:
            raise invalid_request(
                f"Request too long: {why}.",
                param=prompt_param(profile.parsed),
                code="context_length_exceeded",
            )
        raise no_backend(profile.model, why)


def _admitted_headers(ctx: RequestContext, lines: bytes) -> tuple[list[tuple[bytes, bytes]] | None, bytes]:
    """`Reply.raw_headers`, and `lines` then the `x-ratelimit-*` ones, of the request's key admission."""
    admission = ctx.caller.admission
    return (None, lines) if admission is None else (admission.raw_headers, lines + admission.rate_lines)
