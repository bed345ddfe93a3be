"""When requests arrive: a Poisson process, a linear ramp, or the timestamps of a recorded trace.

Every process is open-loop: arrival times are fixed before the run, never by how fast answers come back.
All times are simulated seconds from the start of the run; every generator is bounded by a duration and
a count, and the same seed always gives the same times.

A trace is JSONL, one request per line, in any order (sorted on load):

    {"t": 0.42, "class": "chat", "prompt_tokens": 350, "output_tokens": 120}
    {"t": 0.97, "class": "rag", "document": 3}

Only `t` is required; what a line leaves out is drawn from its class (or from the scenario's mix).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import msgspec


def poisson_times(rate: float, duration_s: float, rng: random.Random, limit: int) -> list[float]:
    """Arrival times of a Poisson process of `rate` per second in [0, duration_s), at most `limit`."""
    times: list[float] = []
    if rate <= 0:
        return times
    t = rng.expovariate(rate)
    while t < duration_s and len(times) < limit:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def ramp_times(
    start_rate: float, end_rate: float, duration_s: float, rng: random.Random, limit: int
) -> list[float]:
    """A Poisson process whose rate moves linearly from `start_rate` to `end_rate` (thinning)."""
    peak = max(start_rate, end_rate)
    times: list[float] = []
    if peak <= 0:
        return times
    for t in poisson_times(peak, duration_s, rng, limit=10 * limit + 1000):
        rate = start_rate + (end_rate - start_rate) * t / duration_s
        if rng.random() * peak < rate:
            times.append(t)
            if len(times) >= limit:
                break
    return times


def burst_times(
    rate: float,
    burst_rate: float,
    every_s: float,
    burst_s: float,
    duration_s: float,
    rng: random.Random,
    limit: int,
) -> list[float]:
    """Poisson at `rate`, at `burst_rate` in the first `burst_s` of every `every_s` (by thinning)."""
    peak = max(rate, burst_rate)
    times: list[float] = []
    for t in poisson_times(peak, duration_s, rng, limit=10 * limit + 1000):
        current = burst_rate if t % every_s < burst_s else rate
        if rng.random() * peak < current:
            times.append(t)
            if len(times) >= limit:
                break
    return times


def expected_ramp_count(start_rate: float, end_rate: float, duration_s: float) -> float:
    return (start_rate + end_rate) / 2 * duration_s


class TraceEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, rename={"cls": "class"}):
    t: float
    cls: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    n: int | None = None
    priority: str | None = None
    document: int | None = None


class TraceError(ValueError):
    """A trace line that cannot be replayed; the message names the file and line."""


_decoder = msgspec.json.Decoder(TraceEntry)


def load_trace(path: Path, duration_s: float | None = None, limit: int | None = None) -> list[TraceEntry]:
    """The trace's entries sorted by time, shifted so the first arrives at 0, within the bounds."""
    entries: list[TraceEntry] = []
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = _decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise TraceError(f"{path}:{number}: {exc}") from None
            if not math.isfinite(entry.t) or entry.t < 0:
                raise TraceError(f"{path}:{number}: `t` must be a finite, non-negative number of seconds")
            entries.append(entry)
    entries.sort(key=lambda e: e.t)
    if entries:
        origin = entries[0].t
        entries = [msgspec.structs.replace(e, t=e.t - origin) for e in entries]
    if duration_s is not None:
        entries = [e for e in entries if e.t < duration_s]
    return entries[:limit] if limit is not None else entries
