"""Coasting: a run of decode-only steps applied in one go, the replay's shortcut (loadtest/whatif/replay.py).

While nothing waits to be admitted, every running request has prefilled, none finishes and nothing arrives,
each engine step is the same decode of the same sequences one token longer: its duration follows from the
performance model alone. Those steps are applied at once (the same steps, the same durations, the same
token times for everything a report reads); the step that finishes a request runs on its own.
"""

from __future__ import annotations

from backends.sim.perf import StepWork
from loadtest.whatif.simfleet import SimBackend


def coast(sim: SimBackend, start: float, horizon: float) -> tuple[float, int]:
    """Apply the decode-only steps that start before `horizon` (the next arrival, scrape or anything that
    may send a request) and finish no request; returns when the next step starts and the steps applied
    (`start`, 0 when none can be: something waits, is prefilling, or a new KV block would be missing)."""
    scheduler, perf = sim.scheduler, sim.perf
    assert scheduler is not None and perf is not None
    running = scheduler.running
    if scheduler.waiting or not running or start >= horizon:
        return start, 0
    room = min(g.steps - g.generated for g in running) - 1  # the finishing step runs on its own
    if room < 2 or any(g.computed < g.target for g in running):
        return start, 0
    seqs = sum(g.n for g in running)
    context = sum(g.n * (g.prompt_tokens + g.generated) for g in running)
    steps, t = 0, start
    step_seconds = perf.step_seconds
    while steps < room and t < horizon:
        t += step_seconds(StepWork(decode_seqs=seqs, decode_context=context), t)
        context += seqs
        steps += 1
    pool = scheduler.pool
    grow = [
        pool.blocks_for(g.prompt_tokens + g.n * (g.generated + steps)) - g.holding.blocks for g in running
    ]
    if steps < 2 or sum(grow) > pool.free:
        return start, 0
    for group, blocks in zip(running, grow, strict=True):
        if blocks > 0:
            pool.grow(group.holding, blocks)
        group.generated += steps
        group.last_token_at = t
    sim.stats.generation_tokens += seqs * steps
    sim.stats.kv_tokens = pool.used * scheduler.limits.block_size
    sim.busy_s += t - start
    return t, steps
