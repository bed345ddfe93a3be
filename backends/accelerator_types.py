"""The shape of one accelerator's record in the catalogue (backends/accelerators.py holds the records)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Vendor = Literal["amd", "nvidia"]
VENDORS: tuple[Vendor, ...] = ("amd", "nvidia")
Runtime = Literal["cuda", "rocm"]
"""The vLLM build and environment a backend runs: CUDA (NVIDIA) or ROCm (AMD)."""
Tier = Literal["latency", "capacity"]
"""The `tier` label a generated fleet gives its pool: where latency-bound work goes first, or bulk work."""


@dataclass(frozen=True, slots=True)
class Curve:
    """Efficiency as a saturating (Hill) curve of parallel work x.

    e(x) = small + (large - small) * x^s / (x^s + half^s), with s = `steepness`: `small` with no work,
    half way at x = half, tending to `large`. s < 1 rises early and keeps climbing slowly (a wide GPU
    that keeps gaining from more sequences long after a narrow one has saturated).
    """

    small: float
    large: float
    half: float
    steepness: float = 1.0

    def __call__(self, x: float) -> float:
        if x <= 0:
            return self.small
        grown = (x / self.half) ** self.steepness
        return self.small + (self.large - self.small) * grown / (1.0 + grown)


@dataclass(frozen=True, slots=True)
class Datasheet:
    """The vendor's figures for one GPU (dense, without structured sparsity)."""

    memory_gb: float
    """As the vendor quotes it; the simulator reads it as GiB (an "80 GB" H100 has 80 GiB of HBM3)."""
    bandwidth_tbps: float
    fp16_tflops: float
    """Dense FP16/BF16 tensor throughput."""
    fp8_tflops: float | None
    """Dense FP8 tensor throughput; None where the GPU has no FP8 (A100)."""


@dataclass(frozen=True, slots=True)
class Priors:
    """What routing assumes before it has measured the backend: an 8B model under vLLM on one GPU."""

    tokens_per_second: float
    """Saturated single-GPU throughput."""
    ttft_s: float
    """Typical time to first token for a short prompt at low load."""
    tpot_s: float
    """Typical time per output token at small batch."""


@dataclass(frozen=True, slots=True)
class Kernels:
    """How close the runtime's kernels get to the datasheet: the simulator's efficiency figures."""

    bw_eff: Curve
    """Achieved fraction of memory bandwidth, by decode batch size (sequences)."""
    flops_eff: Curve
    """Achieved fraction of peak FLOP/s in GEMMs, by tokens in the step (GEMM rows)."""
    attention_eff: float
    """Achieved fraction of peak FLOP/s in attention (FlashAttention 3 vs 2)."""
    step_overhead_ms: float
    """Per engine step: scheduling, sampling, kernel launches."""
    seq_overhead_us: float
    """Per running sequence per step: input prep, detokenization."""


@dataclass(frozen=True, slots=True)
class Accelerator:
    """Everything the gateway, the batch scheduler, the simulator, the planner and the launcher know about
    one kind of GPU."""

    name: str
    """The catalogue's name, as pools and `--gpu` give it: `h100`."""
    vendor: Vendor
    runtime: Runtime
    datasheet: Datasheet
    priors: Priors
    prefill_tokens_per_step: float
    """Prompt tokens it prefills in the time of one decode step: FP16 FLOP/s x flops_eff(1000 tokens) over
    bandwidth x bw_eff(1 sequence) (gateway/batch/slowdown.py)."""
    kernels: Kernels
    price_per_gpu_hour: float
    """Typical on-demand cloud price (USD), the planner's default."""
    tier: Tier
    profile: str
    """The simulator's name for its GPU profile (`h100-sxm5`: the part the figures are for)."""
    aliases: tuple[str, ...] = ()
    """Other names pools and fleet files use for it (`h100-sxm5`, `h100-sxm`)."""
