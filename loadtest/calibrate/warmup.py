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
