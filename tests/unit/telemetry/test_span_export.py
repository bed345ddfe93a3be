"""Tracing off the request path: sampling, context propagation, the shipper's bounds, and the span-export
child process end to end (OTLP/HTTP to a local sink that decodes what it receives)."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.ledger.records import UsageRecord
from gateway.request.classify import Caller
from gateway.settings import Tracing as TracingOptions
from gateway.telemetry.tracing import (
    ChildProcessShipper,
    InProcessShipper,
    RequestTrace,
    Tracing,
    UnsampledTrace,
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


def one_request(tracing: Tracing, **forwarded: str) -> tuple[RequestTrace | UnsampledTrace, dict[str, str]]:
    trace = tracing.start("chat", caller(**forwarded))
    headers: dict[str, str] = {}
    span = trace.attempt(BACKEND, 1, headers)  # type: ignore[arg-type]
    if span is not None:
        RequestTrace.attempt_done(span, 200)
    trace.finish(record(), time.time_ns(), time.time_ns(), 1)
    return trace, headers


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


def test_an_unsampled_request_still_passes_its_context_on() -> None:
    tracing = Tracing(InProcessShipper(InMemorySpanExporter(), "t", 10), sample_ratio=0.0)
    trace, headers = one_request(tracing, traceparent=PARENT[:-2] + "00", tracestate="v=1")
    assert isinstance(trace, UnsampledTrace)
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", PARENT.split("-")[1], "00")
    assert len(span_id) == 16 and span_id != PARENT.split("-")[2]
    assert headers["tracestate"] == "v=1"
    assert tracing.shipper.stats()["submitted"] == 0


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


def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    shipper = InProcessShipper(InMemorySpanExporter(), "t", max_queue=3)  # not started: nothing drains
    tracing = Tracing(shipper)
    for _ in range(5):
        one_request(tracing)
    stats = shipper.stats()
    assert (stats["queued"], stats["submitted"], stats["dropped"]) == (3, 9, 6)  # 3 spans per trace
    shipper.flush()
    assert shipper.stats()["exported"] == 9 and shipper.stats()["queued"] == 0


class _Sink(http.server.ThreadingHTTPServer):
    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _SinkHandler)
        self.spans: list[Any] = []


class _SinkHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.server.spans.extend(scope_spans.spans)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextlib.contextmanager
def otlp_sink() -> Iterator[tuple[str, _Sink]]:
    sink = _Sink(free_port())
    thread = threading.Thread(target=sink.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sink.server_address[1]}/v1/traces", sink
    finally:
        sink.shutdown()
        sink.server_close()


def wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_export_child_sends_otlp_and_exits_at_the_end_of_its_input() -> None:
    with otlp_sink() as (endpoint, sink):
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
