"""The calibration's fit (loadtest/calibrate/fit.py, levels.py) and its small parsers."""

from __future__ import annotations

import argparse
import math

import msgspec
import pytest

from backends.calibrated import StepFit
from loadtest.calibrate.agreement import ClassSlo, attained, off_by_more
from loadtest.calibrate.check import Summary, summarise
from loadtest.calibrate.cli import parse_duration
from loadtest.calibrate.fit import Row, decode_row, fit, predict, prefill_curve, prefill_row
from loadtest.calibrate.levels import Level, ladder, steadiness
from loadtest.calibrate.measure import Timed, histogram_mean, parse_metrics

TRUE = (0.002, 0.0004, 0.00005, 2e-7)


def sweep_rows() -> list[Row]:
    rows = [prefill_row(p, predict(TRUE, (1.0, 1.0, p, 0.0))) for p in (16, 64, 128, 256, 488)]
    for prompt in (61, 244):
        for b in (1, 2, 4, 8, 16, 32):
            ideal = decode_row(b, prompt, 32, 1.0)
            rows.append(Row(ideal.features, predict(TRUE, ideal.features)))
    return rows


def test_fit_recovers_the_step_model_it_was_measured_from() -> None:
    fitted = fit(sweep_rows())
    for got, want in zip(fitted, TRUE, strict=True):
        assert got == pytest.approx(want, rel=0.02)


def test_one_level_a_busy_machine_slowed_does_not_drag_the_fit() -> None:
    rows = sweep_rows()
    rows[8] = Row(rows[8].features, rows[8].measured_s * 3)  # one level three times slower
    fitted = fit(rows)
    errors = [abs(predict(fitted, r.features) - r.measured_s) / r.measured_s for r in sweep_rows()]
    assert sorted(errors)[len(errors) - 2] < 0.05  # all but the slowed level within 5 %


def test_fit_keeps_every_coefficient_non_negative_and_needs_two_levels() -> None:
    rows = [prefill_row(16, 0.010), prefill_row(488, 0.005)]  # longer prompt faster: noise
    assert all(c >= 0 for c in fit(rows))
    with pytest.raises(ValueError, match="too few"):
        fit([prefill_row(16, 0.01)])


def test_histogram_mean_is_the_delta_of_sum_over_count() -> None:
    before = parse_metrics('vllm:x_seconds_sum{a="1"} 1.0\nvllm:x_seconds_count{a="1"} 10\n')
    after = parse_metrics(
        'vllm:x_seconds_sum{a="1"} 1.5\nvllm:x_seconds_count{a="1"} 14\n'
        'vllm:x_seconds_bucket{le="0.1"} 3\nvllm:cache_config_info{block_size="128",num_gpu_blocks="9"} 1\n'
    )
    assert histogram_mean(before, after, "vllm:x_seconds") == (pytest.approx(0.125), 4)
    assert after.info["vllm:cache_config_info"] == {"block_size": "128", "num_gpu_blocks": "9"}


def test_durations_ladder_and_percentiles() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "10m", "1h", "1.5m")] == [90, 90, 600, 3600, 90]
    for bad in ("0", "ten", "5d", "-1m"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)
    assert ladder(488) == [16, 32, 64, 128, 256, 488]
    assert ladder(10) == [10]
    timed = [Timed(8, 8, 0.0, float(v), float(v), float(v)) for v in (1, 2, 3, 4, 5)]
    summary = summarise(timed)
    assert summary.ttft_p50 == 3 and summary.ttft_p90 == pytest.approx(4.6) and summary.tpot_p50 == 3
    assert summarise([]) == Summary(0.0, 0.0, 0.0)


async def test_no_job_starts_past_the_deadline_and_never_more_than_the_concurrency() -> None:
    import asyncio
    import time

    from loadtest.calibrate.measure import Timed, run_closed_loop

    in_flight, most = 0, 0

    async def send(prompt: list[int], output: int) -> Timed:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return Timed(len(prompt), output, 0.0, 0.01, 0.001, 0.05)

    jobs = [([1, 2, 3], 4)] * 40
    done = await run_closed_loop(jobs, 3, send, deadline=time.monotonic() + 0.12)
    assert most == 3 and 6 <= len(done) <= 9  # three rounds at most began before the deadline
    assert len(await run_closed_loop(jobs[:5], 8, send)) == 5


def test_a_sweep_of_one_request_at_a_time_leaves_the_per_sequence_cost_at_zero() -> None:
    rows = [r for r in sweep_rows() if r.features[1] == 1.0]  # the budget allowed nothing concurrent
    fitted = fit(rows)
    assert fitted[1] == 0.0 and fitted[0] > 0
    assert all(abs(predict(fitted, r.features) - r.measured_s) / r.measured_s < 0.05 for r in rows)


def test_front_end_time_grows_with_the_streams_running_and_resists_one_noisy_level() -> None:
    from loadtest.calibrate.levels import front_end
    from loadtest.calibrate.measure import Timed

    def level(concurrency: int, client_ttft: float, engine_ttft: float) -> Level:
        lv = Level("load", concurrency, 64, 32, engine_ttft_s=engine_ttft)
        lv.timed = [Timed(64, 32, 0.0, client_ttft, 0.003, 0.1)]
        return lv

    levels = [level(b, 0.010 + 0.002 * (b - 1) + 0.02, 0.02) for b in (1, 2, 4, 8, 16)]
    levels.append(level(3, 0.5, 0.02))  # a busy machine's level
    intercept, slope = front_end(levels)
    assert intercept == pytest.approx(0.010, rel=0.05) and slope == pytest.approx(0.002, rel=0.05)
    assert front_end([]) == (0.0, 0.0)


def test_a_level_whose_client_got_its_tokens_in_bursts_tells_nothing_of_the_front_end() -> None:
    """Its client's TTFT held the whole generation (tokens 0.02 ms apart where the server made one every
    2.5 ms): the front end's fit and the refinement leave its client TTFT out, its server figures in."""
    from loadtest.calibrate.levels import Level, front_end, shape_of

    def level(concurrency: int, client_ttft: float, client_tpot: float) -> Level:
        lv = Level("load", concurrency, 64, 32, engine_ttft_s=0.02, engine_itl_s=0.0025)
        lv.timed = [Timed(64, 32, 0.0, client_ttft, client_tpot, 0.1) for _ in range(4)]
        return lv

    steady = [level(b, 0.030 + 0.002 * (b - 1), 0.0025) for b in (1, 2, 4, 8, 16)]
    bursty = [level(b, 0.1 * b, 0.00002) for b in (1, 2, 4, 8, 16)]
    assert not any(lv.bursty for lv in steady) and all(lv.bursty for lv in bursty)
    assert front_end(steady + bursty) == pytest.approx(front_end(steady))
    shape = shape_of(bursty[2])
    assert (shape.client_ttft_p50_s, shape.client_ttft_p90_s) == (0.0, 0.0)
    assert (shape.engine_ttft_s, shape.engine_itl_s) == (0.02, 0.0025)


def test_attained_needs_both_bounds() -> None:
    slo = ClassSlo(ttft_s=0.1, tpot_s=0.01)
    assert attained(0.05, 0.005, slo)
    assert not attained(0.2, 0.005, slo)
    assert not attained(0.05, 0.02, slo)
    assert not attained(None, 0.005, slo)


CURVED_STEP = StepFit(
    step_s=0.004, per_seq_s=0.0005, per_prefill_token_s=0.00004, per_context_token_s=0.0, admit_s=0.002
)


def concave_ttft(prompt: float) -> float:
    """A lone request's TTFT whose prefill flattens out, as the CPU build's did (12 ms at 16 tokens, 32 ms
    at 488)."""
    return 0.002 + 0.0045 + 0.026 * (1 - math.exp(-prompt / 100))


def test_a_prefill_curve_from_concave_points_reproduces_them_and_what_lies_between() -> None:
    sizes = (16, 32, 64, 128, 256, 488)
    curve, latency = prefill_curve(CURVED_STEP, [(p, concave_ttft(p)) for p in sizes], 2048)
    step = msgspec.structs.replace(CURVED_STEP, prefill=curve, admit_s=latency)
    for prompt in (*sizes, 24, 48, 96, 192, 372):
        predicted = step.admission_wait(0) + step.step_seconds(1, prompt, 0)
        assert predicted == pytest.approx(concave_ttft(prompt), rel=0.03)
    linear = fit([prefill_row(p, concave_ttft(p) - 0.002) for p in sizes])  # one slope, as before
    errors = [abs(0.002 + predict(linear, (1, 1, p, 0)) - concave_ttft(p)) / concave_ttft(p) for p in sizes]
    assert max(errors) > 0.15  # what the curve is for


def test_a_prefill_curve_never_falls_and_keeps_to_one_step_prompts() -> None:
    """Noise: 488 tokens measured faster than 256 (the two are pooled), two levels of one size (their
    median), a prompt longer than a step holds (chunked: left to the per-token slope), a level with no
    measurement."""
    alone = [(16, 0.010), (256, 0.030), (488, 0.026), (64, 0.014), (64, 0.016), (64, 0.030), (4096, 0.2)]
    curve, latency = prefill_curve(CURVED_STEP, [*alone, (128, 0.0)], 2048)
    rest = 0.004 + 0.0005  # the step of one sequence; the admission is the curve's to find
    shares = [0.010 - rest, 0.016 - rest, 0.028 - rest, 0.028 - rest]
    slope = (shares[1] - shares[0]) / (64 - 16)
    assert latency == pytest.approx(shares[0] - slope * 16)
    assert [t for t, _ in curve] == [16, 64, 256, 488]
    assert [s for _, s in curve] == pytest.approx([share - latency for share in shares])
    assert prefill_curve(CURVED_STEP, [(16, 0.001)], 2048) == ([(16, 0.0)], 0.0)  # never below zero
    assert prefill_curve(CURVED_STEP, [], 2048) == ([], 0.0)


def test_what_every_prompt_pays_alike_is_admission_not_step_time() -> None:
    """A server whose lone TTFT is a 3 ms hand-over plus a step that grows 10 us per prompt token: the
    hand-over goes to the admission, which a running stream does not wait for, and only the tokens'
    part to the step (a newcomer's prefill among decodes lengthens their step by that alone)."""
    step = StepFit(step_s=0.004, per_seq_s=0.0005, per_prefill_token_s=0.0, per_context_token_s=0.0)
    sizes = (16, 32, 64, 128, 256, 488)
    lone = [(p, 0.003 + 0.0045 + 0.00001 * p) for p in sizes]
    curve, latency = prefill_curve(step, lone, 2048)
    assert latency == pytest.approx(0.003)
    assert [s for _, s in curve] == pytest.approx([0.00001 * p for p in sizes])
    fitted = msgspec.structs.replace(step, prefill=curve, admit_s=latency)
    for prompt, ttft in lone:
        assert fitted.admission_wait(0) + fitted.step_seconds(1, prompt, 0) == pytest.approx(ttft)
    decoding = fitted.step_seconds(8, 0, 0)
    assert fitted.step_seconds(9, 16, 0) - decoding == pytest.approx(0.0005 + 0.00016, rel=0.05)
    # and the admission grows with the streams the front end serves when the profile says so
    busy = msgspec.structs.replace(fitted, admit_busy_s=0.001, admit_per_seq_s=0.0002)
    assert busy.admission_wait(0) == pytest.approx(0.003)
    assert busy.admission_wait(10) == pytest.approx(0.003 + 0.001 + 0.002)


def test_a_class_is_off_when_its_replay_is_more_than_5_points_away_either_way_or_missing() -> None:
    real = {"bulk": 0.66, "chat": 0.65, "batch": 0.70}
    assert off_by_more(real, {"bulk": 0.70, "chat": 0.61, "batch": 0.70}) == []  # 4 points each
    assert off_by_more(real, {"bulk": 0.72, "chat": 0.59, "batch": 0.70}) == ["bulk", "chat"]
    assert off_by_more(real, {"bulk": 0.66, "chat": 0.65}) == ["batch"]  # never replayed


def test_a_sweep_whose_single_stream_speed_moved_says_so() -> None:
    """One stream's time per output token should not move with its prompt; a sweep that saw it move by
    more than the check's tolerance measured a slow stretch of the machine as well as the server."""

    def alone(itl: float, kind: str = "load", concurrency: int = 1) -> Level:
        return Level(kind, concurrency, 64, 32, engine_itl_s=itl)  # type: ignore[arg-type]

    steady = [alone(0.00190, "prefill"), alone(0.00201), alone(0.0030, concurrency=4), alone(0.0)]
    note = steadiness(steady)
    assert note == "one stream's time per output token over the sweep: 1.90-2.01 ms"
    slow = [*steady, alone(0.00268)]
    warned = steadiness(slow)
    assert warned is not None and warned.startswith(
        "one stream's time per output token over the sweep: 1.90-2.68"
    )
    assert "moved by 41% during the sweep" in warned and "calibrate again" in warned
    assert (
        steadiness([alone(0.002), alone(0.003, concurrency=2)]) is None
    )  # one single-stream level: no reading
    assert steadiness([alone(0.002), alone(0.0024)]) == (
        "one stream's time per output token over the sweep: 2.00-2.40 ms"
    )  # 20 % is within the tolerance
