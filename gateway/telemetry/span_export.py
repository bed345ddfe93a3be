"""Turning recorded traces into OpenTelemetry SDK spans and handing them to an exporter, off the event loop.

The gateway records a finished request's spans as plain tuples (gateway/telemetry/tracing.py). Building
the SDK's `ReadableSpan` objects (about 12 µs each) and encoding OTLP (about 100 µs per span with the
Python encoder) would cost more than the whole request, so neither happens in the gateway's process by
default: batches of tuples go, msgpack-encoded, through a pipe to this module run as a child process
(`python -m gateway.telemetry.span_export`), which builds the spans and runs the configured SDK exporter.
The same `to_readable_spans` serves an in-process exporter (tests pass the SDK's `InMemorySpanExporter`).

Wire format on the child's stdin: frames of a 4-byte big-endian length and a msgpack payload; the first
frame is the exporter's settings (it may hold credentials, so never argv), each later one a list of
trace records. The child ignores SIGINT and SIGTERM and exits, after flushing, at the end of its stdin,
which comes when the gateway shuts down or dies.

A trace record: (trace_id_high, trace_id_low, parent_span_id, parent_is_remote, tracestate, spans), where
parent_span_id is 0 for a root request span and each span is (span_id, parent_span_id, name, kind,
start_ns, end_ns, attributes, status_code, status_message).
"""

from __future__ import annotations

import logging
import signal
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

import msgspec
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

log = logging.getLogger("switchyard.telemetry")

TraceRecord = tuple[int, int, int, bool, str | None, list[tuple[Any, ...]]]

KINDS = (SpanKind.INTERNAL, SpanKind.SERVER, SpanKind.CLIENT)
"""Span kind codes in records: 0 internal, 1 server, 2 client."""
INTERNAL, SERVER, CLIENT = 0, 1, 2
STATUSES = (StatusCode.UNSET, StatusCode.OK, StatusCode.ERROR)
"""Status codes in records: 0 unset, 1 ok, 2 error."""

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
        return Grpc(endpoint=settings["endpoint"], headers=headers)  # type: ignore[no-any-return]
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings["endpoint"], headers=headers)


def to_readable_spans(
    records: Iterable[Sequence[Any]], resource: Resource, scope: InstrumentationScope
) -> list[ReadableSpan]:
    out: list[ReadableSpan] = []
    for high, low, parent_id, parent_remote, tracestate, spans in records:
        trace_id = (high << 64) | low
        state = TraceState.from_header([tracestate]) if tracestate else None
        remote_parent = (
            SpanContext(trace_id, parent_id, is_remote=parent_remote, trace_flags=_SAMPLED, trace_state=state)
            if parent_id
            else None
        )
        contexts: dict[int, SpanContext] = {}
        for span_id, *_ in spans:
            contexts[span_id] = SpanContext(
                trace_id, span_id, is_remote=False, trace_flags=_SAMPLED, trace_state=state
            )
        for span_id, parent, name, kind, start, end, attributes, status, message in spans:
            out.append(
                ReadableSpan(
                    name=name,
                    context=contexts[span_id],
                    parent=contexts.get(parent, remote_parent) if parent else None,
                    resource=resource,
                    attributes=attributes,
                    kind=KINDS[kind],
                    instrumentation_scope=scope,
                    status=Status(STATUSES[status], message if status == 2 else None),
                    start_time=start,
                    end_time=end,
                )
            )
    return out


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
