"""The accelerator catalogue: every record complete and held to the derivation rule, names resolved in one
place, an unknown accelerator reported (at config load and in /admin/v1/backends), and the simulator
running each added profile."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import httpx
import pytest

from backends.accelerators import (
    CATALOGUE,
    GUESS,
    REFERENCE,
    VENDORS,
    Accelerator,
    canonical,
    find,
    guess_note,
    names_for,
    prefill_tokens_per_step,
    priors,
)
from backends.launcher import LaunchError, LaunchSpec, build_launch
from backends.models import BackendConfig, PoolConfig, build_backends
from backends.sim.app import start_server
from backends.sim.options import SimOptions
from backends.sim.profiles import GPUS, EngineLimits, ProfileError, build_hardware
from backends.yamlfile import ConfigError
from gateway.admin.ops import backend_state
from gateway.batch.slowdown import LineShape, line_cost
from gateway.config.settings import settings_from_text
from loadtest.whatif.plan import PlanError, fleet_of, gpu_type
from loadtest.whatif.plan_cli import parse_gpu
from loadtest.whatif.simfleet import fleet_from_gateway_config

ROOT = Path(__file__).resolve().parents[3]
ADDED = ("b200", "h200", "a100", "l40s", "mi325x", "mi355x")
RUNTIME_OF_VENDOR = {"nvidia": "cuda", "amd": "rocm"}


def _derived_prefill(record: Accelerator) -> float:
    sheet, kernels = record.datasheet, record.kernels
    compute = sheet.fp16_tflops * kernels.flops_eff(1000)
    return compute / (sheet.bandwidth_tbps * kernels.bw_eff(1))


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_every_catalogued_accelerator_is_complete(name: str) -> None:
    record = CATALOGUE[name]
    assert record.name == name == name.lower()
    assert record.vendor in VENDORS and record.runtime == RUNTIME_OF_VENDOR[record.vendor]
    sheet = record.datasheet
    assert sheet.memory_gb > 0 and sheet.bandwidth_tbps > 0 and sheet.fp16_tflops > 0
    assert sheet.fp8_tflops is None or sheet.fp8_tflops >= 2 * sheet.fp16_tflops - 1
    assert (
        record.priors.tokens_per_second > 0 and 0 < record.priors.ttft_s < 1 and 0 < record.priors.tpot_s < 1
    )
    assert record.prefill_tokens_per_step > 0 and record.price_per_gpu_hour > 0
    assert record.tier in ("latency", "capacity")
    # every consumer finds it: routing, batch slowdown, simulator, planner, launcher
    assert priors(name) == record.priors and prefill_tokens_per_step(name) == record.prefill_tokens_per_step
    assert GPUS[record.profile].name == record.profile and GPUS[record.profile].vendor == record.vendor
    assert build_hardware(name, "llama-3.1-8b").kv_capacity_tokens > 8192
    planned = gpu_type(name, record.price_per_gpu_hour, "llama-3.1-8b", 8192)
    assert planned.profile == record.profile and planned.gpus_per_backend == 1
    group = fleet_of([planned], [1], "llama-3.1-8b").groups[0]
    assert (group.vendor, group.labels) == (record.vendor, {"tier": record.tier})
    assert name in names_for(record.runtime)
    assert build_launch(LaunchSpec(vendor=record.vendor, accelerator=name.upper(), model="m")).argv[:2] == (
        "vllm",
        "serve",
    )
    assert guess_note(name) is None


def test_names_and_aliases_never_collide() -> None:
    names = [n for record in CATALOGUE.values() for n in {record.name, record.profile, *record.aliases}]
    assert len(names) == len(set(names))
    assert set(ADDED) | {"h100", "mi300x"} == set(CATALOGUE)


@pytest.mark.parametrize("name", [n for n in CATALOGUE if n not in REFERENCE.values()])
def test_derived_records_follow_the_rule_from_their_runtime_reference(name: str) -> None:
    record = CATALOGUE[name]
    reference = CATALOGUE[REFERENCE[record.runtime]]
    bandwidth = record.datasheet.bandwidth_tbps / reference.datasheet.bandwidth_tbps
    compute = record.datasheet.fp16_tflops / reference.datasheet.fp16_tflops
    assert record.kernels == reference.kernels
    assert record.priors.tpot_s == pytest.approx(reference.priors.tpot_s / bandwidth, rel=0.005)
    assert record.priors.ttft_s == pytest.approx(reference.priors.ttft_s / compute, rel=0.005)
    expected_tokens = reference.priors.tokens_per_second * math.sqrt(bandwidth * compute)
    assert record.priors.tokens_per_second == pytest.approx(expected_tokens, rel=0.005)


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_prefill_per_decode_step_is_compute_over_bandwidth_at_the_kernels_efficiency(name: str) -> None:
    record = CATALOGUE[name]
    assert abs(record.prefill_tokens_per_step - _derived_prefill(record)) <= 1.0
    assert GUESS.prefill_tokens_per_step == min(r.prefill_tokens_per_step for r in CATALOGUE.values())


def test_every_accelerator_has_its_sources_in_the_documentation() -> None:
    doc = (ROOT / "docs" / "accelerators.md").read_text()
    rows = {m.group(1).lower(): m.group(0) for m in re.finditer(r"^\| (\w+) \|.*$", doc, re.MULTILINE)}
    for name, record in CATALOGUE.items():
        assert name in rows, f"{name} has no row in the documentation's table"
        assert (
            f"{record.datasheet.memory_gb:g}" in rows[name]
            and f"{record.price_per_gpu_hour:.2f}" in rows[name]
        )
    assert doc.count("Sources") >= 1 and all(f"**{name}**" in doc for name in CATALOGUE)


def test_aliases_resolve_to_one_record_for_every_consumer() -> None:
    assert canonical(" H100-SXM5 ") == canonical("h100-sxm") == "h100"
    assert find("MI300X") is CATALOGUE["mi300x"] and find("a100-sxm4-80gb") is CATALOGUE["a100"]
    assert find("h100-pcie") is None
    same = [build_hardware(name, "llama-3.1-8b") for name in ("h100", "h100-sxm5", "H100-80GB")]
    assert same[0] == same[1] == same[2]
    shape = LineShape()
    assert line_cost("h100-sxm5", shape) == line_cost("h100", shape) < line_cost("tpu-v9", shape)
    assert gpu_type("H100-SXM5", 2.9, "llama-3.1-8b", 8192).profile == "h100-sxm5"
    pools = [
        PoolConfig(
            name=name,
            vendor="nvidia",
            accelerator=name,
            price_per_gpu_hour=2.0,
            backends=[BackendConfig(url="http://127.0.0.1:9", models=["llama-8b"], max_model_len=8192)],
        )
        for name in ("h100", "H100-SXM5")
    ]
    plain, alias = (backend.pool for backend in build_backends(pools, environ={}))
    assert (
        alias.accelerator_guess is None and alias.accelerator == "h100-sxm5"
    )  # selectors see the config's name
    assert (alias.prior_ttft_s, alias.prior_tpot_s, alias.light_load_tpot_s, alias.memory_gb) == (
        plain.prior_ttft_s,
        plain.prior_tpot_s,
        plain.light_load_tpot_s,
        plain.memory_gb,
    )
    assert alias.cost_floor_per_mtok == plain.cost_floor_per_mtok


def test_an_unknown_accelerator_is_reported_at_config_load_and_in_the_backends_view(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = """\
pools:
  - name: tpu
    vendor: nvidia
    accelerator: TPU-v9
    price_per_gpu_hour: 2
    backends:
      - url: http://127.0.0.1:8001
        models: [meta-llama/Llama-3.1-8B-Instruct]
        max_model_len: 8192
  - name: b200
    vendor: nvidia
    accelerator: b200
    price_per_gpu_hour: 5
    backends:
      - url: http://127.0.0.1:8002
        models: [meta-llama/Llama-3.1-8B-Instruct]
        max_model_len: 8192
"""
    with caplog.at_level(logging.WARNING):
        settings = settings_from_text(config, "<test>")
    warned = [r.getMessage() for r in caplog.records if "TPU-v9" in r.getMessage()]
    assert len(warned) == 1
    assert "pool tpu" in warned[0] and "not in the catalogue" in warned[0]
    assert "10,000 tokens/s" in warned[0] and "TTFT 50 ms" in warned[0] and "b200" in warned[0]
    assert not [r for r in caplog.records if r.getMessage().startswith("pool b200")]

    tpu, b200 = settings.backends
    assert tpu.pool.prior_ttft_s == GUESS.priors.ttft_s and tpu.pool.light_load_tpot_s is None
    shown = backend_state(tpu)
    assert shown["accelerator"] == "tpu-v9" and shown["accelerator_guess"] == warned[0].split(": ", 1)[1]
    assert backend_state(b200)["accelerator_guess"] is None
    assert (
        b200.pool.prior_ttft_s == CATALOGUE["b200"].priors.ttft_s and b200.pool.light_load_tpot_s is not None
    )


def test_a_gateway_configs_fleet_is_simulated_on_the_catalogues_profiles(tmp_path: Path) -> None:
    pool = """\
  - name: {name}
    vendor: {vendor}
    accelerator: {accelerator}
    price_per_gpu_hour: 2
    backends:
      - {{url: "http://127.0.0.1:{port}", models: [llama-3.1-8b], max_model_len: 8192}}
"""
    pools = [("h", "nvidia", "H100-SXM5", 8001), ("b", "nvidia", "b200", 8002), ("m", "amd", "mi355x", 8003)]
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "pools:\n" + "".join(pool.format(name=n, vendor=v, accelerator=a, port=p) for n, v, a, p in pools)
    )
    fleet = fleet_from_gateway_config(str(config))
    assert [g.profile.gpu for g in fleet.groups if g.profile] == ["h100-sxm5", "b200", "mi355x"]
    config.write_text("pools:\n" + pool.format(name="t", vendor="nvidia", accelerator="tpu-v9", port=8001))
    with pytest.raises(ConfigError, match="pool `t`: no GPU profile for accelerator `tpu-v9`"):
        fleet_from_gateway_config(str(config))


def test_unknown_names_are_refused_where_a_guess_cannot_stand() -> None:
    with pytest.raises(ProfileError, match=r"unknown GPU profile `tpu-v9`; known: h100-sxm5, h200, b200"):
        build_hardware("tpu-v9", "llama-3.1-8b")
    with pytest.raises(PlanError, match="unknown GPU; known: a100, b200"):
        gpu_type("tpu-v9", 1.0, "llama-3.1-8b", 8192)
    with pytest.raises(PlanError, match="unknown GPU"):
        parse_gpu("tpu-v9")
    assert parse_gpu("B200") == ("B200", CATALOGUE["b200"].price_per_gpu_hour)
    assert parse_gpu("b200=4.10") == ("b200", 4.10)
    with pytest.raises(LaunchError, match="not a CUDA GPU; known: h100, h200, b200, a100, l40s"):
        build_launch(LaunchSpec(vendor="nvidia", accelerator="mi355x", model="m"))
    with pytest.raises(LaunchError, match="not a ROCm GPU; known: mi300x, mi325x, mi355x"):
        build_launch(LaunchSpec(vendor="amd", accelerator="b200", model="m"))
    rocm = build_launch(LaunchSpec(vendor="amd", accelerator="mi355x", model="m"))
    assert rocm.env["VLLM_ROCM_USE_AITER"] == "1" and "CUDA_VISIBLE_DEVICES" not in rocm.env


def test_vllm_gives_a100_and_small_gpus_the_small_scheduler_defaults() -> None:
    small = EngineLimits(max_num_seqs=256, max_num_batched_tokens=2048)
    assert build_hardware("a100", "llama-3.1-8b").limits == small
    assert build_hardware("l40s", "llama-3.1-8b").limits == small
    assert build_hardware("b200", "llama-3.1-8b").limits == EngineLimits()
    assert build_hardware("mi355x", "llama-3.1-8b").limits == EngineLimits()
    assert build_hardware("a100", "llama-3.1-8b", overrides={"max_num_seqs": 64}).limits.max_num_seqs == 64


@pytest.mark.parametrize("name", ADDED)
async def test_the_simulator_serves_from_each_added_profile(name: str) -> None:
    options = SimOptions(
        models=("llama-3.1-8b",), hardware=build_hardware(name, "llama-3.1-8b"), time_scale=50.0
    )
    server = await start_server(options)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30) as http:
            body = {"prompt": " ".join(f"w{i}" for i in range(200)), "max_tokens": 20}
            response = await http.post("/v1/completions", json=body)
            metrics = (await http.get("/metrics")).text
    finally:
        await server.close()
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (200, 20)
    tpot = re.search(r"^vllm:request_time_per_output_token_seconds_sum(?:\{[^}]*\})? (\S+)$", metrics, re.M)
    assert tpot is not None
    # one sequence decodes at the weights' read over the bandwidth the GPU reaches at batch 1, plus overheads
    record = CATALOGUE[name]
    weights_read_s = 8.03e9 * 2 / (record.datasheet.bandwidth_tbps * 1e12 * record.kernels.bw_eff(1))
    assert weights_read_s < float(tpot.group(1)) < weights_read_s * 1.6


def test_a_pool_whose_vendor_is_not_its_accelerators_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def pool(name: str, vendor: str, accelerator: str) -> PoolConfig:
        return PoolConfig(
            name=name,
            vendor=vendor,  # type: ignore[arg-type]
            accelerator=accelerator,
            price_per_gpu_hour=1.0,
            backends=[BackendConfig(url="http://127.0.0.1:9", models=["m"], max_model_len=8192)],
        )

    with caplog.at_level(logging.WARNING):
        build_backends([pool("odd", "amd", "H100"), pool("fine", "nvidia", "h100")], environ={})
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["pool odd: accelerator `H100` is an nvidia GPU (backends/accelerators.py), not amd"]
