"""Built-in pickers."""

from __future__ import annotations

from collections.abc import Sequence

from backends.models import Backend
from policies.framework import RouteContext


class BestScore:
    """Backends that can take more work first, preferred pools before fallbacks, then by score.

    Equal scores rotate from request to request, so idle backends share the load instead of the first
    one taking everything.
    """

    name = "best-score"

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
        self._turn += 1
        # One float per candidate: unable (+4) > fallback tier (+2) > lower score (1 - score).
        keys = [
            (0.0 if ok else 4.0) + tier * 2.0 + (1.0 - score)
            for ok, tier, score in zip(can_take_more, tiers, scores, strict=True)
        ]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        # Backends tied for first place take turns being first; the rest keep their sorted order.
        best = keys[order[0]]
        tied = 1
        while tied < len(order) and keys[order[tied]] == best:
            tied += 1
        if tied > 1:
            shift = self._turn % tied
            order[:tied] = order[shift:tied] + order[:shift]
        return order
