"""Tracing off the request path: sampling, context propagation, the shipper's bounds, the span-export
child process end to end (OTLP/HTTP to a local sink that decodes what it receives), and the OTLP
encoder and exporter (checked against the SDK's encoder)."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from gateway.config.settings import Tracing as TracingOptions
from gateway.ledger.records import UsageRecord
from gateway.request.classify import Caller
from gateway.request.context import UNTRACED, RequestContext
from gateway.telemetry.otlp_http import OtlpHttpExporter, encode_request
from gateway.telemetry.span_export import to_readable_spans
from gateway.telemetry.tracing import (
    ChildProcessShipper,
    InProcessShipper,
    RequestTrace,
    Tracing,
    build_tracing,
)
from tests.support import free_port

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BACKEND = SimpleNamespace(
    name="h100-0", url="http://127.0.0.1:9", pool=SimpleNamespace(name="h100", vendor="nvidia")
)


def caller(**forwarded: str) -> Caller:
    return Caller(request_id="req-1", authorization=None, forwarded=dict(forwarded), headers=[])


def record(status: int = 200) -> UsageRecord:
    return UsageRecord(
        request_id="req-1", endpoint="chat", model="m", backend="h100-0", pool="h100", vendor="nvidia",
        accelerator="h100", key="key-x", request_class="default", route="r/default", stream=False,
        status=status, prompt_tokens=10, completion_tokens=5, usage_source="backend", ttft_s=None,
        duration_s=0.01, cost_usd=0.001, finished_at=1.5,
    )  # fmt: skip


def one_request(tracing: Tracing, **forwarded: str) -> tuple[RequestTrace | None, dict[str, str]]:
    """One request through the tracing hooks; returns its trace and the headers its backend receives."""
    who = caller(**forwarded)
    trace = tracing.start("chat", who)
    sent = dict(who.forwarded)
    if not isinstance(trace, RequestTrace):
        assert trace is UNTRACED and trace.attempt(BACKEND, 1) == b""  # type: ignore[arg-type]
        return None, sent
    ctx = RequestContext("chat", who, started_ns=time.time_ns())
    header = trace.attempt(BACKEND, 1)  # type: ignore[arg-type]
    name, _, value = header.decode().strip().partition(": ")
    sent[name] = value
    trace.attempt_done(200)
    ctx.attempts, ctx.accounting_ns = 1, time.time_ns()
    trace.finish(ctx, record())
    return trace, sent


@pytest.fixture
def memory() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracing = build_tracing(TracingOptions(), exporter)
    assert tracing is not None
    yield tracing, exporter
    tracing.shutdown()


def test_sampling_follows_the_ratio_and_the_callers_decision() -> None:
    def sampled_share(ratio: float, **forwarded: str) -> float:
        tracing = Tracing(InProcessShipper(InMemorySpanExporter(), "t", 10), sample_ratio=ratio)
        starts = [tracing.start("chat", caller(**forwarded)) for _ in range(2000)]
        return sum(isinstance(t, RequestTrace) for t in starts) / len(starts)

    assert sampled_share(0.0) == 0.0
    assert sampled_share(1.0) == 1.0
    assert 0.2 < sampled_share(0.25) < 0.3
    assert sampled_share(0.0, traceparent=PARENT) == 1.0  # the caller sampled it
    assert sampled_share(1.0, traceparent=PARENT[:-2] + "00") == 0.0  # the caller did not


def test_an_unsampled_request_passes_the_callers_context_on_untouched() -> None:
    tracing = Tracing(InProcessShipper(InMemorySpanExporter(), "t", 10), sample_ratio=0.0)
    unsampled = PARENT[:-2] + "00"
    trace, headers = one_request(tracing, traceparent=unsampled, tracestate="v=1")
    assert trace is None
    assert headers["traceparent"] == unsampled and headers["tracestate"] == "v=1"
    assert tracing.shipper.stats()["submitted"] == 0


def test_an_unsampled_request_without_a_valid_context_sends_a_new_unsampled_one() -> None:
    tracing = Tracing(InProcessShipper(InMemorySpanExporter(), "t", 10), sample_ratio=0.0)
    for forwarded in ({}, {"traceparent": "00-zz-bad-01", "tracestate": "v=1"}):
        trace, headers = one_request(tracing, **forwarded)
        assert trace is None
        version, trace_id, span_id, flags = headers["traceparent"].split("-")
        assert (version, flags, len(trace_id), len(span_id)) == ("00", "00", 32, 16)
        assert int(trace_id, 16) and int(span_id, 16)
        assert "tracestate" not in headers  # it belonged to the invalid traceparent
    assert tracing.shipper.stats()["submitted"] == 0


def test_a_sampled_request_replaces_the_callers_traceparent_with_its_attempts() -> None:
    tracing = Tracing(InProcessShipper(InMemorySpanExporter(), "t", 10), sample_ratio=1.0)
    who = caller(traceparent=PARENT, tracestate="v=1")
    trace = tracing.start("chat", who)
    assert isinstance(trace, RequestTrace)
    assert "traceparent" not in who.forwarded and who.forwarded["tracestate"] == "v=1"
    sent = []
    for number in (1, 2):
        header = trace.attempt(BACKEND, number)  # type: ignore[arg-type]
        name, _, value = header.decode().partition(": ")
        assert name == "traceparent" and value.endswith("\r\n")
        version, trace_id, span_id, flags = value.strip().split("-")
        assert (version, trace_id, flags) == ("00", PARENT.split("-")[1], "01")
        trace.attempt_done(503 if number == 1 else 200)
        sent.append(int(span_id, 16))
    assert sent[0] != sent[1]
    assert [a[0] for a in trace.attempts] == sent  # each attempt's span is the one its backend was sent


def test_spans_keep_the_callers_trace_and_hang_under_the_request(memory) -> None:
    tracing, exporter = memory
    _, headers = one_request(tracing, traceparent=PARENT, tracestate="v=1")
    assert tracing.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root, upstream = spans["chat"], spans["upstream"]
    assert f"{root.context.trace_id:032x}" == PARENT.split("-")[1]
    assert root.parent is not None and root.parent.is_remote
    assert f"{root.parent.span_id:016x}" == PARENT.split("-")[2]
    assert upstream.parent is not None and upstream.parent.span_id == root.context.span_id
    assert headers["traceparent"] == f"00-{PARENT.split('-')[1]}-{upstream.context.span_id:016x}-01"
    assert root.context.trace_state.to_header() == "v=1"
    assert root.attributes["gen_ai.usage.output_tokens"] == 5
    assert upstream.attributes["http.response.status_code"] == 200 and upstream.kind.name == "CLIENT"
    assert root.attributes["switchyard.attempts"] == 1


def test_an_attempt_span_names_the_backends_host_and_port_not_its_url(memory) -> None:
    tracing, exporter = memory
    one_request(tracing)
    assert tracing.force_flush()
    (upstream,) = [s for s in exporter.get_finished_spans() if s.name == "upstream"]
    assert upstream.attributes["server.address"] == "127.0.0.1"  # was "http://127.0.0.1:9"
    assert upstream.attributes["server.port"] == 9


def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    shipper = InProcessShipper(InMemorySpanExporter(), "t", max_queue=3)  # not started: nothing drains
    tracing = Tracing(shipper)
    for _ in range(5):
        one_request(tracing)
    stats = shipper.stats()
    assert (stats["queued"], stats["submitted"], stats["dropped"]) == (3, 9, 6)  # 3 spans per trace
    shipper.flush()
    assert shipper.stats()["exported"] == 9 and shipper.stats()["queued"] == 0


class _Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace collector on 127.0.0.1 that answers with `answers` in turn (then 200) and keeps
    every body with its status and `x-token` header."""

    def __init__(self, answers: list[int]) -> None:
        super().__init__(("127.0.0.1", free_port()), _CollectorHandler)
        self.answers = answers
        self.bodies: list[tuple[int, bytes, str]] = []

    @property
    def spans(self) -> list[Any]:
        """The spans of the accepted requests."""
        requests = [
            ExportTraceServiceRequest.FromString(body) for status, body, _ in self.bodies if status == 200
        ]
        return [
            span
            for request in requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]


class _CollectorHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: _Collector = self.server  # type: ignore[assignment]
        status = server.answers.pop(0) if server.answers else 200
        server.bodies.append((status, body, self.headers.get("x-token", "")))
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextlib.contextmanager
def collector(answers: list[int] | None = None) -> Iterator[tuple[str, _Collector]]:
    server = _Collector(answers or [])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", server
    finally:
        server.shutdown()
        server.server_close()


def wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_export_child_sends_otlp_and_exits_at_the_end_of_its_input() -> None:
    with collector() as (endpoint, sink):
        tracing = build_tracing(TracingOptions(enabled=True, endpoint=endpoint, headers={"x-token": "s3"}))
        assert tracing is not None and isinstance(tracing.shipper, ChildProcessShipper)
        child = tracing.shipper.process
        assert child is not None and "s3" not in " ".join(map(str, child.args))  # secrets never in argv
        for _ in range(3):
            one_request(tracing, traceparent=PARENT)
        tracing.shutdown()  # closes the pipe: the child exports what it has and exits
        assert child.poll() == 0
        wait_for(lambda: len(sink.spans) == 9)
    names = sorted(s.name for s in sink.spans)
    assert names == ["account"] * 3 + ["chat"] * 3 + ["upstream"] * 3
    roots = {s.span_id: s for s in sink.spans if s.name == "chat"}
    for span in sink.spans:
        assert span.trace_id.hex() == PARENT.split("-")[1]
        if span.name != "chat":
            assert span.parent_span_id in roots
        else:
            assert span.parent_span_id.hex() == PARENT.split("-")[2]
    attributes = {a.key: a.value for a in next(iter(roots.values())).attributes}
    assert attributes["switchyard.backend"].string_value == "h100-0"
    assert attributes["gen_ai.usage.input_tokens"].int_value == 10


def test_a_dead_export_child_is_replaced_and_the_lost_batch_counted() -> None:
    tracing = build_tracing(TracingOptions(enabled=True, exporter="none"))
    assert tracing is not None
    shipper = tracing.shipper
    assert isinstance(shipper, ChildProcessShipper)
    shipper.restart_pause = 0.0
    first = shipper.process
    assert first is not None
    first.kill()
    first.wait()
    one_request(tracing)
    shipper.flush()  # the write fails: the batch is counted as dropped
    one_request(tracing)
    shipper.flush()  # a new child takes the next batch
    stats = shipper.stats()
    assert stats["dropped"] + stats["exported"] == 6 and stats["exported"] >= 3
    assert shipper.restarts == 1 and shipper.process is not first and shipper.process.poll() is None
    tracing.shutdown()
    assert shipper.process.poll() == 0


def _records() -> list[Any]:
    now = time.time_ns()
    retried = (
        1, 2, 0, None, 3, "chat", "req-a", now, now + 5000, ("m", 64, 2, True, 200), (now, now + 100),
        (now + 100, now + 200, "interactive", "r/fast", ["h100-0", "h100-1"]),
        [(5, now + 200, now + 4000, 1, "h100-0", "h100", "nvidia", "x", 8000, 503, None),
         (6, now + 4000, now + 4500, 2, "h100-1", "h100", "nvidia", "y", 8001, 200, None)],
        ("m", 200, 64, 200, "nvidia", "h100", "h100-1", "h100", 0.001, 2, 0.05, now + 4500, now + 4600,
         "backend"),
        None,
    )  # fmt: skip
    failed = (
        7, 8, 99, "v=1,w=2", 4, "completions", "req-b", now, now + 5000, None, None, None,
        [(9, now + 1, now + 2, 1, "h100-0", "h100", "nvidia", "x", 8000, None, "ConnectFailed: refused")],
        None, (502, "upstream_failed", "every candidate failed"),
    )  # fmt: skip
    return msgspec.msgpack.decode(msgspec.msgpack.encode([retried, failed]))  # as the child gets them


def test_the_otlp_encoder_writes_what_the_sdk_encoder_writes() -> None:
    resource = Resource.create({"service.name": "switchyard-test"})
    spans = to_readable_spans(_records(), resource, InstrumentationScope("switchyard"))
    assert len(spans) == 8 and any(s.parent is not None and s.parent.is_remote for s in spans)
    ours = ExportTraceServiceRequest.FromString(encode_request(spans))
    assert ours == encode_spans(spans)


def test_the_otlp_exporter_retries_what_is_retryable_and_no_more() -> None:
    spans = to_readable_spans(_records(), Resource.create({}), InstrumentationScope("switchyard"))
    with collector([503, 429]) as (endpoint, server):
        exporter = OtlpHttpExporter(endpoint, {"x-token": "s3"})
        exporter.first_pause = 0.01
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        assert [status for status, _, _ in server.bodies] == [503, 429, 200]
        assert all(token == "s3" for _, _, token in server.bodies)
        assert ExportTraceServiceRequest.FromString(server.bodies[-1][1]) == encode_spans(spans)
    with collector([400]) as (endpoint, server):
        exporter = OtlpHttpExporter(endpoint)
        exporter.first_pause = 0.01
        assert exporter.export(spans) is SpanExportResult.FAILURE  # a bad request is not retried
        assert len(server.bodies) == 1
    exporter = OtlpHttpExporter(f"http://127.0.0.1:{free_port()}/v1/traces", timeout=0.3)
    exporter.first_pause = 0.05
    assert exporter.export(spans) is SpanExportResult.FAILURE  # nobody listening: gives up in time
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE
