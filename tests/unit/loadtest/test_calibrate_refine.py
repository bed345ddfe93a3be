"""The calibration's refinement on the simulator's scheduler, and what the check asserts."""

from __future__ import annotations

import dataclasses
import itertools
import statistics

import msgspec
import pytest

from backends.calibrated import Limits, StepFit
from loadtest.calibrate.check import LevelRun, bursts, compare, failures, format_rows
from loadtest.calibrate.levels import Level, shape_of, staggered
from loadtest.calibrate.measure import Timed, after_opening
from loadtest.calibrate.refine import (
    Shape,
    fit_request_cv,
    refine,
    simulate,
    with_decode_curve,
    with_measured_curves,
    with_prefill_curve,
)
from loadtest.stats import percentile

LIMITS = Limits(
    block_size=128, num_blocks=2048, max_num_seqs=128, max_num_batched_tokens=2048, max_model_len=512
)
TRUE = StepFit(
    step_s=0.005,
    per_seq_s=0.0003,
    per_prefill_token_s=0.00012,
    per_context_token_s=3e-7,
    admit_s=0.006,
    request_s=0.004,
    request_per_seq_s=0.001,
)


def _shape(concurrency: int, prompt: int, output: int, requests: int, true: StepFit = TRUE) -> Shape:
    """A level as the true model would have measured it."""
    blank = Shape(concurrency, prompt, output, requests, 0.0, 0.0, 0.0, 0.0)
    sim = simulate(true, LIMITS, blank, cap=False)
    ttfts = sorted(sim.client_ttft_s)
    return Shape(
        concurrency,
        prompt,
        output,
        requests,
        sim.engine_ttft_s,
        sim.engine_itl_s,
        statistics.median(ttfts),
        percentile(ttfts, 90) or 0.0,  # as shape_of measures it
    )


def test_one_request_at_a_time_is_admission_then_one_prefill_step_then_decode_steps() -> None:
    sim = simulate(TRUE, LIMITS, Shape(1, 100, 8, 3, 0.0, 0.0, 0.0, 0.0), cap=False)
    prefill = TRUE.step_seconds(1, 100, 0)
    assert sim.engine_ttft_s == pytest.approx(TRUE.admit_s + prefill)
    assert sim.client_ttft_s == pytest.approx([TRUE.request_s + TRUE.admit_s + prefill] * 3)
    decode = [TRUE.step_seconds(1, 0, 100 + k) for k in range(1, 8)]  # context grows a token a step
    assert sim.engine_itl_s == pytest.approx(statistics.fmean(decode))


def test_a_cohort_that_overflows_the_token_budget_waits_a_step_behind_itself() -> None:
    """Sixteen prompts of 244 tokens arrive together: 2,048 tokens a step prefill eight of them, the
    other eight wait a whole prefill step, which a steady-state formula would not show."""
    engine_only = msgspec.structs.replace(TRUE, request_s=0.0, request_per_seq_s=0.0)
    sim = simulate(engine_only, LIMITS, Shape(16, 244, 32, 16, 0.0, 0.0, 0.0, 0.0), cap=False)
    alone = TRUE.admit_s + TRUE.step_seconds(1, 244, 0)
    firsts = sorted(sim.client_ttft_s)
    assert firsts.count(firsts[0]) == 8 and firsts.count(firsts[-1]) == 8  # two prefill steps, eight each
    assert firsts[-1] > 1.8 * firsts[0] and sim.engine_ttft_s > 5 * alone


def test_the_front_end_takes_one_request_at_a_time() -> None:
    """Four requests sent together leave the front end 10 ms apart; each is then prefilled in 1 ms."""
    quick = StepFit(
        step_s=0.001, per_seq_s=0.0, per_prefill_token_s=0.0, per_context_token_s=0.0, request_s=0.01
    )
    sim = simulate(quick, LIMITS, Shape(4, 16, 2, 4, 0.0, 0.0, 0.0, 0.0), cap=False)
    assert sorted(sim.client_ttft_s) == pytest.approx([0.011, 0.021, 0.031, 0.041])
    assert sim.engine_ttft_s == pytest.approx(0.001)  # vLLM's clock starts when the front end is done


def test_refine_recovers_what_the_levels_were_measured_from() -> None:
    shapes = [_shape(1, p, 8, 2) for p in (16, 488)]
    shapes += [_shape(c, p, 16, 2 * c) for c in (2, 8) for p in (61, 244)]
    start = msgspec.structs.replace(
        TRUE, step_s=0.008, per_seq_s=0.0001, per_prefill_token_s=0.0002, admit_s=0.0, request_s=0.02
    )
    refined, before, after = refine(start, LIMITS, shapes)
    assert after < before / 3
    for shape in shapes:
        sim = simulate(refined, LIMITS, shape, cap=False)
        assert sim.engine_ttft_s == pytest.approx(shape.engine_ttft_s, rel=0.1)
        assert sim.engine_itl_s == pytest.approx(shape.engine_itl_s, rel=0.1)
        assert statistics.median(sim.client_ttft_s) == pytest.approx(shape.client_ttft_p50_s, rel=0.1)


def test_refine_keeps_a_concave_prefill_curve_fitted_to_the_lone_requests() -> None:
    """A server whose prefill flattens out (as the CPU build's): the curve from its lone requests makes
    the refined model reproduce them within a few %, where one slope misses the mid-sized prompts."""
    curve = [(16, 0.004), (64, 0.012), (128, 0.018), (256, 0.021), (488, 0.023)]
    true = msgspec.structs.replace(TRUE, prefill=curve, per_prefill_token_s=0.00002)
    shapes = [_shape(1, p, 8, 2, true) for p in (16, 32, 64, 128, 256, 488)]
    shapes += [_shape(c, p, 16, 2 * c, true) for c in (2, 8) for p in (61, 244)]
    start = msgspec.structs.replace(TRUE, step_s=0.006, per_prefill_token_s=0.00005, admit_s=0.0)
    curved, _, curved_error = refine(with_prefill_curve(start, LIMITS, shapes), LIMITS, shapes)
    linear, _, linear_error = refine(start, LIMITS, shapes)
    assert curved.prefill and not linear.prefill and curved_error < linear_error / 2

    def lone_errors(step: StepFit) -> list[float]:
        sims = [simulate(step, LIMITS, s, cap=False).engine_ttft_s for s in shapes[:6]]
        return [abs(sim - s.engine_ttft_s) / s.engine_ttft_s for sim, s in zip(sims, shapes, strict=False)]

    assert max(lone_errors(curved)) < 0.03 and max(lone_errors(linear)) > 0.15
    for shape in shapes[6:]:  # the lone levels cannot tell the admission wait from the curve's height
        sim = simulate(curved, LIMITS, shape, cap=False)
        assert sim.engine_ttft_s == pytest.approx(shape.engine_ttft_s, rel=0.15)
        assert sim.engine_itl_s == pytest.approx(shape.engine_itl_s, rel=0.15)


def test_refine_stops_at_its_deadline() -> None:
    shapes = [_shape(4, 61, 32, 8)]
    refined, before, after = refine(TRUE, LIMITS, shapes, deadline=0.0)
    assert refined == TRUE and after == pytest.approx(before)


def _timed(ttft: float, tpot: float) -> Timed:
    return Timed(100, 16, 0.0, ttft, tpot, ttft + 15 * tpot)


def test_the_check_asserts_the_client_figures_and_shows_the_servers() -> None:
    real = [LevelRun([_timed(0.1, 0.01) for _ in range(5)], engine_ttft_s=0.05, engine_itl_s=0.01)]
    close = [LevelRun([_timed(0.11, 0.011) for _ in range(5)], engine_ttft_s=0.2, engine_itl_s=0.05)]
    far = [LevelRun([_timed(0.2, 0.011) for _ in range(5)], engine_ttft_s=0.05, engine_itl_s=0.01)]
    rows = compare(real, close, [3])
    assert [r.metric for r in rows if r.asserted] == ["client TTFT p50", "client TTFT p90", "client TPOT p50"]
    assert not failures(rows)  # the servers' own means are off by 300 %, but only shown
    assert [r.metric for r in failures(compare(real, far, [3]))] == ["client TTFT p50", "client TTFT p90"]


def test_the_check_shows_the_engines_own_part_of_the_ttft_where_the_real_server_says_it() -> None:
    """vLLM's queue and prefill times are the engine core's part of its TTFT; the simulator has no
    prefill histogram, so its column says nothing rather than a 100 % error."""
    real = [LevelRun([_timed(0.1, 0.01) for _ in range(5)], 0.05, 0.01, engine_own_s=0.02)]
    sim = [LevelRun([_timed(0.1, 0.01) for _ in range(5)], 0.05, 0.01)]
    rows = compare(real, sim, [3])
    own = [r for r in rows if r.metric == "engine's own TTFT"]
    assert len(own) == 1 and own[0].real_s == 0.02 and not own[0].asserted
    line = format_rows(rows).splitlines()[-1]
    assert line.split() == ["x3", "engine's", "own", "TTFT", "20.00", "-", "-"]
    assert all(r.metric != "engine's own TTFT" for r in compare(sim, sim, [3]))


def test_a_decode_curve_follows_a_server_whose_steps_do_not_grow_in_a_line() -> None:
    """A server whose step is flat to 8 sequences and then jumps (as a CPU's threads fill): the levels at
    1, 2, 4, 8 and 16 give a curve under which a level the sweep never ran (12 sequences, other
    prompts) replays within 5 %, where the per-sequence line, fitted to the same levels, misses it."""
    curve = [(1, 0.0004), (4, 0.0008), (8, 0.0012), (16, 0.009)]
    true = msgspec.structs.replace(TRUE, decode=curve, per_seq_s=0.0005)
    shapes = [_shape(1, p, 8, 2, true) for p in (16, 488)]
    shapes += [_shape(c, p, 32, 2 * c, true) for c in (2, 4, 8, 16) for p in (61, 244)]
    start = msgspec.structs.replace(TRUE, per_seq_s=0.0003)
    curved, _, curved_error = refine(with_decode_curve(start, LIMITS, shapes, passes=3), LIMITS, shapes)
    linear, _, linear_error = refine(start, LIMITS, shapes)
    assert curved.decode and not linear.decode and curved_error < linear_error
    assert [n for n, _ in curved.decode] == [1, 2, 4, 8, 16]
    held_apart = _shape(12, 150, 40, 24, true)
    for step, within in ((curved, True), (linear, False)):
        itl = simulate(step, LIMITS, held_apart, cap=False).engine_itl_s
        assert (abs(itl - held_apart.engine_itl_s) / held_apart.engine_itl_s < 0.05) is within


def test_with_measured_curves_keeps_the_line_when_the_levels_have_one_concurrency() -> None:
    shapes = [_shape(1, p, 8, 2) for p in (16, 128, 488)]
    assert with_measured_curves(TRUE, LIMITS, shapes).decode == []


def test_a_level_whose_tokens_came_in_bursts_is_named() -> None:
    steady = LevelRun([_timed(0.1, 0.004) for _ in range(5)], engine_ttft_s=0.05, engine_itl_s=0.005)
    burst = LevelRun([_timed(0.3, 0.0001) for _ in range(5)], engine_ttft_s=0.05, engine_itl_s=0.005)
    notes = bursts([steady, burst], [3, 6])
    assert len(notes) == 1 and notes[0].startswith("x6:")


def test_staggered_outputs_cover_their_range_and_mix_it() -> None:
    outputs = staggered(64, 16, 64)
    assert len(outputs) == 64 and min(outputs) == 16 and max(outputs) == 64
    assert len(set(outputs)) == 49  # every length in 16..64 comes up
    assert any(abs(a - b) > 8 for a, b in itertools.pairwise(outputs))  # not in order
    assert set(staggered(40, 16, 28)) == set(range(16, 29))  # a span of 13: another step


def test_a_staggered_level_replays_each_requests_own_output() -> None:
    """Outputs of many lengths end their requests one at a time: newcomers prefill among running
    streams. Against one length (the mean), the same concurrency's decode steps carry those prefills, so
    its inter-token latency is higher, and requests rarely wait behind a whole cohort."""
    outputs = staggered(64, 16, 48)
    mean = round(statistics.fmean(outputs))
    one = simulate(TRUE, LIMITS, Shape(16, 61, mean, 64, 0.0, 0.0, 0.0, 0.0), cap=False)
    mixed = simulate(TRUE, LIMITS, Shape(16, 61, mean, 64, 0.0, 0.0, 0.0, 0.0, outputs=outputs), cap=False)
    assert len(mixed.client_tpot_s) == 64
    assert mixed.engine_itl_s > one.engine_itl_s
    assert statistics.median(mixed.client_ttft_s) < statistics.median(one.client_ttft_s)


def test_a_staggered_levels_client_ttft_is_taken_after_its_opening_cohort() -> None:
    """The opening cohort of a staggered level is a burst (the cohort levels measure those); counted in,
    its first requests set the level's 90th percentile, and a fit that matches it prices a newcomer among
    running streams like a burst's last request."""
    openers = [Timed(61, 16, 0.0, 0.300 + i / 1000, 0.002, 0.4) for i in range(4)]
    steady = [Timed(61, 16, 0.1 * (i + 1), 0.020 + i / 1000, 0.002, 0.1) for i in range(12)]
    level = Level("load", 4, 61, 32, outputs=(16, 48, 32))
    level.timed = [*steady[:6], *openers, *steady[6:]]  # in the order they ended
    assert after_opening(level.timed, 4) == steady
    shape = shape_of(level)
    assert shape.client_ttft_p90_s < 0.035
    cohort = Level("load", 4, 61, 32)
    cohort.timed = level.timed
    assert shape_of(cohort).client_ttft_p90_s > 0.2  # a cohort level keeps every request


def test_a_levels_outputs_reach_its_shape_and_a_recording_without_them_still_loads() -> None:
    level = Level("load", 4, 61, 32, outputs=(16, 48, 32))
    level.timed = [Timed(61, 16, 0.0, 0.01, 0.002, 0.05)]
    assert shape_of(level).outputs == (16, 48, 32)
    old = msgspec.json.encode(Level("load", 4, 61, 32)).replace(b',"outputs":[]', b"")
    assert b"outputs" not in old and msgspec.json.decode(old, type=Level).outputs == ()


def test_a_step_that_prefills_among_decoding_streams_costs_the_mixed_step_on_top() -> None:
    step = msgspec.structs.replace(TRUE, mixed_step_s=0.002)
    assert step.step_seconds(4, 61, 0) == TRUE.step_seconds(4, 61, 0)  # prefill alone
    assert step.step_seconds(4, 0, 400) == TRUE.step_seconds(4, 0, 400)  # decode alone
    assert step.step_seconds(4, 61, 400) == pytest.approx(TRUE.step_seconds(4, 61, 400) + 0.002)


def _staggered_shape(concurrency: int, prompt: int, true: StepFit, spread_seed: int | None = None) -> Shape:
    """`spread_seed`: measured on a server whose front end has `true`'s spread, that draw of it."""
    outputs = staggered(8 * concurrency, 16, 64)
    blank = Shape(concurrency, prompt, 40, len(outputs), 0.0, 0.0, 0.0, 0.0, outputs=outputs)
    spread = spread_seed is not None
    sim = simulate(true, LIMITS, blank, cap=False, spread=spread, seed=spread_seed or 0)
    ttfts = sorted(t.ttft_s for t in after_opening(sim.timed, concurrency))
    return dataclasses.replace(
        blank,
        engine_ttft_s=sim.engine_ttft_s,
        engine_itl_s=sim.engine_itl_s,
        client_ttft_p50_s=statistics.median(ttfts),
        client_ttft_p90_s=percentile(ttfts, 90) or 0.0,
    )


def test_refine_finds_the_mixed_step_in_the_levels_whose_newcomers_arrive_among_streams() -> None:
    """Cohort levels prefill with nothing decoding beside them; only staggered levels show the mixed step."""
    true = msgspec.structs.replace(TRUE, mixed_step_s=0.004)
    shapes = [_shape(1, p, 8, 2, true) for p in (16, 488)]
    shapes += [_shape(c, p, 16, 2 * c, true) for c in (2, 8) for p in (61, 244)]
    shapes += [_staggered_shape(8, p, true) for p in (61, 244)]
    refined, before, after = refine(TRUE, LIMITS, shapes)
    assert after < before * 0.8
    assert refined.mixed_step_s > 0.001  # the admission's terms can take some of it: they too delay newcomers
    for shape in shapes[-2:]:
        assert simulate(refined, LIMITS, shape, cap=False).engine_itl_s == pytest.approx(
            shape.engine_itl_s, rel=0.1
        )


@pytest.mark.parametrize(("cv", "read_as"), [(0.0, {0.0}), (0.5, {0.5}), (1.0, {0.5, 0.75, 1.0})])
def test_the_front_ends_spread_is_read_off_the_staggered_levels(cv: float, read_as: set[float]) -> None:
    """A level is one draw of the server's spread: a large one reads as anything from half of it up."""
    true = msgspec.structs.replace(TRUE, request_cv=cv)
    shapes = [_staggered_shape(width, 61, true, spread_seed=100 + width) for width in (4, 16)]
    assert fit_request_cv(TRUE, LIMITS, shapes) in read_as
    # the cohort levels cannot tell: without a staggered level there is nothing to read it from
    assert fit_request_cv(TRUE, LIMITS, [_shape(4, 61, 32, 16)]) is None
