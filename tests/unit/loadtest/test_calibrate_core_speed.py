"""The machine's own steadiness, second by second (loadtest/calibrate/core_speed.py)."""

from __future__ import annotations

import os

import pytest

from loadtest.calibrate import check, core_speed, levels
from loadtest.calibrate.core_speed import CoreSpeed, measure, report


def test_a_core_that_held_its_speed_is_steady() -> None:
    speed = CoreSpeed(0, (1000, 1040, 980, 1010, 995))
    assert speed.median == 1000
    assert speed.slowest == pytest.approx(0.98)
    assert speed.fastest == pytest.approx(1.04)
    assert speed.off_seconds() == 0 and speed.longest_slow() == 0
    assert speed.steady()


def test_a_slow_stretch_is_counted_and_its_length_read() -> None:
    # half speed for three seconds in a row, then one second fast: the machine of docs/calibrate.md
    speed = CoreSpeed(1, (1000, 1000, 500, 520, 480, 1000, 1300, 1000, 1000))
    assert speed.median == 1000
    assert speed.off_seconds() == 4  # three slow, one fast
    assert speed.longest_slow() == 3
    assert not speed.steady()
    assert speed.steady(tolerance=0.6)  # nothing more than 60 % off
    assert "longest slow stretch 3 s" in speed.describe()


def test_the_report_names_the_unsteady_cores() -> None:
    speeds = [CoreSpeed(0, (100, 101, 99)), CoreSpeed(1, (100, 50, 100))]
    assert core_speed.unsteady(speeds) == speeds[1:]
    lines = report(speeds)
    assert lines[0].startswith("cpu0: 3 s, slowest second 0.99")
    assert lines[-1].startswith("warning: cpu1 did not hold one speed within 20%")
    assert report([CoreSpeed(0, (100, 101, 99))])[-1].startswith("every CPU held its speed within 20%")


def test_its_bound_is_the_checks_as_is_the_sweeps_warning() -> None:
    assert core_speed.TOLERANCE == check.TOLERANCE
    assert pytest.approx(1.0 + check.TOLERANCE) == levels.UNSTEADY


def test_each_core_is_counted_at_once_by_a_process_of_its_own() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    speeds = measure(1, cpus)
    assert [speed.cpu for speed in speeds] == cpus
    assert all(len(speed.per_second) == 1 and speed.per_second[0] > 0 for speed in speeds)


@pytest.mark.parametrize("argv", [["--seconds", "0"], ["--tolerance", "1.5"], ["--tolerance", "0"]])
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        core_speed.main(argv)
    assert exited.value.code == 2
    assert "--" in capsys.readouterr().err
