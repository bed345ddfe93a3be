"""Where the replay departs from the run: the log's requests split by the load each arrived into."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.calibrated import StepFit
from loadtest.calibrate.agreement import ClassSlo, calibrated_fleet, replayed_attainment
from loadtest.calibrate.gap import format_parts, in_flight, replayed_with_parts
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from tests.calibrated_replay import MODEL, write_log, write_profile

REQUEST_S = 0.01
PREFILL_S = 0.002 + 100 * 0.0001  # one step of one sequence prefilling 100 tokens


def _profile(path: Path) -> Path:
    step = StepFit(
        step_s=0.002, per_seq_s=0.0, per_prefill_token_s=0.0001, per_context_token_s=0.0, request_s=REQUEST_S
    )
    return write_profile(path, step)


def test_requests_are_split_by_how_many_were_in_flight_when_they_came(tmp_path: Path) -> None:
    # three alone (2 s apart, each over in 0.1 s), then six together, each running 0.5 s
    alone = [(2.0 * i, 0.015, 0.1) for i in range(3)]
    burst = [(10.0 + 0.001 * i, 0.030 + 0.01 * i, 0.5) for i in range(6)]
    log = write_log(tmp_path / "a.jsonl", alone + burst)
    assert in_flight(read_log(log).requests) == [0, 0, 0, 0, 1, 2, 3, 4, 5]

    slos = {"chat": ClassSlo(ttft_s=0.05, tpot_s=1.0)}
    fleet = calibrated_fleet(_profile(tmp_path / "p.yaml"), MODEL, 512, "calibrated")
    shares, parts = replayed_with_parts(log, fleet, policy_file("balanced"), slos, 0.2)
    assert [(p.load, p.requests) for p in parts] == [("0-1", 5), ("2-4", 3), ("5-8", 1)]
    light, middle, heavy = parts
    # the run: TTFTs 15 ms (three), 30, 40 | 50, 60, 70 | 80 ms against a 50 ms bound
    assert light.ttft_met[0] == pytest.approx(1.0)
    assert middle.ttft_met[0] == pytest.approx(1 / 3)
    assert heavy.ttft_met[0] == 0.0
    assert light.ttft_p50_s[0] == pytest.approx(0.015)
    # the replay: a lone request pays the front end and its prefill step; the burst queues for the front
    # end one at a time, so the later ones of it come out slower
    assert light.ttft_p50_s[1] == pytest.approx(REQUEST_S + PREFILL_S)
    assert heavy.ttft_p50_s[1] > middle.ttft_p50_s[1] > light.ttft_p50_s[1]
    assert all(p.tpot_met == (1.0, 1.0) for p in parts)
    # the parts hold every request once, and their replayed shares add up to the replay's attainment
    met = sum(p.ttft_met[1] * p.requests for p in parts) / sum(p.requests for p in parts)
    assert met == pytest.approx(shares["chat"])
    assert shares == replayed_attainment(log, fleet, policy_file("balanced"), slos)
    table = format_parts(parts)
    assert table.splitlines()[1].split()[:3] == ["chat", "0-1", "5"]


def test_a_request_the_run_failed_met_neither_bound(tmp_path: Path) -> None:
    """As the run's attainment counts it (agreement.logged_attainment): a 502 with a quick first token
    and a quick finish still missed, and its times are no median."""
    requests = [(2.0 * i, 0.015, 0.1) for i in range(4)]
    log = write_log(tmp_path / "a.jsonl", requests, failed=[1])
    slos = {"chat": ClassSlo(ttft_s=0.05, tpot_s=1.0)}
    fleet = calibrated_fleet(_profile(tmp_path / "p.yaml"), MODEL, 512, "calibrated")
    shares, (alone,) = replayed_with_parts(log, fleet, policy_file("balanced"), slos, 0.2)
    assert alone.requests == 4
    assert alone.ttft_met[0] == pytest.approx(3 / 4)
    assert alone.tpot_met[0] == pytest.approx(3 / 4)
    assert alone.ttft_p50_s[0] == pytest.approx(0.015)
    assert alone.tpot_p50_s[0] == pytest.approx((0.1 - 0.015) / 9)
    assert alone.ttft_met[1] == alone.tpot_met[1] == 1.0  # the replay served every one of them
    assert shares == {"chat": 1.0}
