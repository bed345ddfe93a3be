"""Warming a server up before the sweep measures it: every step size it will meet, once.

A server that has run for a while has met every number of tokens a step can hold; a fresh one pays
extra the first time it meets each (the CPU build creates and caches its matrix kernels per shape; a GPU
build captures its CUDA graphs at start-up, but compiles some kernels on first use). Measured on the CPU
build, one request at a time, a prompt of every length from 20 to 460 tokens in steps of 7, three
passes: the first pass's median TTFT was 13.9 ms, the next two 10.7 and 11.0 ms (docs/calibrate.md). A
sweep of a fresh server reads that first-time cost into the levels that meet a new size, and a load of
other sizes run later (the check's held-apart one, or production's) meets it again where the profile
did not expect it. So the sweep first sends one prompt of every length up to the longest it will use,
one token of output each (a step of exactly that many tokens), one at a time; on a long context every
`stride`-th length, at most `MAX_REQUESTS`.
"""

from __future__ import annotations

import math
import random
import statistics
import time

from loadtest.calibrate.measure import Server

MAX_REQUESTS = 512


def longest_prompt(max_model_len: int) -> int:
    """The longest prompt the sweep sends: the context less room for a short output."""
    return max(8, max_model_len - 16 - 8)


def lengths(longest: int, max_requests: int = MAX_REQUESTS) -> range:
    """The prompt lengths the warm-up sends: 1 .. `longest`, every one of them up to `max_requests`."""
    stride = max(1, math.ceil(longest / max_requests))
    return range(1, longest + 1, stride)


async def warm_up(server: Server, longest: int, rng: random.Random, deadline: float) -> int:
    """Sends `lengths(longest)` one at a time until `deadline` (time.monotonic()); how many it sent."""
    sent = 0
    for tokens in lengths(longest):
        if time.monotonic() >= deadline:
            break
        await server.complete(server.prompt(tokens, rng), 1)
        sent += 1
    return sent


SETTLE_MIN_S = 4.0
"""The least time `settle` decodes for. On vLLM's CPU build, right after the warm-up's one-token requests,
one stream decoded at 1.3 ms a token for about 2.5 s of work, then at 0.95 (the same 24-request rounds,
one after the other, 2026-11-28): flat while slow, so a check of stability alone would stop inside it."""
SETTLE_BURST = 8
"""Requests per burst, one at a time; a burst's median time per output token is one reading."""
SETTLE_AGREE = 1.05
"""Settled: the last three bursts' medians within this factor of each other."""


async def settle(
    server: Server,
    prompt_tokens: int,
    output_tokens: int,
    rng: random.Random,
    deadline: float,
    min_s: float = SETTLE_MIN_S,
) -> list[float]:
    """Decodes one stream at a time until the server runs at its steady speed (`min_s` at least, then
    until three bursts agree), or until `deadline` (time.monotonic()); returns each whole burst's median
    seconds per output token. The warm-up prefills only: without this, the sweep's first levels (and a
    check's first held-apart load) met a server up to 1.5 times slower than the rest of the sweep did,
    and the profile averaged the two."""
    started = time.monotonic()
    medians: list[float] = []
    while time.monotonic() < deadline:
        tpots = []
        for _ in range(SETTLE_BURST):
            if time.monotonic() >= deadline:
                return medians
            timed = await server.complete(server.prompt(prompt_tokens, rng), output_tokens)
            if timed.tpot_s is not None:
                tpots.append(timed.tpot_s)
        if tpots:
            medians.append(statistics.median(tpots))
        recent = medians[-3:]
        settled = len(recent) == 3 and max(recent) <= SETTLE_AGREE * min(recent)
        if settled and time.monotonic() - started >= min_s:
            break
    return medians
