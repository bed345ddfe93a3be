"""What the gateway assumes about an accelerator before it has measured anything (backends/gpu_facts.md).

Used as priors only: observed latency (per backend, measured by the gateway) and measured cost per token
(from the ledger) replace them as soon as they exist.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Accelerator:
    memory_gb: float
    tokens_per_second: float
    """Saturated single-GPU throughput serving an 8B model under vLLM."""
    ttft_s: float
    """Typical time to first token for a short prompt at low load."""
    tpot_s: float
    """Typical time per output token at small batch."""


ACCELERATORS: dict[str, Accelerator] = {
    "h100": Accelerator(memory_gb=80, tokens_per_second=17_700, ttft_s=0.030, tpot_s=0.0070),
    "h200": Accelerator(memory_gb=141, tokens_per_second=20_000, ttft_s=0.028, tpot_s=0.0055),
    "mi300x": Accelerator(memory_gb=192, tokens_per_second=17_600, ttft_s=0.040, tpot_s=0.0090),
    "mi325x": Accelerator(memory_gb=256, tokens_per_second=19_000, ttft_s=0.038, tpot_s=0.0080),
    "mi355x": Accelerator(memory_gb=288, tokens_per_second=21_000, ttft_s=0.035, tpot_s=0.0070),
}
UNKNOWN = Accelerator(memory_gb=80, tokens_per_second=10_000, ttft_s=0.050, tpot_s=0.0100)


def accelerator(name: str) -> Accelerator:
    return ACCELERATORS.get(name, UNKNOWN)
