"""The `round-robin` picker, for the round-robin baseline (loadtest/baselines/round-robin.yaml).

Registered when a policy file lists this module under `imports:`. It ignores scores, tiers and
saturation: each request starts one place further along the candidate list, so backends take turns.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.models import Backend
from policies.framework import RouteContext
from policies.registry import register


class RoundRobin:
    """Ignores scores, tiers and saturation: each request starts one place further along the candidate
    list, so backends take turns (the round-robin baseline of the load tests)."""

    name = "round-robin"

    def __init__(self) -> None:
        self._turn = 0

    def order(
        self,
        ctx: RouteContext,
        candidates: Sequence[Backend],
        tiers: Sequence[int],
        scores: Sequence[float],
        can_take_more: Sequence[bool],
    ) -> list[int]:
        count = len(candidates)
        if count == 0:
            return []
        first = self._turn % count
        self._turn += 1
        return [(first + i) % count for i in range(count)]


register("round-robin", "picker", RoundRobin)
