"""Settling admitted requests in Redis in batches, off the request path.

A request's end adds (counter, delta) pairs; while requests are being admitted, each admission batch
carries them to Redis (`take`, `limits.ADMIT` applies them first); otherwise a background task sends
everything pending in one `limits.SETTLE` call a few milliseconds later. While Redis is away the pairs
wait (bounded) and are sent when it returns, so parallel slots and spend are never lost, only late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from gateway.redis.script_client import ScriptClient, bulk, bulk_int
from gateway.tenants.limits import SETTLE

log = logging.getLogger("switchyard.tenants")

BATCH_DELAY_S = 0.002
MAX_PENDING = 500_000
_MAX_BACKOFF_S = 2.0


class Settler:
    def __init__(self, client: Any, timeout_s: float, replica: str, tag: str) -> None:
        """`client`: redis-py's asyncio client to the Redis of the counters (`ScriptClient.like`);
        `tag`: the counters' hash tag (on a cluster, the script goes to the node owning its slot)."""
        self._script = ScriptClient.like(client, SETTLE, timeout_s, tag)
        self._replica = bulk(replica)
        self._timeout = timeout_s
        self._deltas: dict[bytes, int] = {}
        """Pending change per counter (its name as the scripts' argument, `bulk`): the ends of many
        requests of one key add up to one entry."""
        self._settles: dict[int, list[Any]] = {}
        """Pending `settle` calls: per `names` object, [names, tokens, requests, cost, held]."""
        self._wake = asyncio.Event()
        self._woken = False
        """`settle` set `_wake` since `_run` last cleared it (others may set it too: then it is set twice)."""
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.flushes = 0
        self._taken_at = float("-inf")
        """When an admission batch last took the pending settlements (time.monotonic)."""

    def add(self, counter: str, delta: int) -> None:
        self._add(bulk(counter), delta)

    def _add(self, counter: bytes, delta: int) -> None:
        if delta == 0:
            return
        deltas = self._deltas
        if counter in deltas:
            deltas[counter] += delta
        elif len(deltas) >= MAX_PENDING:
            self.dropped += 1
            return
        else:
            deltas[counter] = delta
        self._wake.set()

    def settle(
        self, names: tuple[tuple[bytes, bytes, bytes, bytes], ...], tokens: int, cost: int, held: int = 0
    ) -> None:
        """One admitted request's end: per scope its window's tokens change by `tokens`, its parallel
        slot is given back, its spend changes by `cost` and what is held for requests in flight by `held`
        (minus its reservation). Requests settling the same counters (`names`, one object per key and
        window) add up in one entry, spread into per-counter deltas only when sent."""
        entry = self._settles.get(id(names))
        if entry is not None:
            entry[1] += tokens
            entry[2] += 1
            entry[3] += cost
            entry[4] += held
        else:
            self._settles[id(names)] = [names, tokens, 1, cost, held]
        if not self._woken:  # `Event.set` is a Python call: once until `_run` clears it, not per request
            self._woken = True
            self._wake.set()

    def _spread(self) -> dict[bytes, int]:
        settles = self._settles
        deltas = self._deltas
        if not settles:
            return deltas
        self._settles = {}
        if len(deltas) >= MAX_PENDING:  # Redis away for long: bounded, as `add` is
            for names, tokens, count, cost, held in settles.values():
                for tk, pa, sp, hd in names:
                    self._add(tk, tokens)
                    self._add(pa, -count)
                    self._add(sp, cost)
                    self._add(hd, held)
            return deltas
        get = deltas.get
        for names, tokens, count, cost, held in settles.values():
            for tk, pa, sp, hd in names:
                if tokens:
                    deltas[tk] = get(tk, 0) + tokens
                deltas[pa] = get(pa, 0) - count
                if cost:
                    deltas[sp] = get(sp, 0) + cost
                if held:
                    deltas[hd] = get(hd, 0) + held
        return deltas

    def take(self) -> dict[bytes, int]:
        """Everything pending (counter names RESP-encoded), handed to a caller that sends it to Redis
        (`AdmitBatcher`); `restore` gives it back if that call fails."""
        self._taken_at = time.monotonic()
        deltas = self._spread()
        if not deltas:
            return {}
        self._deltas = {}
        return deltas

    def restore(self, pending: dict[bytes, int]) -> None:
        deltas = self._deltas
        for counter, delta in pending.items():  # merged with what ended meanwhile
            deltas[counter] = deltas.get(counter, 0) + delta
        self._wake.set()

    def pending(self) -> int:
        """Counter changes not yet in Redis (waiting for the next batch, or for Redis to return)."""
        return len(self._spread())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        backoff = BATCH_DELAY_S
        while True:
            await self._wake.wait()
            slept_at = time.monotonic()
            await asyncio.sleep(backoff)
            if backoff == BATCH_DELAY_S and self._taken_at >= slept_at:
                continue  # an admission batch carried settlements meanwhile (`take`): the next takes these
            self._wake.clear()
            self._woken = False
            if await self.flush():
                backoff = BATCH_DELAY_S
            else:
                backoff = min(_MAX_BACKOFF_S, max(0.05, backoff * 2))
                self._wake.set()

    async def flush(self) -> bool:
        pending = {counter: delta for counter, delta in self._spread().items() if delta != 0}
        if not pending:
            self._deltas.clear()
            return True
        self._deltas = {}
        try:
            async with asyncio.timeout(self._timeout):
                await self._call(pending)
        except Exception as exc:
            log.warning("tenants: settling %d counters failed (%s); will retry", len(pending), exc)
            self.restore(pending)
            return False
        self.flushes += 1
        return True

    async def _call(self, pending: dict[bytes, int]) -> None:
        answered: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def answer(reply: object) -> None:
            if not answered.done():
                answered.set_result(reply)

        body = b"".join([*pending, *map(bulk_int, pending.values()), self._replica])
        self._script.call(2 * len(pending) + 1, body, answer, numkeys=len(pending))
        reply = await answered
        if isinstance(reply, BaseException):
            raise reply

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
        await self._script.close()
