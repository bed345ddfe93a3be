"""The in-memory ledger: the demo's store and the reference the Redis store must agree with."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

from backends.models import Backend
from gateway.config.settings import LedgerOptions
from gateway.ledger.allocation import Share, rate_bin
from gateway.ledger.base import BucketData, LedgerBase
from gateway.ledger.costs import METRICS, Counters, bucket_of, merge, record_values
from gateway.ledger.records import DIMENSIONS, Dimension, Totals, UsageRecord

DRAIN_SLICE = 256
"""Queued records aggregated between two turns of the event loop by the ticker and by reads: a second of
traffic drained at once (5,500 records) held the loop for about 15 ms, and with it every request in flight
(docs/benchmarks.md)."""


class InMemoryLedger(LedgerBase):
    """One process's ledger; per-bucket counters are pruned after `retention`, totals are kept.

    `record()` only checks the request id and queues the record: the counters are brought up to date when
    they are read and on every paid-time tick, off the request path.
    """

    kind = "memory"

    def __init__(
        self,
        keep_recent: int = 1000,
        options: LedgerOptions | None = None,
        backends: Sequence[Backend] = (),
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(options, backends, **({"clock": clock} if clock else {}), keep_recent=keep_recent)
        # Counters per combination of (backend, pool, vendor, model, key, class, rate bin), rolled up by
        # dimension on read; the values are METRICS, then weighted tokens and bound nano-USD.
        self._buckets: dict[int, dict[tuple[str | int, ...], list[int]]] = {}
        self._combo_totals: dict[tuple[str, ...], Totals] = {}
        self._paid: dict[int, dict[str, int]] = {}
        self._seen: set[str] = set()
        self._seen_order: deque[str] = deque()
        self._keep_ids = max(keep_recent, 100_000)
        self._pending: list[UsageRecord] = []

    def record(self, record: UsageRecord) -> None:
        """Add one request's usage; a request id already recorded is ignored (idempotent)."""
        if record.request_id in self._seen:
            return
        self._seen.add(record.request_id)
        self._seen_order.append(record.request_id)
        if len(self._seen_order) > self._keep_ids:
            self._seen.discard(self._seen_order.popleft())
        self._recent.append(record)
        self._pending.append(record)
        if len(self._pending) >= 10_000:  # the ticker normally drains it first; keep it bounded regardless
            self._drain()

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        for record in pending:
            self._aggregate(record)

    async def _drain_between_requests(self) -> None:
        """`_drain`, `DRAIN_SLICE` records at a time, letting requests run between slices."""
        while self._pending:
            pending = self._pending  # read again each time: a `_drain` in between swaps the list
            chunk = pending[:DRAIN_SLICE]
            del pending[:DRAIN_SLICE]
            for record in chunk:
                self._aggregate(record)
            if self._pending:
                await asyncio.sleep(0)

    def _aggregate(self, record: UsageRecord) -> None:
        start = bucket_of(record.finished_at, self.options.bucket_seconds)
        bucket = self._buckets.get(start)
        if bucket is None:
            bucket = self._buckets[start] = {}
        weighted = round(record.prompt_tokens + self._weight * record.completion_tokens)
        bound = record.bound_nusd
        combo = (record.backend, record.pool, record.vendor, record.model, record.key, record.request_class)
        values = (
            *record_values(
                record.prompt_tokens,
                record.completion_tokens,
                record.busy_s,
                record.cost_usd,
                record.status >= 400,
                record.usage_source == "estimated",
            ),
            weighted,
            bound,
        )
        binned = (*combo, rate_bin(bound, weighted))
        counters = bucket.get(binned)
        if counters is None:
            bucket[binned] = list(values)
        else:
            for i, value in enumerate(values):
                counters[i] += value
        totals = self._combo_totals.get(combo)
        if totals is None:
            totals = self._combo_totals[combo] = Totals()
        totals.add(record)

    def totals(self, by: Dimension) -> dict[str, Totals]:
        self._drain()
        index = DIMENSIONS.index(by)
        out: dict[str, Totals] = {}
        for combo, totals in self._combo_totals.items():
            rolled = out.get(combo[index])
            if rolled is None:
                out[combo[index]] = replace(totals)
            else:
                rolled.merge(totals)
        return out

    async def read_totals(self, by: Dimension) -> dict[str, Totals]:
        await self._drain_between_requests()
        return self.totals(by)

    async def _window(self, by: Dimension, buckets: list[int]) -> list[BucketData]:
        await self._drain_between_requests()
        index = DIMENSIONS.index(by)
        out: list[BucketData] = []
        for start in buckets:
            counters: dict[str, Counters] = {}
            sums: dict[tuple[str, int, str], list[int]] = {}
            for combo, values in self._buckets.get(start, {}).items():
                name = str(combo[index])
                for metric, value in zip(METRICS, values, strict=False):
                    merge(counters, name, metric, value)
                at = (str(combo[0]), int(combo[-1]), name)
                pair = sums.get(at)
                if pair is None:
                    sums[at] = [values[-2], values[-1]]
                else:
                    pair[0] += values[-2]
                    pair[1] += values[-1]
            shares: list[Share] = [(b, k, n, w, bound) for (b, k, n), (w, bound) in sums.items()]
            out.append((counters, dict(self._paid.get(start, {})), shares))
        return out

    async def _claim_paid(self, claims: dict[int, int], backends: list[str]) -> None:
        await self._drain_between_requests()
        for start, ms in claims.items():
            stored = self._paid.setdefault(start, {})
            for name in backends:
                if ms > stored.get(name, 0):
                    stored[name] = ms
        oldest = bucket_of(self._clock() - self.options.retention, self.options.bucket_seconds)
        for table in (self._buckets, self._paid):
            for start in [s for s in table if s < oldest]:
                del table[start]

    def stats(self) -> dict[str, int | str | None]:
        return {**super().stats(), "buffered": 0, "dropped": 0, "flush_errors": 0}
