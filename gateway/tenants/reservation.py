"""How much a request may cost and how many tokens it may use, decided before it is sent.

Budget cost: until the allocated-cost ledger lands (issue 14), a request is charged its ledger record's
`cost_usd`; `charged_cost` is the one place to switch.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.models import Backend
from gateway.ledger.records import Ledger, UsageRecord

PROMPT_MARGIN = 2
"""The prompt is reserved at twice the gateway's estimate (4 characters a token): tokenizers differ."""


def charged_cost(record: UsageRecord) -> float:
    """What a finished request costs its key's and team's budgets."""
    return record.cost_usd


def max_output_tokens(
    candidates: Sequence[Backend], prompt_tokens: int, max_tokens: int | None, n: int
) -> int:
    """`max_tokens` (per choice) times `n`; without it, what the largest context left after the prompt."""
    if max_tokens is None:
        longest = max((b.max_model_len for b in candidates), default=0)
        max_tokens = max(1, longest - prompt_tokens)
    return max_tokens * max(1, n)


def max_cost_usd(ledger: Ledger, candidates: Sequence[Backend], prompt_tokens: int, completion: int) -> float:
    """The dearest the request can be on any backend it may be routed to: the backend's measured rate
    (what the record will be charged, gateway/request/account.py), or before it is measured, its price
    for the time the request should take (the accelerator's prior latencies, unloaded)."""
    dearest = 0.0
    prompt = prompt_tokens * PROMPT_MARGIN
    for backend in candidates:
        cost = ledger.measured_cost(backend.name, prompt, completion)
        if cost is None:
            pool = backend.pool
            cost = pool.backend_price_per_second * (pool.prior_ttft_s + completion * pool.prior_tpot_s)
        dearest = max(dearest, cost)
    return dearest
