"""The JSON access log, the batch that feeds it and the metrics, and trace-context parsing."""

from __future__ import annotations

import asyncio
import io
import json
from types import SimpleNamespace

from gateway.ledger.records import UsageRecord
from gateway.telemetry import BATCH_S, Telemetry
from gateway.telemetry.logs import AccessLog
from gateway.telemetry.metrics import Metrics
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


class _KeptOpen(io.BytesIO):
    def close(self) -> None:  # read after the log is closed
        return None


async def test_records_are_batched_then_counted_and_logged_in_order() -> None:
    """The request path only appends; a flush (a scrape's first step, gateway/admin/ops.py), the batch timer
    or shutdown makes the cells and lines."""
    out = _KeptOpen()
    metrics = Metrics([])
    telemetry = Telemetry(metrics, AccessLog(out, include_prompts=True))
    bodies = [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    for n, body in enumerate(bodies):
        done = record()
        done.request_id = f"req-{n}"
        telemetry.recorded(done, SimpleNamespace(body=body, prompt_prefix=lambda chars: ""))  # type: ignore[arg-type]
    assert out.getvalue() == b""  # nothing made on the request path
    assert "switchyard_requests_total{" not in metrics.render().decode()
    telemetry.flush()
    rendered = metrics.render().decode()
    labels = 'model="m",class="interactive",route="r",pool="h100",vendor="nvidia",status="200"'
    assert f"switchyard_requests_total{{{labels}}} 3" in rendered
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == ["req-0", "req-1", "req-2"]
    assert [line["request_body"] for line in lines] == [b.decode() for b in bodies]
    telemetry.recorded(record(), SimpleNamespace(body=b"{}", prompt_prefix=lambda chars: ""))  # type: ignore[arg-type]
    telemetry.close()  # shutdown writes the last batch
    assert len(out.getvalue().splitlines()) == 4


async def test_the_batch_timer_writes_what_waited() -> None:
    out = io.BytesIO()
    telemetry = Telemetry(None, AccessLog(out))
    telemetry.recorded(record(), SimpleNamespace(body=b"{}", prompt_prefix=lambda chars: ""))  # type: ignore[arg-type]
    assert out.getvalue() == b""
    await asyncio.sleep(BATCH_S * 2)
    assert json.loads(out.getvalue())["request_id"] == "req-abc"
