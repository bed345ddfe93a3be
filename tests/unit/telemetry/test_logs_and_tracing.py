"""The JSON access log and trace-context parsing."""

from __future__ import annotations

import io
import json

from gateway.ledger.records import UsageRecord
from gateway.telemetry.logs import AccessLog
from gateway.telemetry.tracing import parent_context


def record() -> UsageRecord:
    return UsageRecord(
        request_id="req-abc", endpoint="chat", model="m", backend="b0", pool="h100", vendor="nvidia",
        accelerator="h100", key="key-x", request_class="interactive", route="r", stream=False, status=200,
        prompt_tokens=10, completion_tokens=5, usage_source="backend", ttft_s=0.02, duration_s=0.1,
        cost_usd=0.001, finished_at=1.5,
    )  # fmt: skip


def test_one_line_per_request_and_no_prompt_unless_asked() -> None:
    out = io.BytesIO()
    log = AccessLog(out)
    log.record(record(), None)
    log.error("req-def", "chat", 404, "model_not_found", "No pool serves `x`.", None)
    log.flush()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == ["req-abc", "req-def"]
    assert lines[0]["class"] == "interactive" and lines[0]["completion_tokens"] == 5
    assert "request_body" not in lines[0]
    assert lines[1]["status"] == 404 and lines[1]["error_code"] == "model_not_found"


def test_prompt_logged_only_when_turned_on() -> None:
    out = io.BytesIO()
    log = AccessLog(out, include_prompts=True)
    log.record(record(), b'{"messages":[{"role":"user","content":"secret"}]}')
    log.flush()
    assert "secret" in json.loads(out.getvalue())["request_body"]


def test_traceparent_is_parsed_and_bad_ones_ignored() -> None:
    parent = parent_context(
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "a=1"}
    )
    assert parent is not None
    assert parent.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736 and parent.span_id == 0x00F067AA0BA902B7
    assert parent.sampled and parent.tracestate == "a=1"
    unsampled = parent_context({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"})
    assert unsampled is not None and not unsampled.sampled
    zero_trace = "00-" + "0" * 32 + "-00f067aa0ba902b7-01"
    bad_version = "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for bad in ("garbage", zero_trace, bad_version, "00-xyz-00f067aa0ba902b7-01"):
        assert parent_context({"traceparent": bad}) is None
    assert parent_context({}) is None
