"""Per-request bookkeeping against the engine statistics, from admission to finish or abort.

Each choice of a request counts as one engine request, as in vLLM v1 where `n > 1` fans out into
child requests: it is running until its last token, then finishes with its own reason.
"""

from __future__ import annotations

from backends.sim.metrics import EngineStats
from backends.sim.text import Generation


class RequestRun:
    def __init__(self, stats: EngineStats, prompt_tokens: int, generations: list[Generation]) -> None:
        self._stats = stats
        self._lengths = [len(g.tokens) for g in generations]
        self._reasons = [g.finish_reason for g in generations]
        self._done = [False] * len(generations)
        self._held = prompt_tokens
        self._elapsed = 0.0
        self._first = 0.0
        self.steps = max(self._lengths)
        stats.queue.observe(0.0)  # fixed timing has no queue
        stats.running += len(generations)
        stats.kv_tokens += prompt_tokens
        stats.prompt_tokens += prompt_tokens
        stats.prefix_cache_queries += prompt_tokens

    def step(self, step: int, seconds: float) -> None:
        """Record that every unfinished choice produced its token number `step`, `seconds` after the last.

        `seconds` are simulated seconds.
        """
        stats = self._stats
        self._elapsed += seconds
        if step == 0:
            self._first = self._elapsed
        latency = stats.ttft if step == 0 else stats.itl
        produced = 0
        for index, length in enumerate(self._lengths):
            if length <= step:
                continue
            produced += 1
            latency.observe(seconds)
            if length == step + 1:
                self._done[index] = True
                stats.running -= 1
                stats.finished[self._reasons[index]] += 1
                stats.e2e.observe(self._elapsed)
                if length > 1:
                    stats.tpot.observe((self._elapsed - self._first) / (length - 1))
        stats.generation_tokens += produced
        stats.kv_tokens += produced
        self._held += produced

    def close(self) -> None:
        """End the request; any choice still running counts as aborted. Safe to call twice."""
        stats = self._stats
        for index, done in enumerate(self._done):
            if not done:
                self._done[index] = True
                stats.running -= 1
                stats.finished["abort"] += 1
        stats.kv_tokens -= self._held
        self._held = 0
