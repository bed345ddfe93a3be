"""Telemetry end to end: spans (in-memory exporter), `GET /metrics` and the JSON access log.

The other integration tests run the gateway as a subprocess; here it runs in this process (uvicorn in a
thread, real sockets, simulated backends as subprocesses), because the assertion is on the SDK's own span
objects: the app gets an `InMemorySpanExporter`, which the span shipper feeds in its own thread with the
same records-to-spans conversion the span-export child process uses. That needs no test-only exporter
option in the config; the child process itself is tested in tests/unit/telemetry/test_span_export.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from litestar import Litestar
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from gateway.app import SwitchyardPlugin
from gateway.config.settings import load_settings
from tests.support import RecordingBackend, free_port

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.90,
      ttft_ms: 2, tpot_ms: 1}}
"""
SPREAD = "name: spread\nroutes:\n  default:\n    prefer: any\n    strategy: {least-outstanding: 1}\n"
PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
MESSAGES = [{"role": "user", "content": "Say hello"}]


@dataclass
class Env:
    base: str
    fleet: Fleet
    recorder: RecordingBackend
    spans: InMemorySpanExporter
    access_log: Path

    def backend_url(self, name: str) -> str:
        return next(b.url for b in self.fleet.backends if b.name == name)

    def trace_of(self, request_id: str, timeout: float = 5.0) -> list[ReadableSpan]:
        """The request span carrying `request_id` (once ended) and its children."""
        deadline = time.monotonic() + timeout
        while True:
            spans = list(self.spans.get_finished_spans())
            roots = [s for s in spans if (s.attributes or {}).get("switchyard.request_id") == request_id]
            if roots:
                root = roots[0].context.span_id
                return [roots[0], *(s for s in spans if s.parent is not None and s.parent.span_id == root)]
            assert time.monotonic() < deadline, f"no span for {request_id}"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("telemetry")
    access_log = workdir / "access.log"
    logging.getLogger("switchyard.access").setLevel(logging.INFO)
    with (
        Fleet(parse_fleet_spec(FLEET, "<telemetry>"), log_dir=workdir) as fleet,
        RecordingBackend("echo-model") as recorder,
    ):
        config = fleet.gateway_config(
            timeouts={"connect": 1.0, "first_byte": 5.0, "between_chunks": 5.0},
            health={"interval": 0.5, "timeout": 0.5},
            breaker={"failure_threshold": 50},
            retries={"max_attempts": 3, "backoff_ms": 1},
        )
        (workdir / "spread.yaml").write_text(SPREAD)
        config["policy"] = {"file": str(workdir / "spread.yaml")}
        config["telemetry"] = {"access_log": {"destination": str(access_log)}}
        config["pools"].append(
            {
                "name": "recorder",
                "vendor": "amd",
                "accelerator": "mi300x",
                "price_per_gpu_hour": 1.0,
                "backends": [{"url": recorder.url, "models": ["echo-model"], "max_model_len": 4096}],
            }
        )
        path = workdir / "gateway.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        exporter = InMemorySpanExporter()
        app = Litestar(plugins=[SwitchyardPlugin(load_settings(path), span_exporter=exporter)])
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "gateway did not start"
            time.sleep(0.02)
        try:
            yield Env(base, fleet, recorder, exporter, access_log)
        finally:
            server.should_exit = True
            thread.join(timeout=15)


def chat(env: Env, stream: bool = False, model: str = MODEL, **headers: str) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "messages": MESSAGES, "max_tokens": 8, "stream": stream}
    response = httpx.post(env.base + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    response.read()
    return response


def tree(spans: list[ReadableSpan]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    """The request span and its children, in start order."""
    (root,) = [s for s in spans if s.kind.name == "SERVER"]
    children = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    return root, children


def assert_request_span(root: ReadableSpan, stream: bool) -> None:
    a = dict(root.attributes or {})
    assert root.name == f"chat {MODEL}"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.usage.output_tokens"] > 0
    assert a["switchyard.vendor"] == "nvidia"
    assert a["switchyard.pool"] == "h100"
    assert a["switchyard.backend"] in ("h100-0", "h100-1")
    assert a["switchyard.class"] == "default"
    assert a["switchyard.route"] == "spread/default"
    assert a["switchyard.cost_usd"] > 0
    assert a["switchyard.stream"] is stream
    assert a["http.response.status_code"] == 200
    assert root.status.is_ok


def test_non_streaming_request_has_one_span_per_step_and_honours_traceparent(env: Env) -> None:
    response = chat(env, traceparent=TRACEPARENT)
    assert response.status_code == 200
    root, children = tree(env.trace_of(response.headers["x-request-id"]))
    assert_request_span(root, stream=False)
    assert f"{root.context.trace_id:032x}" == PARENT_TRACE
    assert root.parent is not None and f"{root.parent.span_id:016x}" == PARENT_SPAN
    assert [c.name for c in children] == ["classify", "route", "upstream", "account"]
    upstream = children[2]
    assert upstream.kind.name == "CLIENT"
    assert upstream.attributes["http.response.status_code"] == 200
    assert upstream.attributes["switchyard.backend"] == root.attributes["switchyard.backend"]
    assert children[3].attributes["switchyard.cost_usd"] == root.attributes["switchyard.cost_usd"]
    for child in children:  # each step lies inside the request span
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time


def test_backend_receives_the_attempt_spans_context(env: Env) -> None:
    response = chat(env, model="echo-model", traceparent=TRACEPARENT, tracestate="vendor=1")
    assert response.status_code == 200
    _, children = tree(env.trace_of(response.headers["x-request-id"]))
    (upstream,) = [c for c in children if c.name == "upstream"]
    sent = {k.lower(): v for k, v in env.recorder.requests[-1][1].items()}
    assert sent["traceparent"] == f"00-{PARENT_TRACE}-{upstream.context.span_id:016x}-01"
    assert sent["tracestate"] == "vendor=1"


def test_streaming_request_span_ends_with_the_stream(env: Env) -> None:
    response = chat(env, stream=True)
    assert response.status_code == 200 and b"[DONE]" in response.content
    root, children = tree(env.trace_of(response.headers["x-request-id"]))
    assert_request_span(root, stream=True)
    assert root.attributes["switchyard.ttft_s"] > 0
    assert [c.name for c in children] == ["classify", "route", "upstream", "account"]
    assert children[3].start_time >= children[2].end_time  # accounted when the stream ended


@pytest.mark.parametrize("stream", [False, True])
def test_retried_request_has_a_span_per_attempt(env: Env, stream: bool) -> None:
    httpx.post(env.backend_url("h100-0") + "/sim/faults", json={"error_rate": 1, "error_status": 503})
    try:
        for _ in range(8):  # the spread policy puts h100-0 first for about half the requests
            response = chat(env, stream=stream)
            assert response.status_code == 200
            if response.headers.get("x-switchyard-attempts") == "2":
                break
        else:
            pytest.fail("no request was retried")
    finally:
        httpx.post(env.backend_url("h100-0") + "/sim/faults", json={"reset": True})
    root, children = tree(env.trace_of(response.headers["x-request-id"]))
    assert_request_span(root, stream=stream)
    assert root.attributes["switchyard.backend"] == "h100-1"
    assert root.attributes["switchyard.attempts"] == 2
    assert [c.name for c in children] == ["classify", "route", "upstream", "upstream", "account"]
    failed, served = children[2], children[3]
    assert failed.attributes["switchyard.backend"] == "h100-0"
    assert failed.attributes["switchyard.attempt"] == 1
    assert failed.attributes["http.response.status_code"] == 503
    assert not failed.status.is_ok
    assert served.attributes["switchyard.backend"] == "h100-1"
    assert served.attributes["switchyard.attempt"] == 2
    assert served.status.is_ok


def test_a_refused_request_ends_its_span_with_the_error(env: Env) -> None:
    response = chat(env, model="no-such-model")
    assert response.status_code == 404
    root, children = tree(env.trace_of(response.headers["x-request-id"]))
    assert not root.status.is_ok
    assert root.attributes["http.response.status_code"] == 404
    assert root.attributes["error.type"] == "model_not_found"
    assert [c.name for c in children] == ["classify"]


def scrape(env: Env) -> dict[str, float]:
    response = httpx.get(env.base + "/metrics", timeout=5)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    values: dict[str, float] = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_metrics_series_move(env: Env) -> None:
    series = f'model="{MODEL}",class="default",route="spread/default",pool="h100",vendor="nvidia"'
    ok = f'switchyard_requests_total{{{series},status="200"}}'

    def total(values: dict[str, float], prefix: str) -> float:
        return sum(v for k, v in values.items() if k.startswith(prefix))

    before = scrape(env)
    assert chat(env).status_code == 200
    assert chat(env, stream=True).status_code == 200
    assert chat(env, model="no-such-model").status_code == 404
    after = scrape(env)
    assert after.get(ok, 0) - before.get(ok, 0) == 2
    e2e = f"switchyard_request_duration_seconds_count{{{series}}}"
    assert after[e2e] - before.get(e2e, 0) == 2
    ttft = f"switchyard_time_to_first_token_seconds_count{{{series}}}"
    assert after[ttft] - before.get(ttft, 0) == 1
    assert after[f'switchyard_time_to_first_token_seconds_bucket{{{series},le="+Inf"}}'] == after[ttft]
    tokens = "switchyard_backend_completion_tokens_total"
    assert total(after, tokens) > total(before, tokens)
    cost = "switchyard_backend_cost_usd_total"
    assert total(after, cost) > total(before, cost)
    missing = 'switchyard_request_errors_total{endpoint="chat",status="404",code="model_not_found"}'
    assert after[missing] - before.get(missing, 0) == 1
    decisions = "switchyard_routing_decision_seconds_count"
    assert after[decisions] > before[decisions]
    labels = 'backend="h100-0",pool="h100",vendor="nvidia"'
    assert after[f"switchyard_backend_up{{{labels}}}"] == 1
    assert after[f'switchyard_backend_breaker_state{{{labels},state="closed"}}'] == 1
    assert after[f"switchyard_backend_load_age_seconds{{{labels}}}"] >= 0  # the sim's /metrics was read
    assert 'switchyard_ledger_buffered_records{store="memory"}' in after
    exported = "switchyard_trace_spans_exported_total"
    deadline = time.monotonic() + 5
    while scrape(env)[exported] < before[exported] + 12:  # 5 spans per answered request, 2 for the 404
        assert time.monotonic() < deadline, "the spans of these requests were never exported"
        time.sleep(0.05)
    assert after["switchyard_trace_spans_dropped_total"] == 0
    for line in httpx.get(env.base + "/metrics").text.splitlines():  # bounded labels only
        assert "req-" not in line and "Say hello" not in line


def test_access_log_has_one_json_line_per_request_without_text(env: Env) -> None:
    ok = chat(env).headers["x-request-id"]
    missing = chat(env, model="no-such-model").headers["x-request-id"]
    deadline = time.monotonic() + 5
    while True:
        text = env.access_log.read_text() if env.access_log.exists() else ""
        if ok in text and missing in text:
            break
        assert time.monotonic() < deadline, "access log lines not written"
        time.sleep(0.05)
    lines = {(d := json.loads(line))["request_id"]: d for line in text.splitlines()}
    assert lines[ok]["status"] == 200 and lines[ok]["model"] == MODEL and lines[ok]["backend"]
    assert lines[ok]["completion_tokens"] > 0 and lines[ok]["class"] == "default"
    assert lines[missing]["status"] == 404 and lines[missing]["error_code"] == "model_not_found"
    assert "Say hello" not in text and "request_body" not in text


def test_latencies_are_timed_finer_than_the_event_loops_millisecond_clock(env: Env) -> None:
    """uvloop's `loop.time()` counts whole milliseconds: a 1 ms step in a 10 ms TTFT is a 10 % error
    in the access log, the latency averages routing reads and the profile drift ratios."""
    ids = {chat(env, stream=True).headers["x-request-id"] for _ in range(6)}
    deadline = time.monotonic() + 5
    while True:
        text = env.access_log.read_text() if env.access_log.exists() else ""
        lines = [d for line in text.splitlines() if (d := json.loads(line))["request_id"] in ids]
        if len(lines) == len(ids):
            break
        assert time.monotonic() < deadline, "access log lines not written"
        time.sleep(0.05)
    ms = [line[field] * 1000 for line in lines for field in ("ttft_s", "duration_s")]
    assert all(value > 0 for value in ms)
    assert any(abs(value - round(value)) > 0.01 for value in ms), ms
