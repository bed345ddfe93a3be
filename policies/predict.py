"""Predicted latency of a backend for the next request, and whether it can take more work.

A heuristic on purpose, cheap enough to run for every candidate of every request:

    queue = waiting at the last scrape
            + requests this gateway sent since that scrape, when the backend was already queueing
              (waiting > 0 or KV cache past the route's limit): those queue too
    ttft  = base x (1 + queue / 2) + (prompt + prompt tokens still to prefill) / prefill speed

Tokens still to prefill are those of the requests this gateway sent since the last scrape and that the
backend has not answered yet: a request that got its first byte back has been prefilled, so it leaves the
estimate then (`answered`), not only at the next scrape (a backend that is never scraped, with no vLLM
metrics, would otherwise be predicted ever slower).
    tpot  = observed time per output token (EWMA; prior before any)

`base` is the TTFT this gateway measured on the backend (EWMA), or the accelerator's prior before any
measurement. (An average measured during a spike keeps the backend demoted until a request refreshes it:
it then only gets work once the other pools are predicted to miss too. A class that would be held then
sends its request to an idle backend, so the measurement is refreshed.) The prefill speed is the
accelerator's saturated throughput times PREFILL_PER_DECODE_TOKEN (prefill is compute-bound and runs a few
times faster than decode).

The scrape is up to a scrape interval old; `Recent` holds what the gateway itself sent each backend
since then, so a burst between two scrapes sees the queue it is building and spills to another pool
instead of piling onto the one that looked idle.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.models import Backend
from policies.config import Route, Saturation

PREFILL_PER_DECODE_TOKEN = 2.2
"""Prefill tokens per second over saturated decode tokens per second (8B on H100 or MI300X: ~40k/18k)."""


@dataclass(slots=True)
class Recent:
    """What this gateway routed to one backend since the backend's last scrape."""

    scraped_at: float | None = None
    requests: int = 0
    prompt_tokens: int = 0


class RecentSends:
    """Per backend: requests and prompt tokens routed since its last scrape (reset when it changes)."""

    __slots__ = ("by_backend", "speeds")

    def __init__(self) -> None:
        self.by_backend: dict[Backend, Recent] = {}
        self.speeds: dict[str, float] = {}
        """Prefill tokens per second of one backend, by pool name."""

    def get(self, backend: Backend) -> Recent | None:
        recent = self.by_backend.get(backend)
        if recent is None or recent.scraped_at != backend.load.scraped_at:
            return None
        return recent

    def sent(self, backend: Backend, prompt_tokens: int) -> None:
        recent = self.by_backend.get(backend)
        if recent is None:
            recent = self.by_backend[backend] = Recent()
        scraped_at = backend.load.scraped_at
        if recent.scraped_at != scraped_at:
            recent.scraped_at, recent.requests, recent.prompt_tokens = scraped_at, 0, 0
        recent.requests += 1
        recent.prompt_tokens += prompt_tokens

    def answered(self, backend: Backend, prompt_tokens: int) -> None:
        """A request counted by `sent` got its first byte back (or ended): its prompt is no longer pending."""
        recent = self.by_backend.get(backend)
        if recent is None or recent.scraped_at != backend.load.scraped_at:
            return  # counted in a window a scrape has closed since
        recent.requests = max(0, recent.requests - 1)
        recent.prompt_tokens = max(0, recent.prompt_tokens - prompt_tokens)

    def prefill_speed(self, backend: Backend) -> float:
        """Prompt tokens per second one backend of this pool prefills."""
        pool = backend.pool
        speed = self.speeds.get(pool.name)
        if speed is None:
            speed = self.speeds[pool.name] = prefill_speed(backend)
        return speed


def prefill_speed(backend: Backend) -> float:
    """Prompt tokens per second `backend` prefills: its accelerators' saturated decode throughput (for
    its model's size) times PREFILL_PER_DECODE_TOKEN."""
    return backend.pool.saturated_tokens_per_s * PREFILL_PER_DECODE_TOKEN


def queue_estimate(backend: Backend, recent: Recent | None, max_kv: float) -> float:
    load = backend.load
    waiting = load.waiting
    if recent is not None and (waiting > 0 or load.kv_cache_usage > max_kv):
        waiting += recent.requests
    return waiting


def idle(backend: Backend) -> bool:
    """Nothing of this gateway's in flight and nothing running or waiting at the last scrape."""
    load = backend.load
    return backend.inflight == 0 and load.running <= 0 and load.waiting <= 0


def ttft_estimate(
    backend: Backend, recent: Recent | None, queue: float, prompt_tokens: int, prefill_speed: float
) -> float:
    observed = backend.observed.ttft
    base = backend.pool.prior_ttft_s if observed is None else observed
    pending = prompt_tokens + (recent.prompt_tokens if recent is not None else 0)
    return base * (1.0 + queue * 0.5) + pending / prefill_speed


def predicted_tpot(backend: Backend) -> float:
    observed = backend.observed.tpot
    return observed if observed is not None else backend.pool.prior_tpot_s


_NO_RECENT = RecentSends()


def predicted_ttft(backend: Backend, prompt_tokens: int = 0, recent: RecentSends | None = None) -> float:
    """The engine's TTFT prediction for one backend (for explanations and errors; the engine inlines it)."""
    sends = recent or _NO_RECENT
    seen = sends.get(backend)
    queue = queue_estimate(backend, seen, 1.0)
    return ttft_estimate(backend, seen, queue, prompt_tokens, sends.prefill_speed(backend))


def saturation_reason(backend: Backend, limits: Saturation, recent: RecentSends | None = None) -> str | None:
    """Why `backend` is past a route's `saturation` limits, or None (the engine inlines the same test; a
    property test holds the two equal)."""
    load = backend.load
    queue = queue_estimate(backend, (recent or _NO_RECENT).get(backend), limits.max_kv_cache_usage)
    if queue > limits.max_waiting:
        return f"{queue:g} requests waiting (limit {limits.max_waiting:g})"
    if load.kv_cache_usage > limits.max_kv_cache_usage:
        return f"KV cache {load.kv_cache_usage:.0%} full (limit {limits.max_kv_cache_usage:.0%})"
    if limits.max_inflight is not None and backend.inflight >= limits.max_inflight:
        return f"{backend.inflight} requests in flight (limit {limits.max_inflight})"
    if limits.max_seqs is not None and backend.inflight_seqs >= limits.max_seqs:
        return f"{backend.inflight_seqs} sequences in flight (limit {limits.max_seqs})"
    if decoding_slowly(backend, limits):
        tpot_ms = (backend.observed.tpot or 0.0) * 1000
        return f"decoding at {tpot_ms:.0f} ms per token (limit {tpot_mark(backend, limits) * 1000:.0f} ms)"
    return None


def tpot_mark(backend: Backend, limits: Saturation) -> float:
    """Seconds per output token past which `backend` takes no more of the route (inf: no mark)."""
    mark = float("inf") if limits.max_tpot_ms is None else limits.max_tpot_ms / 1000
    light_load = backend.pool.light_load_tpot_s
    if limits.max_slowdown is not None and light_load is not None:
        mark = min(mark, light_load * limits.max_slowdown)
    return mark


def decoding_slowly(backend: Backend, limits: Saturation) -> bool:
    """Its measured time per output token is past the route's mark while it has work in flight.

    An idle backend is never slow: the measurement is of requests that have ended, and with none in
    flight nothing would refresh it, so the backend would stay closed to the class for good.
    """
    tpot = backend.observed.tpot
    return tpot is not None and tpot > tpot_mark(backend, limits) and not idle(backend)


def slo_miss_reason(
    backend: Backend, route: Route, prompt_tokens: int = 0, recent: RecentSends | None = None
) -> str | None:
    slo = route.slo
    if slo is None:
        return None
    if slo.ttft_ms is not None:
        ttft_ms = predicted_ttft(backend, prompt_tokens, recent) * 1000
        if ttft_ms > slo.ttft_ms:
            return f"predicted TTFT {ttft_ms:.0f} ms > SLO {slo.ttft_ms:g} ms"
    if slo.tpot_ms is not None:
        tpot_ms = predicted_tpot(backend) * 1000
        if tpot_ms > slo.tpot_ms:
            return f"predicted time per token {tpot_ms:.1f} ms > SLO {slo.tpot_ms:g} ms"
    return None
