"""Step 5: turn what a backend served into one ledger record and the request's cost estimate.

The request's allocated cost is settled when its bucket ends (gateway/ledger/allocation.py); the record
carries its bound (price x GPUs x its time on the backend), and the estimate sent as
`x-switchyard-cost-usd` is: once the ledger has measured the backend (paid GPU time over weighted tokens
served, 15-minute window), the request's weighted tokens at that rate (`Ledger.measured_cost`), else a
time share (its bound divided by the requests the backend was serving when it was sent); either way
capped by the bound. Estimate and final allocation both lie in [0, bound].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.models import Backend
from gateway.ledger.records import Ledger, UsageRecord, UsageSource
from gateway.openai.responses import Usage
from gateway.request.classify import Caller
from gateway.request.parse import ParsedRequest
from policies.profile import RequestProfile

if TYPE_CHECKING:
    from gateway.request.context import RequestContext


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


def estimate_cost(
    ledger: Ledger, backend: Backend, prompt: int, completion: int, duration_s: float, concurrency: int
) -> float:
    """USD: the measured rate for these tokens, else a time share; never above the request's bound."""
    bound = backend.pool.backend_price_per_second * duration_s
    cost = ledger.measured_cost(backend.name, prompt, completion)
    if cost is None:
        return bound / max(1, concurrency)
    return cost if cost < bound else bound


def account(
    ledger: Ledger,
    caller: Caller,
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
    cost = estimate_cost(ledger, backend, prompt, completion, duration, served.concurrency)
    pool = backend.pool
    ttft = (served.first_byte_at - served.started_at) if served.first_byte_at is not None else None
    # By position, in the order of UsageRecord's fields: a third of the keyword call's CPU, once per request
    # (tests/unit/gateway/test_ledger_memory.py checks every field by its name).
    record = UsageRecord(
        caller.request_id,  # request_id
        parsed.endpoint,  # endpoint
        parsed.model,  # model
        backend.name,  # backend
        pool.name,  # pool
        pool.vendor,  # vendor
        pool.accelerator,  # accelerator
        profile.key_id,  # key
        profile.request_class,  # request_class
        route,  # route
        parsed.stream,  # stream
        served.status,  # status
        prompt,  # prompt_tokens
        completion,  # completion_tokens
        source,  # usage_source
        ttft,  # ttft_s
        duration,  # duration_s
        cost,  # cost_usd
        time.time(),  # finished_at
        duration / max(1, served.concurrency),  # busy_s
        profile.prompt_tokens_estimate,  # prompt_estimate
        profile.max_tokens,  # max_tokens
        profile.n,  # n
        profile.priority,  # priority
        profile.explicit_class,  # class_header
        profile.tenant,  # tenant
        profile.session,  # session
        "",  # affinity
        None,  # prefix
        int(pool.backend_price_per_second * duration * 1e9),  # bound_nusd
        caller.client_request_id,  # client_request_id
        0.0,  # queued_s
        parsed.prompt_chars,  # prompt_chars
    )
    ledger.record(record)
    return record


def stream_cost_of(ledger: Ledger, ctx: RequestContext) -> Callable[[Usage], float]:
    """The cost estimate for the stream's final usage event (the client asked for usage). It holds what it
    needs of the open stream's context, not the context: the context holds the relay that holds it, and
    that cycle left every streamed request's objects to the garbage collector (8 ms passes)."""
    backend = ctx.backend
    assert backend is not None
    started_at, concurrency = ctx.started_at, ctx.concurrency

    def cost_of(usage: Usage) -> float:
        duration = time.monotonic() - started_at
        return estimate_cost(
            ledger, backend, usage.prompt_tokens, usage.completion_tokens, duration, concurrency
        )

    return cost_of
