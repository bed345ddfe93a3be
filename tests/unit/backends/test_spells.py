"""A calibrated server's slow spells: measured by the sweep, kept in the profile, drawn by the simulator and
the what-if replay (backends/calibrated.py `Pace`, backends/sim/spells.py, loadtest/calibrate/pace.py)."""

from __future__ import annotations

import statistics

import msgspec
import pytest

from backends.calibrated import Pace, StepFit, dump_profile, parse_profile
from backends.sim.perf import PerfModel, StepWork
from backends.sim.profiles import calibrated_hardware
from backends.sim.spells import Spells
from backends.yamlfile import ConfigError
from loadtest.calibrate.levels import Level
from loadtest.calibrate.measure import Timed
from loadtest.calibrate.pace import MIN_SAMPLES, pace_of
from tests.support import simulated_ttft
from tests.unit.backends.test_calibrated import STEP, profile

PACE = Pace(spell_s=0.2, factors=[0.6, 0.8, 1.0, 1.2, 1.4])


def _paced(pace: Pace | None, **step: float) -> StepFit:
    return msgspec.structs.replace(STEP, **step, pace=pace)


def test_a_profile_keeps_its_spells_and_a_bad_pace_names_the_line() -> None:
    paced = profile()
    paced.step = _paced(PACE)
    text = dump_profile(paced)
    assert parse_profile(text) == paced and "spell_s: 0.2" in text
    assert "pace" not in dump_profile(profile())  # a profile measured without spells is written as before
    bad = text.replace("- 0.8\n", "- 1.3\n")
    with pytest.raises(ConfigError, match=r"p\.yaml:\d+.*must not decrease"):
        parse_profile(bad, "p.yaml")
    with pytest.raises(ConfigError, match=r"p\.yaml:\d+"):
        parse_profile(text.replace("spell_s: 0.2", "spell_s: 0"), "p.yaml")
    with pytest.raises(ConfigError, match="above 0"):
        parse_profile(text.replace("- 0.6\n", "- 0.0\n"), "p.yaml")


def test_a_spell_holds_one_factor_drawn_from_the_seed_and_its_number_only() -> None:
    spells = Spells(PACE, seed=7)
    first = spells.factor(0.0)
    assert spells.factor(0.199) == first  # one spell, one factor
    again = Spells(PACE, seed=7)
    times = [i * 0.2 + 0.1 for i in range(2000)]
    drawn = [spells.factor(t) for t in times]
    assert [again.factor(t) for t in reversed(times)] == drawn[::-1]  # the same whatever the order asked
    assert all(0.6 <= f <= 1.4 for f in drawn)
    assert statistics.fmean(drawn) == pytest.approx(1.0, abs=0.02)  # the factors' mean
    assert statistics.pstdev(drawn) > 0.2  # spread as the factors are
    other = [Spells(PACE, seed=8).factor(t) for t in times]
    assert other != drawn  # another server, its own spells


def test_the_step_model_takes_the_factor_of_the_spell_a_step_starts_in() -> None:
    paced = profile()
    paced.step = _paced(Pace(spell_s=1.0, factors=[2.0]))
    hardware = calibrated_hardware(paced)
    work = StepWork(prefill_tokens=100, prefill_seqs=1, decode_seqs=3, decode_context=300)
    steady = STEP.step_seconds(4, 100, 300)
    perf = PerfModel(hardware)
    assert perf.step_seconds(work, 5.0) == pytest.approx(2 * steady)
    assert perf.step_seconds(work) == pytest.approx(steady)  # no time given: the model's own
    assert perf.step_seconds(StepWork(), 5.0) == 0.0


async def test_the_http_simulator_runs_its_steps_at_the_spells_pace() -> None:
    steady, slow = profile(request_s=0.0), profile(request_s=0.0)
    steady.step = _paced(None, request_s=0.0)
    slow.step = _paced(Pace(spell_s=0.5, factors=[3.0]), request_s=0.0)
    alone = await simulated_ttft(steady, 200)
    assert alone == pytest.approx(steady.ttft_seconds(200), rel=0.02)
    assert await simulated_ttft(slow, 200) == pytest.approx(3 * alone, rel=0.02)  # a step, not a front end


def _level(
    ratios: list[float], *, concurrency: int = 4, outputs: tuple[int, ...] = (), itl: float = 0.01
) -> Level:
    timed = [Timed(64, 32, i * 0.1, 0.02, 0.01 * r, 0.02 + 31 * 0.01 * r) for i, r in enumerate(ratios)]
    return Level("load", concurrency, 64, 32, timed, engine_itl_s=itl, outputs=outputs)


def test_the_sweep_measures_spells_as_the_spread_within_levels_of_one_shape() -> None:
    spread = [0.7, 0.8, 0.9, 1.0, 1.0, 1.1, 1.2, 1.3]  # mean 1.0
    levels = [_level(spread) for _ in range(6)]
    pace = pace_of(levels)
    assert pace is not None and len(pace.factors) == 10
    assert statistics.harmonic_mean(pace.factors) == pytest.approx(1.0, abs=1e-3)
    assert pace.factors == sorted(pace.factors)
    assert (pace.factors[0], pace.factors[-1]) == pytest.approx((0.7, 1.3), abs=0.05)
    # Steps run back to back through the spells: counted one by one they keep the measured mean and spread
    # (a slow spell holds fewer steps, which the factors, counted by time, make up for).
    spells, at, step_s, steps = Spells(pace, seed=3), 0.0, 0.001, []
    while at < 2000.0:
        factor = spells.factor(at)
        steps.append(factor)
        at += step_s * factor
    assert statistics.fmean(steps) == pytest.approx(1.0, abs=0.02)
    measured = statistics.quantiles(spread * 6, n=10)
    simulated = statistics.quantiles(steps, n=10)
    assert (simulated[0], simulated[-1]) == pytest.approx((measured[0], measured[-1]), abs=0.05)
    assert pace.spell_s == pytest.approx(0.31)  # a request's decode: as long as the spread was measured over
    # a level twice as slow spreads the same: factors are relative to each level's own mean
    slower = pace_of([_level([2 * r for r in spread]) for _ in range(6)])
    assert slower is not None and slower.factors == pace.factors


def test_levels_that_spread_by_design_or_measured_the_client_are_left_out() -> None:
    wild = [0.2, 0.2, 0.2, 3.0, 3.0, 3.0, 0.2, 3.0]
    staggered = _level(wild, outputs=(16, 24, 32, 40, 48, 56, 64, 16))
    bursty = _level(
        [0.1 * r for r in wild], itl=0.01
    )  # the client got tokens faster than the server made them
    assert bursty.bursty
    few = _level([1.0] * 7)  # too few requests to measure a spread
    steady = [_level([0.9, 1.1] * 4) for _ in range(MIN_SAMPLES // 8)]
    pace = pace_of([staggered, bursty, few, *steady])
    assert pace is not None and pace.factors[0] >= 0.88 and pace.factors[-1] <= 1.12
    assert pace_of(steady[:-1]) is None  # too few samples in all: no spells rather than a guess
