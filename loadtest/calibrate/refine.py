"""Refining the fitted profile by replaying the sweep's own levels on the simulator's scheduler.

The linear fit (loadtest/calibrate/fit.py) reads each level as a steady state: newcomers spread evenly
over the steps. A closed loop is not one: its requests start together, and when their outputs are of
one length they end together, so the next ones arrive as a cohort whose prompts fill whole steps
(`max_num_batched_tokens`) and wait behind each other. The simulator's scheduler
(backends/sim/scheduler.py) replays that, so the profile is judged by what the simulator started from
it would report for the very levels the sweep ran: each level is run on a virtual clock (no sleeping,
the same admission, chunked prefill and KV-cache rules as `python -m backends.sim --calibrated`), and
the step model and the front-end terms are moved, one at a time, while that lowers the error on what
was measured: vLLM's own mean TTFT and inter-token latency, and the client's median and 90th-percentile
TTFT (the front end's share; the front end takes one request at a time, so a cohort queues for it).
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from backends.calibrated import Limits, StepFit
from backends.sim.frontend import FrontEnd
from backends.sim.metrics import EngineStats
from backends.sim.perf import StepWork
from backends.sim.profiles import EngineLimits
from backends.sim.scheduler import Group, Scheduler
from loadtest.calibrate.fit import non_decreasing as _non_decreasing
from loadtest.calibrate.fit import prefill_curve
from loadtest.calibrate.measure import Timed, after_opening
from loadtest.stats import percentile

PARAMETERS = (
    "step_s",
    "per_seq_s",
    "per_prefill_token_s",
    "per_context_token_s",
    "mixed_step_s",
    "admit_s",
    "admit_busy_s",
    "admit_per_seq_s",
    "request_s",
    "request_per_seq_s",
)
"""The levels are replayed without the front end's spread (`request_cv`), which is not searched with them: a
cohort that arrives together leaves the front end at the same mean times whatever the spread, and the
few draws a level's replay would make move the fit from one seed to the next (the front end's time fitted
at 1.8 or 2.8 ms from one recording). `fit_request_cv` sets it afterwards, over several draws."""
SPREADS = (0.0, 0.25, 0.5, 0.75, 1.0)
"""The front end's spreads `fit_request_cv` tries."""
SPREAD_DRAWS = 6
FACTORS = (0.6, 0.85, 1.15, 1.6)
ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Shape:
    """What one sweep level sent, and what was measured (0 where nothing was)."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    requests: int
    engine_ttft_s: float
    engine_itl_s: float
    client_ttft_p50_s: float
    client_ttft_p90_s: float
    outputs: tuple[int, ...] = ()
    """Each request's output where they differ (levels.staggered)."""


@dataclass(frozen=True, slots=True)
class Simulated:
    engine_ttft_s: float
    engine_itl_s: float
    timed: list[Timed]
    """Per request, in the order they ended, as a client on the virtual clock would have timed it."""

    @property
    def client_ttft_s(self) -> list[float]:
        """Per request, in the order they ended."""
        return [t.ttft_s for t in self.timed]

    @property
    def client_tpot_s(self) -> list[float | None]:
        """Per request, in the order they ended (None: a one-token output)."""
        return [t.tpot_s for t in self.timed]


def simulate(
    step: StepFit, limits: Limits, shape: Shape, cap: bool = True, spread: bool = False, seed: int = 0
) -> Simulated:
    """One sweep level, closed loop on a virtual clock (`closed_loop`). `cap`: at most two requests per
    client (a closed loop of one request size repeats itself after that), which keeps the search quick.
    `spread`: with the front end's spread (`seed`: its draw), which the refinement leaves out."""
    if shape.outputs:  # a staggered level only reaches its steady mix after a few rounds
        count = min(shape.requests, max(8, 4 * shape.concurrency)) if cap else shape.requests
        jobs = [(shape.prompt_tokens, output) for output in shape.outputs[:count]]
        return closed_loop(step, limits, jobs, shape.concurrency, spread, seed)
    count = min(shape.requests, max(4, 2 * shape.concurrency)) if cap else shape.requests
    jobs = [(shape.prompt_tokens, shape.output_tokens)] * count
    return closed_loop(step, limits, jobs, shape.concurrency, spread, seed)


def closed_loop(
    step: StepFit,
    limits: Limits,
    jobs: Sequence[tuple[int, int]],
    concurrency: int,
    spread: bool = True,
    seed: int = 0,
) -> Simulated:
    """`jobs` (prompt tokens, output tokens) in order, `concurrency` at a time, on a virtual clock, as
    `BatchEngine` runs them: each client sends its next request when its previous one ends; a request
    spends the front end's time before the scheduler sees it, and the front end takes one request at a
    time (a cohort queues); `seed`: the draw of its spread."""
    stats = EngineStats("calibration", limits.kv_capacity_tokens)
    engine_limits = EngineLimits(limits.block_size, limits.max_num_seqs, limits.max_num_batched_tokens)
    scheduler = Scheduler(engine_limits, limits.num_blocks, stats)
    entering: list[tuple[float, int, Group]] = []
    sent_at: dict[int, float] = {}
    timed: list[Timed] = []
    queue = list(reversed(jobs))
    front = FrontEnd(step.request_cv if spread else 0.0, seed)
    order = itertools.count()

    def send(at: float) -> None:
        prompt, output = queue.pop()
        running = stats.running
        leaves = front.leave(at, step.front_end(running))
        group = Group(prompt, [], [output], ["length"], arrival=leaves)
        group.ready = leaves + step.admission_wait(running)
        sent_at[id(group)] = at
        heapq.heappush(entering, (leaves, next(order), group))  # ties in the order sent

    for _ in range(min(concurrency, len(queue))):
        send(0.0)
    now = 0.0
    while entering or scheduler.has_work():
        while entering and entering[0][0] <= now:
            scheduler.add(heapq.heappop(entering)[2])
        if not scheduler.has_work():
            now = entering[0][0]
            continue
        plan = scheduler.plan(now)
        work: StepWork = plan.work
        duration = step.step_seconds(
            work.prefill_seqs + work.decode_seqs, work.prefill_tokens, work.decode_context
        )
        if duration <= 0:  # the head still in its admission wait, or nothing fits until an arrival
            waiting = scheduler.waiting
            ready = waiting[0].ready if waiting and waiting[0].ready > now else math.inf
            now = min(ready, entering[0][0] if entering else math.inf)
            if math.isinf(now):
                break
            continue
        end = now + duration
        for group in scheduler.apply(plan, end):
            if group.done:
                steps = group.steps
                tpot = (end - group.first_token_at) / (steps - 1) if steps > 1 else None
                sent = sent_at[id(group)]
                first = group.first_token_at - sent
                timed.append(Timed(group.prompt_tokens, steps, sent, first, tpot, end - sent))
                if queue:
                    send(end)
        now = end
    itl = stats.itl.total / stats.itl.count if stats.itl.count else 0.0
    ttft = stats.ttft.total / stats.ttft.count if stats.ttft.count else 0.0
    return Simulated(ttft, itl, timed)


def _error(predicted: float, measured: float) -> float:
    if measured <= 0:
        return 0.0
    return abs(math.log(max(predicted, 1e-6) / measured))


def level_error(step: StepFit, limits: Limits, shape: Shape) -> float:
    """The sum of the level's absolute log errors (a 20 % miss either way counts about alike): vLLM's
    mean TTFT and inter-token latency, and the client's median and 90th-percentile TTFT (of a staggered
    level, after its opening cohort, as `levels.shape_of` measures it)."""
    sim = simulate(step, limits, shape)
    error = _error(sim.engine_ttft_s, shape.engine_ttft_s) + _error(sim.engine_itl_s, shape.engine_itl_s)
    timed = after_opening(sim.timed, shape.concurrency) if shape.outputs else sim.timed
    ttfts = [t.ttft_s for t in timed]
    if ttfts:
        error += _error(statistics.median(ttfts), shape.client_ttft_p50_s)
        error += _error(percentile(ttfts, 90) or 0.0, shape.client_ttft_p90_s)
    return error


def total_error(step: StepFit, limits: Limits, shapes: Sequence[Shape]) -> float:
    return sum(level_error(step, limits, shape) for shape in shapes) / max(1, len(shapes))


def with_prefill_curve(step: StepFit, limits: Limits, shapes: Sequence[Shape]) -> StepFit:
    """`step` with the prefill curve its one-request-at-a-time levels give (fit.prefill_curve)."""
    alone = [(s.prompt_tokens, s.engine_ttft_s) for s in shapes if s.concurrency == 1]
    curve, latency = prefill_curve(step, alone, limits.max_num_batched_tokens)
    if not curve:
        return msgspec.structs.replace(step, prefill=curve)
    return msgspec.structs.replace(step, prefill=curve, admit_s=latency)


def with_decode_curve(step: StepFit, limits: Limits, shapes: Sequence[Shape], passes: int = 1) -> StepFit:
    """`step` with the decode curve (StepFit.decode) under which the simulator's scheduler reproduces
    each level's inter-token latency: per level, what its concurrency's sequences add to a step, moved
    by what the replay misses (vLLM's mean inter-token latency less the replayed one); the median per
    concurrency, made non-decreasing. A level's steps do not all hold its full batch (it fills and
    drains), so each pass moves the curve part of the way; `passes` repeats it. Needs levels at two
    concurrencies at least, else `step` unchanged."""
    measured = [shape for shape in shapes if shape.engine_itl_s > 0]
    widths = sorted({shape.concurrency for shape in measured})
    if len(widths) < 2:
        return step
    for _ in range(passes):
        targets: dict[int, list[float]] = {}
        for shape in measured:
            missed = shape.engine_itl_s - simulate(step, limits, shape).engine_itl_s
            targets.setdefault(shape.concurrency, []).append(
                step.sequence_seconds(shape.concurrency) + missed
            )
        seconds = _non_decreasing([max(0.0, statistics.median(targets[w])) for w in widths])
        step = msgspec.structs.replace(step, decode=list(zip(widths, seconds, strict=True)))
    return step


def with_curves(step: StepFit, limits: Limits, shapes: Sequence[Shape], passes: int = 1) -> StepFit:
    """`step` with whichever curves it has refitted: the decode curve first, then the prefill curve (a
    request alone is one step of one sequence, which the decode curve prices)."""
    if step.decode:
        step = with_decode_curve(step, limits, shapes, passes)
    if step.prefill:
        step = with_prefill_curve(step, limits, shapes)
    return step


def with_measured_curves(
    step: StepFit, limits: Limits, shapes: Sequence[Shape], decode: bool = True
) -> StepFit:
    """`step` (a linear fit) with a prefill curve and, where it replays the levels better than the
    per-sequence line (and `decode`), a decode curve."""
    curved = with_prefill_curve(step, limits, shapes)
    if not decode:
        return curved
    both = with_prefill_curve(with_decode_curve(curved, limits, shapes, passes=3), limits, shapes)
    if both.decode and total_error(both, limits, shapes) < total_error(curved, limits, shapes):
        return both
    return curved


def _seed(step: StepFit, name: str) -> float:
    """A starting value for a term at zero: a tenth of a step at a typical size of what it multiplies."""
    typical = {
        "per_seq_s": 4.0,
        "per_prefill_token_s": 256.0,
        "per_context_token_s": 1000.0,
        "admit_per_seq_s": 8.0,
    }
    base = step.step_s or 0.001
    return base / 10 / typical.get(name, 1.0)


def refine(
    step: StepFit,
    limits: Limits,
    shapes: Sequence[Shape],
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
) -> tuple[StepFit, float, float]:
    """Coordinate search from `step`: each term in turn scaled (or set to zero; a term at zero is tried
    at a fifth of its seed, the seed and five times it) while that lowers the mean error; the steps
    shrink after a round that changed nothing, and the search ends after one at the finest steps or when
    `deadline` (time.monotonic()) passes. The engine's and the front end's terms are searched together:
    a front end that spaces a cohort out changes what the engine sees. A step's curves are refitted to
    every trial (with_curves). Returns the refined model and its mean error before and after."""
    best = step
    best_error = before = total_error(step, limits, shapes)
    factors: Sequence[float] = FACTORS
    for round_ in range(ROUNDS):
        improved = False
        for name in PARAMETERS:
            if name == "admit_s" and best.prefill:
                continue  # the prefill curve's fit sets it (with_prefill_curve)
            value = getattr(best, name)
            if value > 0:
                candidates = [*(value * f for f in factors), 0.0]
            else:
                candidates = [_seed(best, name) * f for f in (0.2, 1, 5)]
            for candidate in candidates:
                if deadline is not None and time.monotonic() > deadline:
                    return best, before, best_error
                trial = with_curves(msgspec.structs.replace(best, **{name: candidate}), limits, shapes)
                error = total_error(trial, limits, shapes)
                # a better fit, or as good a one with a term less (one the levels cannot tell apart)
                if error < best_error * 0.999 or (candidate == 0.0 and error <= best_error * 1.001):
                    best, best_error, improved = trial, error, True
        if progress is not None:
            progress(f"refine round {round_ + 1}: mean error {best_error:.3f}")
        if not improved:
            if factors[0] > 0.9:
                break
            factors = [1 + (f - 1) / 3 for f in factors]
    return best, before, best_error


def fit_request_cv(step: StepFit, limits: Limits, shapes: Sequence[Shape]) -> float | None:
    """The front end's spread (`StepFit.request_cv`, one of `SPREADS`) under which the replay of the
    staggered levels (newcomers among running streams, as real traffic comes) gives their client TTFT p50
    and p90, averaged over `SPREAD_DRAWS` draws each; None when the sweep ran no such level. The refined
    terms already carry the mean: with a spread of 1 on top, those levels' replayed p90 came out 1.5 to 2
    times the measured one, and with none within 5 % (docs/calibrate.md, 2026-11-28, 22:00 UTC)."""
    staggered = [s for s in shapes if s.outputs and s.client_ttft_p50_s > 0 and s.client_ttft_p90_s > 0]
    if not staggered:
        return None
    best, best_error = SPREADS[0], math.inf
    for cv in SPREADS:
        spread = msgspec.structs.replace(step, request_cv=cv)
        error = 0.0
        for shape in staggered:
            p50s, p90s = [], []
            for draw in range(SPREAD_DRAWS):
                timed = simulate(spread, limits, shape, spread=True, seed=draw).timed
                ttfts = [t.ttft_s for t in after_opening(timed, shape.concurrency)]
                p50s.append(statistics.median(ttfts))
                p90s.append(percentile(ttfts, 90) or 0.0)
            error += _error(statistics.fmean(p50s), shape.client_ttft_p50_s)
            error += _error(statistics.fmean(p90s), shape.client_ttft_p90_s)
        if error < best_error - 1e-9:
            best, best_error = cv, error
    return best
