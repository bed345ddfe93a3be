"""The calibration's levels: what one level measured, the sizes a sweep steps through, what the refinement
replays of each (loadtest/calibrate/refine.py), and the front end's first estimate from the levels."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from loadtest.calibrate.measure import Server, Timed, after_opening
from loadtest.calibrate.refine import Shape
from loadtest.stats import percentile

BURST = 0.5
"""A client whose time per output token is below this share of the server's inter-token latency got its
tokens in bursts: they waited between the engine and the client (an API server or a client starved of
CPU), so its TTFT holds much of the generation and is no measurement of the server's front end."""


def bursty(client_tpot_s: float, engine_itl_s: float) -> bool:
    """The client got its tokens in bursts (`BURST`)."""
    return engine_itl_s > 0 and client_tpot_s < BURST * engine_itl_s


@dataclass(slots=True)
class Level:
    kind: Literal["prefill", "load", "prefix"]
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    timed: list[Timed] = field(default_factory=list)
    engine_ttft_s: float = 0.0
    engine_itl_s: float = 0.0
    wall_s: float = 0.0
    max_running: float = 0.0
    max_waiting: float = 0.0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    outputs: tuple[int, ...] = ()
    """Each request's output, in the order sent, where they differ (`staggered`); `output_tokens` is then
    their mean."""

    @property
    def tokens_per_s(self) -> float:
        return sum(t.output_tokens for t in self.timed) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def client_tpot_s(self) -> float:
        tpots = [t.tpot_s for t in self.timed if t.tpot_s is not None]
        return statistics.fmean(tpots) if tpots else 0.0

    @property
    def bursty(self) -> bool:
        return bursty(self.client_tpot_s, self.engine_itl_s)

    @property
    def client_ttft_s(self) -> float:
        return statistics.median(t.ttft_s for t in self.timed) if self.timed else 0.0


def shape_of(level: Level) -> Shape:
    """What the refinement replays of a level: its load, vLLM's means and the client's TTFT spread (none
    when the client got its tokens in bursts: its TTFT is then no measurement of the server; of a
    staggered level, after its opening cohort, which the cohort levels measure)."""
    timed = after_opening(level.timed, level.concurrency) if level.outputs else level.timed
    ttfts = [] if level.bursty else [t.ttft_s for t in timed]
    return Shape(
        concurrency=level.concurrency,
        prompt_tokens=level.prompt_tokens,
        output_tokens=level.output_tokens,
        requests=max(1, len(level.timed)),
        engine_ttft_s=level.engine_ttft_s,
        engine_itl_s=level.engine_itl_s,
        client_ttft_p50_s=percentile(ttfts, 50) or 0.0,
        client_ttft_p90_s=percentile(ttfts, 90) or 0.0,
        outputs=level.outputs,
    )


def front_end(levels: Sequence[Level]) -> tuple[float, float]:
    """The front end's time before the engine sees a request: what the client's TTFT adds to vLLM's
    (median client TTFT minus vLLM's mean, per level) as a line in the other sequences running, fitted
    robustly (Theil-Sen: the median of the slopes between levels), never below zero. A level whose client
    got its tokens in bursts (`Level.bursty`) is left out."""
    points = [
        (lv.concurrency - 1, lv.client_ttft_s - lv.engine_ttft_s)
        for lv in levels
        if lv.kind in ("prefill", "load") and lv.timed and lv.engine_ttft_s > 0 and not lv.bursty
    ]
    if not points:
        return 0.0, 0.0
    slopes = [(y2 - y1) / (x2 - x1) for x1, y1 in points for x2, y2 in points if x2 > x1]
    slope = max(0.0, statistics.median(slopes)) if slopes else 0.0
    intercept = max(0.0, statistics.median(y - slope * x for x, y in points))
    return intercept, slope


UNSTEADY = 1.20
"""How much one stream's time per output token may move over a sweep before the sweep says the server
(or the machine under it) did not hold one speed: the check's own tolerance (check.TOLERANCE)."""


def steadiness(levels: Sequence[Level]) -> str | None:
    """What one stream's time per output token did over the sweep's single-stream levels (vLLM's clock;
    with one sequence it hardly moves with the prompt), and a warning when its slowest level is more than
    `UNSTEADY` times its fastest: a level measured in a slow stretch is read as the server's own speed.
    On a two-core CPU machine the two sweeps of seven that moved by 40 and 57 % gave profiles whose replay
    missed the real run's SLO attainment by 8-14 points, while one that moved by 30 % held it within 5
    (docs/calibrate.md, 2026-11-29, 03:00 UTC): a risk, not a verdict. None when the sweep ran fewer than
    two such levels."""
    alone = [
        lv.engine_itl_s
        for lv in levels
        if lv.concurrency == 1 and lv.kind != "prefix" and lv.engine_itl_s > 0
    ]
    if len(alone) < 2:
        return None
    fastest, slowest = min(alone), max(alone)
    note = f"one stream's time per output token over the sweep: {fastest * 1000:.2f}-{slowest * 1000:.2f} ms"
    if slowest <= UNSTEADY * fastest:
        return note
    return (
        f"{note}: warning, the server's speed moved by {slowest / fastest - 1:.0%} during the sweep, and the "
        "profile takes its slow levels for the server's own speed; calibrate again when nothing else loads "
        "the server or its machine"
    )


def extremes_first(sizes: list[int]) -> list[int]:
    """The shortest and the longest first, so a tight budget still measures the whole range."""
    return [*sizes[:1], *sizes[-1:], *sizes[1:-1]] if len(sizes) > 2 else sizes


def concurrencies(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`, and `limit` itself."""
    levels = [1]
    while levels[-1] * 2 <= limit:
        levels.append(levels[-1] * 2)
    if levels[-1] != limit:
        levels.append(limit)
    return levels


def ladder(longest: int) -> list[int]:
    """Prompt sizes from short to `longest`: 16, then doubling, then `longest` itself."""
    sizes: list[int] = []
    size = 16
    while size < longest:
        sizes.append(size)
        size *= 2
    sizes.append(longest)
    return sizes


def staggered(requests: int, shortest: int, longest: int) -> tuple[int, ...]:
    """Outputs spread evenly over `shortest` .. `longest`, in an order that mixes them: a closed loop of
    these ends its requests one at a time, so newcomers arrive among running streams (one at a time into
    a decoding batch), where outputs of one length make them arrive, and wait, as a cohort."""
    span = longest - shortest + 1
    step = next(s for s in (13, 11, 7, 5, 3, 1) if math.gcd(s, span) == 1)  # so every length comes up
    return tuple(shortest + (i * step) % span for i in range(requests))


async def prefix_level(server: Server, prompt_tokens: int, rng: random.Random) -> Level:
    """Prefix reuse: one prompt sent twice, and how many of the repeat's tokens vLLM found cached."""
    prompt = server.prompt(prompt_tokens, rng)
    await server.complete(prompt, 4)
    before = await server.metrics()
    await server.complete(prompt, 4)
    after = await server.metrics()
    level = Level("prefix", 1, prompt_tokens, 4)
    hits, queries = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
    level.prefix_hits = after.get(hits) - before.get(hits)
    level.prefix_queries = after.get(queries) - before.get(queries)
    return level
