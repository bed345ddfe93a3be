"""The request path end to end: parse → classify → route → forward → account, one call per step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from time import time_ns
from typing import TYPE_CHECKING

import msgspec

from backends.catalog import Catalog
from backends.models import Backend
from gateway.errors import GatewayError, invalid_request, model_not_found, no_backend
from gateway.ledger.records import Ledger, UsageRecord
from gateway.openai.responses import usage_decoder
from gateway.request.account import Served, account
from gateway.request.backpressure import ClassQueue, no_room, overloaded
from gateway.request.classify import Caller, classify
from gateway.request.forward import OpenStream, RelayedStream, Upstream, upstream_status_error
from gateway.request.limits import Limits, resolve_limits
from gateway.request.parse import Endpoint, ParsedRequest, parse
from gateway.request.sse import SseRelay
from gateway.tenants.reservation import charged_cost
from policies.engine import PolicyEngine
from policies.framework import Decision, Router
from policies.profile import RequestProfile

if TYPE_CHECKING:
    from gateway.telemetry import Telemetry
    from gateway.telemetry.tracing import RequestTrace, Tracing
    from gateway.tenants.admission import Tenants


@dataclass(slots=True)
class Reply:
    """What the HTTP layer sends back: a whole body, or a stream of server-sent events."""

    headers: dict[str, str]
    body: bytes = b""
    content_type: str = "application/json"
    stream: RelayedStream | None = None


class Pipeline:
    def __init__(self, catalog: Catalog, router: Router, upstream: Upstream, ledger: Ledger) -> None:
        self.catalog = catalog
        self.router = router
        self.upstream = upstream
        self.ledger = ledger
        self._limits_router: Router | None = None
        self._limits: dict[str, Limits] = {}
        self.queues: dict[str, ClassQueue] = {}
        self.queued = 0
        """Requests waiting for room (back-pressure), all classes."""
        self._settling: set[asyncio.Task[None]] = set()
        self.recorded: Callable[[UsageRecord, ParsedRequest], None] | None = None
        """Telemetry fed once per ledger record (metrics, access log); None when both are off."""
        self._tracing: Tracing | None = None
        self.tracing = None
        self.telemetry: Telemetry | None = None
        """Metrics and the access log, for errors the gateway answers itself (gateway/routes.py)."""
        self.tenants: Tenants | None = None
        """Keys, limits and budgets (gateway/tenants/); None when `auth.mode` is open."""

    @property
    def tracing(self) -> Tracing | None:
        """OpenTelemetry tracing; None when off (then no span is ever made)."""
        return self._tracing

    @tracing.setter
    def tracing(self, tracing: Tracing | None) -> None:
        # `handle` becomes the traced variant itself rather than awaiting it: one coroutine frame fewer
        # for every resumption of the request.
        self._tracing = tracing
        self.handle = self._untraced if tracing is None else self._traced  # type: ignore[method-assign]

    async def handle(self, endpoint: Endpoint, body: bytes, caller: Caller) -> Reply:
        """Serve one request (replaced by `_untraced` or `_traced` when tracing is set)."""
        return await self._untraced(endpoint, body, caller)

    async def _untraced(self, endpoint: Endpoint, body: bytes, caller: Caller) -> Reply:
        parsed = parse(endpoint, body)
        profile = classify(parsed, caller)
        if caller.key is not None:
            return await self._admitted(parsed, profile, caller)
        decision = self.route(profile)
        limits = self.limits(decision.request_class)
        if limits.backpressure is not None:
            decision = await self.wait_for_room(profile, decision, limits)
        if parsed.stream:
            return await self._stream(parsed, profile, decision, caller, limits)
        return await self._complete(parsed, profile, decision, caller, limits)

    async def _admitted(self, parsed: ParsedRequest, profile: RequestProfile, caller: Caller) -> Reply:
        """The request of an API key: capped hints, routed, admitted by its limits, released on failure."""
        tenants, tenant = self.tenants, caller.key
        assert tenants is not None and tenant is not None
        ignored = tenants.check(tenant, profile)
        decision = self.route(profile)
        limits = self.limits(decision.request_class)
        if limits.backpressure is not None:
            decision = await self.wait_for_room(profile, decision, limits)
        if caller.trace is not None:
            caller.trace.decision = decision
            caller.trace.routed_ns = time_ns()
        admission = caller.admission = await tenants.admit(tenant, profile, decision.candidates, ignored)
        try:
            if parsed.stream:
                return await self._stream(parsed, profile, decision, caller, limits)
            return await self._complete(parsed, profile, decision, caller, limits)
        except BaseException:
            tenants.release(admission)  # no record was made; a stream that started settles in `finish`
            raise

    async def _traced(self, endpoint: Endpoint, body: bytes, caller: Caller) -> Reply:
        """`handle` with spans (gateway/telemetry/tracing.py); the request span ends once accounted.

        An unsampled request (no trace) runs here too rather than awaiting `_untraced`: a coroutine
        layer costs something at every resumption of the request, and most requests of a busy gateway
        that traces are not sampled.
        """
        trace = caller.trace = self._tracing.start(endpoint, caller)  # type: ignore[union-attr]
        try:
            parsed = parse(endpoint, body)
            profile = classify(parsed, caller)
            if trace is not None:
                trace.profile = profile
                trace.classified_ns = time_ns()
            if caller.key is not None:
                return await self._admitted(parsed, profile, caller)
            decision = self.route(profile)
            limits = self.limits(decision.request_class)
            if limits.backpressure is not None:
                decision = await self.wait_for_room(profile, decision, limits)
            if trace is not None:
                trace.decision = decision
                trace.routed_ns = time_ns()
            if parsed.stream:
                return await self._stream(parsed, profile, decision, caller, limits)
            return await self._complete(parsed, profile, decision, caller, limits)
        except GatewayError as error:
            if trace is not None:
                trace.fail(error.status, error.body.code, error.body.message)
            raise
        except BaseException as exc:
            if trace is not None:
                trace.fail(500, "server_error", exc.__class__.__name__)
            raise

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

    async def wait_for_room(self, profile: RequestProfile, decision: Decision, limits: Limits) -> Decision:
        """Back-pressure: queue while every candidate is saturated (see gateway/request/backpressure.py)."""
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
        deadline = loop.time() + options.max_wait_ms / 1000.0
        waiter = queue.join(profile.priority)
        self.queued += 1
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    queue.refused += 1
                    raise overloaded(cls, options.retry_after_s, f"waited {options.max_wait_ms:g} ms")
                if queue.waiters[0] is waiter:
                    decision = self.route(profile)
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

    def route(self, profile: RequestProfile) -> Decision:
        serving = self.catalog.serving(profile.model)
        if not serving:
            raise model_not_found(profile.model)
        decision = self.router.choose(profile, serving)
        if decision.candidates:
            return decision
        why = decision.why_none or "no backend fits"
        if decision.rejected_for_context:
            raise invalid_request(
                f"Request too long: {why}.", param="messages", code="context_length_exceeded"
            )
        raise no_backend(profile.model, why)

    async def _complete(
        self,
        parsed: ParsedRequest,
        profile: RequestProfile,
        decision: Decision,
        caller: Caller,
        limits: Limits,
    ) -> Reply:
        trace = caller.trace
        answer = await self.upstream.complete(decision.candidates, parsed, caller.forwarded, limits, trace)
        backend = answer.backend
        backend.inflight -= 1
        if self.queued:
            self._room_made()
        if not 200 <= answer.status < 300:
            raise upstream_status_error(answer.status, answer.body, backend)
        try:
            usage = usage_decoder.decode(answer.body).usage
        except msgspec.DecodeError:
            usage = None
        served = Served(
            backend=backend,
            concurrency=answer.concurrency,
            status=answer.status,
            usage=usage,
            completion_events=0,
            started_at=answer.started_at,
            first_byte_at=answer.first_byte_at,
            ended_at=answer.first_byte_at,
        )
        accounting = time_ns() if trace is not None else 0
        record = account(self.ledger, caller.request_id, parsed, profile, decision.route, served)
        if caller.admission is not None:
            self.tenants.settle(  # type: ignore[union-attr]
                caller.admission, record.prompt_tokens, record.completion_tokens, charged_cost(record)
            )
        observe(backend, record)
        if self.recorded is not None:
            self.recorded(record, parsed)
        if trace is not None:
            trace.finish(record, accounting, time_ns(), answer.attempts)
        headers = _reply_headers(caller.request_id, backend, decision, profile)
        headers["x-switchyard-cost-usd"] = f"{record.cost_usd:.10f}"
        if caller.admission is not None:
            headers.update(caller.admission.headers)
        if answer.attempts > 1:
            headers["x-switchyard-attempts"] = str(answer.attempts)
        return Reply(headers=headers, body=answer.body, content_type=answer.content_type)

    async def _stream(
        self,
        parsed: ParsedRequest,
        profile: RequestProfile,
        decision: Decision,
        caller: Caller,
        limits: Limits,
    ) -> Reply:
        trace = caller.trace
        opened = await self.upstream.open_stream(decision.candidates, parsed, caller.forwarded, limits, trace)
        sse = SseRelay(keep_usage_chunk=parsed.client_wants_usage)

        def finish(ended_at: float) -> None:
            opened.backend.inflight -= 1
            if self.queued:
                self._room_made()
            served = _served_stream(opened, sse, ended_at)
            if served.usage is None:
                self._settle_later(caller, parsed, profile, decision.route, served, trace)
                return
            accounting = time_ns() if trace is not None else 0
            record = account(self.ledger, caller.request_id, parsed, profile, decision.route, served)
            if caller.admission is not None:
                self.tenants.settle(  # type: ignore[union-attr]
                    caller.admission, record.prompt_tokens, record.completion_tokens, charged_cost(record)
                )
            observe(opened.backend, record)
            if self.recorded is not None:
                self.recorded(record, parsed)
            if trace is not None:
                trace.finish(record, accounting, time_ns(), opened.attempts)

        stream = self.upstream.relay(opened, sse, finish, limits)
        headers = _reply_headers(caller.request_id, opened.backend, decision, profile)
        if caller.admission is not None:
            headers.update(caller.admission.headers)
        if opened.attempts > 1:
            headers["x-switchyard-attempts"] = str(opened.attempts)
        return Reply(headers=headers, content_type="text/event-stream", stream=stream)

    def _settle_later(
        self,
        caller: Caller,
        parsed: ParsedRequest,
        profile: RequestProfile,
        route: str,
        served: Served,
        trace: RequestTrace | None = None,
    ) -> None:
        """A stream that ended without its usage chunk: ask the backend to count the prompt, then record."""
        task = asyncio.get_running_loop().create_task(
            self._settle(caller, parsed, profile, route, served, trace)
        )
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(
        self,
        caller: Caller,
        parsed: ParsedRequest,
        profile: RequestProfile,
        route: str,
        served: Served,
        trace: RequestTrace | None = None,
    ) -> None:
        try:
            served.prompt_tokens_counted = await self.upstream.count_prompt_tokens(served.backend, parsed)
        finally:
            accounting = time_ns()
            record = account(self.ledger, caller.request_id, parsed, profile, route, served)
            if caller.admission is not None:
                self.tenants.settle(  # type: ignore[union-attr]
                    caller.admission, record.prompt_tokens, record.completion_tokens, charged_cost(record)
                )
            if self.recorded is not None:
                self.recorded(record, parsed)
            if trace is not None:
                trace.finish(record, accounting, time_ns(), 1)

    async def settle_pending(self) -> None:
        """Wait for streams still being settled (at shutdown, before the ledger is flushed)."""
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)


def observe(backend: Backend, record: UsageRecord) -> None:
    """Feed the backend's latency averages, which routing uses to predict the next request's latency.

    Streams give time to first token and time per output token; a non-streaming answer gives only a
    time per token that includes the prefill, so it is used only when the output is long enough to
    dominate.
    """
    tokens = record.completion_tokens
    if record.status != 200 or tokens < 1:
        return
    if record.stream and record.ttft_s is not None:
        tpot = (record.duration_s - record.ttft_s) / (tokens - 1) if tokens > 1 else None
        backend.observed.add(record.ttft_s, tpot)
    elif tokens >= 16:
        backend.observed.add(None, record.duration_s / tokens)


def _served_stream(opened: OpenStream, sse: SseRelay, ended_at: float) -> Served:
    return Served(
        backend=opened.backend,
        concurrency=opened.concurrency,
        status=sse.failed.status if sse.failed is not None else 200,
        usage=sse.usage,
        completion_events=sse.events,
        started_at=opened.started_at,
        first_byte_at=opened.first_byte_at,
        ended_at=ended_at,
    )


def _reply_headers(
    request_id: str, backend: Backend, decision: Decision, profile: RequestProfile
) -> dict[str, str]:
    return {
        "x-request-id": request_id,
        "x-switchyard-backend": backend.name,
        "x-switchyard-pool": backend.pool.name,
        "x-switchyard-vendor": backend.pool.vendor,
        "x-switchyard-route": decision.route,
        "x-switchyard-class": profile.request_class,
    }
