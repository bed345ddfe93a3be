"""Every figure the code used for H100 and MI300X before the accelerator catalogue, pinned through each
consumer (routing priors, batch slowdown, simulator, planner, launcher): moving the figures into one
catalogue must not change one of them. Exact equality on purpose: the same arithmetic on the same literals.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from backends.launcher import LaunchSpec, build_launch
from backends.model_size import REFERENCE_PARAMS_B
from backends.models import BackendConfig, Pool, PoolConfig, build_backends
from backends.sim.profiles import Curve, EngineLimits, GpuProfile, build_hardware
from gateway.batch.slowdown import LineShape, line_cost
from loadtest.whatif.plan import DEFAULT_PRICES, fleet_of, gpu_type

H100_SIM = GpuProfile(
    name="h100-sxm5",
    vendor="nvidia",
    memory_gib=80,
    hbm_bandwidth_tbps=3.35,
    bf16_tflops=989,
    bw_eff=Curve(small=0.80, large=0.86, half=32),
    flops_eff=Curve(small=0.30, large=0.65, half=512),
    attention_eff=0.6,
    step_overhead_ms=1.0,
    seq_overhead_us=6,
)
MI300X_SIM = GpuProfile(
    name="mi300x",
    vendor="amd",
    memory_gib=192,
    hbm_bandwidth_tbps=5.3,
    bf16_tflops=1307,
    bw_eff=Curve(small=0.40, large=0.75, half=128, steepness=0.5),
    flops_eff=Curve(small=0.30, large=0.60, half=256),
    attention_eff=0.35,
    step_overhead_ms=2.0,
    seq_overhead_us=6,
)


class Facts(NamedTuple):
    name: str
    vendor: str
    memory_gb: float
    tokens_per_s: float
    ttft_s: float
    tpot_s: float
    prefill_tokens_per_step: float


H100 = Facts("h100", "nvidia", 80, 17_700, 0.030, 0.0070, 195.0)
MI300X = Facts("mi300x", "amd", 192, 17_600, 0.040, 0.0090, 310.0)


def _pool(accelerator: str, vendor: str, models: list[str], gpus: int = 1, price: float = 2.0) -> Pool:
    config = PoolConfig(
        name="p",
        vendor=vendor,  # type: ignore[arg-type]
        accelerator=accelerator,
        price_per_gpu_hour=price,
        gpus_per_backend=gpus,
        backends=[BackendConfig(url="http://127.0.0.1:9", models=models, max_model_len=8192)],
    )
    return build_backends([config], environ={})[0].pool


@pytest.mark.parametrize("facts", [H100, MI300X], ids=["h100", "mi300x"])
def test_routing_priors_of_a_pool_are_unchanged(facts: Facts) -> None:
    name, vendor, memory_gb, tokens_per_s, ttft_s, tpot_s, _ = facts
    unsized = _pool(name.upper(), vendor, ["tiny"], gpus=2, price=2.5)
    assert (unsized.accelerator, unsized.memory_gb) == (name, memory_gb * 2)
    assert (unsized.prior_ttft_s, unsized.prior_tpot_s, unsized.light_load_tpot_s) == (ttft_s, tpot_s, None)
    assert unsized.saturated_tokens_per_s == tokens_per_s * 2 / 1.0
    assert unsized.cost_floor_per_mtok == 2.5 * 2 / 3600.0 / (tokens_per_s * 2 / 1.0) * 1e6

    sized = _pool(name, vendor, ["meta-llama/Llama-3.1-70B-Instruct"], gpus=2, price=2.5)
    scale = 70.0 / REFERENCE_PARAMS_B
    assert sized.model_scale == scale
    assert sized.prior_ttft_s == ttft_s
    assert sized.prior_tpot_s == sized.light_load_tpot_s == tpot_s * scale / 2
    assert sized.saturated_tokens_per_s == tokens_per_s * 2 / scale
    assert sized.cost_floor_per_mtok == 2.5 * 2 / 3600.0 / (tokens_per_s * 2 / scale) * 1e6


@pytest.mark.parametrize("facts", [H100, MI300X], ids=["h100", "mi300x"])
def test_batch_line_cost_is_unchanged(facts: Facts) -> None:
    name, prefill = facts.name, facts.prefill_tokens_per_step
    for prompt, output in ((1000.0, 200.0), (30_000.0, 5.0), (10.0, 0.2)):
        shape = LineShape(prompt_tokens=prompt, output_tokens=output)
        out = max(output, 1.0)
        assert line_cost(name, shape) == prompt / (prefill * out) + (prompt + out) * 2.5e-6


@pytest.mark.parametrize(("name", "profile"), [("h100-sxm5", H100_SIM), ("mi300x", MI300X_SIM)])
def test_simulator_profile_is_unchanged(name: str, profile: GpuProfile) -> None:
    for model, gpus in (("llama-3.1-8b", 1), ("llama-3.1-70b", 2)):
        hardware = build_hardware(name, model, gpus)
        assert hardware.gpu == profile
        assert hardware.limits == EngineLimits(
            block_size=16, max_num_seqs=1024, max_num_batched_tokens=8192, gpu_memory_utilization=0.9
        )
        assert (hardware.gpu.non_kv_reserve_gib, hardware.gpu.tp_efficiency) == (1.5, 0.9)
    assert build_hardware("h100-sxm5", "llama-3.1-8b").kv_capacity_tokens == 454_992
    assert build_hardware("mi300x", "llama-3.1-8b").kv_capacity_tokens == 1_280_752


def test_planner_types_prices_and_tiers_are_unchanged() -> None:
    assert DEFAULT_PRICES == {"h100": 2.90, "mi300x": 1.75}
    h100 = gpu_type("H100", 2.90, "llama-3.1-8b", 8192)
    mi300x = gpu_type("mi300x", 1.75, "llama-3.1-8b", 8192)
    assert (h100.name, h100.profile, h100.gpus_per_backend, h100.max_model_len) == (
        "h100",
        "h100-sxm5",
        1,
        8192,
    )
    assert (mi300x.name, mi300x.profile, mi300x.gpus_per_backend) == ("mi300x", "mi300x", 1)
    assert gpu_type("h100-sxm5", 2.9, "llama-3.1-8b", 100).profile == "h100-sxm5"
    assert gpu_type("h100", 2.9, "llama-3.1-70b", 20_000).gpus_per_backend == 2
    assert gpu_type("mi300x", 1.75, "llama-3.1-70b", 20_000).gpus_per_backend == 1
    fleet = fleet_of([h100, mi300x], [2, 3], "llama-3.1-8b")
    shapes = [(g.pool, g.vendor, g.accelerator, g.labels, g.profile and g.profile.gpu) for g in fleet.groups]
    assert shapes == [
        ("h100", "nvidia", "h100", {"tier": "latency"}, "h100-sxm5"),
        ("mi300x", "amd", "mi300x", {"tier": "capacity"}, "mi300x"),
    ]


def test_launcher_commands_are_unchanged() -> None:
    rocm = build_launch(LaunchSpec(vendor="amd", model="m", tensor_parallel_size=2, python="py"))
    assert rocm.env == {
        "VLLM_ROCM_USE_AITER": "1",
        "HIP_FORCE_DEV_KERNARG": "1",
        "TORCH_BLAS_PREFER_HIPBLASLT": "1",
        "SAFETENSORS_FAST_GPU": "1",
        "HIP_VISIBLE_DEVICES": "0,1",
        "NCCL_MIN_NCHANNELS": "112",
    }
    assert (
        build_launch(LaunchSpec(vendor="amd", accelerator="MI300X", model="m")).argv
        == build_launch(LaunchSpec(vendor="amd", model="m")).argv
    )
    cuda = build_launch(LaunchSpec(vendor="nvidia", model="m", tensor_parallel_size=2))
    assert cuda.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert cuda.argv == (
        "vllm", "serve", "m", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9",
        "--host", "127.0.0.1", "--port", "8000",
    )  # fmt: skip
    assert build_launch(LaunchSpec(vendor="nvidia", accelerator="h100", model="m")) == build_launch(
        LaunchSpec(vendor="nvidia", model="m")
    )
