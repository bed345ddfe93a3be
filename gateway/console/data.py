"""What the console shows, read through the admin API's own handler functions.

The console never re-implements a read or an action: it calls the function behind `/admin/v1/...`
(found by the route's name among the app's handlers), so the console and the JSON API cannot disagree,
and on every replica both read the same shared state (the fleet view, the ledger, the key store).
The one thing the admin API does not answer, the cost over time, is read from the ledger's buckets
with the ledger's own cost rules (`LedgerBase.report_buckets`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import asdict
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.handlers import BaseRouteHandler

from gateway.ledger.base import LedgerBase
from gateway.ledger.costs import bucket_of
from gateway.ledger.records import Dimension, Ledger

WINDOWS = ("1m", "15m", "1h", "24h")
HOURS = 24


class AdminApi:
    """The admin handlers' functions by route name, called in-process."""

    def __init__(self, handlers: Iterable[BaseRouteHandler]) -> None:
        self._fns = {h.name: h.fn for h in handlers if h.name}

    def has(self, name: str) -> bool:
        return name in self._fns

    async def call(self, route: str, /, **kwargs: Any) -> Any:
        result = await self._fns[route](**kwargs)
        if isinstance(result, Response):
            result = result.content
        if isinstance(result, msgspec.Struct):
            result = msgspec.to_builtins(result)
        return result


async def fleet(api: AdminApi, request: Request[Any, Any, Any]) -> dict[str, Any]:
    return await api.call("backends", state=request.app.state)


async def costs(api: AdminApi, request: Request[Any, Any, Any], by: str, window: str) -> list[dict[str, Any]]:
    body = await api.call("costs", request=request, by=by, window=window, format="json")
    return body["rows"]


async def keys_with_spend(api: AdminApi) -> list[dict[str, Any]]:
    if not api.has("keys-list"):
        return []
    listed = (await api.call("keys-list", team=None))["data"]
    return list(await asyncio.gather(*(api.call("keys-get", key_id=k["id"]) for k in listed)))


async def recent(api: AdminApi, request: Request[Any, Any, Any], limit: int = 1000) -> list[dict[str, Any]]:
    return (await api.call("recent-requests", state=request.app.state, limit=limit))["data"]


def traffic_mix(records: list[dict[str, Any]], now: float, minutes: int = 30) -> dict[str, Any]:
    """Classes and routes of the recent requests, and the vendor split per minute over `minutes`."""
    classes = Counter(f"{r.get('request_class') or '-'}" for r in records)
    routes = Counter(f"{r.get('route') or '-'}" for r in records)
    start = bucket_of(now, 60) - (minutes - 1) * 60
    vendors = sorted({r.get("vendor") or "-" for r in records})
    split = {v: [0] * minutes for v in vendors}
    for r in records:
        slot = int((r.get("finished_at", 0) - start) // 60)
        if 0 <= slot < minutes:
            split[r.get("vendor") or "-"][slot] += 1
    return {
        "classes": classes.most_common(),
        "routes": routes.most_common(),
        "split": split,
        "start": start,
        "count": len(records),
    }


class Recent:
    """Answers kept `ttl` seconds, then refreshed in the background while the kept one is still shown.

    The cost tables and the day's chart read thousands of ledger buckets (seconds, with 64 backends and
    a day of data); a page view must not wait for that. The first view of a key waits (login starts
    it, see routes.py); later views answer at once from what was read within the last `ttl` or so.
    """

    def __init__(self, ttl: float = 10.0) -> None:
        self.ttl = ttl
        self._values: dict[Hashable, tuple[float, Any]] = {}
        self._pending: dict[Hashable, asyncio.Task[Any]] = {}

    async def get(self, key: Hashable, compute: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
        """(wall time it was read, value)."""
        entry = self._values.get(key)
        if entry is None or time.time() - entry[0] > self.ttl:
            task = self._pending.get(key)
            if task is None:
                task = self._pending[key] = asyncio.create_task(self._fill(key, compute))
                task.add_done_callback(_retrieve)
            if entry is None:
                return await asyncio.shield(task)
        return entry

    def peek(self, key: Hashable, compute: Callable[[], Awaitable[Any]]) -> tuple[float, Any] | None:
        """What is kept for `key`, never waiting: a missing or old one is read in the background."""
        self.start(key, compute)
        return self._values.get(key)

    def start(self, key: Hashable, compute: Callable[[], Awaitable[Any]]) -> None:
        """Read `key` in the background now unless it is fresh or being read."""
        entry = self._values.get(key)
        if (entry is None or time.time() - entry[0] > self.ttl) and key not in self._pending:
            task = self._pending[key] = asyncio.create_task(self._fill(key, compute))
            task.add_done_callback(_retrieve)

    async def _fill(self, key: Hashable, compute: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
        try:
            entry = (time.time(), await compute())
            self._values[key] = entry
            return entry
        finally:
            self._pending.pop(key, None)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """A background refresh that failed is retried by the next view; its error is not left unretrieved."""
    if not task.cancelled():
        task.exception()


CHART_STEPS: dict[str, tuple[int, int]] = {"1m": (60, 5), "15m": (60, 15), "1h": (60, 60), "24h": (900, 96)}
"""Per cost window: the chart's step (seconds) and number of steps, the current (partial) one last: a
day in quarter hours, an hour or less in minutes. The 1-minute window is drawn over 5 minutes: a minute
is the ledger's default bucket, the finest step."""


class CostSeries:
    """Spend per step (a minute or an hour) over the selected window, by one dimension, from the
    ledger's buckets.

    Finished steps do not change once their buckets are written, so they are kept: a page view reads
    only the current step after the first.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._steps: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    @property
    def available(self) -> bool:
        return isinstance(self.ledger, LedgerBase)

    async def hourly(self, by: Dimension, now: float | None = None) -> tuple[list[int], dict[str, list]]:
        """(hour starts, {name: [row or None per hour]}), oldest first, the current hour last."""
        return await self.series(by, 3600, HOURS, now)

    async def series(
        self, by: Dimension, step: int, count: int, now: float | None = None
    ) -> tuple[list[int], dict[str, list]]:
        """(step starts, {name: [row or None per step]}), oldest first, the current step last."""
        ledger = self.ledger
        assert isinstance(ledger, LedgerBase)
        now = time.time() if now is None else now
        size = ledger.options.bucket_seconds
        step = max(step, size)
        current = bucket_of(now, step)
        starts = [current - (count - 1 - i) * step for i in range(count)]
        async with self._lock:
            per_step = [await self._step(ledger, by, start, step, size, start < current) for start in starts]
        self._forget(by, step, starts[0])
        names = sorted({name for rows in per_step for name in rows})
        return starts, {name: [rows.get(name) for rows in per_step] for name in names}

    async def _step(
        self, ledger: LedgerBase, by: Dimension, start: int, step: int, size: int, done: bool
    ) -> dict[str, dict[str, Any]]:
        cached = self._steps.get((by, step, start)) if done else None
        if cached is not None:
            return cached
        first = bucket_of(start, size)
        buckets = list(range(first, start + step, size))
        rows, _ = await ledger.report_buckets(by, buckets)
        result = {row.name: asdict(row) for row in rows}
        if done:
            self._steps[(by, step, start)] = result
        return result

    def _forget(self, by: str, step: int, oldest: int) -> None:
        for key in [k for k in self._steps if k[0] == by and k[1] == step and k[2] < oldest]:
            del self._steps[key]
