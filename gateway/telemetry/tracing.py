"""OpenTelemetry traces: one server span per request, with a child span per step.

    chat llama-3.1-8b                  SERVER  gen_ai.* and switchyard.* attributes, the final status
    ├── classify                               parse + the facts routing reads
    ├── route                                  the policy's decision (and any back-pressure wait)
    ├── upstream                       CLIENT  one per attempt: backend, status, error; a retried
    ├── upstream                       CLIENT  request has several
    └── account                                the ledger record and attributed cost

An incoming W3C `traceparent` (and `tracestate`) makes the request span its child, sampled as the caller
decided; each attempt sends the backend its own span's context, so vLLM's spans hang under the attempt.

Nothing here runs when tracing is off: the pipeline checks one attribute and takes the untraced path, so
no span object, context or timestamp is made. Spans get explicit start and end times instead of being
made current, so no context variable is touched on the request path either. The SDK's
`BatchSpanProcessor` exports in a background thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

if TYPE_CHECKING:
    from backends.models import Backend
    from gateway.ledger.records import UsageRecord
    from gateway.request.classify import Caller, RequestProfile
    from gateway.settings import Tracing as TracingOptions
    from policies.framework import Decision

log = logging.getLogger("switchyard.telemetry")

OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
"""`gen_ai.operation.name` per endpoint (OpenTelemetry GenAI semantic conventions)."""

_SERVER, _CLIENT, _INTERNAL = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL
_ERROR = StatusCode.ERROR


class DropSpans(SpanExporter):
    """An exporter that drops everything: the cost of tracing without a collector (benchmarks)."""

    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def parent_context(forwarded: dict[str, str]) -> Any:
    """The caller's trace context from a W3C `traceparent` (`00-<trace>-<span>-<flags>`), or None."""
    header = forwarded.get("traceparent")
    if header is None:
        return None
    parts = header.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    state = forwarded.get("tracestate")
    context = SpanContext(
        trace_id,
        span_id,
        is_remote=True,
        trace_flags=TraceFlags(flags & 1),
        trace_state=TraceState.from_header([state]) if state else None,
    )
    return trace.set_span_in_context(NonRecordingSpan(context))


class Tracing:
    """The tracer requests use; owns the provider (flushed and shut down with the app)."""

    def __init__(self, provider: TracerProvider, own_provider: bool = True) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("switchyard")
        self._own = own_provider

    def start(self, endpoint: str, caller: Caller) -> RequestTrace:
        return RequestTrace(self.tracer, endpoint, caller)

    def shutdown(self) -> None:
        if self._own:
            self.provider.shutdown()
        else:
            self.provider.force_flush()


def build_tracing(options: TracingOptions, provider: TracerProvider | None = None) -> Tracing | None:
    """Tracing as configured (None when off); `provider` replaces the configured one (tests)."""
    if provider is not None:
        return Tracing(provider, own_provider=False)
    if not options.enabled:
        return None
    provider = TracerProvider(
        resource=Resource.create({"service.name": options.service_name}),
        sampler=ParentBased(TraceIdRatioBased(options.sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(_exporter(options)))
    return Tracing(provider)


def _exporter(options: TracingOptions) -> SpanExporter:
    if options.exporter == "none":
        return DropSpans()
    if options.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
        except ImportError as exc:
            raise RuntimeError(
                "telemetry.tracing.protocol is grpc: pip install opentelemetry-exporter-otlp-proto-grpc"
            ) from exc
        return Grpc(endpoint=options.endpoint, headers=dict(options.headers) or None)  # type: ignore[no-any-return]
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=options.endpoint, headers=dict(options.headers) or None)


class RequestTrace:
    """The spans of one request; made only when tracing is on."""

    __slots__ = ("_context", "_ended", "_operation", "_tracer", "root")

    def __init__(self, tracer: trace.Tracer, endpoint: str, caller: Caller) -> None:
        self._tracer = tracer
        self._operation = operation = OPERATIONS.get(endpoint, endpoint)
        self.root = tracer.start_span(
            operation,
            context=parent_context(caller.forwarded),
            kind=_SERVER,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": "vllm",
                "switchyard.request_id": caller.request_id,
            },
        )
        self._context = trace.set_span_in_context(self.root)
        self._ended = False

    def step(self, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any] | None = None) -> None:
        span = self._tracer.start_span(
            name, context=self._context, kind=_INTERNAL, attributes=attributes, start_time=start_ns
        )
        span.end(end_time=end_ns)

    def classified(self, profile: RequestProfile, start_ns: int, end_ns: int) -> None:
        root = self.root
        root.update_name(f"{self._operation} {profile.model}")
        root.set_attribute("gen_ai.request.model", profile.model)
        if profile.max_tokens is not None:
            root.set_attribute("gen_ai.request.max_tokens", profile.max_tokens)
        if profile.n != 1:
            root.set_attribute("gen_ai.request.choice.count", profile.n)
        root.set_attribute("switchyard.stream", profile.stream)
        estimate = {"switchyard.prompt_tokens_estimate": profile.prompt_tokens_estimate}
        self.step("classify", start_ns, end_ns, estimate)

    def routed(self, decision: Decision, start_ns: int, end_ns: int) -> None:
        self.root.set_attribute("switchyard.class", decision.request_class)
        self.root.set_attribute("switchyard.route", decision.route)
        self.step(
            "route",
            start_ns,
            end_ns,
            {
                "switchyard.class": decision.request_class,
                "switchyard.route": decision.route,
                "switchyard.candidates": [b.name for b in decision.candidates],
            },
        )

    # --- upstream attempts (gateway/request/forward.py) ------------------------------------------------

    def attempt(self, backend: Backend, number: int, headers: dict[str, str]) -> Any:
        """A client span for one attempt; `headers` (to the backend) get its trace context."""
        span = self._tracer.start_span(
            "upstream",
            context=self._context,
            kind=_CLIENT,
            attributes={
                "switchyard.attempt": number,
                "switchyard.backend": backend.name,
                "switchyard.pool": backend.pool.name,
                "switchyard.vendor": backend.pool.vendor,
                "server.address": backend.url,
            },
        )
        ctx = span.get_span_context()
        if ctx.is_valid:
            headers["traceparent"] = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
            if ctx.trace_state:
                headers["tracestate"] = ctx.trace_state.to_header()
        return span

    @staticmethod
    def attempt_done(span: Any, status: int | None, error: str | None = None) -> None:
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if error is not None or (status is not None and status >= 400):
            span.set_status(Status(_ERROR, error or f"HTTP {status}"))
            if error is not None:
                span.set_attribute("error.type", error.split(":", 1)[0])
        span.end()

    # --- the end ---------------------------------------------------------------------------------------

    def finish(self, record: UsageRecord, account_start_ns: int, account_end_ns: int, attempts: int) -> None:
        """The request was accounted: its usage and cost go on the request span, which ends."""
        if self._ended:
            return
        self._ended = True
        self.step(
            "account",
            account_start_ns,
            account_end_ns,
            {"switchyard.usage_source": record.usage_source, "switchyard.cost_usd": record.cost_usd},
        )
        root = self.root
        root.set_attributes(
            {
                "gen_ai.response.model": record.model,
                "gen_ai.usage.input_tokens": record.prompt_tokens,
                "gen_ai.usage.output_tokens": record.completion_tokens,
                "http.response.status_code": record.status,
                "switchyard.vendor": record.vendor,
                "switchyard.pool": record.pool,
                "switchyard.backend": record.backend,
                "switchyard.accelerator": record.accelerator,
                "switchyard.cost_usd": record.cost_usd,
                "switchyard.attempts": attempts,
            }
        )
        if record.ttft_s is not None and record.stream:
            root.set_attribute("switchyard.ttft_s", record.ttft_s)
        if record.status >= 400:
            root.set_status(Status(_ERROR, f"HTTP {record.status}"))
        root.end()

    def fail(self, status: int, code: str | None, message: str) -> None:
        """The request ended in an error of the gateway's (no backend answer to account)."""
        if self._ended:
            return
        self._ended = True
        root = self.root
        root.set_attribute("http.response.status_code", status)
        if code:
            root.set_attribute("error.type", code)
        root.set_status(Status(_ERROR, message))
        root.end()
