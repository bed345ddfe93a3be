"""The Redis ledger: records go to a bounded local buffer; a background task writes them in batches.

`record()` only appends to a deque (no I/O, no await). The flusher sends up to `batch_size` records in
one Lua call (gateway/ledger/scripts.py) every `flush_interval`, or as soon as a batch is waiting. A
batch leaves the buffer only after Redis acknowledged it; a failed or timed-out call leaves it there and
the flusher retries with a growing pause (up to 2 s). Re-sending a batch that Redis did apply is harmless:
each request id is counted once (SET NX). When the buffer is full, new records are dropped, counted
(`dropped` in `stats()`, shown by /ready and /admin/v1/costs) and logged, never silently.
`close()` flushes what is left (bounded by a few seconds) and logs anything it could not write.
While Redis is unreachable the buffer is also spilled to a local file that the next start replays
(gateway/ledger/spill.py), so neither SIGTERM nor SIGKILL loses what was buffered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from backends.models import Backend
from gateway.config.settings import LedgerOptions
from gateway.ledger.allocation import Share, rate_bin
from gateway.ledger.base import BucketData, LedgerBase
from gateway.ledger.costs import BOUND, PAID, WEIGHTED, Counters, merge
from gateway.ledger.keys import Keys
from gateway.ledger.records import GPU_DIMENSIONS, Dimension, Totals, UsageRecord
from gateway.ledger.scripts import CLAIM_PAID, RECORD
from gateway.ledger.spill import LedgerSpill, default_spill_path
from gateway.openai.errors import ledger_unavailable
from gateway.redis.client import REDIS_ERRORS, AnyRedis, as_text, redis_client

log = logging.getLogger("switchyard.ledger")

_CLOSE_DEADLINE_S = 5.0
_MAX_BACKOFF_S = 2.0


class RedisLedger(LedgerBase):
    kind = "redis"

    def __init__(
        self,
        options: LedgerOptions,
        backends: Sequence[Backend] = (),
        client: AnyRedis | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(options, backends, clock)
        if client is None:
            if not options.redis_url:
                raise ValueError("the Redis ledger needs ledger.redis_url")
            client = redis_client(
                options.redis_url,
                decode_responses=True,
                socket_connect_timeout=options.redis_timeout,
                socket_timeout=options.redis_timeout,
                # A pooled connection that outlived a Redis restart fails once; one quick retry on a
                # fresh connection hides that. Writes may be retried: each request id counts once.
                retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 2),
                retry_on_error=[RedisConnectionError, RedisTimeoutError],
            )
        self.client = client
        self.keys = Keys(options.key_prefix)
        self._record_script = client.register_script(RECORD)
        self._claim_script = client.register_script(CLAIM_PAID)
        self._buffer: deque[UsageRecord] = deque()
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._head = (self.keys.tag, str(round(options.dedupe_ttl)), str(round(options.retention)))
        self.flushed = 0
        self.duplicates = 0
        self.dropped = 0
        self.flush_errors = 0
        self.last_error: str | None = None
        self.spill: LedgerSpill | None = None
        """Set by `start` when spilling is on and this process owns the file."""

    # --- request path ---------------------------------------------------------------------------------

    def record(self, record: UsageRecord) -> None:
        buffer = self._buffer
        if len(buffer) >= self.options.buffer_max:
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.error(
                    "ledger buffer full (%d records waiting for Redis): %d records dropped so far",
                    len(buffer),
                    self.dropped,
                )
            return
        buffer.append(record)
        self._recent.append(record)
        if len(buffer) >= self.options.batch_size and not self._wake.is_set():
            self._wake.set()

    # --- flushing -------------------------------------------------------------------------------------

    async def start(self) -> None:
        options = self.options
        if options.spill and self.spill is None:
            spill = LedgerSpill(Path(options.spill_path or default_spill_path(options.key_prefix)))
            if spill.claim():
                self.spill = spill
                self._buffer.extendleft(reversed(spill.load()))
        await super().start()
        self._tasks.append(asyncio.create_task(self._flush_loop()))

    async def _flush_loop(self) -> None:
        pause = self.options.flush_interval
        while True:
            if self.spill is not None and self.last_error is not None:
                await self._spill_while_down(pause)
            else:
                try:
                    async with asyncio.timeout(pause):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            written = await self.flush()
            pause = self.options.flush_interval if written else min(_MAX_BACKOFF_S, pause * 2)

    async def _spill_while_down(self, pause: float) -> None:
        """Wait `pause` before the next try at Redis, putting new records on disk every `flush_interval`."""
        deadline = time.monotonic() + pause
        while True:
            try:
                await self._write_spill()
            except OSError as exc:
                log.error("ledger: cannot spill to %s: %s", self.spill and self.spill.path, exc)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, self.options.flush_interval))

    async def _write_spill(self) -> None:
        if self.spill is not None:
            async with self._lock:
                await self.spill.append_new(self._buffer)

    async def flush(self) -> bool:
        """Write everything buffered; False if Redis failed (the records stay buffered)."""
        async with self._lock:
            while self._buffer:
                batch = list(islice(self._buffer, self.options.batch_size))
                try:
                    async with asyncio.timeout(self.options.redis_timeout):
                        added = await self._record_script(keys=[self.keys.route], args=self._args(batch))
                except Exception as exc:
                    self._failed(exc)
                    return False
                for _ in batch:
                    self._buffer.popleft()
                if self.spill is not None:
                    self.spill.acknowledged(len(batch))
                self.flushed += len(batch)
                self.duplicates += len(batch) - int(added)
                if self.last_error is not None:
                    log.warning("ledger: Redis is back; %d records waiting", len(self._buffer))
                    self.last_error = None
            if self.spill is not None:
                await self.spill.clear_if_drained(self._buffer)
        return True

    def _failed(self, exc: Exception) -> None:
        self.flush_errors += 1
        first = self.last_error is None
        self.last_error = f"{exc.__class__.__name__}: {exc}"
        if first or self.flush_errors % 100 == 0:
            log.warning(
                "ledger: cannot write to Redis (%s); %d records buffered, will retry",
                self.last_error,
                len(self._buffer),
            )

    def _args(self, batch: list[UsageRecord]) -> list[Any]:
        """The batch as one string (see scripts.RECORD): one f-string per record, one argument in all."""
        size = self.options.bucket_seconds
        weight = self._weight
        lines = []
        for r in batch:
            weighted = round(r.prompt_tokens + weight * r.completion_tokens)
            lines.append(
                f"{r.request_id}\x1f{int(r.finished_at // size) * size}\x1f{r.backend}\x1f{r.pool}\x1f"
                f"{r.vendor}\x1f{r.model}\x1f{r.key}\x1f{r.request_class}\x1f1\x1f{r.prompt_tokens}\x1f"
                f"{r.completion_tokens}\x1f{round(r.busy_s * 1e6)}\x1f{round(r.cost_usd * 1e9)}\x1f"
                f"{1 if r.status >= 400 else 0}\x1f{1 if r.usage_source == 'estimated' else 0}\x1f"
                f"{weighted}\x1f{r.bound_nusd}\x1f{rate_bin(r.bound_nusd, weighted)}"
            )
        payload = "\x1e".join(lines)
        return [*self._head, payload]

    async def close(self) -> None:
        await self._stop_tasks()
        deadline = time.monotonic() + _CLOSE_DEADLINE_S
        for _ in range(100):
            if await self.flush() or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        lost = len(self._buffer)
        if lost and self.spill is not None:
            try:
                await self._write_spill()
                log.warning(
                    "ledger: Redis unreachable at shutdown; %s kept in %s and written to Redis at the "
                    "next start",
                    "1 record" if lost == 1 else f"{lost} records",
                    self.spill.path,
                )
                lost = 0
                kept = True
            except OSError as exc:
                log.error("ledger: cannot spill to %s: %s", self.spill.path, exc)
        else:
            kept = False
        if lost:
            one = lost == 1
            log.error(
                "ledger: %s could not be written to Redis at shutdown and %s lost: the usage and cost "
                "totals in Redis do not include %s (last error: %s)",
                "1 record" if one else f"{lost} records",
                "is" if one else "are",
                "it" if one else "them",
                self.last_error,
            )
        elif not kept:
            log.info("ledger: every record is written to Redis")
        if self._started_at is not None:
            try:
                async with asyncio.timeout(self.options.redis_timeout):
                    await self.tick()
            except Exception as exc:
                log.warning("ledger: final paid-time claim failed: %s", exc)
        await self.client.aclose()
        if self.spill is not None:
            self.spill.release()

    # --- paid time and reading ------------------------------------------------------------------------

    async def _claim_paid(self, claims: dict[int, int], backends: list[str]) -> None:
        args: list[Any] = [self.keys.tag, round(self.options.retention)]
        for start, ms in claims.items():
            for name in backends:
                args.extend((start, name, ms))
        async with asyncio.timeout(self.options.redis_timeout):
            await self._claim_script(keys=[self.keys.route], args=args)

    async def _window(self, by: Dimension, buckets: list[int]) -> list[BucketData]:
        dims: tuple[str, ...] = (by,) if by == "backend" else (by, "backend")
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for start in buckets:
                    for dim in dims:
                        pipe.hgetall(self.keys.bucket(start, dim))
                replies = await pipe.execute()
        except REDIS_ERRORS as exc:
            raise ledger_unavailable(f"Redis: {exc}") from exc
        # Pool and vendor allocations are their backends' (the script keeps no allocation sums for them).
        shares_dim = "backend" if by in GPU_DIMENSIONS else by
        out: list[BucketData] = []
        for at in range(0, len(replies), len(dims)):
            counters: dict[str, Counters] = {}
            paid: dict[str, int] = {}
            sums: dict[tuple[str, int, str], list[int]] = {}
            for i, dim in enumerate(dims):
                for field, value in replies[at + i].items():
                    metric, _, name = field.partition("|")
                    if metric == PAID:
                        paid[name] = paid.get(name, 0) + int(value)
                    elif metric in (WEIGHTED, BOUND):
                        if dim == shares_dim:
                            backend, rbin, name = name.split("|", 2)
                            pair = sums.setdefault((backend, int(rbin), name), [0, 0])
                            pair[metric == BOUND] += int(value)
                    elif dim == by:
                        merge(counters, name, metric, int(value))
            shares: list[Share] = [(b, k, n, w, bound) for (b, k, n), (w, bound) in sums.items()]
            out.append((counters, paid, shares))
        return out

    async def read_totals(self, by: Dimension) -> dict[str, Totals]:
        try:
            raw = await self.client.hgetall(self.keys.totals(by))
        except REDIS_ERRORS as exc:
            raise ledger_unavailable(f"Redis: {exc}") from exc
        counters: dict[str, Counters] = {}
        for field, value in raw.items():
            metric, _, name = as_text(field).partition("|")
            merge(counters, name, metric, int(value))
        return {
            name: Totals(
                requests=c.get("req", 0),
                prompt_tokens=c.get("in", 0),
                completion_tokens=c.get("out", 0),
                cost_usd=c.get("cost_nusd", 0) / 1e9,
                errors=c.get("err", 0),
                estimated=c.get("est", 0),
            )
            for name, c in sorted(counters.items())
        }

    def stats(self) -> dict[str, int | str | None]:
        return {
            **super().stats(),
            "buffered": len(self._buffer),
            "dropped": self.dropped,
            "flushed": self.flushed,
            "duplicates": self.duplicates,
            "flush_errors": self.flush_errors,
            "last_error": self.last_error,
            "spilled": self.spill.spilled if self.spill is not None else 0,
            "replayed": self.spill.replayed if self.spill is not None else 0,
        }
