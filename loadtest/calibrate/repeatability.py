"""Does the real server agree with itself? The check's held-apart load, twice per level, on one server.

    python -m loadtest.calibrate.repeatability --url URL --model M [--runs 3] [--seed S]

The check (loadtest/calibrate/check.py) asks a simulator to agree with a real server within 20 % per level,
and the what-if replay within 5 points of SLO attainment. Those bounds only mean something where the server
agrees that closely with itself. This runs each level of the held-apart load twice, back to back, on a
server warmed up as the sweep warms it, the second time with fresh prompt tokens of the same lengths (the
same tokens would be found in the prefix cache), and prints the check's rows with the first leg as "real"
and the second in the simulator's place; then each leg's SLO attainment against bounds at the other leg's
own percentiles of TTFT and time per output token (both classes together: they share one server), as the
check sets them at the 80th. Exit status 0 when every row held and the attainment agreed within 5 points at
the 80th percentile in every run, 1 when not, 2 when the server could not be measured (nothing answers, or
it is no vLLM server).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import aiohttp
import httpx

from loadtest.calibrate.agreement import ClassSlo, attained
from loadtest.calibrate.check import (
    LEVELS,
    TOLERANCE,
    WIDTHS,
    Job,
    LevelRun,
    Row,
    Target,
    compare,
    failures,
    format_rows,
    held_apart_jobs,
    run_level,
)
from loadtest.calibrate.measure import Server, ServerError, stream_client
from loadtest.calibrate.warmup import longest_prompt, warm_up
from loadtest.stats import percentile

PERCENTILES = (80, 90, 95, 98)
POINTS = 5.0


def fresh_tokens(
    levels: Sequence[list[Job]], vocabulary: Sequence[int], rng: random.Random
) -> list[list[Job]]:
    """The same requests (prompt lengths, outputs, classes) with other prompt tokens."""
    return [
        [replace(job, prompt=[rng.choice(vocabulary) for _ in job.prompt]) for job in jobs] for jobs in levels
    ]


def attainment(reference: Sequence[LevelRun], other: Sequence[LevelRun], q: float) -> tuple[float, float]:
    """The share of `reference`'s requests and of `other`'s with TTFT and time per output token both
    within `reference`'s own `q`th percentiles of each."""
    ref = [t for run in reference for t in run.timed]
    bounds = ClassSlo(
        percentile([t.ttft_s for t in ref], q) or 0.0,
        percentile([t.tpot_s for t in ref if t.tpot_s is not None], q) or 0.0,
    )

    def share(runs: Sequence[LevelRun]) -> float:
        timed = [t for run in runs for t in run.timed]
        return sum(attained(t.ttft_s, t.tpot_s, bounds) for t in timed) / len(timed) if timed else 0.0

    return share(reference), share(other)


@dataclass(frozen=True, slots=True)
class Repeat:
    rows: list[Row]
    gaps: dict[int, float]
    """Per percentile: the larger gap, in points, of either leg's attainment against the other's bounds."""


def repeat(first: Sequence[LevelRun], second: Sequence[LevelRun]) -> Repeat:
    gaps = {}
    for q in PERCENTILES:
        a, b = attainment(first, second, q)
        c, d = attainment(second, first, q)
        gaps[q] = 100 * max(abs(a - b), abs(c - d))
    return Repeat(compare(first, second, WIDTHS), gaps)


async def twice(url: str, model: str, levels: Sequence[list[Job]], again: Sequence[list[Job]]) -> Repeat:
    target = Target(url, url)
    first: list[LevelRun] = []
    second: list[LevelRun] = []
    async with stream_client() as client:
        for jobs, jobs_again, width in zip(levels, again, WIDTHS, strict=True):
            first.append(await run_level(client, target, model, jobs, width))
            second.append(await run_level(client, target, model, jobs_again, width))
    return repeat(first, second)


async def _warmed_up(url: str, model: str, rng: random.Random) -> tuple[list[int], int, int]:
    """The server's vocabulary and `max_model_len`, after the sweep's warm-up (loadtest/calibrate/warmup.py)
    so that both legs meet a warm server; and how many prompts that sent."""
    server = Server(url, model)
    try:
        await server.learn_vocabulary()
        max_model_len = await server.max_model_len()
        sent = await warm_up(server, longest_prompt(max_model_len), rng, math.inf)
        return server.vocabulary, max_model_len, sent
    finally:
        await server.close()


def _at_least_one(text: str) -> int:
    runs = int(text)
    if runs < 1:
        raise argparse.ArgumentTypeError(f"runs must be 1 or more, not {runs}")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.calibrate.repeatability", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", type=_at_least_one, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    try:
        vocabulary, max_model_len, sent = asyncio.run(_warmed_up(args.url, args.model, rng))
    # not a vLLM server, or none there: say so, no traceback
    except (ServerError, httpx.HTTPError, aiohttp.ClientError) as exc:
        print(f"repeatability: {args.url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"warm-up: {sent} prompts")
    held = 0
    print(f"the held-apart load ({', '.join(f'x{w}: {n} requests' for w, n in LEVELS)}), twice per level")
    for run in range(args.runs):
        levels = held_apart_jobs(vocabulary, max_model_len, args.seed + run)
        result = asyncio.run(twice(args.url, args.model, levels, fresh_tokens(levels, vocabulary, rng)))
        asserted = len([r for r in result.rows if r.asserted])
        rows_held = asserted - len(failures(result.rows))
        print(f"\nrun {run + 1}: the first leg as 'real', the second as 'sim'\n{format_rows(result.rows)}")
        print(
            f"{rows_held} of {asserted} rows within {TOLERANCE:.0%}; attainment gap, points, by percentile:"
        )
        print("  " + "  ".join(f"p{q} {gap:4.1f}" for q, gap in result.gaps.items()))
        held += not failures(result.rows) and result.gaps[80] <= POINTS
    print(f"\nthe server agreed with itself in {held} of {args.runs} runs")
    return 0 if held == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
