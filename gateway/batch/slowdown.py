"""How much one batch line slows the online requests decoding on the same backend: a pure estimate, in
fractions of one online decode step, so the cap holds whatever the policy knows about those requests'
SLOs (a class with no SLO in the policy is protected like one with a tight SLO).

vLLM runs every running sequence's next token in one step, and a chunk of any prompt being admitted in
the same step. A decode step streams the weights once (bandwidth-bound), so in units of that step (time
per output token of a lightly loaded backend) a batch line of P prompt and D output tokens costs:

    prefill    P / R once, R = prompt tokens the accelerator prefills in the time of one decode step
               (its compute over its bandwidth, at the efficiencies it reaches: backends/accelerators.py;
               an accelerator the catalogue does not know gets the lowest R, the costliest prefill);
               over the line's D steps of life that is P / (R x D) per step;
    decode     (P + D) x KV_READ_PER_TOKEN per step: the line's KV cache read alongside the weights.

k lines slow each online token by k x cost (as a fraction); the cap is max_online_slowdown / cost. The
step the fraction is taken of is the unloaded one (weights only): online requests with long contexts
make a real step longer, so the true fraction is smaller than this estimate, never larger.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from backends.accelerators import prefill_tokens_per_step

KV_READ_PER_TOKEN = 2.5e-6
"""One context token's KV read over the weights' read in a decode step: Llama-3.1-70B's 320 KiB per
token over its 141 GB. Smaller GQA models read relatively more (8B: 8e-6), still small next to prefill."""


@dataclass(slots=True)
class LineShape:
    """Prompt and output tokens of this replica's recent batch lines (moving averages of their usage)."""

    prompt_tokens: float = 1000.0
    output_tokens: float = 200.0
    weight: float = 0.1

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        w = self.weight
        self.prompt_tokens += w * (prompt_tokens - self.prompt_tokens)
        self.output_tokens += w * (max(output_tokens, 1) - self.output_tokens)


def line_cost(accelerator: str, shape: LineShape, models: Iterable[str] = ()) -> float:
    """The fraction of one online decode step a batch line adds, averaged over its life (`models`: the
    backend's, whose measured profile, if the catalogue has one, gives its prefill speed)."""
    tokens_per_step = prefill_tokens_per_step(accelerator, models)
    output = max(shape.output_tokens, 1.0)
    prefill = shape.prompt_tokens / (tokens_per_step * output)
    decode = (shape.prompt_tokens + output) * KV_READ_PER_TOKEN
    return prefill + decode


def slowdown_cap(online: int, cost: float, max_slowdown: float) -> int | None:
    """Batch lines a backend may run while `online` online requests are on it (None: no online request,
    nothing to slow; the other limits decide)."""
    if online <= 0:
        return None
    if cost <= 0:
        return None
    return max(0, math.floor(max_slowdown / cost + 1e-9))
