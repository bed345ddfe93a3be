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


class CostSeries:
    """Spend per hour over the last day, by one dimension, from the ledger's buckets.

    Finished hours do not change once their buckets are written, so they are kept: a page view reads
    only the current hour (60 buckets with the default 1-minute buckets) after the first.
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._hours: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    @property
    def available(self) -> bool:
        return isinstance(self.ledger, LedgerBase)

    async def hourly(self, by: Dimension, now: float | None = None) -> tuple[list[int], dict[str, list]]:
        """(hour starts, {name: [row or None per hour]}), oldest first, the current hour last."""
        ledger = self.ledger
        assert isinstance(ledger, LedgerBase)
        now = time.time() if now is None else now
        size = ledger.options.bucket_seconds
        current = bucket_of(now, 3600)
        hours = [current - (HOURS - 1 - i) * 3600 for i in range(HOURS)]
        async with self._lock:
            per_hour = [await self._hour(ledger, by, start, size, done=start < current) for start in hours]
        self._forget(by, hours[0])
        names = sorted({name for rows in per_hour for name in rows})
        return hours, {name: [rows.get(name) for rows in per_hour] for name in names}

    async def _hour(
        self, ledger: LedgerBase, by: Dimension, start: int, size: int, done: bool
    ) -> dict[str, dict[str, Any]]:
        cached = self._hours.get((by, start)) if done else None
        if cached is not None:
            return cached
        first = bucket_of(start, size)
        buckets = list(range(first, start + 3600, size))
        rows, _ = await ledger.report_buckets(by, buckets)
        result = {row.name: asdict(row) for row in rows}
        if done:
            self._hours[(by, start)] = result
        return result

    def _forget(self, by: str, oldest: int) -> None:
        for key in [k for k in self._hours if k[0] == by and k[1] < oldest]:
            del self._hours[key]
