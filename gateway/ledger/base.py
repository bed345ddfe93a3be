"""What every ledger store shares: the paid-time ticker, the cost refresher, recent records, attribution.

A store implements `record`, `_claim_paid` (store paid GPU time per backend and bucket, keeping the
larger value so replicas never double pay), `_window` (per bucket: counters, paid time and allocation
sums) and `read_totals`; `costs` allocates each bucket's paid cost (gateway/ledger/allocation.py).
Background tasks (started by `start`, stopped by `close`):

- every `paid_interval`: claim the paid time of each backend from this replica's start to now, for the
  buckets not yet claimed (after an outage it catches up from the first unclaimed bucket);
- every `refresh_interval`: read the 15-minute backend window and set `Backend.measured_cost_per_mtok`
  (blended) and the per-weighted-token rate used to attribute costs, so routing and accounting read them
  without I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from backends.models import Backend
from gateway.config.settings import LedgerOptions
from gateway.ledger.allocation import Share, allocate_bucket
from gateway.ledger.costs import Counters, bucket_of, build_rows, merge, paid_nusd, window_buckets
from gateway.ledger.records import GPU_DIMENSIONS, CostRow, Dimension, Totals, UsageRecord

log = logging.getLogger("switchyard.ledger")

REFRESH_WINDOW = "15m"

BucketData = tuple[dict[str, Counters], dict[str, int], list[Share]]
"""One bucket as a store reads it: counters by name, paid ms by backend, allocation sums."""


class LedgerBase:
    kind = "base"

    def __init__(
        self,
        options: LedgerOptions | None = None,
        backends: Sequence[Backend] = (),
        clock: Callable[[], float] = time.time,
        keep_recent: int = 1000,
    ) -> None:
        self.options = options or LedgerOptions()
        self.backends = list(backends)
        self._clock = clock
        self._recent: deque[UsageRecord] = deque(maxlen=keep_recent)
        self._rates: dict[str, float] = {}
        self._weight = self.options.output_token_weight
        self._started_at: float | None = None
        self._unclaimed_from: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.background_errors = 0
        self.idle_cost = self.options.idle_cost
        self.window_rows: list[CostRow] = []
        """The backend rows of the last refresh (REFRESH_WINDOW), for the cost metrics."""

    # --- on the request path: constant time, no I/O ---------------------------------------------------

    def record(self, record: UsageRecord) -> None:
        raise NotImplementedError

    def measured_cost(self, backend: str, prompt_tokens: int, completion_tokens: int) -> float | None:
        rate = self._rates.get(backend)
        return None if rate is None else (prompt_tokens + self._weight * completion_tokens) * rate

    def recent(self, limit: int) -> list[UsageRecord]:
        return list(self._recent)[-limit:] if limit > 0 else []

    # --- reading --------------------------------------------------------------------------------------

    async def read_totals(self, by: Dimension) -> dict[str, Totals]:
        raise NotImplementedError

    async def costs(self, by: Dimension, window: str) -> list[CostRow]:
        return (await self.report(by, window))[0]

    async def report(self, by: Dimension, window: str) -> tuple[list[CostRow], dict[str, int]]:
        """The cost rows, and the window's totals over all backends: `paid_nusd` = `allocated_nusd` +
        `idle_nusd` (the rows of any dimension add up to them)."""
        return await self.report_buckets(
            by, window_buckets(window, self.options.bucket_seconds, self._clock())
        )

    async def report_buckets(self, by: Dimension, buckets: list[int]) -> tuple[list[CostRow], dict[str, int]]:
        """`report` over any list of buckets (the console's hourly chart reads one hour at a time)."""
        backends = {b.name: b for b in self.backends}
        spread = self.idle_cost == "spread"
        counters: dict[str, Counters] = {}
        paid_ms: dict[str, int] = {}
        paid: dict[str, int] = {}
        allocated: dict[str, int] = {}
        idle: dict[str, int] = {}
        gpu_rows = by in GPU_DIMENSIONS
        for bucket_counters, bucket_paid_ms, shares in await self._window(by, buckets):
            for name, values in bucket_counters.items():
                for metric, value in values.items():
                    merge(counters, name, metric, value)
            bucket_paid: dict[str, int] = {}
            for name, ms in bucket_paid_ms.items():
                paid_ms[name] = paid_ms.get(name, 0) + ms
                backend = backends.get(name)
                if backend is not None:
                    bucket_paid[name] = paid_nusd(ms, backend)
            by_name, by_backend, bucket_idle = allocate_bucket(bucket_paid, shares, spread)
            for name, value in (by_backend if gpu_rows else by_name).items():
                allocated[name] = allocated.get(name, 0) + value
            for name, value in bucket_paid.items():
                paid[name] = paid.get(name, 0) + value
                idle[name] = idle.get(name, 0) + bucket_idle[name]
        rows = build_rows(by, counters, paid_ms, self.backends, self._weight, allocated, paid, idle)
        total_idle = sum(idle.values())
        totals = {
            "paid_nusd": sum(paid.values()),
            "allocated_nusd": sum(paid.values()) - total_idle,
            "idle_nusd": total_idle,
        }
        return rows, totals

    async def _window(self, by: Dimension, buckets: list[int]) -> list[BucketData]:
        """For each of `buckets`: counters per name of `by`, paid ms per backend, allocation sums."""
        raise NotImplementedError

    def stats(self) -> dict[str, int | str | None]:
        return {"store": self.kind, "background_errors": self.background_errors}

    async def flush(self) -> bool:
        """Write what is buffered (stores without a buffer have nothing to do); False if it failed."""
        return True

    # --- background work ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started_at is None:
            self._started_at = self._clock()
        self._spawn(self.options.paid_interval, self.tick)
        self._spawn(self.options.refresh_interval, self.refresh)

    def _spawn(self, interval: float, step: Callable[[], Awaitable[object]]) -> None:
        self._tasks.append(asyncio.create_task(self._every(interval, step)))

    async def _every(self, interval: float, step: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await step()
            except Exception as exc:
                self.background_errors += 1
                if self.background_errors in (1, 10) or self.background_errors % 100 == 0:
                    log.warning(
                        "ledger %s failed (%d so far): %s", step.__name__, self.background_errors, exc
                    )

    async def tick(self, now: float | None = None) -> None:
        """Claim the GPU time paid for every backend, from this replica's start to `now`."""
        now = self._clock() if now is None else now
        if self._started_at is None:
            self._started_at = now
        size = self.options.bucket_seconds
        last = bucket_of(now, size)
        first = (
            self._unclaimed_from if self._unclaimed_from is not None else bucket_of(self._started_at, size)
        )
        first = max(first, last - int(self.options.retention // size) * size)
        claims: dict[int, int] = {}
        for start in range(first, last + size, size):
            overlap = min(now, start + size) - max(self._started_at, start)
            if overlap > 0:
                claims[start] = round(overlap * 1000)
        if claims and self.backends:
            await self._claim_paid(claims, [b.name for b in self.backends])
        self._unclaimed_from = last

    async def _claim_paid(self, claims: dict[int, int], backends: list[str]) -> None:
        """For each bucket start -> ms, and each backend: paid ms = max(stored, ms)."""
        raise NotImplementedError

    async def refresh(self) -> None:
        """Keep `measured_cost_per_mtok` and the attribution rates fresh from the 15-minute window."""
        self.window_rows = await self.costs("backend", REFRESH_WINDOW)
        rows = {row.name: row for row in self.window_rows}
        rates: dict[str, float] = {}
        for backend in self.backends:
            row = rows.get(backend.name)
            if row is None or row.usd_per_weighted_token is None or row.paid_usd is None:
                backend.measured_cost_per_mtok = None
                continue
            backend.measured_cost_per_mtok = row.blended_usd_per_mtok
            rates[backend.name] = row.usd_per_weighted_token
        self._rates = rates

    async def _stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def close(self) -> None:
        await self._stop_tasks()
        if self._started_at is not None:
            with contextlib.suppress(Exception):
                await self.tick()
