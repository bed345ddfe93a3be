"""A backend's answers feed its latency averages (`observe`, which routing predicts from) and are compared
with its pool profile's prediction (backends/drift.py): the ratio the gateway exports as
`switchyard_profile_error_ratio`, and the log line when it stays off."""

from __future__ import annotations

import logging
import time

from backends.drift import BOUND as DRIFT_BOUND
from backends.drift import METRICS
from backends.drift import WINDOW_S as DRIFT_WINDOW_S
from backends.drift import predict as predict_latency
from backends.models import Backend
from gateway.ledger.records import UsageRecord

log = logging.getLogger("switchyard.drift")


def compare_with_profile(
    backend: Backend, prompt_tokens: int, tokens: int, ttft: float, tpot: float | None
) -> None:
    """Compare the answer with the pool profile's prediction; log once when it has stayed off."""
    pool = backend.pool
    predicted = predict_latency(
        pool.step, pool.prior_ttft_s, pool.prior_tpot_s, backend.load.running, prompt_tokens, tokens
    )
    now = time.monotonic()
    for metric, measured, expected in zip(METRICS, (ttft, tpot), predicted, strict=True):
        if measured is None or expected is None:
            continue
        if backend.drift.observe(metric, measured, expected, now):
            ratio = backend.drift.metrics[metric].ratio or 0.0
            log.warning(
                "backend %s: measured %s has been %.2fx its profile's prediction for %.0f minutes "
                "(more than %.0f%% off); recalibrate it (switchyard calibrate, docs/calibrate.md)",
                backend.name, metric.upper(), ratio, DRIFT_WINDOW_S / 60, DRIFT_BOUND * 100,
            )  # fmt: skip


def observe(backend: Backend, record: UsageRecord, clock_scale: float = 1.0) -> None:
    """Feed the backend's latency averages, which routing uses to predict the next request's latency.

    Streams give time to first token and time per output token; a non-streaming answer gives only a
    time per token that includes the prefill, so it is used only when the output is long enough to
    dominate. With `n` choices the backend decodes them side by side: a token of each choice per step, so
    the time per step is the duration over the tokens of one choice. Durations are multiplied by
    `clock_scale` (backend seconds per gateway second) to be on the backends' clock, as the SLOs are.
    """
    tokens = record.completion_tokens // max(1, record.n)
    if record.status != 200 or tokens < 1:
        return
    duration = record.duration_s * clock_scale
    if record.stream and record.ttft_s is not None:
        ttft = record.ttft_s * clock_scale
        tpot = (duration - ttft) / (tokens - 1) if tokens > 1 else None
        backend.observed.add(ttft, tpot)
        compare_with_profile(backend, record.prompt_tokens, tokens, ttft, tpot)
    elif tokens >= 16:
        backend.observed.add(None, duration / tokens)
