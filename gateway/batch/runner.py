"""The scheduler each replica runs: moves batches through their statuses and runs their lines in the
fleet's idle room (gateway/batch/capacity.py, headroom.py).

Every `tick_s` it hands out as many lines as the backends have headroom for, each to its backend,
claimed one at a time from the shared state (round robin over the batches in progress); every
`refresh_s` it re-reads which batches exist and advances them: `validating` -> `in_progress` (the input
read, lines counted), `in_progress` -> `finalizing` (every line has a result, or the window is over),
`cancelling` -> `finalizing`, and `finalizing` -> `completed` / `expired` / `cancelled` (output and
error files written, by one replica under a lock). A replica that dies mid-batch stops renewing its
leases; another claims those lines.

Every tick, before handing out lines, it reads whether any key changed (`Tenants.sync`, one Redis GET)
and checks each batch's key as it is now: a batch whose key was revoked, expired or deleted stops on
every replica within a tick or two (its running lines cancelled, `finalizing` ending `failed`, an error
line per line it did not finish); while the key store cannot be read, no line is handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from backends.models import Backend
from gateway.batch.capacity import FleetRoom
from gateway.batch.finalize import finalize, read_input
from gateway.batch.headroom import HeadroomLimits
from gateway.batch.lines import run_line
from gateway.batch.objects import ErrorData, StoredBatch
from gateway.batch.service import BatchService
from gateway.batch.transitions import to_failed, to_finalizing, to_in_progress, to_stopped
from gateway.openai.errors import GatewayError
from gateway.redis.client import REDIS_ERRORS
from gateway.tenants.errors import KEY_UNUSABLE

log = logging.getLogger("switchyard.batch")

REFRESH_S = 0.5
FINALIZE_LOCK_S = 60.0


class BatchRunner:
    def __init__(self, service: BatchService) -> None:
        self.service = service
        self.options = service.options
        options = service.options
        limits = HeadroomLimits(
            options.kv_reserve,
            options.slo_margin,
            options.per_backend,
            options.ramp_lines,
            max_online_slowdown=options.max_online_slowdown,
        )
        self.room = FleetRoom(service.catalog, service.pipeline, limits, options.resume_after_s)
        self.token = service.replica
        self.batches: dict[str, StoredBatch] = {}
        """Batches in progress, as last read."""
        self.inputs: dict[str, list[bytes]] = {}
        self.running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.exhausted: set[str] = set()
        """Batches with nothing to claim until the next refresh."""
        self.held: set[str] = set()
        """Batches whose key could not be checked this tick: no line of theirs is handed out."""
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        """Set by `stop`: the loop ends on it, not only on a cancellation (redis-py can swallow one that
        lands while it reconnects, as gateway/tenants/admission.py says)."""
        self._next_refresh = 0.0
        self._next_renew = 0.0
        self._turn = 0

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop claiming; give back the lines still running, so another replica takes them at once."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        running = list(self.running)
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        for batch_id, line in running:
            with contextlib.suppress(Exception):
                await self.service.state.release(batch_id, line, self.token, 0.0)

    async def _loop(self) -> None:
        away = False
        while not self._stopping:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except REDIS_ERRORS as exc:  # an outage or a failover, not a bug: one line, not a traceback
                if not away:
                    log.warning("batch scheduler: Redis unreachable (%s); retrying every second", exc)
                away = True
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("batch scheduler tick failed")
                await asyncio.sleep(1.0)
            else:
                if away:
                    log.warning("batch scheduler: Redis reachable again")
                away = False
            await asyncio.sleep(self.options.tick_s)

    async def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + REFRESH_S
            await self.refresh()
        await self.check_keys()
        if self.running and now >= self._next_renew:
            self._next_renew = now + self.options.lease_s / 3
            await self._renew()
        await self.dispatch()

    # --- statuses ------------------------------------------------------------------------------------

    async def refresh(self) -> None:
        state = self.service.state
        self.exhausted.clear()
        seen: dict[str, StoredBatch] = {}
        for batch_id in await state.active():
            stored = await state.get(batch_id)
            if stored is None:
                continue
            stored = await self.advance(stored)
            if stored is not None and stored.batch.status == "in_progress":
                seen[batch_id] = stored
        for gone in set(self.inputs) - set(seen):
            self.inputs.pop(gone, None)
        self.batches = seen

    async def advance(self, stored: StoredBatch) -> StoredBatch | None:
        service, state = self.service, self.service.state
        batch = stored.batch
        status = batch.status
        if status == "validating":
            data = await read_input(service, stored)
            if isinstance(data, ErrorData):
                return await state.update(batch.id, to_failed(data))
            self.inputs[batch.id] = data[0]
            return await state.update(batch.id, to_in_progress(len(data[0]), data[1]))
        if status == "in_progress":
            completed, failed, _ = await state.progress(batch.id)
            if time.time() >= stored.deadline:
                return await state.update(batch.id, to_finalizing("expired"))
            if completed + failed >= batch.request_counts.total:
                return await state.update(batch.id, to_finalizing("completed"))
            return stored
        if status in ("cancelling", "finalizing"):
            self._cancel_local(batch.id)
            ending = "cancelled" if status == "cancelling" else stored.ending or "completed"
            if status == "cancelling" and time.time() - (batch.cancelling_at or 0) < REFRESH_S * 2:
                return stored  # the other replicas stop its lines at their next refresh
            if stored.stop is not None and time.time() - stored.stopped_at < REFRESH_S * 2:
                return stored  # likewise: no line of a stopped batch may finish after its files are written
            if await state.lock(batch.id, "finalize", self.token, FINALIZE_LOCK_S):
                return await finalize(service, stored, ending)
        return stored

    async def check_keys(self) -> None:
        """Each batch in progress against its key as it is now (keys mode): stop the batches whose key
        can no longer be used; hold every batch while the key store cannot be read (fail closed)."""
        self.held.clear()
        tenants = self.service.tenants
        if not self.batches or tenants is None or not self.service.keys_mode:
            return
        try:
            await tenants.sync()
        except Exception as exc:
            log.debug("batch scheduler: cannot read the key store (%s); no lines handed out", exc)
            self.held.update(self.batches)
            return
        for batch_id, stored in list(self.batches.items()):
            try:
                await self.service.tenant_of(stored)
            except GatewayError as exc:
                if exc.body.code in KEY_UNUSABLE:
                    await self._stop(stored, ErrorData(code=exc.body.code, message=exc.body.message))
                else:
                    self.held.add(batch_id)

    async def _stop(self, stored: StoredBatch, why: ErrorData) -> None:
        batch_id = stored.batch.id
        self.batches.pop(batch_id, None)
        self._cancel_local(batch_id)
        if await self.service.state.update(batch_id, to_stopped(why)) is not None:
            log.warning("batch %s stopped: %s", batch_id, why.message)

    def _cancel_local(self, batch_id: str) -> None:
        for (owner, _), task in list(self.running.items()):
            if owner == batch_id:
                task.cancel()

    # --- lines ---------------------------------------------------------------------------------------

    async def dispatch(self) -> None:
        """Start a line on every free slot of the backends with headroom, round robin over the batches."""
        if not self.batches:
            return
        slots: dict[str, list[Backend]] = {}
        skip = self.exhausted | self.held
        order = [b for b in self.batches.values() if b.batch.id not in skip]
        while order:
            self._turn = (self._turn + 1) % len(order)
            stored = order[self._turn]
            model = stored.model or ""
            free = slots.get(model)
            if free is None:
                free = slots[model] = self.room.plan(model)
            if not free:
                order.remove(stored)
                continue
            line = await self.service.state.claim(
                stored.batch.id, stored.batch.request_counts.total, self.token, self.options.lease_s
            )
            if line is None:
                self.exhausted.add(stored.batch.id)
                order.remove(stored)
                continue
            backend = free.pop(0)
            self.room.started(backend)
            key = (stored.batch.id, line)
            self.running[key] = asyncio.get_running_loop().create_task(self._run(stored, line, backend))

    async def _run(self, stored: StoredBatch, line: int, backend: Backend) -> None:
        service, state = self.service, self.service.state
        batch_id = stored.batch.id
        try:
            lines = self.inputs.get(batch_id)
            if lines is None:
                data = await read_input(service, stored)
                if isinstance(data, ErrorData):
                    return
                lines = self.inputs[batch_id] = data[0]
            try:
                tenant = await service.tenant_of(stored)
            except GatewayError as exc:  # not sent; a stopped key stops the batch at the next tick
                wait = 0.0 if exc.body.code in KEY_UNUSABLE else self.options.retry_backoff_s
                await state.release(batch_id, line, self.token, wait)
                return
            attempt = await state.attempt(batch_id, line)
            result = await run_line(
                service.pipeline,
                service.tenants,
                lines[line],
                stored.batch.endpoint,
                f"{batch_id}-{line}",
                tenant,
                stored.authorization,
                backend,
                self.room.contexts,
            )
            if result.usage is not None:
                self.room.shape.observe(*result.usage)
            if result.retry and attempt < self.options.max_attempts:
                await state.release(batch_id, line, self.token, self.options.retry_backoff_s * attempt)
                return
            name = f"batches/{batch_id}/lines/{line:07d}-{self.token}.json"
            await service.files.put(name, result.text)
            await state.finish(batch_id, line, ("e:" if result.failed else "o:") + name, result.failed)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s line %d failed in the gateway", batch_id, line)
            with contextlib.suppress(Exception):
                await state.release(batch_id, line, self.token, self.options.retry_backoff_s)
        finally:
            self.room.contexts.pop(f"{batch_id}-{line}", None)
            self.room.ended(backend)
            self.running.pop((batch_id, line), None)

    async def _renew(self) -> None:
        by_batch: dict[str, list[int]] = {}
        for batch_id, line in self.running:
            by_batch.setdefault(batch_id, []).append(line)
        for batch_id, lines in by_batch.items():
            await self.service.state.renew(batch_id, lines, self.token, self.options.lease_s)
