"""The `cheapest` scorer: USD per million tokens, measured by the ledger where it has data."""

from __future__ import annotations

from collections.abc import Sequence

from backends.models import Backend
from policies.framework import RouteContext


def cost_per_mtok(backend: Backend) -> float:
    """Measured effective cost, else the price at the accelerator's saturated throughput (a floor)."""
    measured = backend.measured_cost_per_mtok
    if measured is not None and measured > 0:
        return measured
    return backend.pool.cost_floor_per_mtok


class Cheapest:
    """The cheapest candidate scores 1; one costing twice as much scores 0.5."""

    name = "cheapest"
    scores_in_unit_range = True
    reads_predictions = False

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        costs = [cost_per_mtok(b) for b in candidates]
        least = min(costs)
        if least <= 0:
            return [1.0 if c <= 0 else 0.0 for c in costs]
        return [least / c for c in costs]
