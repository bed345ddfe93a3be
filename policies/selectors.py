"""Which pools a route's `prefer` and `fallback` name."""

from __future__ import annotations

from collections.abc import Iterator

from backends.models import Pool
from policies.config import PoolSelector, Selection


def _matches(selector: PoolSelector, pool: Pool) -> bool:
    if selector.vendor is not None and pool.vendor != selector.vendor:
        return False
    if selector.accelerator is not None:
        wanted = [selector.accelerator] if isinstance(selector.accelerator, str) else selector.accelerator
        if pool.accelerator not in {a.lower() for a in wanted}:
            return False
    if selector.pool is not None:
        names = [selector.pool] if isinstance(selector.pool, str) else selector.pool
        if pool.name not in names:
            return False
    return not selector.labels or all(pool.labels.get(k) == v for k, v in selector.labels.items())


def selects(selection: Selection, pool: Pool) -> bool:
    if selection == "any":
        return True
    if selection == "none":
        return False
    if isinstance(selection, PoolSelector):
        return _matches(selection, pool)
    return any(_matches(s, pool) for s in selection)


def each_selector(selection: Selection) -> Iterator[tuple[tuple[int, ...], PoolSelector]]:
    """Each selector of a `prefer` or `fallback`, with its index when given as a list."""
    if isinstance(selection, PoolSelector):
        yield (), selection
    elif isinstance(selection, list):
        for i, selector in enumerate(selection):
            yield (i,), selector
