"""A measured prefill curve in a calibrated profile (backends/calibrated.py `StepFit.prefill`): the step
model, old files without one, and the simulator, the priors and the drift check reading it."""

from __future__ import annotations

import msgspec
import pytest

from backends.calibrated import CalibratedProfile, FitError, Limits, StepFit, dump_profile, parse_profile
from backends.drift import predict
from backends.sim.metrics import EngineStats
from backends.sim.perf import PerfModel
from backends.sim.profiles import calibrated_hardware
from backends.sim.scheduler import Group, Scheduler
from backends.yamlfile import ConfigError
from tests.support import simulated_ttft

MODEL = "tiny-llama"
CURVE = [(16, 0.008), (128, 0.020), (256, 0.024), (488, 0.026)]
"""Concave, as the CPU build measured: short prompts dear per token, long ones nearly free."""
STEP = StepFit(
    step_s=0.004, per_seq_s=0.0005, per_prefill_token_s=0.00002, per_context_token_s=1e-7, prefill=CURVE
)
LINEAR = msgspec.structs.replace(STEP, prefill=[])

OLD_FILE = """\
# cpu / tiny-llama: measured by `switchyard calibrate` (docs/calibrate.md)
accelerator: cpu
model: tiny-llama
step:
  step_s: 0.004
  per_seq_s: 0.0005
  per_prefill_token_s: 4.0e-05
  per_context_token_s: 1.0e-07
  request_s: 0.003
  request_per_seq_s: 0.0
  admit_s: 0.002
  admit_busy_s: 0.0
limits:
  block_size: 16
  num_blocks: 512
  max_num_seqs: 8
  max_num_batched_tokens: 2048
  max_model_len: 512
fit_error:
  ttft_mean: 0.05
  ttft_max: 0.1
  tpot_mean: 0.04
  tpot_max: 0.08
saturated_tokens_per_second: 1500.0
prefix_cache_hit_rate: 0.0
source: null
points: []
"""


def profile(step: StepFit = STEP) -> CalibratedProfile:
    return CalibratedProfile(
        accelerator="cpu",
        model=MODEL,
        step=step,
        limits=Limits(
            block_size=16, num_blocks=512, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=512
        ),
        fit_error=FitError(ttft_mean=0.05, ttft_max=0.1, tpot_mean=0.04, tpot_max=0.08),
        saturated_tokens_per_second=1500.0,
    )


def test_the_curve_is_interpolated_from_zero_and_extended_with_the_per_token_slope() -> None:
    assert STEP.prefill_seconds(0) == 0.0
    assert STEP.prefill_seconds(8) == pytest.approx(0.004)  # half way from (0, 0) to the first point
    assert STEP.prefill_seconds(128) == pytest.approx(0.020)
    assert STEP.prefill_seconds(192) == pytest.approx(0.022)
    assert STEP.prefill_seconds(1000) == pytest.approx(0.026 + 512 * 0.00002)
    assert STEP.step_seconds(1, 128, 0) == pytest.approx(0.004 + 0.0005 + 0.020)
    assert STEP.step_seconds(0, 128, 0) == 0.0


def test_a_chunked_step_costs_the_curve_at_its_total_not_the_sum_of_its_requests() -> None:
    """Four 64-token prompts admitted together are one step's prefill: one pass over 256 tokens (24 ms),
    not four passes over 64 (4 x 13.1 ms)."""
    hardware = calibrated_hardware(profile())
    scheduler = Scheduler(hardware.limits, hardware.num_blocks, EngineStats(MODEL, 0))
    for _ in range(4):
        scheduler.add(Group(64, [], [4], ["length"], arrival=0.0))
    work = scheduler.plan(0.0).work
    assert (work.prefill_tokens, work.prefill_seqs) == (256, 4)
    assert PerfModel(hardware).step_seconds(work) == pytest.approx(0.004 + 4 * 0.0005 + 0.024)
    assert 4 * STEP.prefill_seconds(64) == pytest.approx(4 * (0.008 + 0.012 * 48 / 112))


def test_a_profile_with_a_curve_round_trips_and_a_bad_curve_names_its_line() -> None:
    text = dump_profile(profile())
    assert "prefill:" in text and parse_profile(text) == profile()
    for bad in ("[[16, 0.01], [128, 0.005]]", "[[128, 0.01], [16, 0.02]]"):  # seconds fall; tokens fall
        broken = OLD_FILE.replace("  admit_busy_s: 0.0\n", f"  admit_busy_s: 0.0\n  prefill: {bad}\n")
        with pytest.raises(ConfigError, match=r"p\.yaml:\d+.*prefill"):
            parse_profile(broken, "p.yaml")


def test_an_old_profile_without_a_curve_loads_and_behaves_as_before() -> None:
    old = parse_profile(OLD_FILE)
    step = old.step
    assert step.prefill == []
    assert dump_profile(old) == OLD_FILE  # written back byte for byte
    for seqs, prompt, context in ((1, 16, 0), (1, 488, 0), (3, 300, 1000), (8, 0, 4000)):
        linear = 0.004 + 0.0005 * seqs + 4.0e-05 * prompt + 1.0e-07 * context
        assert step.step_seconds(seqs, prompt, context) == linear  # exactly, not approximately
    assert old.prefill_tokens_per_second == 1 / 4.0e-05
    assert old.ttft_seconds(128) == 0.003 + 0.002 + (0.004 + 0.0005 + 4.0e-05 * 128 + 1.0e-07 * 0)


def test_priors_and_the_exchange_rate_read_the_curve() -> None:
    curved, linear = profile(), profile(LINEAR)
    assert curved.ttft_seconds(128) == pytest.approx(0.004 + 0.0005 + 0.020)
    assert curved.priors().ttft_s == pytest.approx(curved.ttft_seconds(128))
    assert linear.priors().ttft_s == pytest.approx(0.004 + 0.0005 + 128 * 0.00002)
    full = 0.026 + (2048 - 488) * 0.00002  # a step full of prompt tokens
    assert curved.prefill_tokens_per_second == pytest.approx(2048 / full)
    assert curved.prefill_tokens_per_step == pytest.approx(curved.tpot_seconds(1, 128) * 2048 / full)


def test_drift_predicts_ttft_from_the_curve() -> None:
    ttft, _ = predict(STEP, 0.0, 0.0, running=1, prompt_tokens=128, output_tokens=16)
    assert ttft == pytest.approx(0.004 + 0.0005 + 0.020)


async def _server_ttft(step: StepFit, prompt: int) -> float:
    return await simulated_ttft(profile(step), prompt)


async def test_the_simulator_times_a_prompt_on_the_curve() -> None:
    curved = await _server_ttft(STEP, 128)
    assert curved == pytest.approx(profile().ttft_seconds(128), rel=0.05)
    assert curved == pytest.approx(0.004 + 0.0005 + 0.020, rel=0.05)
    assert await _server_ttft(LINEAR, 128) == pytest.approx(0.004 + 0.0005 + 128 * 0.00002, rel=0.05)
