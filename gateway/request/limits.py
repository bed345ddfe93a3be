"""What bounds one request of a class: its timeouts, its retries, and when it must wait for room.

Resolved once per (policy, class) from the gateway's defaults (`gateway.timeouts`, `gateway.retries`)
and the route's overrides (`timeouts:`, `backpressure:` in the policy file), then reused by every request
of that class: the request path reads attributes, it does not merge settings.

The global retry budget is a token bucket shared by all requests: each request adds `budget_ratio` of a
token, each retry takes one, the bucket holds at most `budget_burst`. The request path only increments a
counter; the bucket is settled when a retry asks for a token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gateway.config.settings import Retries, Timeouts
from policies.config import Backpressure, Route, Saturation

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers moved to the next candidate (before the first byte reaches the client)."""


@dataclass(frozen=True, slots=True)
class Limits:
    connect: float
    first_byte: float
    between_chunks: float
    total: float | None
    max_attempts: int
    saturation: Saturation | None = None
    backpressure: Backpressure | None = None


def resolve_limits(timeouts: Timeouts, retries: Retries, route: Route | None = None) -> Limits:
    o = route.timeouts if route is not None else None
    connect = (o and o.connect) or timeouts.connect
    return Limits(
        connect=connect,
        first_byte=(o and o.first_byte) or timeouts.first_byte,
        between_chunks=(o and o.between_chunks) or timeouts.between_chunks,
        total=(o and o.total) or timeouts.total,
        max_attempts=retries.max_attempts,
        saturation=route.saturation if route is not None else None,
        backpressure=route.backpressure if route is not None else None,
    )


class RetryBudget:
    """Gateway-wide cap on retries: at most `ratio` of requests, plus a burst of `burst`."""

    __slots__ = (
        "_seen",
        "_tokens",
        "backoff_base",
        "backoff_max",
        "burst",
        "denied",
        "ratio",
        "requests",
        "retries",
    )

    def __init__(self, retries: Retries) -> None:
        self.ratio = retries.budget_ratio
        self.burst = retries.budget_burst
        self.backoff_base = retries.backoff_ms / 1000.0
        self.backoff_max = retries.backoff_max_ms / 1000.0
        self.requests = 0
        """Incremented by every request (the only per-request cost)."""
        self._seen = 0
        self._tokens = self.burst
        self.retries = 0
        self.denied = 0

    def take(self) -> bool:
        """One retry's token, if the budget has one."""
        fresh = self.requests - self._seen
        self._seen = self.requests
        self._tokens = min(self.burst, self._tokens + fresh * self.ratio)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            self.retries += 1
            return True
        self.denied += 1
        return False

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1, 2, ...): full jitter, capped."""
        return random.uniform(0.0, min(self.backoff_max, self.backoff_base * (1 << (retry - 1))))

    def stats(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "retries": self.retries,
            "denied": self.denied,
            "tokens": round(min(self.burst, self._tokens + (self.requests - self._seen) * self.ratio), 2),
        }


def retry_after_seconds(value: str | None, default: float = 1.0) -> float:
    """A `Retry-After` header in seconds (HTTP dates are rare from vLLM; they get `default`)."""
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        return default
