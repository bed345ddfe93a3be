"""`switchyard calibrate`'s measurement: sweep a live vLLM server and fit its profile.

The sweep, in order, each level stopping the run early when the time budget would not hold it (after a
warm-up and a settling: loadtest/calibrate/warmup.py):

1. what the server says about itself: `max_model_len` (/v1/models), KV-cache block size and blocks
   (`vllm:cache_config_info`), token ids to build prompts from (/tokenize);
2. prefill: one request at a time, prompts from short to the longest the context holds, a short output
   (with the other levels that send one request at a time, the profile's prefill curve);
3. load: closed-loop concurrency 1, 2, 4, ... (never above `max_concurrency`) for a short and a long
   prompt, until output throughput stops growing (two levels in a row under 10 % more than the best);
   then a long output (a quarter of the context) at concurrency 1, 4 and 16, and outputs of 16 to 64
   tokens mixed (`levels.staggered`): the short prompt at concurrency 4 and 16, the long one at 16;
4. prefix reuse: one long prompt sent twice, and the share of its tokens vLLM found cached.

Every level reads vLLM's histograms before and after (`vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds`: the server's own clocks, which a busy client machine does not skew)
and polls the running and waiting gauges while it runs (a queue that forms below the concurrency sent
reveals `max_num_seqs`). The client's clocks give the front end's share of TTFT (HTTP and tokenisation
before the engine sees the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Literal

import msgspec

from backends.calibrated import CalibratedProfile, FitError, Limits, Point, Source, StepFit
from loadtest.calibrate.defaults import CPU_LIMITS, GPU_LIMITS, REQUEST_CV
from loadtest.calibrate.fit import FEATURES, Row, decode_row, fit, prefill_row
from loadtest.calibrate.levels import (
    Level,
    concurrencies,
    extremes_first,
    front_end,
    ladder,
    prefix_level,
    shape_of,
    staggered,
    steadiness,
)
from loadtest.calibrate.measure import Metrics, Server, ServerError, histogram_mean, run_closed_loop
from loadtest.calibrate.options import Geometry, Options
from loadtest.calibrate.pace import with_spells
from loadtest.calibrate.refine import fit_request_cv, refine, simulate, with_measured_curves
from loadtest.calibrate.warmup import lengths, longest_prompt, settle, warm_up

TTFT = "vllm:time_to_first_token_seconds"
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
GROWTH = 1.10
"""A load level must beat the one before by this factor in output tokens/s for the sweep to go on."""
WARM_UP_SHARE = 0.15
"""The budget's share the warm-up may take (loadtest/calibrate/warmup.py)."""
SETTLE_SHARE = 0.1
"""The budget's share the settling after the warm-up may take (warmup.settle)."""
WATCH_INTERVAL_S = 1.0
"""When a level first polls /metrics for the running and waiting gauges. A scrape holds vLLM's API server
10-25 ms on a quiet machine (longer on a busy one), which a request or a token arriving meanwhile waits
out, and the gateway in front of the server scrapes it too (once a second by default): a sweep polling as
often again would measure a front end slower than the one the gateway's traffic meets."""
WATCH_EVERY_S = 5.0
"""How often it polls after that."""
PHASES = (0.2, 0.3, 0.2, 0.2)
"""The budget's shares: prefill, the short prompt's load levels, the long prompt's, the long outputs (the
rest: prefix reuse); a phase that ends early leaves its time to the next."""


class Calibration:
    def __init__(
        self,
        options: Options,
        progress: Callable[[str], None] | None = None,
        between: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`between`: awaited after each phase of the sweep, its time not counted in the budget (a check
        that wants its load measured while the machine runs as it did for the sweep puts it there)."""
        self.options = options
        self._between = between
        self.server = Server(options.url, options.model, through=options.through)
        self.rng = random.Random(options.seed)
        self.levels: list[Level] = []
        self.started = 0.0
        self.requests = 0
        self.phase_end = 0.0
        self.geometry: Geometry | None = None
        self._progress = progress or (lambda text: print(text, file=sys.stderr, flush=True))

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        self._progress(f"[{self.elapsed():5.1f}s/{self.options.budget_s:.0f}s] {text}")

    def in_phase(self, estimate_s: float) -> bool:
        """Whether a level of about `estimate_s` starts within the current phase's share of the budget."""
        return time.monotonic() + estimate_s <= self.phase_end

    async def between_phases(self) -> None:
        if self._between is None:
            return
        paused = time.monotonic()
        await self._between()
        spent = time.monotonic() - paused
        self.started += spent
        self.phase_end += spent

    async def run(self) -> CalibratedProfile:
        self.started = time.monotonic()
        try:
            return await self._run()
        finally:
            await self.server.close()

    async def _run(self) -> CalibratedProfile:
        server, options = self.server, self.options
        if not options.model:
            options.model = server.model = await server.only_model()
        max_model_len = await server.max_model_len()
        await server.learn_vocabulary()
        info = (await server.metrics()).info.get("vllm:cache_config_info", {})
        try:
            block_size, num_blocks = int(info["block_size"]), int(info["num_gpu_blocks"])
        except (KeyError, ValueError):
            raise ServerError(
                f"{server.url}/metrics has no vllm:cache_config_info with block_size and num_gpu_blocks "
                "(is it a vLLM server?)"
            ) from None
        version = await server.version()
        trip = await server.round_trip()
        self.say(
            f"{server.url} serves {options.model}: max_model_len {max_model_len}, "
            f"{num_blocks} KV blocks of {block_size} tokens, vLLM {version or '?'}"
        )
        longest = longest_prompt(max_model_len)
        budget = options.budget_s
        sent = await warm_up(server, longest, self.rng, self.started + WARM_UP_SHARE * budget)
        planned = len(lengths(longest))  # fewer sent: the budget's share ran out first
        self.say(f"warm-up: {sent} of {planned} prompts of 1 to {longest} tokens, one token out each")
        short = max(16, longest // 8)
        settled_by = time.monotonic() + SETTLE_SHARE * budget
        medians = await settle(server, short, load_output(max_model_len, short), self.rng, settled_by)
        readings = " ".join(f"{m * 1000:.2f}" for m in medians)
        self.say(f"settled: one stream's time per output token, burst by burst: {readings} ms")
        hop = await server.gateway_hop(self.rng)  # the hop a simulator's client pays itself (measured warm)
        if options.through:
            self.say(f"through {server.send_url}: it adds {hop * 1000:.2f} ms to a forwarded request")
        self.geometry = Geometry(max_model_len, block_size, num_blocks, version, trip + hop)
        # the prefill phase keeps what the warm-up's share leaves of it, however long it and the settling took
        self.phase_end = max(self.started, time.monotonic() - WARM_UP_SHARE * budget) + PHASES[0] * budget
        for prompt in extremes_first(ladder(longest)):
            if not self.in_phase(1.0):
                break
            await self._level("prefill", 1, prompt, 8, repeats=options.repeats)
        await self.between_phases()
        long = max(32, longest // 2)
        for phase, prompt in zip(PHASES[1:3], (short, long), strict=True):
            self.phase_end = self.phase_end + phase * budget
            output = load_output(max_model_len, prompt)
            best, flat = 0.0, 0
            for concurrency in concurrencies(options.max_concurrency):
                if not self.in_phase(0.5):
                    break
                level = await self._level(
                    "load", concurrency, prompt, output, repeats=max(32, 8 * concurrency)
                )
                # two levels in a row that do not beat the best by 10 %: throughput stopped growing (one
                # alone may be a busy moment of the machine)
                flat = flat + 1 if level.tokens_per_s < best * GROWTH else 0
                if flat >= 2 and concurrency >= 4:
                    break
                best = max(best, level.tokens_per_s)
            await self.between_phases()
        self.phase_end = self.phase_end + PHASES[3] * budget
        longer = max(8, min(256, max_model_len // 4, max_model_len - short - 1))  # output lengths too
        for concurrency in (1, 4, 16):
            if concurrency > options.max_concurrency or not self.in_phase(0.5):
                break
            await self._level("load", concurrency, short, longer, repeats=max(8, 2 * concurrency))
        for concurrency, prompt in ((4, short), (16, short), (16, long)):  # outputs of many lengths:
            if concurrency > options.max_concurrency or not self.in_phase(0.5):  # newcomers among streams
                break
            outputs = staggered(8 * concurrency, 16, max(17, min(64, max_model_len - prompt - 1)))
            await self._level("load", concurrency, prompt, 0, repeats=len(outputs), outputs=outputs)
        self.phase_end = self.started + budget
        if self.in_phase(1.0):
            await self._prefix(long)
        # the sweep's own levels replayed (loadtest/calibrate/refine.py): what is left of the budget, or 15 s
        deadline = max(self.started + self.options.budget_s, time.monotonic() + 15.0)
        source = Source(
            url=self.options.url,
            measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            seconds=round(self.elapsed(), 1),
            requests=self.requests,
            vllm_version=version,
        )
        assert self.geometry is not None
        return fit_profile(self.options, self.geometry, self.levels, deadline, self.say, source)

    async def _level(
        self,
        kind: Literal["prefill", "load"],
        concurrency: int,
        prompt: int,
        output: int,
        repeats: int,
        outputs: tuple[int, ...] = (),
    ) -> Level:
        """`outputs`: each request's own output, in place of `output` for all."""
        server = self.server
        output = round(statistics.fmean(outputs)) if outputs else output
        level = Level(kind, concurrency, prompt, output, outputs=outputs)
        jobs = [(server.prompt(prompt, self.rng), o) for o in (outputs or (output,) * repeats)]
        before = await server.metrics()
        started = time.perf_counter()
        stop = asyncio.Event()
        watcher = asyncio.create_task(self._watch(level, stop))
        try:
            deadline = min(self.phase_end, self.started + self.options.budget_s)
            level.timed = await run_closed_loop(jobs, concurrency, server.complete, deadline)
        finally:
            level.wall_s = time.perf_counter() - started
            stop.set()
            await watcher
        after = await server.metrics()
        self.requests += len(level.timed)
        level.engine_ttft_s, _ = histogram_mean(before, after, TTFT)
        level.engine_itl_s = _itl(before, after)
        if level.timed:  # a level the budget cut before it began is not a measurement
            self.levels.append(level)
            out = f"{min(outputs)}-{max(outputs)}" if outputs else str(output)
            self.say(
                f"{kind:7} prompt {prompt:5} out {out:>5} x{concurrency:<3}: "
                f"{len(level.timed):3} of {len(jobs):3} requests, "
                f"TTFT {level.engine_ttft_s * 1000:7.1f} ms (client {level.client_ttft_s * 1000:7.1f}), "
                f"ITL {level.engine_itl_s * 1000:6.2f} ms (client {level.client_tpot_s * 1000:6.2f}), "
                f"{level.tokens_per_s:7.0f} tok/s, "
                f"running <= {level.max_running:.0f}, waiting <= {level.max_waiting:.0f}"
            )
        return level

    async def _watch(self, level: Level, stop: asyncio.Event) -> None:
        """Polls the gauges WATCH_INTERVAL_S into the level (not while its first requests arrive), then every
        WATCH_EVERY_S: a queue that forms in a closed loop stays for the whole level, so one poll sees it,
        and every poll holds the API server (see WATCH_INTERVAL_S)."""
        wait = WATCH_INTERVAL_S
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            wait = WATCH_EVERY_S
            if stop.is_set():
                break
            with contextlib.suppress(Exception):
                m = await self.server.metrics()
                level.max_running = max(level.max_running, m.get("vllm:num_requests_running"))
                level.max_waiting = max(level.max_waiting, m.get("vllm:num_requests_waiting"))

    async def _prefix(self, prompt_tokens: int) -> None:
        level = await prefix_level(self.server, prompt_tokens, self.rng)
        self.requests += 2
        self.levels.append(level)
        rate = level.prefix_hits / level.prefix_queries if level.prefix_queries else 0.0
        self.say(f"prefix  prompt {prompt_tokens:5} sent twice: {rate:.0%} of the repeat found in the cache")


def load_output(max_model_len: int, prompt_tokens: int) -> int:
    """The output of a load level (and of the settling): 32 tokens, or what the context leaves, 8 at least."""
    return max(8, min(32, max_model_len - prompt_tokens - 1))


def limits_of(options: Options, geometry: Geometry, levels: Sequence[Level]) -> Limits:
    defaults = CPU_LIMITS if options.accelerator == "cpu" else GPU_LIMITS
    max_num_seqs = options.max_num_seqs
    if max_num_seqs is None:
        # all the rest queued while fewer ran: the server's max_num_seqs (a request waits its step at any
        # load: 10 running and 2 waiting at 16 streams were read off an uncapped server)
        capped = [
            lv for lv in levels if lv.kind == "load" and lv.max_running + lv.max_waiting >= lv.concurrency
        ]
        seen = [int(lv.max_running) for lv in capped if 0 < lv.max_running < lv.concurrency]
        max_num_seqs = min(seen) if seen else defaults[0]
    return Limits(
        block_size=geometry.block_size,
        num_blocks=geometry.num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens or max(defaults[1], geometry.max_model_len),
        max_model_len=geometry.max_model_len,
    )


def fit_profile(
    options: Options,
    geometry: Geometry,
    levels: Sequence[Level],
    deadline: float,
    say: Callable[[str], None],
    source: Source | None = None,
    decode_curve: bool = True,
    spells: bool = True,
) -> CalibratedProfile:
    """The profile the sweep's `levels` give: the linear fit, the curves, then the refinement on the
    simulator's scheduler until `deadline` (time.monotonic()). A recording's levels give the same
    profile offline (loadtest/calibrate/offline.py); `decode_curve=False`: the per-sequence line only
    (to compare the two on one recording); `spells=False`: without the server's slow spells."""
    rows: list[tuple[Level, str, Row]] = []
    for level in levels:
        if level.kind == "prefill" and level.engine_ttft_s > 0:
            rows.append((level, "ttft", prefill_row(level.prompt_tokens, level.engine_ttft_s)))
        if level.kind in ("prefill", "load") and level.engine_itl_s > 0:
            row = decode_row(level.concurrency, level.prompt_tokens, level.output_tokens, level.engine_itl_s)
            rows.append((level, "tpot", row))
    coefficients = fit([row for _, _, row in rows])
    request_s, request_per_seq_s = front_end(levels)
    terms: dict[str, float] = dict(zip(FEATURES, coefficients, strict=True))
    linear = StepFit(
        step_s=terms["step_s"],
        per_seq_s=terms["per_seq_s"],
        per_prefill_token_s=terms["per_prefill_token_s"],
        per_context_token_s=terms["per_context_token_s"],
        request_s=request_s,
        request_per_seq_s=request_per_seq_s,
        request_cv=REQUEST_CV,
        http_s=geometry.round_trip_s,
    )
    limits = limits_of(options, geometry, levels)
    shapes = [shape_of(level) for level in levels if level.kind != "prefix" and level.timed]
    # the prefill curve from the levels that sent one request at a time, the decode curve from every
    # level's inter-token latency where it beats the per-sequence line; both kept fitted as the rest moves
    curved = with_measured_curves(linear, limits, shapes, decode_curve)
    step, before, after = refine(curved, limits, shapes, say, deadline)
    say(f"refined on the simulator's scheduler: mean error {before:.3f} -> {after:.3f}")
    spread = fit_request_cv(step, limits, shapes)
    if spread is not None:
        step = msgspec.structs.replace(step, request_cv=spread)
        say(f"the front end's spread from one request to the next: {spread:g} (from the staggered levels)")
    step = with_spells(step, levels, say) if spells else step
    if (steady := steadiness(levels)) is not None:
        say(steady)
    points = []
    replayed = [level for level in levels if level.kind != "prefix" and level.timed]
    for level, shape in zip(replayed, shapes, strict=True):
        sim = simulate(step, limits, shape, cap=False)
        for kind, measured, predicted in (
            ("ttft", shape.engine_ttft_s, sim.engine_ttft_s),
            ("tpot", shape.engine_itl_s, sim.engine_itl_s),
        ):
            if measured > 0:
                points.append(
                    Point(
                        kind=kind,  # type: ignore[arg-type]
                        concurrency=level.concurrency,
                        prompt_tokens=level.prompt_tokens,
                        output_tokens=level.output_tokens,
                        measured_s=measured,
                        predicted_s=predicted,
                        requests=max(1, len(level.timed)),
                    )
                )
    errors = {kind: [p.error for p in points if p.kind == kind] or [0.0] for kind in ("ttft", "tpot")}
    prefix = [lv for lv in levels if lv.kind == "prefix"]
    hit_rate = (
        prefix[0].prefix_hits / prefix[0].prefix_queries if prefix and prefix[0].prefix_queries else 0.0
    )
    return CalibratedProfile(
        accelerator=options.accelerator,
        model=options.model,
        step=step,
        limits=limits,
        fit_error=FitError(
            ttft_mean=statistics.fmean(errors["ttft"]),
            ttft_max=max(errors["ttft"]),
            tpot_mean=statistics.fmean(errors["tpot"]),
            tpot_max=max(errors["tpot"]),
        ),
        saturated_tokens_per_second=max((lv.tokens_per_s for lv in levels if lv.kind == "load"), default=0.0),
        prefix_cache_hit_rate=hit_rate,
        source=source,
        points=points,
    )


def _itl(before: Metrics, after: Metrics) -> float:
    for name in ITL:
        mean, count = histogram_mean(before, after, name)
        if count > 0:
            return mean
    return 0.0


def calibrate(options: Options, progress: Callable[[str], None] | None = None) -> CalibratedProfile:
    return asyncio.run(Calibration(options, progress).run())
