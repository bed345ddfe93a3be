"""Turning recorded traces into OpenTelemetry SDK spans and handing them to an exporter, off the event loop.

The gateway records a finished request as one flat tuple (gateway/telemetry/tracing.py). Building the
spans' attributes, the SDK's `ReadableSpan` objects (about 4 µs each) and OTLP (about 40 µs per span
with the SDK's encoder, 10-15 with gateway/telemetry/otlp_http.py's) would cost more than the whole
request, so none of it happens in the gateway's process by default: batches of records go,
msgpack-encoded, through a pipe to this module run as a child process, which builds the spans and runs
the configured exporter (OTLP/HTTP: `OtlpHttpExporter`; gRPC: the SDK's).
The same `to_readable_spans` serves an in-process exporter (tests pass the SDK's `InMemorySpanExporter`).

Wire format on the child's stdin: frames of a 4-byte big-endian length and a msgpack payload; the first
frame is the exporter's settings (it may hold credentials, so never argv), each later one a list of
trace records. The child ignores SIGINT and SIGTERM and exits, after flushing, at the end of its stdin,
which comes when the gateway shuts down or dies.

A request record (the gateway knows only what it must; this module builds spans and attributes):
(trace_id_high, trace_id_low, parent_span_id or 0, tracestate, root_span_id, endpoint, request_id,
start_ns, end_ns, profile (model, max_tokens, n, stream, prompt_tokens_estimate) or None, classify
(start_ns, end_ns) or None, route (start_ns, end_ns, class, route, candidates) or None, attempts [(span_id,
start_ns, end_ns, number, backend, pool, vendor, host, port, status, error)], result (model, prompt_tokens,
completion_tokens, status, vendor, pool, backend, accelerator, cost_usd, attempts, ttft_s or None,
account_start_ns, account_end_ns, usage_source) or None, failure (status, code, message) or None).
"""

from __future__ import annotations

import logging
import signal
import struct
import sys
from collections.abc import Iterable, Sequence
from random import getrandbits
from typing import Any, BinaryIO

import msgspec
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

log = logging.getLogger("switchyard.telemetry")

_HEADER = struct.Struct(">I")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class DropSpans(SpanExporter):
    """Drops everything (`exporter: none`): the spans are still built, only not sent."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def build_exporter(settings: dict[str, Any]) -> SpanExporter:
    """The SDK exporter for `telemetry.tracing` (as a dict: exporter, protocol, endpoint, headers)."""
    if settings["exporter"] == "none":
        return DropSpans()
    headers = dict(settings.get("headers") or {}) or None
    if settings["protocol"] == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
        except ImportError as exc:
            raise RuntimeError(
                "telemetry.tracing.protocol is grpc: pip install opentelemetry-exporter-otlp-proto-grpc"
            ) from exc
        return Grpc(endpoint=settings["endpoint"], headers=headers)
    from gateway.telemetry.otlp_http import OtlpHttpExporter

    return OtlpHttpExporter(settings["endpoint"], headers)


OPERATIONS = {
    "chat": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "messages": "chat",
    "responses": "chat",
}
"""`gen_ai.operation.name` per endpoint (OpenTelemetry GenAI semantic conventions)."""


def to_readable_spans(
    records: Iterable[Sequence[Any]], resource: Resource, scope: InstrumentationScope
) -> list[ReadableSpan]:
    """The spans of each request record (see the module docstring for the record's fields)."""
    out: list[ReadableSpan] = []
    for record in records:
        out.extend(_request_spans(record, resource, scope))
    return out


def _request_spans(
    record: Sequence[Any], resource: Resource, scope: InstrumentationScope
) -> list[ReadableSpan]:
    (high, low, parent_id, tracestate, root_id, endpoint, request_id, start, end,
     profile, classify, routed, attempts, result, failure) = record  # fmt: skip
    trace_id = (high << 64) | low
    state = TraceState.from_header([tracestate]) if tracestate else None

    def context(span_id: int, remote: bool = False) -> SpanContext:
        return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=_SAMPLED, trace_state=state)

    root = context(root_id)

    def span(
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
        error: str | None = None,
        span_id: int | None = None,
    ) -> ReadableSpan:
        return ReadableSpan(
            name=name,
            context=context(span_id or getrandbits(64) or 1),
            parent=root,
            resource=resource,
            attributes=attributes,
            kind=kind,
            instrumentation_scope=scope,
            status=Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.UNSET),
            start_time=start_ns,
            end_time=end_ns,
        )

    operation = OPERATIONS.get(endpoint, endpoint)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": "vllm",
        "switchyard.request_id": request_id,
    }
    spans: list[ReadableSpan] = []
    name = operation
    if profile is not None:
        model, max_tokens, n, stream, estimate = profile
        name = f"{operation} {model}"
        attributes["gen_ai.request.model"] = model
        if max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        if n != 1:
            attributes["gen_ai.request.choice.count"] = n
        attributes["switchyard.stream"] = stream
        if classify is not None:
            classify_start, classify_end = classify
            spans.append(
                span(
                    "classify", classify_start, classify_end, {"switchyard.prompt_tokens_estimate": estimate}
                )
            )
    if routed is not None:
        route_start, route_end, request_class, route, candidates = routed
        attributes["switchyard.class"] = request_class
        attributes["switchyard.route"] = route
        spans.append(span("route", route_start, route_end, {"switchyard.candidates": candidates}))
    for span_id, a_start, a_end, number, backend, pool, vendor, host, port, status, attempt_error in attempts:
        a_attributes: dict[str, Any] = {
            "switchyard.attempt": number,
            "switchyard.backend": backend,
            "switchyard.pool": pool,
            "switchyard.vendor": vendor,
            "server.address": host,
            "server.port": port,
        }
        if status is not None:
            a_attributes["http.response.status_code"] = status
        if attempt_error is not None:
            a_attributes["error.type"] = attempt_error.split(":", 1)[0]
        failed = (
            attempt_error
            if attempt_error is not None
            else (f"HTTP {status}" if status is not None and status >= 400 else None)
        )
        spans.append(span("upstream", a_start, a_end, a_attributes, SpanKind.CLIENT, failed, span_id))
    error: str | None = None
    if result is not None:
        (model, prompt_tokens, completion_tokens, status, vendor, pool, backend, accelerator, cost,
         tries, ttft, account_start, account_end, usage_source) = result  # fmt: skip
        spans.append(
            span(
                "account",
                account_start,
                account_end,
                {"switchyard.usage_source": usage_source, "switchyard.cost_usd": cost},
            )
        )
        attributes.update(
            {
                "gen_ai.response.model": model,
                "gen_ai.usage.input_tokens": prompt_tokens,
                "gen_ai.usage.output_tokens": completion_tokens,
                "http.response.status_code": status,
                "switchyard.vendor": vendor,
                "switchyard.pool": pool,
                "switchyard.backend": backend,
                "switchyard.accelerator": accelerator,
                "switchyard.cost_usd": cost,
                "switchyard.attempts": tries,
            }
        )
        if ttft is not None:
            attributes["switchyard.ttft_s"] = ttft
        if status >= 400:
            error = f"HTTP {status}"
    if failure is not None:
        status, code, message = failure
        attributes["http.response.status_code"] = status
        if code:
            attributes["error.type"] = code
        error = message
    spans.insert(
        0,
        ReadableSpan(
            name=name,
            context=root,
            parent=context(parent_id, remote=True) if parent_id else None,
            resource=resource,
            attributes=attributes,
            kind=SpanKind.SERVER,
            instrumentation_scope=scope,
            status=Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.UNSET),
            start_time=start,
            end_time=end,
        ),
    )
    return spans


def frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload)) + payload


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's payload, or None at the end of the stream."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    payload = stream.read(size)
    return payload if len(payload) == size else None


def main() -> int:
    """The span-export child: settings frame, then batches until stdin ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the gateway's group is signalled; EOF ends us
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stdin = sys.stdin.buffer
    first = read_frame(stdin)
    if first is None:
        return 0
    settings = msgspec.msgpack.decode(first)
    exporter = build_exporter(settings)
    resource = Resource.create({"service.name": settings["service_name"]})
    scope = InstrumentationScope("switchyard")
    decoder = msgspec.msgpack.Decoder()
    failures = 0
    while (payload := read_frame(stdin)) is not None:
        spans = to_readable_spans(decoder.decode(payload), resource, scope)
        try:
            result = exporter.export(spans)
        except Exception as exc:  # an exporter must not take the child down
            result = SpanExportResult.FAILURE
            log.warning("span export failed: %s", exc)
        if result is not SpanExportResult.SUCCESS:
            failures += 1
            if failures in (1, 10, 100) or failures % 1000 == 0:
                log.warning("span export: %d batches not accepted by the exporter so far", failures)
    exporter.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
