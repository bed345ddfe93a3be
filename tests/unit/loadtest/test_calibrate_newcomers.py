"""What a newcomer cost the streams, read off a load's timings (loadtest/calibrate/newcomers.py): the
windows count what ran beside each request, the line is exact on exact data, and on the simulator's own
replay of a known step model it reads that model's prefill and context costs back."""

from __future__ import annotations

import random

import pytest

from backends.calibrated import CalibratedProfile, FitError, Limits, StepFit
from loadtest.calibrate.check import Job, LevelRun
from loadtest.calibrate.measure import Timed
from loadtest.calibrate.newcomers import Window, regress, report, split, windows
from loadtest.calibrate.recording import Recording
from loadtest.calibrate.refine import closed_loop
from tests.unit.loadtest.test_calibrate_recording import GEOMETRY, OPTIONS

STEP = StepFit(step_s=0.003, per_seq_s=0.0002, per_prefill_token_s=0.00002, per_context_token_s=2e-7)
LIMITS = Limits(
    block_size=128, num_blocks=2048, max_num_seqs=128, max_num_batched_tokens=2048, max_model_len=512
)


def test_a_window_counts_the_newcomers_and_the_streams_beside_a_request() -> None:
    a = Timed(prompt_tokens=100, output_tokens=11, sent_at=0.0, ttft_s=1.0, tpot_s=0.1, e2e_s=2.0)
    b = Timed(prompt_tokens=200, output_tokens=31, sent_at=1.2, ttft_s=0.3, tpot_s=0.05, e2e_s=1.8)
    c = Timed(prompt_tokens=50, output_tokens=11, sent_at=2.3, ttft_s=0.2, tpot_s=0.08, e2e_s=1.0)
    short = Timed(prompt_tokens=10, output_tokens=2, sent_at=0.0, ttft_s=0.1, tpot_s=0.1, e2e_s=0.2)
    first, second, third = windows([a, b, c, short])  # two tokens are one step: no window of its own

    assert first.step_s == pytest.approx(0.1)  # 1 s over 10 steps
    assert first.newcomers == pytest.approx(1 / 10)  # b's first token at 1.5, inside a's 1.0-2.0
    assert first.newcomer_tokens == pytest.approx(200 / 10)
    assert first.running == pytest.approx(1 + 0.5)  # a itself, b over half of a's window
    assert first.context == pytest.approx(1 * (100 + 5.5) + 0.5 * (200 + 15.5))

    assert second.newcomers == pytest.approx(1 / 30)  # c's first token at 2.5, inside b's 1.5-3.0
    assert second.running == pytest.approx(1 / 3 + 1 + 1 / 3)
    assert third.newcomers == 0.0
    assert third.running == pytest.approx(1 + 0.5 / 0.8)  # b's last 0.5 s of c's 2.5-3.3


def test_the_line_is_exact_on_exact_data() -> None:
    rng = random.Random(3)
    rows = []
    for _ in range(40):
        newcomers, tokens = rng.uniform(0, 0.5), rng.uniform(0, 200)
        running, context = rng.uniform(1, 12), rng.uniform(100, 4000)
        step = 0.002 + 0.0004 * newcomers + 0.00001 * tokens + 0.0001 * running + 1e-7 * context
        rows.append(Window(step, newcomers, tokens, running, context))
    cost = regress(rows)
    assert cost.base == pytest.approx(0.002, rel=1e-6)
    assert cost.per_newcomer == pytest.approx(0.0004, rel=1e-6)
    assert cost.per_token == pytest.approx(0.00001, rel=1e-6)
    assert cost.per_running == pytest.approx(0.0001, rel=1e-6)
    assert cost.per_context_token == pytest.approx(1e-7, rel=1e-6)
    assert cost.at(244) == pytest.approx(0.0004 + 244 * 0.00001)
    step, added = split(rows)
    assert added == pytest.approx(sum(0.0004 * r.newcomers + 0.00001 * r.newcomer_tokens for r in rows) / 40)
    assert step == pytest.approx(sum(r.step_s for r in rows) / 40)


def test_newcomers_of_one_size_cannot_be_split_into_a_fixed_and_a_per_token_cost() -> None:
    rng = random.Random(4)
    rows = [
        Window(rng.uniform(0.002, 0.004), n, 61 * n, rng.uniform(1, 9), rng.uniform(50, 900))
        for n in (0.1, 0.2, 0.3, 0.4) * 5
    ]
    with pytest.raises(ValueError, match="cannot be told apart"):
        regress(rows)
    with pytest.raises(ValueError, match="cannot fit"):
        regress(rows[:3])


def _held_apart(seed: int) -> tuple[list[list[Job]], list[int]]:
    rng = random.Random(seed)
    widths = [3, 6, 12]
    jobs = [
        [Job([7] * rng.randint(8, 480), rng.randint(16, 64), "chat") for _ in range(15 * w)] for w in widths
    ]
    return jobs, widths


def test_the_replay_of_a_known_step_model_reads_its_prefill_and_context_costs_back() -> None:
    jobs, widths = _held_apart(5)
    rows = []
    for level, width in zip(jobs, widths, strict=True):
        timed = closed_loop(STEP, LIMITS, [(len(j.prompt), j.output_tokens) for j in level], width).timed
        assert len(timed) == len(level) and all(t.e2e_s > t.ttft_s > 0 for t in timed)
        rows += windows(timed)
    cost = regress(rows)
    assert cost.per_token == pytest.approx(STEP.per_prefill_token_s, rel=0.15)
    assert cost.per_context_token == pytest.approx(STEP.per_context_token_s, rel=0.15)
    # a newcomer is one sequence more in the step it is prefilled in
    assert cost.per_newcomer == pytest.approx(STEP.per_seq_s, abs=0.0004)


def test_the_report_replays_the_held_apart_load_on_the_profile_and_sets_it_beside_the_real_run() -> None:
    jobs, widths = _held_apart(6)
    real = [
        LevelRun(
            closed_loop(STEP, LIMITS, [(len(j.prompt), j.output_tokens) for j in level], w).timed, 0.0, 0.0
        )
        for level, w in zip(jobs, widths, strict=True)
    ]
    recording = Recording(OPTIONS, GEOMETRY, [], 7, widths, jobs, real, [0.5, 0.4, 0.3])
    profile = CalibratedProfile(
        accelerator="cpu",
        model="tiny-llama",
        step=STEP,
        limits=LIMITS,
        fit_error=FitError(ttft_mean=0.0, ttft_max=0.0, tpot_mean=0.0, tpot_max=0.0),
        saturated_tokens_per_second=1000.0,
    )
    lines = report("rec", recording, profile).splitlines()
    assert lines[0].startswith("rec: what a newcomer cost")
    sweep, real_line, replayed_line, charged = lines[2:6]
    assert "0 requests cannot fit" in sweep  # the recording has no sweep levels
    # the real run was this very model: its replay reads the same
    assert real_line.split()[-7:] == replayed_line.split()[-7:]
    assert charged.split()[-1] == f"{STEP.prefill_seconds(488) * 1000:.2f}"
    per_level = lines[-3:]
    assert [line.split()[0] for line in per_level] == ["x3", "x6", "x12"]
    for line in per_level:
        real_split, replayed_split = line.split()[1:6], line.split()[6:]
        assert real_split == replayed_split
