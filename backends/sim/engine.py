"""The simulated engines behind the server: fixed timing, or continuous batching on a GPU model.

Both hand the server a `Run` per request, which it awaits step by step (streams) or to the end
(full responses). Durations are simulated seconds on a `SimClock`, which runs `time_scale` times
faster than real time; every latency the engines record is simulated, so a faster clock changes
how long a test takes, not what it measures.

`BatchEngine` runs one scheduler loop per backend: it plans a step, prices it with the performance
model, sleeps until the step's simulated end, then applies it and wakes the requests it advanced.
Steps follow one another back to back while there is work, on the simulated timeline, so a loop
that falls behind real time (a busy CPU, a large time scale) delays answers but not the latencies
it reports. With no work it waits on an event and uses no CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

from backends.sim.accounting import RequestRun
from backends.sim.frontend import FrontEnd
from backends.sim.kvcache import block_hashes
from backends.sim.metrics import EngineStats
from backends.sim.perf import PerfModel
from backends.sim.profiles import Hardware
from backends.sim.protocol import GenerationRequest, SimError
from backends.sim.scheduler import Group, Scheduler
from backends.sim.text import Generation
from backends.sim.timing import Timing

_LEARN = 0.1
_MOST_EARLY_S = 0.002


class SimClock:
    """Simulated seconds since the clock was made, running `scale` times faster than real time."""

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("time scale must be positive")
        self.scale = scale
        self._origin = time.monotonic()
        self.early = 0.0
        """Real seconds to aim a timer early by: the event loop wakes timers late (asyncio rounds a wait
        up to the next millisecond: 0.1-0.8 ms late here) or early (uvloop rounds down), so the clock
        learns its loop's average miss from its own wake-ups and aims that much ahead."""

    def now(self) -> float:
        return (time.monotonic() - self._origin) * self.scale

    def at(self, monotonic: float) -> float:
        """The simulated time of a `time.monotonic()` reading."""
        return (monotonic - self._origin) * self.scale

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.scale)

    async def sleep_until(self, when: float) -> None:
        delay = (when - self.now()) / self.scale - self.early
        if delay <= 0:
            return
        await asyncio.sleep(delay)
        missed = (self.now() - when) / self.scale  # real seconds; below zero: woke early
        self.early = min(max(self.early + _LEARN * missed, 0.0), _MOST_EARLY_S)


class Run(Protocol):
    """One request inside an engine. `steps` is the number of tokens of its longest choice."""

    steps: int

    async def advance(self, produced: int) -> int:
        """Wait until more than `produced` steps are done; returns how many are done."""
        ...

    async def finish(self) -> None:
        """Wait until every step is done."""
        ...

    def close(self) -> None:
        """Leave the engine; unfinished choices count as aborted. Safe to call twice."""
        ...


class Engine(Protocol):
    def submit(
        self, req: GenerationRequest, generations: list[Generation], received: float | None = None
    ) -> Run:
        """`received`: when the request reached the server (`time.monotonic()`), if not now."""
        ...

    async def close(self) -> None: ...


class FixedRun:
    """Each request on its own: the first token after `ttft`, then one every `tpot`, whatever the load."""

    def __init__(
        self,
        timing: Timing,
        clock: SimClock,
        stats: EngineStats,
        prompt_tokens: int,
        generations: list[Generation],
    ) -> None:
        self._account = RequestRun(stats, prompt_tokens, generations)
        self._clock = clock
        self._ttft, self._tpot = timing.ttft(prompt_tokens), timing.tpot()
        self._started = self._last = clock.now()
        self._done = 0
        self.steps = self._account.steps

    def _deadline(self, step: int) -> float:
        return self._started + self._ttft + step * self._tpot

    async def advance(self, produced: int) -> int:
        await self._clock.sleep_until(self._deadline(produced))
        now = self._clock.now()
        self._account.step(produced, now - self._last)
        self._last, self._done = now, produced + 1
        return self._done

    async def finish(self) -> None:
        try:
            await self._clock.sleep_until(self._deadline(self.steps - 1))
        except asyncio.CancelledError:
            elapsed = self._clock.now() - self._started
            tpot = self._tpot
            produced = (
                0
                if elapsed < self._ttft
                else self.steps
                if tpot <= 0
                else 1 + int((elapsed - self._ttft) / tpot)
            )
            self._record(min(produced, self.steps))
            raise
        self._record(self.steps)

    def _record(self, upto: int) -> None:
        for step in range(self._done, upto):
            self._account.step(step, self._ttft if step == 0 else self._tpot)
        self._done = max(self._done, upto)

    def close(self) -> None:
        self._account.close()


class FixedEngine:
    def __init__(self, timing: Timing, stats: EngineStats, clock: SimClock) -> None:
        self._timing, self._stats, self._clock = timing, stats, clock

    def submit(
        self, req: GenerationRequest, generations: list[Generation], received: float | None = None
    ) -> Run:
        return FixedRun(self._timing, self._clock, self._stats, req.prompt_tokens, generations)

    async def close(self) -> None:
        return None


class BatchRun:
    def __init__(self, engine: BatchEngine, group: Group) -> None:
        self._engine = engine
        self._group = group
        self.steps = group.steps

    async def advance(self, produced: int) -> int:
        group = self._group
        if group.generated > produced or group.done:
            return group.generated
        return await self._engine.wait(group, produced + 1)

    async def finish(self) -> None:
        group = self._group
        while not group.done and group.generated < group.steps:
            await self._engine.wait(group, group.steps)

    def close(self) -> None:
        self._engine.abort(self._group)


class BatchEngine:
    """Continuous batching over a `Hardware` profile (see `scheduler` and `perf`)."""

    def __init__(self, hardware: Hardware, stats: EngineStats, clock: SimClock, seed: int = 0) -> None:
        self.hardware = hardware
        self.perf = PerfModel(hardware, seed)
        self.scheduler = Scheduler(hardware.limits, hardware.num_blocks, stats)
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._step_end: float | None = None  # simulated end of the step in flight
        self._entering: dict[Group, asyncio.TimerHandle] = {}  # still in the front end (calibrated)
        self._front = FrontEnd(hardware.request_cv(), seed)  # a calibrated server's, one at a time

    def submit(
        self, req: GenerationRequest, generations: list[Generation], received: float | None = None
    ) -> Run:
        block = self.hardware.limits.block_size
        lengths = [len(g.tokens) for g in generations]
        blocks = -(-(req.prompt_tokens + len(lengths) * max(lengths)) // block)
        if blocks > self.scheduler.pool.num_blocks:
            raise SimError(
                400,
                f"The request needs {blocks * block} tokens of KV cache but this backend holds "
                f"{self.scheduler.pool.num_blocks * block}.",
            )
        now = self._clock.now()
        # a request arriving while the loop runs behind real time joins at the next step boundary
        arrival = now if self._step_end is None else min(now, self._step_end)
        group = Group(
            prompt_tokens=req.prompt_tokens,
            hashes=block_hashes(req.prompt_key, req.prompt_tokens, block),
            lengths=lengths,
            reasons=[g.finish_reason for g in generations],
            arrival=arrival,
        )
        running = self.scheduler.stats.running
        front_end = self.hardware.front_end(running)  # a calibrated server's HTTP and tokenisation time
        if front_end > 0:  # the front end takes one request at a time
            # from when the request reached this server: the time it took this process to read and
            # parse it is part of the modelled front end, not more on top of it
            came = now if received is None else min(now, self._clock.at(received))
            # the front end's round trip is what this server's client pays it anyway: not held again
            leaves = max(came, self._front.leave(came, front_end) - self.hardware.own_http_s())
            group.arrival = leaves
            group.ready = leaves + self.hardware.admission_wait(running)
            loop = asyncio.get_running_loop()
            delay = max(0.0, (leaves - now) / self._clock.scale - self._clock.early)
            self._entering[group] = loop.call_later(delay, self._enter, group)
        else:
            group.ready = now + self.hardware.admission_wait(running)
            self._enter(group)
        return BatchRun(self, group)

    def _enter(self, group: Group) -> None:
        self._entering.pop(group, None)
        self.scheduler.add(group)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-engine")
        self._wake.set()

    async def wait(self, group: Group, want: int) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        group.waiter, group.want = future, want
        try:
            return await future
        finally:
            group.waiter = None

    def abort(self, group: Group) -> None:
        entering = self._entering.pop(group, None)
        if entering is not None:  # never reached the scheduler
            entering.cancel()
            group.done = True
            self.scheduler.stats.finished["abort"] += group.n
            return
        self.scheduler.abort(group)
        self._wake.set()

    async def _loop(self) -> None:
        scheduler, clock, perf = self.scheduler, self._clock, self.perf
        last_end: float | None = None
        while True:
            if not scheduler.has_work():
                last_end = self._step_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            if last_end is None:  # waking from idle: start when the first request arrived, not when we woke
                waiting = scheduler.waiting
                start = min(clock.now(), waiting[0].arrival) if waiting else clock.now()
            else:
                start = last_end
            plan = scheduler.plan(start)
            duration = perf.step_seconds(plan.work, start)
            waiting = scheduler.waiting
            if duration <= 0 and waiting and waiting[0].ready > start:  # a calibrated front end's wait
                ready = waiting[0].ready
                await clock.sleep_until(ready)
                last_end = self._step_end = ready
                continue
            if duration <= 0:  # nothing can run until something leaves
                last_end = self._step_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            end = self._step_end = start + duration
            await clock.sleep_until(end)
            for group in scheduler.apply(plan, end):
                waiter = group.waiter
                if waiter is not None and (group.generated >= group.want or group.done) and not waiter.done():
                    waiter.set_result(group.generated)
            last_end = end

    async def close(self) -> None:
        for entering in self._entering.values():
            entering.cancel()
        self._entering.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
