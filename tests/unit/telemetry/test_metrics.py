"""The hand-written Prometheus registry: histogram buckets, exposition, bounded labels."""

from __future__ import annotations

from gateway.ledger.records import UsageRecord
from gateway.telemetry.metrics import MAX_ERROR_SERIES, Histogram, Metrics


def record(**changes: object) -> UsageRecord:
    values: dict[str, object] = dict(
        request_id="req-1", endpoint="chat", model="m", backend="b0", pool="h100", vendor="nvidia",
        accelerator="h100", key="key-x", request_class="interactive", route="balanced/interactive",
        stream=True, status=200, prompt_tokens=10, completion_tokens=5, usage_source="backend",
        ttft_s=0.02, duration_s=0.1, cost_usd=0.001, finished_at=0.0,
    )  # fmt: skip
    values.update(changes)
    return UsageRecord(**values)  # type: ignore[arg-type]


def parse(text: bytes) -> dict[str, float]:
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    lines = list(h.lines("x", 'a="1"'))
    assert lines[:3] == [
        'x_bucket{a="1",le="0.1"} 2',
        'x_bucket{a="1",le="1"} 3',
        'x_bucket{a="1",le="+Inf"} 4',
    ]
    assert lines[3] == 'x_sum{a="1"} 2.65' and lines[4] == 'x_count{a="1"} 4'


def test_records_feed_counters_and_histograms_by_bounded_labels() -> None:
    m = Metrics([])
    m.record(record())
    m.record(record(request_id="req-2", status=502, stream=False, ttft_s=None))
    values = parse(m.render())
    labels = 'model="m",class="interactive",route="balanced/interactive",pool="h100",vendor="nvidia"'
    assert values[f'switchyard_requests_total{{{labels},status="200"}}'] == 1
    assert values[f'switchyard_requests_total{{{labels},status="502"}}'] == 1
    assert values[f"switchyard_request_duration_seconds_count{{{labels}}}"] == 2
    assert values[f"switchyard_time_to_first_token_seconds_count{{{labels}}}"] == 1
    tpot = values[f"switchyard_time_per_output_token_seconds_sum{{{labels}}}"]
    assert abs(tpot - (0.1 - 0.02) / 4) < 1e-12
    assert not any("req-" in name or "key-x" in name for name in values)


def test_error_codes_are_bounded() -> None:
    m = Metrics([])
    m.error("chat", 404, "model_not_found")
    m.error("chat", 400, "Some Backend's Free Text!")
    for i in range(MAX_ERROR_SERIES + 50):
        m.error("chat", 400, f"code_{i}")
    values = parse(m.render())
    errors = [k for k in values if k.startswith("switchyard_request_errors_total")]
    assert len(errors) <= MAX_ERROR_SERIES + 1
    assert values['switchyard_request_errors_total{endpoint="chat",status="404",code="model_not_found"}'] == 1
    assert values['switchyard_request_errors_total{endpoint="chat",status="400",code="other"}'] >= 51
