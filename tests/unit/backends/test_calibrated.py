"""A measured profile (backends/calibrated.py): its file, and every consumer that reads it."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import backends.accelerators as catalogue
from backends.calibrated import (
    CalibratedProfile,
    FitError,
    Limits,
    StepFit,
    dump_profile,
    load_profile,
    parse_profile,
)
from backends.models import PoolConfig, build_backends
from backends.sim.metrics import EngineStats
from backends.sim.perf import PerfModel, StepWork
from backends.sim.profiles import build_hardware, calibrated_hardware
from backends.sim.scheduler import Group, Scheduler
from backends.yamlfile import ConfigError
from gateway.batch.slowdown import LineShape, line_cost
from tests.support import simulated_ttft

MODEL = "tiny-llama"
STEP = StepFit(
    step_s=0.002, per_seq_s=0.0001, per_prefill_token_s=0.00005, per_context_token_s=1e-7, request_s=0.01
)


def profile(accelerator: str = "mi300x", **step: float) -> CalibratedProfile:
    return CalibratedProfile(
        accelerator=accelerator,
        model=MODEL,
        step=StepFit(**{**{f: getattr(STEP, f) for f in STEP.__struct_fields__}, **step}),
        limits=Limits(
            block_size=16, num_blocks=512, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=512
        ),
        fit_error=FitError(ttft_mean=0.05, ttft_max=0.1, tpot_mean=0.04, tpot_max=0.08),
        saturated_tokens_per_second=1500.0,
    )


@pytest.fixture
def measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A catalogue with one measured record (mi300x, tiny-llama), restored afterwards."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "mi300x-tiny.yaml").write_text(dump_profile(profile()))
    monkeypatch.setenv(catalogue.PROFILES_ENV, str(folder))
    catalogue.load_calibrated()
    yield folder / "mi300x-tiny.yaml"
    monkeypatch.delenv(catalogue.PROFILES_ENV)
    catalogue.load_calibrated()


def test_profile_file_round_trips_and_bad_files_name_the_line(tmp_path: Path) -> None:
    original = profile()
    path = tmp_path / "p.yaml"
    path.write_text(dump_profile(original))
    assert load_profile(path) == original
    with pytest.raises(ConfigError, match=r"p\.yaml:\d+"):
        parse_profile(dump_profile(original).replace("step_s: 0.002", "step_s: -1"), "p.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path / "missing.yaml")


def test_priors_derive_from_the_step_model() -> None:
    p = profile()
    assert p.ttft_seconds(128) == pytest.approx(0.01 + 0.002 + 0.0001 + 128 * 0.00005)
    assert p.tpot_seconds(4, 100) == pytest.approx(0.002 + 4 * 0.0001 + 400 * 1e-7)
    priors = p.priors()
    assert priors.tokens_per_second == 1500.0 and priors.tpot_s == pytest.approx(p.tpot_seconds(1, 128))
    assert p.prefill_tokens_per_step == pytest.approx(p.tpot_seconds(1, 128) / 0.00005)


def test_calibrated_hardware_prices_steps_with_the_fit_and_keeps_the_servers_limits() -> None:
    hardware = calibrated_hardware(profile())
    assert hardware.num_blocks == 512 and hardware.kv_capacity_tokens == 512 * 16
    assert (hardware.limits.max_num_seqs, hardware.limits.block_size) == (8, 16)
    perf = PerfModel(hardware)
    work = StepWork(prefill_tokens=100, prefill_seqs=1, decode_seqs=3, decode_context=300)
    assert perf.step_seconds(work) == pytest.approx(STEP.step_seconds(4, 100, 300))
    assert perf.step_seconds(StepWork()) == 0.0
    assert hardware.admission_wait(0) == 0.0


def test_scheduler_does_not_admit_a_group_before_it_is_ready() -> None:
    hardware = calibrated_hardware(profile())
    stats = EngineStats(model_name=MODEL, kv_capacity_tokens=0)
    scheduler = Scheduler(hardware.limits, hardware.num_blocks, stats)
    group = Group(32, [], [4], ["length"], arrival=0.0, ready=0.5)
    scheduler.add(group)
    assert scheduler.plan(0.4).work.prefill_tokens == 0 and stats.waiting == 1
    assert scheduler.plan(0.5).work.prefill_tokens == 32 and stats.running == 1


async def test_simulator_from_a_profile_times_ttft_as_the_fit_predicts() -> None:
    p = profile(request_s=0.0)
    assert await simulated_ttft(p, 200) == pytest.approx(p.ttft_seconds(200), rel=0.02)


def test_catalogue_records_replace_the_datasheet_priors_for_their_model(measured: Path) -> None:
    found = catalogue.calibrated("MI300X-192GB", MODEL)
    assert found is not None and found[0] == measured
    assert catalogue.calibrated("mi300x", "other-model") is None
    assert catalogue.priors_for("mi300x", ["other", MODEL]) == profile().priors()
    assert catalogue.priors_for("mi300x", ["other"]) == catalogue.priors("mi300x")
    assert catalogue.prefill_tokens_per_step("mi300x", [MODEL]) == pytest.approx(
        profile().prefill_tokens_per_step
    )
    assert (
        catalogue.prefill_tokens_per_step("mi300x") == catalogue.CATALOGUE["mi300x"].prefill_tokens_per_step
    )


def test_routing_priors_batch_cost_and_simulator_read_the_measured_record(measured: Path) -> None:
    pools = [
        {
            "name": name,
            "vendor": "amd",
            "accelerator": "mi300x",
            "price_per_gpu_hour": 1.75,
            "backends": [{"url": f"http://127.0.0.1:1/{name}", "models": [model], "max_model_len": 512}],
        }
        for name, model in (("measured", MODEL), ("datasheet", "llama-3.1-8b"))
    ]

    by_pool = {
        b.pool.name: b.pool for b in build_backends(msgspec.convert(pools, list[PoolConfig]), environ={})
    }
    measured_pool, datasheet_pool = by_pool["measured"], by_pool["datasheet"]
    expected = profile().priors()
    assert measured_pool.calibrated and not datasheet_pool.calibrated
    assert (measured_pool.prior_ttft_s, measured_pool.prior_tpot_s) == (expected.ttft_s, expected.tpot_s)
    assert measured_pool.saturated_tokens_per_s == 1500.0
    assert datasheet_pool.prior_ttft_s == catalogue.priors("mi300x").ttft_s
    shape = LineShape()
    assert line_cost("mi300x", shape, [MODEL]) != line_cost("mi300x", shape)
    assert build_hardware("mi300x", MODEL).fitted == profile().step
    assert build_hardware("mi300x", "llama-3.1-8b").fitted is None


def test_a_fresh_install_has_no_measured_records() -> None:
    assert catalogue.calibrated("h100", "llama-3.1-8b") is None
    assert build_hardware("h100", "llama-3.1-8b").fitted is None


def test_a_fleet_group_on_a_measured_accelerator_and_model_runs_the_measured_profile(measured: Path) -> None:
    from backends.sim.__main__ import options_from_args, parse_args
    from backends.sim.fleet_spec import parse_fleet_spec

    group = "  - {{pool: {}, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1, profile: {}}}\n"
    fleet = parse_fleet_spec(
        "model: tiny-llama\nmax_model_len: 512\ngroups:\n"
        + group.format("a", "{gpu: mi300x}")
        + group.format("b", f"{{calibrated: {measured}}}")
    )
    assert [g.hardware("tiny-llama").fitted for g in fleet.groups] == [profile().step, profile().step]
    options = options_from_args(parse_args(["--model", MODEL, "--max-model-len", "512", "--gpu", "mi300x"]))
    assert options.hardware is not None and options.hardware.fitted == profile().step
    with pytest.raises(ConfigError, match="either `gpu` or `calibrated`"):
        parse_fleet_spec("model: m\ngroups:\n" + group.format("a", "{}"))
