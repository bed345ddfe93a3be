"""The accelerator catalogue: one record per GPU, read by routing (backends/models.py), batch scheduling
(gateway/batch/slowdown.py), the simulator (backends/sim/profiles.py), the planner (loadtest/whatif/plan.py)
and the launcher (backends/launcher.py). Names are resolved here once (`h100-sxm5` is `h100`).

Sources per record (datasheet, price); the table and the sources are in docs/incoming/accel-catalogue.md.
H100 and MI300X are the measured references (backends/gpu_facts.md); every other record's priors follow
from its datasheet by one rule, relative to the reference of its runtime (H100 for CUDA, MI300X for ROCm):

    tpot_s            x reference bandwidth / bandwidth      (a small-batch decode step reads the weights)
    ttft_s            x reference FP16 FLOP/s / FP16 FLOP/s  (a short prompt's prefill is compute-bound)
    tokens_per_second x sqrt(bandwidth ratio x FLOP/s ratio) (a saturated batch is bound by both: GEMMs,
                                                              and weight and KV reads)

and its kernels (the simulator's efficiency curves) are its runtime reference's: nothing but the datasheet
separates two GPUs of one runtime. `prefill_tokens_per_step` is FP16 FLOP/s x flops_eff(1000 tokens) over
bandwidth x bw_eff(1 sequence). tests/unit/backends/test_accelerators.py holds every record to the rule.

An accelerator the catalogue does not know gets `GUESS` and is reported (a warning at config load, and
`accelerator_guess` in /admin/v1/backends), never silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from backends.accelerator_types import (
    VENDORS,
    Accelerator,
    Curve,
    Datasheet,
    Kernels,
    Priors,
    Runtime,
    Tier,
    Vendor,
)
from backends.calibrated import CalibratedProfile, load_profile

__all__ = [
    "CATALOGUE",
    "CUDA_KERNELS",
    "GUESS",
    "REFERENCE",
    "ROCM_KERNELS",
    "VENDORS",
    "Accelerator",
    "Curve",
    "Datasheet",
    "Guess",
    "Kernels",
    "Priors",
    "Runtime",
    "Tier",
    "Vendor",
    "calibrated",
    "canonical",
    "find",
    "guess_note",
    "load_calibrated",
    "names_for",
    "prefill_tokens_per_step",
    "priors",
    "priors_for",
]

# CUDA's mature kernels (FlashAttention 3, CUDA graphs) reach high efficiency with little work; ROCm's need
# many sequences in flight to saturate a wide GPU (backends/sim/profiles.py says more).
CUDA_KERNELS = Kernels(
    bw_eff=Curve(small=0.80, large=0.86, half=32),
    flops_eff=Curve(small=0.30, large=0.65, half=512),
    attention_eff=0.6,
    step_overhead_ms=1.0,
    seq_overhead_us=6,
)
ROCM_KERNELS = Kernels(
    bw_eff=Curve(small=0.40, large=0.75, half=128, steepness=0.5),
    flops_eff=Curve(small=0.30, large=0.60, half=256),
    attention_eff=0.35,
    step_overhead_ms=2.0,
    seq_overhead_us=6,
)

_RECORDS = (
    # The CUDA reference. NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, FP16 989 and
    # FP8 1,979 TFLOPS dense. Priors and price: backends/gpu_facts.md (17.7k tokens/s on Llama-3.1-8B under
    # vLLM; $2.90/h at one marketplace).
    Accelerator(
        name="h100",
        vendor="nvidia",
        runtime="cuda",
        datasheet=Datasheet(memory_gb=80, bandwidth_tbps=3.35, fp16_tflops=989, fp8_tflops=1979),
        priors=Priors(tokens_per_second=17_700, ttft_s=0.030, tpot_s=0.0070),
        prefill_tokens_per_step=195.0,
        kernels=CUDA_KERNELS,
        price_per_gpu_hour=2.90,
        tier="latency",
        profile="h100-sxm5",
        aliases=("h100-sxm5", "h100-sxm", "h100-80gb"),
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, FP16 989 and FP8 1,979 TFLOPS
    # dense. Price: backends/gpu_facts.md ($4.50/h on-demand).
    Accelerator(
        name="h200",
        vendor="nvidia",
        runtime="cuda",
        datasheet=Datasheet(memory_gb=141, bandwidth_tbps=4.8, fp16_tflops=989, fp8_tflops=1979),
        priors=Priors(tokens_per_second=21_200, ttft_s=0.030, tpot_s=0.00489),
        prefill_tokens_per_step=136.0,
        kernels=CUDA_KERNELS,
        price_per_gpu_hour=4.50,
        tier="latency",
        profile="h200",
        aliases=("h200-sxm", "h200-141gb"),
    ),
    # NVIDIA HGX B200 / DGX B200 datasheets, per GPU: 180 GB HBM3e (1,440 GB per 8), 8 TB/s, FP16 2.25 and
    # FP8 4.5 PFLOPS dense (4.5 and 9 with sparsity). Price: specialised clouds' on-demand $4.50-6.00/h in
    # 2026 (Lyceum, "NVIDIA B200 GPU Cloud Pricing 2026"), the middle.
    Accelerator(
        name="b200",
        vendor="nvidia",
        runtime="cuda",
        datasheet=Datasheet(memory_gb=180, bandwidth_tbps=8.0, fp16_tflops=2250, fp8_tflops=4500),
        priors=Priors(tokens_per_second=41_300, ttft_s=0.0132, tpot_s=0.00293),
        prefill_tokens_per_step=186.0,
        kernels=CUDA_KERNELS,
        price_per_gpu_hour=5.25,
        tier="latency",
        profile="b200",
        aliases=("b200-sxm", "b200-180gb"),
    ),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB): 80 GB HBM2e, 2,039 GB/s, FP16 312 TFLOPS dense, no
    # FP8. Price: specialised clouds' on-demand $1.10-1.50/h (Mercatus, cloud GPU pricing, May 2026).
    # vLLM gives it the small-GPU scheduler defaults (256 sequences, 2,048 tokens a step).
    Accelerator(
        name="a100",
        vendor="nvidia",
        runtime="cuda",
        datasheet=Datasheet(memory_gb=80, bandwidth_tbps=2.039, fp16_tflops=312, fp8_tflops=None),
        priors=Priors(tokens_per_second=7_760, ttft_s=0.0951, tpot_s=0.0115),
        prefill_tokens_per_step=101.0,
        kernels=CUDA_KERNELS,
        price_per_gpu_hour=1.30,
        tier="capacity",
        profile="a100",
        aliases=("a100-80gb", "a100-sxm4", "a100-sxm4-80gb"),
    ),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, FP16/BF16 362 and FP8 733 TFLOPS dense. Price: median
    # $0.92/h over ten providers (rentgpu.org, 2026); RunPod $0.86, Vultr $1.67, AWS g6e $1.86.
    Accelerator(
        name="l40s",
        vendor="nvidia",
        runtime="cuda",
        datasheet=Datasheet(memory_gb=48, bandwidth_tbps=0.864, fp16_tflops=362.05, fp8_tflops=733),
        priors=Priors(tokens_per_second=5_440, ttft_s=0.0820, tpot_s=0.0271),
        prefill_tokens_per_step=278.0,
        kernels=CUDA_KERNELS,
        price_per_gpu_hour=0.92,
        tier="capacity",
        profile="l40s",
        aliases=("l40s-48gb",),
    ),
    # The ROCm reference. AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s, FP16 1,307 and FP8 2,615
    # TFLOPS dense. Priors and price: backends/gpu_facts.md (16.5k-18.8k tokens/s; $1.75/h mid-market).
    Accelerator(
        name="mi300x",
        vendor="amd",
        runtime="rocm",
        datasheet=Datasheet(memory_gb=192, bandwidth_tbps=5.3, fp16_tflops=1307, fp8_tflops=2615),
        priors=Priors(tokens_per_second=17_600, ttft_s=0.040, tpot_s=0.0090),
        prefill_tokens_per_step=310.0,
        kernels=ROCM_KERNELS,
        price_per_gpu_hour=1.75,
        tier="capacity",
        profile="mi300x",
        aliases=("mi300x-192gb",),
    ),
    # AMD Instinct MI325X datasheet: 256 GB HBM3e, 6 TB/s, FP16 1,307 and FP8 2,615 TFLOPS dense. Price:
    # TensorWave $1.95/h (Cliff Center, "AMD inference economics", May 2026).
    Accelerator(
        name="mi325x",
        vendor="amd",
        runtime="rocm",
        datasheet=Datasheet(memory_gb=256, bandwidth_tbps=6.0, fp16_tflops=1307, fp8_tflops=2615),
        priors=Priors(tokens_per_second=18_700, ttft_s=0.040, tpot_s=0.00795),
        prefill_tokens_per_step=273.0,
        kernels=ROCM_KERNELS,
        price_per_gpu_hour=1.95,
        tier="capacity",
        profile="mi325x",
        aliases=("mi325x-256gb",),
    ),
    # AMD Instinct MI355X (AMD product page; The Register, 2025-06-12): 288 GB HBM3e, 8 TB/s, FP16 about 2.5
    # and FP8 about 5 PFLOPS dense. Price: no public list price found; an estimate, B200's price at the
    # MI300X/H100 price ratio (5.25 x 1.75 / 2.90).
    Accelerator(
        name="mi355x",
        vendor="amd",
        runtime="rocm",
        datasheet=Datasheet(memory_gb=288, bandwidth_tbps=8.0, fp16_tflops=2500, fp8_tflops=5000),
        priors=Priors(tokens_per_second=29_900, ttft_s=0.0209, tpot_s=0.00596),
        prefill_tokens_per_step=393.0,
        kernels=ROCM_KERNELS,
        price_per_gpu_hour=3.15,
        tier="capacity",
        profile="mi355x",
        aliases=("mi355x-288gb",),
    ),
)
CATALOGUE: dict[str, Accelerator] = {a.name: a for a in _RECORDS}
REFERENCE: dict[Runtime, str] = {"cuda": "h100", "rocm": "mi300x"}
"""The measured record each runtime's other records are derived from."""
_NAMES: dict[str, str] = {alias: a.name for a in _RECORDS for alias in (a.name, a.profile, *a.aliases)}


@dataclass(frozen=True, slots=True)
class Guess:
    """What an accelerator the catalogue does not know is assumed to be."""

    memory_gb: float
    priors: Priors
    prefill_tokens_per_step: float


GUESS = Guess(
    memory_gb=80,
    priors=Priors(tokens_per_second=10_000, ttft_s=0.050, tpot_s=0.0100),
    prefill_tokens_per_step=min(a.prefill_tokens_per_step for a in _RECORDS),  # the costliest prefill
)


def canonical(name: str) -> str:
    """The catalogue's name for `name` (`H100-SXM5` -> `h100`); an unknown name, lower-cased."""
    key = name.strip().lower()
    return _NAMES.get(key, key)


def find(name: str) -> Accelerator | None:
    record = CATALOGUE.get(name)  # the routing path's case: a pool's name, already the catalogue's
    return record if record is not None else CATALOGUE.get(canonical(name))


def priors(name: str) -> Priors:
    record = find(name)
    return record.priors if record is not None else GUESS.priors


def prefill_tokens_per_step(name: str, models: Iterable[str] = ()) -> float:
    for model in models:
        measured = calibrated(name, model)
        if measured is not None:
            return measured[1].prefill_tokens_per_step
    record = find(name)
    return record.prefill_tokens_per_step if record is not None else GUESS.prefill_tokens_per_step


def names_for(runtime: Runtime) -> tuple[str, ...]:
    return tuple(a.name for a in _RECORDS if a.runtime == runtime)


def guess_note(name: str) -> str | None:
    """None for a catalogued accelerator; else what is guessed for it, naming it."""
    if find(name) is not None:
        return None
    p = GUESS.priors
    return (
        f"accelerator `{name}` is not in the catalogue (backends/accelerators.py); guessing "
        f"{GUESS.memory_gb:g} GB per GPU, {p.tokens_per_second:,.0f} tokens/s, TTFT {p.ttft_s * 1000:g} ms, "
        f"TPOT {p.tpot_s * 1000:g} ms, {GUESS.prefill_tokens_per_step:g} prefill tokens per decode step, and "
        f"no saturation.max_slowdown mark; known: {', '.join(CATALOGUE)}"
    )


# Measured profiles: `switchyard calibrate` writes one per accelerator and model (backends/calibrated.py).
# A folder of them named by SWITCHYARD_PROFILES is read once; each record found there replaces the
# datasheet priors above for its accelerator and model, in routing, the batch scheduler, the simulator,
# `whatif` and `plan`. A fresh install has none, and the datasheet records are what it uses.

PROFILES_ENV = "SWITCHYARD_PROFILES"
_calibrated: dict[tuple[str, str], tuple[Path, CalibratedProfile]] | None = None


def load_calibrated(
    folder: str | Path | None = None,
) -> dict[tuple[str, str], tuple[Path, CalibratedProfile]]:
    """The measured records of `folder` (default: $SWITCHYARD_PROFILES; none when unset), by (accelerator,
    model); raises ConfigError naming a file that is not a profile."""
    global _calibrated
    where = folder if folder is not None else os.environ.get(PROFILES_ENV)
    records: dict[tuple[str, str], tuple[Path, CalibratedProfile]] = {}
    if where:
        for path in sorted(Path(where).glob("*.yaml")):
            profile = load_profile(path)
            records[(canonical(profile.accelerator), profile.model)] = (path, profile)
    _calibrated = records
    return records


def calibrated(accelerator: str, model: str) -> tuple[Path, CalibratedProfile] | None:
    """The measured record of this accelerator serving this model, with its file; None when none is."""
    records = _calibrated if _calibrated is not None else load_calibrated()
    return records.get((canonical(accelerator), model))


def priors_for(accelerator: str, models: Iterable[str]) -> Priors:
    """The measured priors of the first of `models` calibrated on `accelerator`, else the datasheet's."""
    for model in models:
        record = calibrated(accelerator, model)
        if record is not None:
            return record[1].priors()
    return priors(accelerator)
