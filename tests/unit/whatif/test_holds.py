"""The replay holds requests of back-pressure routes as the gateway does (gateway/request/pipeline.py
`_room`): a request whose route has no room waits in its class's queue, the head goes when a request ends
and makes room, a waiter is refused with 429 at `max_wait_ms` (on the gateway's clock) and at once when
the queue is full; a held request's arrival comes from the access log's `queued_s`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.fleet_spec import load_fleet_spec
from loadtest.client import Outcome
from loadtest.report import class_metrics
from loadtest.scenario import Slo
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.replay import Replay, ReplayResult
from loadtest.whatif.simfleet import build_fleet
from policies.config import load_policy
from policies.engine import PolicyEngine

FLEET = (
    "model: llama-3.1-8b\ngroups:\n  - {pool: h100, vendor: nvidia, accelerator: h100, count: 1,"
    " price_per_gpu_hour: 2.9, profile: {gpu: h100-sxm5}}\n"
)
POLICY = """name: one-at-a-time
classes:
  - name: fast
    when: {priority: high}
routes:
  fast:
    prefer: any
  default:
    prefer: any
    shed: true
    saturation: {max_inflight: 1}
    backpressure: {max_queued: 2, max_wait_ms: 1000, retry_after_s: 1}
"""


def _line(t: float, tokens: int = 50, **extra: object) -> dict[str, object]:
    line: dict[str, object] = {
        "ts": 1000.0 + t,
        "duration_s": 0.0,
        "request_id": f"r{t}",
        "endpoint": "chat",
        "status": 200,
        "model": "llama-3.1-8b",
        "stream": True,
        "backend": "h100-0",
        "class": "default",
        "prompt_tokens": 200,
        "completion_tokens": tokens,
        "prompt_estimate": 200,
        "max_tokens": tokens,
    }
    line.update(extra)
    return line


def _replay(tmp_path: Path, lines: list[dict[str, object]], clock_scale: float = 1.0) -> ReplayResult:
    log = tmp_path / "access.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "policy.yaml").write_text(POLICY)
    fleet = build_fleet(load_fleet_spec(tmp_path / "fleet.yaml"))
    engine = PolicyEngine(load_policy(tmp_path / "policy.yaml"), [s.backend for s in fleet])
    trace = read_log(log)
    return Replay(fleet, engine, trace.requests, scrape_interval_s=0.25, clock_scale=clock_scale).run()


def _by_index(result: ReplayResult) -> list[Outcome]:
    return sorted(result.outcomes, key=lambda o: o.index)


@pytest.mark.parametrize("clock_scale", [1.0, 2.0])
def test_a_held_request_goes_when_room_is_made_and_is_refused_at_max_wait_or_a_full_queue(
    tmp_path: Path, clock_scale: float
) -> None:
    # one backend, one request at a time (~7 ms a token): the first runs ~0.7 s per gateway second of
    # wait, the second waits for it, then runs ~0.55 s more; the third waits behind both and gives up at
    # max_wait; the fourth finds the queue full (2 waiting) and is refused at once
    k = int(clock_scale)
    lines = [_line(0.0, tokens=100 * k), _line(0.01, tokens=80 * k), _line(0.02), _line(0.03)]
    result = _replay(tmp_path, lines, clock_scale)
    first, second, third, fourth = _by_index(result)
    max_wait = 1.0 * clock_scale  # the gateway's max_wait_ms on its clock, in simulated seconds
    assert first.status == second.status == 200 and first.e2e is not None and second.ttft is not None
    assert first.e2e < max_wait + 0.01  # room made inside the second's wait
    # sent the moment the first ended: its wait is in its TTFT, as the client measures it
    assert second.ttft > first.e2e - 0.01
    assert (third.status, third.error, third.backend) == (429, "refused (429)", None)
    assert third.e2e == pytest.approx(max_wait)
    assert (fourth.status, fourth.error) == (429, "refused (429)") and fourth.e2e == 0.0
    assert (result.held, result.refused) == (2, 2)
    # counted as the load test counts a 429: an error that missed its SLO
    metrics = class_metrics(result.outcomes, {"default": Slo(ttft_ms=10_000)}, 10.0)
    assert metrics["errors"] == 2 and metrics["error_kinds"] == {"refused (429)": 2}
    assert metrics["slo_met"] == 2


def test_waiters_go_best_priority_first_and_an_unheld_class_is_never_held(tmp_path: Path) -> None:
    lines = [
        _line(0.0, tokens=30),
        _line(0.01, priority="low"),  # waits (the head)
        _line(0.02),  # unmarked: ahead of the low-priority waiter, so the head now
        _line(0.03, priority="high"),  # class `fast`, whose route has no back-pressure: sent at once
    ]
    first, low, unmarked, high = _by_index(_replay(tmp_path, lines))
    assert [o.status for o in (first, low, unmarked, high)] == [200, 200, 200, 200]
    assert high.ttft is not None and high.ttft < 0.1
    assert low.ttft is not None and unmarked.ttft is not None and unmarked.e2e is not None
    # the later, unmarked request was sent first; the low one only once it had ended
    assert unmarked.sent_at + unmarked.ttft < low.sent_at + low.ttft
    assert low.sent_at + low.ttft > unmarked.sent_at + unmarked.e2e


def test_the_log_s_queued_s_puts_a_held_request_back_at_its_arrival(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    lines = [_line(0.0, duration_s=1.0), _line(5.0, duration_s=1.0, queued_s=0.75)]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    trace = read_log(log)
    # arrivals: ts - duration_s - queued_s = 999.0 and 1003.25
    assert [r.at_s for r in trace.requests] == pytest.approx([0.0, 4.25])
