"""Predicted latency of a backend for the next request, and whether it can take more work.

A heuristic on purpose, cheap enough to run for every candidate of every request (the engine inlines
the same formulas in its loop; these functions serve explanations and errors):

    ttft = observed TTFT (EWMA; the accelerator's prior before any) x (1 + waiting / 2)
    tpot = observed time per output token (EWMA; prior before any)

`waiting` is vLLM's own queue from the last scrape: each queued request delays a new one's prefill.
The observed averages already carry the effect of the current batch size on decode speed.
"""

from __future__ import annotations

from backends.models import Backend
from policies.config import Route


def predicted_ttft(backend: Backend) -> float:
    observed = backend.observed.ttft
    base = observed if observed is not None else backend.pool.prior_ttft_s
    return base * (1.0 + backend.load.waiting / 2.0)


def predicted_tpot(backend: Backend) -> float:
    observed = backend.observed.tpot
    return observed if observed is not None else backend.pool.prior_tpot_s


def saturation_reason(backend: Backend, route: Route) -> str | None:
    limits = route.saturation
    load = backend.load
    if load.waiting > limits.max_waiting:
        return f"{load.waiting:g} requests waiting (limit {limits.max_waiting:g})"
    if load.kv_cache_usage > limits.max_kv_cache_usage:
        return f"KV cache {load.kv_cache_usage:.0%} full (limit {limits.max_kv_cache_usage:.0%})"
    if limits.max_inflight is not None and backend.inflight >= limits.max_inflight:
        return f"{backend.inflight} requests in flight (limit {limits.max_inflight})"
    return None


def slo_miss_reason(backend: Backend, route: Route) -> str | None:
    slo = route.slo
    if slo is None:
        return None
    if slo.ttft_ms is not None:
        ttft_ms = predicted_ttft(backend) * 1000
        if ttft_ms > slo.ttft_ms:
            return f"predicted TTFT {ttft_ms:.0f} ms > SLO {slo.ttft_ms:g} ms"
    if slo.tpot_ms is not None:
        tpot_ms = predicted_tpot(backend) * 1000
        if tpot_ms > slo.tpot_ms:
            return f"predicted time per token {tpot_ms:.1f} ms > SLO {slo.tpot_ms:g} ms"
    return None
