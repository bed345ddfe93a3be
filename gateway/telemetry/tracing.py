"""OpenTelemetry traces: one server span per request, with a child span per step.

    chat llama-3.1-8b                  SERVER  gen_ai.* and switchyard.* attributes, the final status
    ├── classify                               parse + the facts routing reads
    ├── route                                  the policy's decision (and any back-pressure wait)
    ├── upstream                       CLIENT  one per attempt: backend, status, error; a retried
    ├── upstream                       CLIENT  request has several
    └── account                                the ledger record and attributed cost

An incoming W3C `traceparent` (and `tracestate`) makes the request span its child, sampled as the caller
decided; each attempt sends the backend its own span's context, so vLLM's spans hang under the attempt.
Without one, `sample_ratio` decides, exactly as the SDK's `ParentBased(TraceIdRatioBased(ratio))`.

The request path makes no SDK object and no span: a request keeps references and timestamps, and when
it ends one flat msgpack tuple goes to a `SpanShipper` (gateway/telemetry/span_shippers.py). The event
loop writes batches of them to the span-export child process (gateway/telemetry/span_export.py), which
builds the spans and runs the OTLP exporter on another core (or, with an exporter object passed in, a
thread builds and exports them in process: tests). An unsampled request records nothing and still
passes its context (flags 00) to the backend. The request path never asks whether it is traced: it
calls the hooks of `ctx.trace` (gateway/request/context.py), which do nothing for a request that is
not. With tracing off, nothing here runs.
"""

from __future__ import annotations

from functools import lru_cache
from random import getrandbits
from time import time_ns
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from gateway.request.context import UNTRACED, Untraced
from gateway.telemetry.span_shippers import ChildProcessShipper, InProcessShipper, SpanShipper

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from backends.models import Backend
    from gateway.config.settings import Tracing as TracingOptions
    from gateway.ledger.records import UsageRecord
    from gateway.request.classify import Caller
    from gateway.request.context import RequestContext

__all__ = [
    "ChildProcessShipper",
    "InProcessShipper",
    "Parent",
    "RequestTrace",
    "SpanShipper",
    "Tracing",
    "build_tracing",
    "parent_context",
    "server_address",
]

_MASK64 = (1 << 64) - 1
_encode = msgspec.msgpack.Encoder().encode
"""A finished trace is encoded at once: its objects die young instead of lingering until the next batch
(measured: keeping the records for the batch and encoding them together costs more, in the GC)."""


class Parent(msgspec.Struct, frozen=True):
    """The caller's span, from a W3C `traceparent` (`00-<trace>-<span>-<flags>`)."""

    trace_id: int
    span_id: int
    sampled: bool
    tracestate: str | None = None


def parent_context(forwarded: dict[str, str]) -> Parent | None:
    """The caller's trace context, or None when there is none or it is malformed."""
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
    return Parent(trace_id, span_id, bool(flags & 1), forwarded.get("tracestate"))


class Tracing:
    """Starts request traces and owns where finished ones go."""

    __slots__ = ("_bound", "shipper")

    def __init__(self, shipper: SpanShipper, sample_ratio: float = 1.0) -> None:
        self.shipper = shipper
        self._bound = round(sample_ratio * (1 << 64))
        """TraceIdRatioBased: sampled when the trace id's low 64 bits are below this."""

    def start(self, endpoint: str, caller: Caller) -> RequestTrace | Untraced:
        """The request's trace when sampled; otherwise UNTRACED, after giving the backend an unsampled
        context.

        A sampled request's attempts each send their own `traceparent` (so the caller's is taken out of
        `caller.forwarded`); an unsampled one records nothing and passes the caller's context on as it
        came (or, without a valid one, a new context flagged not sampled), so the backend does not trace
        what the gateway left out.
        """
        forwarded = caller.forwarded
        parent = parent_context(forwarded) if "traceparent" in forwarded else None
        if parent is not None:
            trace_id, sampled = parent.trace_id, parent.sampled
        else:
            trace_id = getrandbits(128) or 1
            sampled = (trace_id & _MASK64) < self._bound
            forwarded.pop("tracestate", None)  # meaningless without a valid traceparent
        if sampled:
            forwarded.pop("traceparent", None)
            return RequestTrace(self.shipper, trace_id, parent, endpoint, caller.request_id)
        if parent is None:
            forwarded["traceparent"] = "00-%032x-%016x-00" % (trace_id, getrandbits(64) or 1)  # noqa: UP031 - twice as fast as an f-string
        return UNTRACED

    def force_flush(self, timeout: float = 5.0) -> bool:
        return self.shipper.flush(timeout)

    def shutdown(self) -> None:
        self.shipper.close()


def build_tracing(options: TracingOptions, exporter: SpanExporter | None = None) -> Tracing | None:
    """Tracing as configured (None when off); `exporter` exports in-process instead of a child (tests)."""
    if exporter is not None:
        shipper: SpanShipper = InProcessShipper(exporter, options.service_name, options.max_queue)
    elif not options.enabled:
        return None
    else:
        shipper = ChildProcessShipper(_child_settings(options), options.max_queue)
    shipper.start()
    return Tracing(shipper, options.sample_ratio if exporter is None or options.enabled else 1.0)


def _child_settings(options: TracingOptions) -> dict[str, Any]:
    return {
        "exporter": options.exporter,
        "protocol": options.protocol,
        "endpoint": options.endpoint,
        "headers": dict(options.headers),
        "service_name": options.service_name,
    }


class RequestTrace:
    """One sampled request: its attempts' spans as they happen; the rest is read from the request's context
    when it ends (gateway/request/context.py: step timestamps, profile, decision).

    The spans and their attributes are built by the span-export process from one flat tuple per request
    (gateway/telemetry/span_export.py), so the request path makes no dict, no span and no id but the
    ones the backend must see. The hooks are those of gateway/request/context.py.
    """

    __slots__ = (
        "_attempt",
        "_parent",
        "_shipper",
        "attempts",
        "ended",
        "endpoint",
        "request_id",
        "root_id",
        "trace_id",
    )

    def __init__(
        self,
        shipper: SpanShipper,
        trace_id: int,
        parent: Parent | None,
        endpoint: str,
        request_id: str,
    ) -> None:
        self._shipper = shipper
        self.trace_id = trace_id
        self._parent = parent
        self.endpoint = endpoint
        self.request_id = request_id
        self.root_id = getrandbits(64) or 1
        self.ended = False
        self.attempts: list[tuple[Any, ...]] = []
        self._attempt: tuple[int, int, Backend, int] | None = None

    # --- upstream attempts (gateway/request/attempts.py), one at a time ------------------------------------

    def attempt(self, backend: Backend, number: int) -> bytes:
        """Open a client span for an attempt; returns the `traceparent` header line the backend gets."""
        span_id = getrandbits(64) or 1
        self._attempt = (span_id, time_ns(), backend, number)
        return b"traceparent: 00-%032x-%016x-01\r\n" % (self.trace_id, span_id)

    def attempt_done(self, status: int | None, error: str | None = None) -> None:
        """Close the open attempt's span with the backend's status, or the error that ended it."""
        opened = self._attempt
        if opened is None:
            return
        self._attempt = None
        span_id, start_ns, b, number = opened
        host, port = server_address(b.url)
        self.attempts.append(
            (
                span_id,
                start_ns,
                time_ns(),
                number,
                b.name,
                b.pool.name,
                b.pool.vendor,
                host,
                port,
                status,
                error,
            )
        )

    # --- the end of the request (gateway/request/pipeline.py `Pipeline.end`) ----------------------------

    def finish(self, ctx: RequestContext, record: UsageRecord) -> None:
        """The request was accounted: its usage and cost go on the request span, which ends."""
        if self.ended:
            return
        r = record
        result = (
            r.model, r.prompt_tokens, r.completion_tokens, r.status, r.vendor, r.pool, r.backend,
            r.accelerator, r.cost_usd, ctx.attempts, r.ttft_s if r.stream else None,
            ctx.accounting_ns, time_ns(), r.usage_source,
        )  # fmt: skip
        self._end(ctx, result, None)

    def fail(self, ctx: RequestContext, status: int, code: str | int | None, message: str) -> None:
        """The request ended in an error (no backend answer to account)."""
        if self.ended:
            return
        self._end(ctx, None, (status, code, message))

    def _end(
        self,
        ctx: RequestContext,
        result: tuple[Any, ...] | None,
        failure: tuple[int, str | int | None, str] | None,
    ) -> None:
        self.ended = True
        parent = self._parent
        trace_id = self.trace_id
        p = ctx.profile
        profile = classify = None
        if p is not None and ctx.classified_ns:
            profile = (p.model, p.max_tokens, p.n, p.stream, p.prompt_tokens_estimate)
            classify = (ctx.started_ns, ctx.classified_ns)
        d = ctx.decision
        routed = None
        if d is not None and ctx.routed_ns:
            routed = (
                ctx.classified_ns,
                ctx.routed_ns,
                d.request_class,
                d.route,
                [b.name for b in d.candidates],
            )
        attempts = self.attempts
        spans = 1 + len(attempts) + (profile is not None) + (routed is not None) + (result is not None)
        self._shipper.submit(
            _encode(
                (
                    trace_id >> 64,
                    trace_id & _MASK64,
                    parent.span_id if parent is not None else 0,
                    parent.tracestate if parent is not None else None,
                    self.root_id,
                    self.endpoint,
                    self.request_id,
                    ctx.started_ns,
                    time_ns(),
                    profile,
                    classify,
                    routed,
                    attempts,
                    result,
                    failure,
                )
            ),
            spans,
        )


@lru_cache(maxsize=256)
def server_address(url: str) -> tuple[str, int]:
    """OpenTelemetry's `server.address` (the host, not the URL) and `server.port` of a backend URL."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or url, port
