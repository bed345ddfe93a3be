"""Settling admitted requests in Redis in batches, off the request path.

A request's end adds (counter, delta) pairs; a background task sends everything pending in one
`limits.SETTLE` call a few milliseconds later. While Redis is away the pairs wait (bounded) and are sent
when it returns, so parallel slots and spend are never lost, only late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis

from gateway.tenants.limits import SETTLE

log = logging.getLogger("switchyard.tenants")

BATCH_DELAY_S = 0.002
MAX_PENDING = 500_000
_MAX_BACKOFF_S = 2.0


class Settler:
    def __init__(self, client: aioredis.Redis, timeout_s: float, replica: str) -> None:
        self._script = client.register_script(SETTLE)
        self._replica = replica
        self._timeout = timeout_s
        self._keys: list[str] = []
        self._deltas: list[int] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.flushes = 0

    def add(self, counter: str, delta: int) -> None:
        if delta == 0:
            return
        if len(self._keys) >= MAX_PENDING:
            self.dropped += 1
            return
        self._keys.append(counter)
        self._deltas.append(delta)
        self._wake.set()

    def pending(self) -> int:
        """Counter changes not yet in Redis (waiting for the next batch, or for Redis to return)."""
        return len(self._keys)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        backoff = BATCH_DELAY_S
        while True:
            await self._wake.wait()
            await asyncio.sleep(backoff)
            self._wake.clear()
            if await self.flush():
                backoff = BATCH_DELAY_S
            else:
                backoff = min(_MAX_BACKOFF_S, max(0.05, backoff * 2))
                self._wake.set()

    async def flush(self) -> bool:
        if not self._keys:
            return True
        keys, deltas = self._keys, self._deltas
        self._keys, self._deltas = [], []
        try:
            async with asyncio.timeout(self._timeout):
                await self._script(keys=keys, args=[*deltas, self._replica])
        except Exception as exc:
            log.warning("tenants: settling %d counters failed (%s); will retry", len(keys), exc)
            self._keys, self._deltas = keys + self._keys, deltas + self._deltas
            return False
        self.flushes += 1
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
