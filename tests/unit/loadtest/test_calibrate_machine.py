"""The check's CPU meter (loadtest/calibrate/machine.py): each CPU's busy share over what it measured."""

from __future__ import annotations

from pathlib import Path

from loadtest.calibrate.machine import BusyMeter, cpu_times


def _stat(path: Path, cpu0: tuple[int, int], cpu1: tuple[int, int]) -> None:
    """`/proc/stat` with (busy user ticks, idle ticks) per CPU; the all-CPUs line and others are ignored."""

    def line(name: str, busy: int, idle: int) -> str:
        return f"{name} {busy} 0 0 {idle} 0 0 0 0 0 0"

    path.write_text(
        "\n".join(
            [
                line("cpu", cpu0[0] + cpu1[0], cpu0[1] + cpu1[1]),
                line("cpu0", *cpu0),
                line("cpu1", *cpu1),
                "intr 12345 0 0",
                "ctxt 999",
            ]
        )
        + "\n"
    )


def test_the_busy_share_is_added_over_the_stretches_measured(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    meter = BusyMeter(stat)
    _stat(stat, (100, 100), (50, 150))
    with meter.measuring():
        _stat(stat, (175, 125), (60, 240))  # cpu0 75 of 100 ticks busy, cpu1 10 of 100
    _stat(stat, (500, 500), (500, 500))  # between stretches: not counted
    with meter.measuring():
        _stat(stat, (525, 575), (590, 510))  # cpu0 25 of 100, cpu1 90 of 100
    assert meter.shares() == {"cpu0": 0.5, "cpu1": 0.5}
    assert meter.describe() == "cpu0 50%, cpu1 50%"
    assert cpu_times(stat) == {"cpu0": (525, 1100), "cpu1": (590, 1100)}


def test_a_machine_without_proc_stat_is_not_measured(tmp_path: Path) -> None:
    meter = BusyMeter(tmp_path / "missing")
    with meter.measuring():
        pass
    assert meter.shares() == {} and meter.describe() == "not measured"
