"""The two-worker bench's projections, from known CPU costs per answer."""

from __future__ import annotations

import pytest

from loadtest.bench.workers_scaling import format_table, summarize


def _rounds(one: float, many: float, alone: float, control: float) -> dict[str, list[float]]:
    # medians of three rounds, the middle value each time
    return {
        k: [v * 1.1, v, v * 0.9]
        for k, v in (("one", one), ("many", many), ("alone", alone), ("control", control))
    }


def test_workers_as_cheap_as_separate_processes_on_free_cores_project_to_n() -> None:
    # taking turns on one core costs a fifth more per answer, whatever the processes are
    case = summarize(2, 32, _rounds(one=300, many=360, alone=300, control=360), [0.5, 0.5, 0.5])
    assert case["projected_scaling_raw"] == pytest.approx(300 / 360 / 0.5)
    assert case["workers_over_separate"] == pytest.approx(1.0)
    assert case["projected_scaling"] == pytest.approx(2.0)


def test_the_workers_own_cost_and_an_uneven_split_lower_the_projection() -> None:
    case = summarize(2, 4, _rounds(one=300, many=396, alone=330, control=360), [0.6, 0.55, 0.6])
    assert case["workers_over_separate"] == pytest.approx(1.1)
    # a core each: 330 x 1.1 per answer, the busier worker taking 60 % of the answers
    assert case["projected_scaling"] == pytest.approx(300 / (330 * 1.1 * 0.6))
    assert case["alone_c4_us_per_answer"] == 330


def test_table_names_both_projections() -> None:
    summary = {
        "workers": 2,
        "tokens": 512,
        "cases": {"c=8": summarize(2, 4, _rounds(300, 396, 330, 360), [0.5])},
    }
    table = format_table(summary)
    assert "c=8" in table and "1.52x" in table and "1.65x" in table
