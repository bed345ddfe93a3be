"""Step 5: turn what a backend served into one ledger record and the cost attributed to the request.

Attributed cost: once the ledger has measured the backend (paid GPU time over tokens served, 15-minute
window), the request's tokens at that rate, output tokens weighted by `ledger.output_token_weight`
(`Ledger.measured_cost`; rules in gateway/ledger/costs.py). Until then a time-share estimate: the
backend's price per second (price per GPU-hour x GPUs) times the request's duration, divided by the
requests it was serving at the same time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from backends.models import Backend
from gateway.ledger.records import Ledger, UsageRecord, UsageSource
from gateway.openai.responses import Usage
from gateway.request.parse import ParsedRequest
from policies.profile import RequestProfile


@dataclass(slots=True)
class Served:
    """What happened upstream, gathered by the pipeline for accounting."""

    backend: Backend
    concurrency: int
    status: int
    usage: Usage | None
    completion_events: int
    started_at: float
    first_byte_at: float | None
    ended_at: float
    prompt_tokens_counted: int | None = None
    """The backend's count of the prompt when it sent no usage (a stream cut short), if it could say."""


def attributed_cost(backend: Backend, duration_s: float, concurrency: int) -> float:
    return backend.pool.backend_price_per_second * duration_s / max(1, concurrency)


def account(
    ledger: Ledger,
    request_id: str,
    parsed: ParsedRequest,
    profile: RequestProfile,
    route: str,
    served: Served,
) -> UsageRecord:
    usage = served.usage
    source: UsageSource
    if usage is not None:
        prompt, completion, source = usage.prompt_tokens, usage.completion_tokens, "backend"
    else:
        counted = served.prompt_tokens_counted
        prompt = counted if counted is not None else profile.prompt_tokens_estimate
        completion = max(0, served.completion_events - 1)
        source = "estimated"
    duration = max(0.0, served.ended_at - served.started_at)
    backend = served.backend
    cost = ledger.measured_cost(backend.name, prompt, completion)
    if cost is None:
        cost = attributed_cost(backend, duration, served.concurrency)
    record = UsageRecord(
        request_id=request_id,
        endpoint=parsed.endpoint,
        model=parsed.model,
        backend=backend.name,
        pool=backend.pool.name,
        vendor=backend.pool.vendor,
        accelerator=backend.pool.accelerator,
        key=profile.key_id,
        request_class=profile.request_class,
        route=route,
        stream=parsed.stream,
        status=served.status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        usage_source=source,
        ttft_s=(served.first_byte_at - served.started_at) if served.first_byte_at is not None else None,
        duration_s=duration,
        cost_usd=cost,
        finished_at=time.time(),
        busy_s=duration / max(1, served.concurrency),
        prompt_estimate=profile.prompt_tokens_estimate,
        max_tokens=profile.max_tokens,
        n=profile.n,
        priority=profile.priority,
        class_header=profile.explicit_class,
        tenant=profile.tenant,
        session=profile.session,
    )
    ledger.record(record)
    return record
