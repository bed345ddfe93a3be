"""Back-pressure: when every candidate of a class is saturated, wait briefly for room, then refuse.

Only routes with `backpressure:` (or `shed: true`, which implies it) in the policy take part. A request
whose candidates are all saturated (the route's `saturation` limits: vLLM's queue, KV cache, requests in
flight), or whose `shed` route found none able to take more work (policies/engine.py), joins its class's
queue, bounded by `max_queued`; waiters are served in priority order (`high`, then unmarked, then `low` or
`batch`), first come first served within a priority. The head of the queue re-routes whenever a request
finishes and at a short poll interval (scraped load changes without any request finishing); the rest
wait their turn. After `max_wait_ms` the request gets 429 with `Retry-After` instead of adding to queues
that would miss every SLO.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Sequence

from backends.models import Backend
from gateway.openai.errors import GatewayError
from policies.config import Saturation
from policies.framework import Decision
from policies.predict import saturation_reason

POLL_S = 0.05
PRIORITY = {"high": 0, "low": 2, "batch": 2}
"""Waiters' order by priority (unmarked: 1); loadtest/whatif/holds.py replays the same queues."""


def all_saturated(candidates: Sequence[Backend], limits: Saturation) -> bool:
    for backend in candidates:  # noqa: SIM110 - a plain loop is cheaper than all() over a generator
        if saturation_reason(backend, limits) is None:
            return False
    return True


def no_room(decision: Decision, limits: Saturation) -> bool:
    """Whether the request must wait: its route sheds it under overload (the engine found no candidate
    able to take more work, by the predicted queue and SLO), or every candidate is saturated."""
    return decision.hold or all_saturated(decision.candidates, limits)


def overloaded(request_class: str, retry_after_s: int, why: str) -> GatewayError:
    return GatewayError(
        429,
        f"Every backend for class `{request_class}` is saturated ({why}); retry after {retry_after_s} s.",
        "rate_limit_error",
        code="overloaded",
        headers={"retry-after": str(retry_after_s)},
    )


class _Waiter:
    __slots__ = ("event", "key")

    def __init__(self, key: tuple[int, int]) -> None:
        self.key = key
        self.event = asyncio.Event()

    def __lt__(self, other: _Waiter) -> bool:
        return self.key < other.key


class ClassQueue:
    """The waiting requests of one class, best first."""

    _order = itertools.count()

    def __init__(self) -> None:
        self.waiters: list[_Waiter] = []
        self.refused = 0
        self.served = 0

    def __len__(self) -> int:
        return len(self.waiters)

    def join(self, priority: str | None) -> _Waiter:
        waiter = _Waiter((PRIORITY.get(priority or "", 1), next(self._order)))
        bisect.insort(self.waiters, waiter)
        return waiter

    def leave(self, waiter: _Waiter) -> None:
        self.waiters.remove(waiter)
        self.wake_head()

    def wake_head(self) -> None:
        if self.waiters:
            self.waiters[0].event.set()

    async def turn(self, waiter: _Waiter, longest: float) -> None:
        """Until this waiter is woken (it became the head, or room was made) or a poll interval passes."""
        if not waiter.event.is_set():
            try:
                async with asyncio.timeout(min(longest, POLL_S)):
                    await waiter.event.wait()
            except TimeoutError:
                pass
        waiter.event.clear()
