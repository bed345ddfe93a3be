"""A measured decode curve in a calibrated profile (backends/calibrated.py `StepFit.decode`): the step
model, old files without one, validation naming the line, and the simulator's scheduler pricing it."""

from __future__ import annotations

import msgspec
import pytest

from backends.calibrated import CalibratedProfile, FitError, Limits, StepFit, dump_profile, parse_profile
from backends.sim.metrics import EngineStats
from backends.sim.perf import PerfModel
from backends.sim.profiles import calibrated_hardware
from backends.sim.scheduler import Group, Scheduler
from backends.yamlfile import ConfigError
from tests.unit.backends.test_prefill_curve import OLD_FILE

CURVE = [(1, 0.001), (4, 0.002), (8, 0.006), (16, 0.008)]
"""Not a line: flat to 4 sequences, steep to 8, flat again (as a CPU's threads fill)."""
STEP = StepFit(
    step_s=0.002, per_seq_s=0.0005, per_prefill_token_s=0.00002, per_context_token_s=1e-7, decode=CURVE
)


def profile(step: StepFit = STEP) -> CalibratedProfile:
    return CalibratedProfile(
        accelerator="cpu",
        model="tiny-llama",
        step=step,
        limits=Limits(
            block_size=16, num_blocks=512, max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=512
        ),
        fit_error=FitError(ttft_mean=0.05, ttft_max=0.1, tpot_mean=0.04, tpot_max=0.08),
        saturated_tokens_per_second=1500.0,
    )


def test_the_curve_is_read_between_its_points_and_extended_with_per_seq_s() -> None:
    assert STEP.sequence_seconds(0) == 0.0
    assert STEP.sequence_seconds(1) == pytest.approx(0.001)
    assert STEP.sequence_seconds(6) == pytest.approx(0.004)  # half way from 4 to 8
    assert STEP.sequence_seconds(12) == pytest.approx(0.007)
    assert STEP.sequence_seconds(20) == pytest.approx(0.008 + 4 * 0.0005)
    assert STEP.step_seconds(6, 0, 600) == pytest.approx(0.002 + 0.004 + 600 * 1e-7)
    assert profile().tpot_seconds(12, 100) == pytest.approx(0.002 + 0.007 + 1200 * 1e-7)


def test_without_a_curve_a_step_is_the_per_sequence_line_exactly() -> None:
    linear = msgspec.structs.replace(STEP, decode=[])
    for seqs in (1, 3, 12):
        assert linear.step_seconds(seqs, 50, 900) == 0.002 + 0.0005 * seqs + 0.00002 * 50 + 1e-7 * 900


def test_a_profile_with_a_curve_round_trips_and_an_old_one_is_written_back_byte_for_byte() -> None:
    text = dump_profile(profile())
    assert "decode:" in text and parse_profile(text) == profile()
    old = parse_profile(OLD_FILE)
    assert old.step.decode == [] and dump_profile(old) == OLD_FILE


def test_a_bad_curve_names_its_line() -> None:
    for bad in ("[[1, 0.002], [8, 0.001]]", "[[8, 0.001], [4, 0.002]]", "[[0, 0.001]]"):
        broken = OLD_FILE.replace("  admit_busy_s: 0.0\n", f"  admit_busy_s: 0.0\n  decode: {bad}\n")
        with pytest.raises(ConfigError, match=r"p\.yaml:\d+.*decode"):
            parse_profile(broken, "p.yaml")


def test_the_simulator_prices_a_decode_step_on_the_curve() -> None:
    """Twelve sequences decoding together cost the curve at 12, not 12 x per_seq_s."""
    hardware = calibrated_hardware(profile())
    scheduler = Scheduler(hardware.limits, hardware.num_blocks, EngineStats("tiny-llama", 0))
    for _ in range(12):
        scheduler.add(Group(16, [], [4], ["length"], arrival=0.0))
    scheduler.apply(scheduler.plan(0.0), 0.01)  # all twelve prefilled in one step
    work = scheduler.plan(0.01).work
    assert (work.decode_seqs, work.prefill_tokens) == (12, 0)
    expected = 0.002 + 0.007 + 1e-7 * work.decode_context
    assert PerfModel(hardware).step_seconds(work) == pytest.approx(expected)


def test_the_admission_per_running_sequence_round_trips_and_a_negative_one_names_its_line() -> None:
    step = msgspec.structs.replace(STEP, admit_s=0.002, admit_busy_s=0.001, admit_per_seq_s=0.0003)
    text = dump_profile(profile(step))
    assert "admit_per_seq_s: 0.0003" in text and parse_profile(text) == profile(step)
    assert parse_profile(text).step.admission_wait(4) == pytest.approx(0.002 + 0.001 + 4 * 0.0003)
    assert "admit_per_seq_s" not in OLD_FILE and parse_profile(OLD_FILE).step.admit_per_seq_s == 0.0
    broken = OLD_FILE.replace("  admit_busy_s: 0.0\n", "  admit_busy_s: 0.0\n  admit_per_seq_s: -0.001\n")
    with pytest.raises(ConfigError, match=r"p\.yaml:\d+.*admit_per_seq_s"):
        parse_profile(broken, "p.yaml")
