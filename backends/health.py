"""Active health checks: `GET /health` on every backend, per pool at its own interval, in the background.

A backend is taken out of routing (`Backend.health_ok = False`) after `unhealthy_after` failed checks in
a row and put back after `healthy_after` passing ones. Passive detection from live traffic is the
circuit breaker's job (backends/breaker.py); both end in the one flag routing reads, `Backend.healthy`.

Every check opens a new connection (its own session, `force_close`), never a pooled keep-alive one: a
backend that refuses new connections while an old one still answers cannot take a request, and a check
over the old connection would keep calling it healthy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import aiohttp

from backends.models import Backend

log = logging.getLogger("switchyard.health")


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """How one group of backends (a pool) is checked."""

    interval: float = 5.0
    timeout: float = 2.0
    unhealthy_after: int = 2
    healthy_after: int = 1


class HealthChecker:
    def __init__(
        self,
        backends: Sequence[Backend],
        interval: float = 5.0,
        timeout: float = 2.0,
        plans: dict[str, CheckPlan] | None = None,
        default: CheckPlan | None = None,
    ) -> None:
        """`plans` maps a pool name to its plan; other pools use `default` (or `interval`/`timeout`)."""
        self._session: aiohttp.ClientSession | None = None
        self._stopped = False
        self._backends = tuple(backends)
        default = default or CheckPlan(interval=interval, timeout=timeout)
        self._groups: dict[CheckPlan, list[Backend]] = {}
        for backend in self._backends:
            plan = (plans or {}).get(backend.pool.name, default)
            self._groups.setdefault(plan, []).append(backend)
        self._streaks: dict[str, int] = {}
        """Per backend: consecutive passing checks (> 0) or failing ones (< 0)."""
        self._tasks: list[asyncio.Task[None]] = []
        self.rounds = 0
        for plan, group in self._groups.items():
            for backend in group:
                backend.breaker.confirm = partial(self.confirm, backend, plan)

    async def confirm(self, backend: Backend, plan: CheckPlan) -> bool:
        """One check now, for the breaker (backends/breaker.py `suspect`); its streak counts it too."""
        ok = await self._probe(backend, aiohttp.ClientTimeout(total=plan.timeout))
        self._note(backend, ok, plan, False)
        return ok

    def _probes(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(force_close=True, limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        return self._session

    async def _probe(self, backend: Backend, limit: aiohttp.ClientTimeout) -> bool:
        if self._stopped:  # a breaker's check asked for during shutdown: no new session
            return False
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        try:
            async with self._probes().get(backend.url + "/health", timeout=limit, headers=headers) as r:
                await r.read()
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _note(self, backend: Backend, ok: bool, plan: CheckPlan, first: bool) -> None:
        streak = self._streaks.get(backend.name, 0)
        streak = (max(streak, 0) + 1) if ok else (min(streak, 0) - 1)
        self._streaks[backend.name] = streak
        if backend.health_ok and not ok and (first or -streak >= plan.unhealthy_after):
            log.warning("backend %s is now unhealthy (%d failed health checks)", backend.name, -streak)
            backend.health_ok = False
            backend.breaker.refresh()
        elif not backend.health_ok and ok and (first or streak >= plan.healthy_after):
            log.warning("backend %s is now healthy", backend.name)
            backend.health_ok = True
            backend.breaker.refresh()

    async def check_group(self, plan: CheckPlan, backends: Sequence[Backend], first: bool = False) -> None:
        timeout = aiohttp.ClientTimeout(total=plan.timeout)
        results = await asyncio.gather(*(self._probe(b, timeout) for b in backends))
        for backend, ok in zip(backends, results, strict=True):
            self._note(backend, ok, plan, first)

    async def check_all(self, first: bool = False) -> None:
        await asyncio.gather(*(self.check_group(p, g, first) for p, g in self._groups.items()))
        self.rounds += 1

    async def _run(self, plan: CheckPlan, backends: Sequence[Backend]) -> None:
        while True:
            await asyncio.sleep(plan.interval)
            await self.check_group(plan, backends)

    async def start(self) -> None:
        """Run one round now (its verdict applies at once, so readiness is right from the start), then
        keep checking each pool at its interval in the background."""
        await self.check_all(first=True)
        self._tasks = [
            asyncio.create_task(self._run(plan, group), name="switchyard-health")
            for plan, group in self._groups.items()
        ]

    async def stop(self) -> None:
        self._stopped = True
        for backend in self._backends:
            backend.breaker.confirm = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None
