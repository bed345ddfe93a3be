"""A backend's answers against its pool profile's prediction (backends/drift.py): the ratio the gateway
exports as `switchyard_profile_error_ratio`, and the log line when it stays off."""

from __future__ import annotations

import logging
import time

from backends.drift import BOUND as DRIFT_BOUND
from backends.drift import METRICS
from backends.drift import WINDOW_S as DRIFT_WINDOW_S
from backends.drift import predict as predict_latency
from backends.models import Backend

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
