"""The open-loop arrival processes: Poisson rate and count, the ramp, bounds, determinism, trace replay."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from loadtest.arrivals import TraceError, expected_ramp_count, load_trace, poisson_times, ramp_times


def test_poisson_rate_and_count_within_tolerance() -> None:
    rate, duration = 20.0, 500.0
    times = poisson_times(rate, duration, random.Random(1), limit=1_000_000)
    expected = rate * duration  # 10,000; the count's standard deviation is 100
    assert abs(len(times) - expected) < 4 * math.sqrt(expected)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / rate, rel=0.05)
    # exponential gaps: the coefficient of variation is 1
    mean = sum(gaps) / len(gaps)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert sd / mean == pytest.approx(1.0, abs=0.05)
    assert times == sorted(times)
    assert all(0 <= t < duration for t in times)


def test_poisson_is_bounded_and_deterministic() -> None:
    assert len(poisson_times(1000.0, 60.0, random.Random(2), limit=50)) == 50
    assert poisson_times(5.0, 10.0, random.Random(3), 100) == poisson_times(5.0, 10.0, random.Random(3), 100)
    assert poisson_times(0.0, 10.0, random.Random(3), 100) == []


def test_ramp_rises_with_the_expected_count() -> None:
    duration = 400.0
    times = ramp_times(2.0, 18.0, duration, random.Random(4), limit=1_000_000)
    expected = expected_ramp_count(2.0, 18.0, duration)  # 4,000
    assert abs(len(times) - expected) < 4 * math.sqrt(expected)
    first = sum(t < duration / 4 for t in times)
    last = sum(t >= 3 * duration / 4 for t in times)
    # mean rate in the first quarter is 4/s, in the last 16/s
    assert last / first == pytest.approx(16 / 4, rel=0.2)
    assert len(ramp_times(2.0, 18.0, duration, random.Random(4), limit=30)) == 30


def test_trace_replay_sorts_shifts_and_bounds(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"t": 12.5, "class": "rag", "document": 2},
        {"t": 10.0, "class": "chat", "prompt_tokens": 30, "output_tokens": 5},
        {"t": 11.0},
        {"t": 99.0},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    entries = load_trace(path, duration_s=10.0)
    assert [e.t for e in entries] == [0.0, 1.0, 2.5]
    assert entries[0].cls == "chat" and entries[0].prompt_tokens == 30
    assert entries[2].document == 2
    assert len(load_trace(path, limit=2)) == 2


def test_trace_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 1}\n{"t": -3}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2"):
        load_trace(path)
    path.write_text('{"t": 1}\n{"when": 2}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2"):
        load_trace(path)
