"""Reads each backend's vLLM `/metrics` in the background and keeps `Backend.load` current.

Only three gauges matter to routing: `vllm:num_requests_running`, `vllm:num_requests_waiting` and
`vllm:kv_cache_usage_perc` (older servers call it `vllm:gpu_cache_usage_perc`; both are accepted). A
server may label series per model or engine: values of one gauge are summed (the usage takes the max).
A backend that cannot be scraped keeps its last values, marked stale by `scraped_at`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import aiohttp

from backends.models import Backend, EngineLoad

log = logging.getLogger("switchyard.scraper")

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def parse_engine_load(text: str) -> EngineLoad | None:
    """The engine gauges from Prometheus text; None when the text has none of them (not a vLLM server)."""
    running = waiting = kv = 0.0
    seen = False
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_end = line.find("{")
        space = line.rfind(" ")
        if space < 0:
            continue
        name = line[: name_end if 0 < name_end < space else space]
        if name not in (_RUNNING, _WAITING, *_KV_USAGE):
            continue
        try:
            value = float(line[space + 1 :])
        except ValueError:
            continue
        seen = True
        if name == _RUNNING:
            running += value
        elif name == _WAITING:
            waiting += value
        else:
            kv = max(kv, value)
    if not seen:
        return None
    return EngineLoad(running=running, waiting=waiting, kv_cache_usage=kv, scraped_at=time.monotonic())


class MetricsScraper:
    def __init__(
        self, session: aiohttp.ClientSession, backends: Sequence[Backend], interval: float, timeout: float
    ) -> None:
        self._session = session
        self._backends = tuple(backends)
        self._interval = interval
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._task: asyncio.Task[None] | None = None

    async def _scrape(self, backend: Backend) -> None:
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        try:
            async with self._session.get(
                backend.url + "/metrics", timeout=self._timeout, headers=headers
            ) as r:
                if r.status != 200:
                    return
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return
        load = parse_engine_load(text)
        if load is not None:
            backend.load = load

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self._scrape(b) for b in self._backends))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.scrape_all()

    async def start(self) -> None:
        await self.scrape_all()
        self._task = asyncio.create_task(self._run(), name="switchyard-scraper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
