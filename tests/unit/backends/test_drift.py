"""Drift from the profile (backends/drift.py): the ratio the gateway exports and when it logs."""

from __future__ import annotations

import logging

import msgspec
import pytest

import gateway.request.drift as drift_module
import gateway.request.pipeline as pipeline
from backends.calibrated import StepFit
from backends.drift import BOUND, WINDOW_S, DriftMetric, ProfileDrift, predict
from backends.models import Backend, Pool, PoolConfig, build_backends
from gateway.ledger.records import UsageRecord
from gateway.telemetry.metrics import Metrics

STEP = StepFit(
    step_s=0.002, per_seq_s=0.0002, per_prefill_token_s=0.00005, per_context_token_s=0.0, request_s=0.01
)


def backends() -> list[Backend]:
    config = [
        {
            "name": "mi300x",
            "vendor": "amd",
            "accelerator": "mi300x",
            "price_per_gpu_hour": 1.75,
            "backends": [
                {"name": "b", "url": "http://127.0.0.1:1", "models": ["llama-3.1-8b"], "max_model_len": 8192}
            ],
        }
    ]
    return build_backends(msgspec.convert(config, list[PoolConfig]), environ={})


def pool() -> Pool:
    return backends()[0].pool


def test_a_ratio_off_for_the_whole_window_is_reported_once_and_rearms_when_back() -> None:
    metric = DriftMetric()
    assert not metric.observe(1.5, now=0.0)
    assert not metric.observe(1.5, now=WINDOW_S - 1)
    assert metric.observe(1.5, now=WINDOW_S)
    assert not metric.observe(1.5, now=WINDOW_S + 10)  # once per excursion
    for t in range(60):  # back to what the profile says
        metric.observe(1.0, now=WINDOW_S + 20 + t)
    assert metric.ratio is not None and abs(metric.ratio - 1) <= BOUND and metric.off_since is None
    assert not any(metric.observe(2.0, now=1000.0 + t) for t in range(10))  # the average climbs past 1.3
    off_since = metric.off_since
    assert off_since is not None and not metric.observe(2.0, now=off_since + WINDOW_S - 1)
    assert metric.observe(2.0, now=off_since + WINDOW_S)


def test_within_bound_never_reports() -> None:
    metric = DriftMetric()
    assert not any(metric.observe(1.0 + BOUND * 0.9, now=t * 60.0) for t in range(20))


def test_prediction_follows_the_step_model_at_the_scraped_load() -> None:
    ttft, tpot = predict(STEP, 0.04, 0.009, running=1, prompt_tokens=100, output_tokens=20)
    assert ttft == pytest.approx(0.01 + STEP.step_seconds(1, 100, 0))
    assert tpot == pytest.approx(STEP.step_seconds(1, 0, 110))
    _, busy = predict(STEP, 0.04, 0.009, running=9, prompt_tokens=100, output_tokens=20)
    assert busy is not None and busy > tpot
    assert predict(None, 0.04, 0.009, running=1, prompt_tokens=100, output_tokens=20) == (0.04, 0.009)
    assert predict(None, 0.04, 0.009, running=8, prompt_tokens=100, output_tokens=20) == (None, None)


def _record(ttft: float, duration: float) -> UsageRecord:
    return UsageRecord(
        request_id="r", endpoint="chat", model="llama-3.1-8b", backend="b", pool="mi300x", vendor="amd",
        accelerator="mi300x", key="k", request_class="c", route="r/c", stream=True, status=200,
        prompt_tokens=100, completion_tokens=11, usage_source="backend", ttft_s=ttft, duration_s=duration,
        cost_usd=0.0, finished_at=0.0,
    )  # fmt: skip


def test_gateway_exports_the_ratio_and_logs_a_backend_off_for_five_minutes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    backend = backends()[0]
    prior = backend.pool.prior_ttft_s
    clock = [0.0]
    monkeypatch.setattr(drift_module.time, "monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="switchyard.drift"):
        for minute in range(6):
            clock[0] = minute * 60.0
            pipeline.observe(
                backend, _record(ttft=prior * 2, duration=prior * 2 + 10 * backend.pool.prior_tpot_s)
            )
    assert backend.drift.metrics["ttft"].ratio == pytest.approx(2.0)
    assert backend.drift.metrics["tpot"].ratio == pytest.approx(1.0)
    warnings = [r.getMessage() for r in caplog.records if "profile's prediction" in r.getMessage()]
    assert len(warnings) == 1 and "backend b: measured TTFT has been 2.00x" in warnings[0]
    rendered = Metrics(backends=[backend]).render().decode()
    assert (
        'switchyard_profile_error_ratio{backend="b",pool="mi300x",vendor="amd",metric="ttft"} 2' in rendered
    )


def test_profile_drift_ignores_what_cannot_be_compared() -> None:
    drift = ProfileDrift()
    assert not drift.observe("ttft", 0.0, 0.1, 0.0) and not drift.observe("tpot", 0.1, 0.0, 0.0)
    assert drift.metrics["ttft"].ratio is None
