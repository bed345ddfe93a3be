"""GPU and model profiles for the performance model, and the engine geometry they imply.

The GPU profiles are the accelerator catalogue's records (backends/accelerators.py: the figures and their
public sources), named by the catalogue's names or aliases (`h100`, `h100-sxm5`). Memory is in GiB (an
"80 GB" H100 has 80 GiB of HBM3, a "192 GB" MI300X 192 GiB), bandwidth in TB/s and compute in dense
BF16 TFLOP/s, as vendors quote them.

The efficiency factors are what separates the vendors beyond the spec sheet. Each is a saturating
curve of how much parallel work a step offers (`Curve`): the fraction of peak a kernel reaches
grows with the batch (decode) or with the tokens in the step (GEMM rows), from `small` towards
`large`, reaching half way at `half`. CUDA's mature kernels (FlashAttention 3, CUDA graphs) reach
high efficiency with little work, so the H100 curves start high and saturate early; ROCm's kernels
need many sequences in flight to saturate MI300X's 304 compute units and 8 HBM stacks, so its
curves start lower and saturate late, at a higher ceiling of larger raw figures. H100's small-batch
lead and MI300X's large-batch lead both come out of these curves; nothing else is vendor-specific.

Every field can be overridden by name (see `OVERRIDABLE`), e.g. `bw_eff.half: 64` or
`hbm_bandwidth_tbps: 3.0`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from backends.accelerators import CATALOGUE, Accelerator, Curve, Vendor, calibrated, find
from backends.calibrated import CalibratedProfile, StepFit

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "GIB",
    "GPUS",
    "MODELS",
    "MODEL_ALIASES",
    "OVERRIDABLE",
    "Curve",
    "EngineLimits",
    "GpuProfile",
    "Hardware",
    "ModelProfile",
    "ProfileError",
    "build_hardware",
    "calibrated_hardware",
    "engine_defaults",
    "gpu_profile",
]

GIB = 1024**3


class ProfileError(ValueError):
    """A profile that does not exist, an unknown override, or a model that does not fit the GPUs."""


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    vendor: Vendor
    memory_gib: float
    hbm_bandwidth_tbps: float
    bf16_tflops: float
    bw_eff: Curve  # achieved fraction of HBM bandwidth, by decode batch size (sequences)
    flops_eff: Curve  # achieved fraction of peak FLOP/s in GEMMs, by tokens in the step (GEMM rows)
    attention_eff: float  # achieved fraction of peak FLOP/s in attention (FlashAttention 3 vs 2)
    step_overhead_ms: float  # per engine step: scheduling, sampling, kernel launches
    seq_overhead_us: float  # per running sequence per step: input prep, detokenization
    non_kv_reserve_gib: float = 1.5  # per GPU: activations, graphs, allocator slack
    tp_efficiency: float = 0.9  # fraction of linear scaling kept with tensor parallelism > 1


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    params_b: float  # billions of parameters
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # BF16

    @property
    def weights_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        """Dense FLOPs to process one token, attention excluded (2 per parameter)."""
        return 2.0 * self.params_b * 1e9

    @property
    def attention_flops_per_context_token(self) -> float:
        """FLOPs one token spends per token of context it attends to (QK^T and AV, every layer)."""
        return 4.0 * self.layers * self.hidden


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """vLLM's scheduler settings; these defaults are its OpenAI server's on a GPU with 70 GiB or more that is
    not an A100, 1,024 sequences and 8,192 tokens per step (`engine_defaults` picks them per GPU)."""

    block_size: int = 16
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9


def gpu_profile(accelerator: Accelerator) -> GpuProfile:
    sheet, kernels = accelerator.datasheet, accelerator.kernels
    return GpuProfile(
        name=accelerator.profile,
        vendor=accelerator.vendor,
        memory_gib=sheet.memory_gb,
        hbm_bandwidth_tbps=sheet.bandwidth_tbps,
        bf16_tflops=sheet.fp16_tflops,
        bw_eff=kernels.bw_eff,
        flops_eff=kernels.flops_eff,
        attention_eff=kernels.attention_eff,
        step_overhead_ms=kernels.step_overhead_ms,
        seq_overhead_us=kernels.seq_overhead_us,
    )


GPUS: dict[str, GpuProfile] = {a.profile: gpu_profile(a) for a in CATALOGUE.values()}
"""By profile name (`h100-sxm5`, `mi300x`); `build_hardware` also takes the catalogue's names and aliases."""


def engine_defaults(gpu: GpuProfile) -> EngineLimits:
    """vLLM's scheduler defaults for the OpenAI server on this GPU: 1,024 sequences and 8,192 tokens a step
    with 70 GiB or more unless it is an A100, else 256 and 2,048 (`EngineArgs.get_batch_defaults`)."""
    if gpu.memory_gib >= 70 and "a100" not in gpu.name:
        return EngineLimits()
    return EngineLimits(max_num_seqs=256, max_num_batched_tokens=2048)


MODELS: dict[str, ModelProfile] = {
    "llama-3.1-8b": ModelProfile(
        name="llama-3.1-8b", params_b=8.03, layers=32, hidden=4096, kv_heads=8, head_dim=128
    ),
    "llama-3.1-70b": ModelProfile(
        name="llama-3.1-70b", params_b=70.6, layers=80, hidden=8192, kv_heads=8, head_dim=128
    ),
}
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
}


@dataclass(frozen=True, slots=True)
class Hardware:
    """One backend: a model served on `gpus` GPUs of one kind (tensor parallel), with its KV geometry."""

    gpu: GpuProfile
    model: ModelProfile
    gpus: int
    limits: EngineLimits
    fitted: StepFit | None = None
    """A calibrated backend's measured step-time model, used instead of the datasheet roofline."""
    blocks: int | None = None
    """A calibrated backend's measured KV-cache blocks, instead of what memory leaves after the weights."""

    def front_end(self, running: int) -> float:
        """Front-end time before a request reaches the scheduler, with `running` sequences in flight
        (calibrated backends only)."""
        return self.fitted.front_end(running) if self.fitted is not None else 0.0

    def request_cv(self) -> float:
        """How much a calibrated front end's time varies from one request to the next (StepFit.request_cv)."""
        return self.fitted.request_cv if self.fitted is not None else 0.0

    def own_http_s(self) -> float:
        """Of a calibrated front end, the client's round trip that a simulator's client pays it anyway."""
        return self.fitted.http_s if self.fitted is not None else 0.0

    def admission_wait(self, running: int) -> float:
        """A calibrated backend's wait before scheduling a newcomer, with `running` sequences in flight."""
        return self.fitted.admission_wait(running) if self.fitted is not None else 0.0

    @property
    def kv_budget_bytes(self) -> float:
        usable = self.gpu.memory_gib * GIB * self.limits.gpu_memory_utilization * self.gpus
        return usable - self.model.weights_bytes - self.gpu.non_kv_reserve_gib * GIB * self.gpus

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.limits.block_size

    @property
    def num_blocks(self) -> int:
        if self.blocks is not None:
            return self.blocks
        return max(0, int(self.kv_budget_bytes // (self.model.kv_bytes_per_token * self.limits.block_size)))

    def describe(self) -> str:
        return f"{self.model.name} on {self.gpus}x {self.gpu.name}"


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


OVERRIDABLE: frozenset[str] = frozenset(
    {f"gpu.{n}" for n in _field_names(GpuProfile) - {"name", "vendor", "bw_eff", "flops_eff"}}
    | {f"gpu.{c}.{p}" for c in ("bw_eff", "flops_eff") for p in ("small", "large", "half", "steepness")}
    | {f"model.{n}" for n in _field_names(ModelProfile) - {"name"}}
    | {f"engine.{n}" for n in _field_names(EngineLimits)}
)


_Profile = TypeVar("_Profile", bound="DataclassInstance")


def _apply(obj: _Profile, path: list[str], value: float) -> _Profile:
    head, *rest = path
    current = getattr(obj, head)
    new = _apply(current, rest, value) if rest else type(current)(value)
    return dataclasses.replace(obj, **{head: new})


def _canonical(key: str) -> str:
    """Accept `hbm_bandwidth_tbps`, `bw_eff.half`, `kv_heads` or `max_num_seqs` without a section prefix."""
    if key in OVERRIDABLE:
        return key
    matches = [full for full in OVERRIDABLE if full.split(".", 1)[1] == key]
    if len(matches) == 1:
        return matches[0]
    raise ProfileError(f"unknown profile override `{key}`; known: {', '.join(sorted(OVERRIDABLE))}")


def build_hardware(
    gpu: str, model: str, gpus: int = 1, overrides: Mapping[str, float] | None = None
) -> Hardware:
    """Resolve named profiles plus overrides; refuses a model whose weights leave no room for KV cache.

    One GPU without overrides: a profile measured on that accelerator for that model (the catalogue's
    calibrated records, $SWITCHYARD_PROFILES) is used instead of the datasheet's."""
    model_key = MODEL_ALIASES.get(model, model)
    if gpus == 1 and not overrides:  # a profile measured on this accelerator for this model wins
        measured = calibrated(gpu, model) or calibrated(gpu, model_key)
        if measured is not None:
            return calibrated_hardware(measured[1])
    accelerator = find(gpu)
    if accelerator is None:
        raise ProfileError(f"unknown GPU profile `{gpu}`; known: {', '.join(GPUS)}")
    gpu_base = GPUS[accelerator.profile]
    if model_key not in MODELS:
        raise ProfileError(f"unknown model profile `{model}`; known: {', '.join(MODELS)}")
    if gpus < 1:
        raise ProfileError("gpus must be at least 1")
    gpu_chosen, model_profile, limits = gpu_base, MODELS[model_key], engine_defaults(gpu_base)
    for key, value in (overrides or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ProfileError(f"profile override `{key}` must be a number, got {value!r}")
        section, *path = _canonical(key).split(".")
        if section == "gpu":
            gpu_chosen = _apply(gpu_chosen, path, value)
        elif section == "model":
            model_profile = _apply(model_profile, path, value)
        else:
            limits = _apply(limits, path, value)
    hardware = Hardware(gpu=gpu_chosen, model=model_profile, gpus=gpus, limits=limits)
    min_blocks = 16  # at least one 256-token request must fit, or the engine could never run anything
    if hardware.num_blocks < min_blocks:
        utilization = hardware.limits.gpu_memory_utilization
        usable = hardware.gpu.memory_gib * utilization * gpus
        raise ProfileError(
            f"{hardware.describe()} does not fit: {hardware.model.weights_bytes / GIB:.1f} GiB of weights "
            f"in {usable:.1f} GiB usable (memory x gpu_memory_utilization {utilization}), "
            f"leaving no room for KV cache; use more GPUs (tensor parallelism) or a larger GPU"
        )
    return hardware


def calibrated_hardware(profile: CalibratedProfile) -> Hardware:
    """A backend timed by its measured profile (backends/calibrated.py): the fitted step model and the
    server's own scheduler limits and KV-cache blocks. The GPU record is the catalogue's when the profile
    names a catalogued accelerator, else a placeholder (a CPU server) that nothing reads."""
    accelerator = find(profile.accelerator)
    gpu = GPUS[accelerator.profile] if accelerator is not None else _placeholder_gpu(profile.accelerator)
    model = MODELS.get(MODEL_ALIASES.get(profile.model, profile.model)) or ModelProfile(
        name=profile.model, params_b=0.0, layers=1, hidden=1, kv_heads=1, head_dim=1
    )
    limits = profile.limits
    return Hardware(
        gpu=gpu,
        model=model,
        gpus=1,
        limits=EngineLimits(
            block_size=limits.block_size,
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
        ),
        fitted=profile.step,
        blocks=limits.num_blocks,
    )


def _placeholder_gpu(name: str) -> GpuProfile:
    reference = GPUS["h100-sxm5"]
    return dataclasses.replace(reference, name=name)
