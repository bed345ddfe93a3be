"""The open-loop sender: every request leaves at its planned time, whatever the gateway is doing.

Each arrival starts its own asyncio task at its time; nothing waits for an answer before sending the
next. Requests beyond `max_inflight` open at once are dropped and counted as errors (the arrival process
never slows down). The run ends by itself: after the last arrival it waits at most `drain_s` for the
answers still open, then cancels them (counted as errors). Times in and out are simulated seconds:
the runner schedules at `at_s / time_scale` real seconds and multiplies what it measures by `time_scale`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from loadtest.client import Outcome, send
from loadtest.guard import require_loopback
from loadtest.progress import Progress
from loadtest.workload import PlannedRequest


@dataclass(frozen=True, slots=True)
class RunLimits:
    time_scale: float = 1.0
    max_inflight: int = 512
    drain_s: float = 60.0
    """Simulated seconds to wait after the last arrival."""


@dataclass(slots=True)
class RunResult:
    outcomes: list[Outcome]
    wall_s: float
    """Real seconds the run took."""
    max_lag_s: float
    """The latest any request left after its planned time (real seconds): how well the sender kept up."""


CLIENT_KEEPALIVE_S = 2.0


async def run_open_loop(
    base_url: str,
    requests: Sequence[PlannedRequest],
    limits: RunLimits,
    progress: Progress | None = None,
) -> RunResult:
    """Send `requests` (sorted by `at_s`) to `base_url`'s chat endpoint; outcomes in simulated seconds."""
    url = require_loopback(base_url).rstrip("/") + "/v1/chat/completions"
    scale = limits.time_scale
    outcomes: dict[int, Outcome] = {}
    tasks: dict[int, asyncio.Task[Outcome]] = {}
    sent_at: dict[int, float] = {}
    errors = 0
    max_lag = 0.0
    # Idle connections are dropped well before the gateway's own idle timeout (5 s by default): reusing one
    # the server is closing at that moment fails the request (ClientOSError / ServerDisconnectedError), and
    # after each burst hundreds of connections sit idle.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=CLIENT_KEEPALIVE_S)
    timeout = aiohttp.ClientTimeout(total=None, connect=10)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trust_env=False, auto_decompress=False
    ) as session:
        started = time.monotonic()

        def finished(task: asyncio.Task[Outcome]) -> None:
            nonlocal errors
            if task.cancelled():
                return
            outcome = task.result()
            outcomes[outcome.index] = outcome
            tasks.pop(outcome.index, None)
            errors += not outcome.ok

        for request in requests:
            delay = started + request.at_s / scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            max_lag = max(max_lag, -delay)
            if len(tasks) >= limits.max_inflight:
                outcomes[request.index] = Outcome(
                    request.index, request.request_class, time.monotonic() - started, error="dropped"
                )
                errors += 1
            else:
                task = asyncio.create_task(send(session, url, request, started))
                task.add_done_callback(finished)
                tasks[request.index] = task
                sent_at[request.index] = time.monotonic() - started
            if progress is not None:
                progress.update(len(outcomes) + len(tasks), len(outcomes), len(tasks), errors)
        deadline = time.monotonic() + limits.drain_s / scale
        while tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            if progress is not None:
                progress.update(len(outcomes) + len(tasks), len(outcomes), len(tasks), errors)
        by_index = {r.index: r for r in requests}
        for index, task in list(tasks.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            outcomes[index] = Outcome(
                index, by_index[index].request_class, sent_at[index], error="unfinished at deadline"
            )
        tasks.clear()
        wall = time.monotonic() - started
    if progress is not None:
        progress.update(len(outcomes), len(outcomes), 0, sum(not o.ok for o in outcomes.values()), force=True)
        progress.close()
    return RunResult(
        outcomes=[_scaled(outcomes[r.index], scale) for r in requests], wall_s=wall, max_lag_s=max_lag
    )


def _scaled(outcome: Outcome, scale: float) -> Outcome:
    outcome.sent_at *= scale
    for name in ("ttft", "e2e", "tpot"):
        value = getattr(outcome, name)
        if value is not None:
            setattr(outcome, name, value * scale)
    return outcome
