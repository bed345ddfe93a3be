"""A replay keeps each session's order: its next request waits for the replayed answer and the logged think
time (loadtest/whatif/sessions.py); requests without a session, or that overlapped in the log, keep their
logged times."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.sim.fleet_spec import load_fleet_spec
from loadtest.client import Outcome
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.replay import Replay
from loadtest.whatif.sessions import Sessions
from loadtest.whatif.simfleet import build_fleet
from policies.config import load_policy
from policies.engine import PolicyEngine
from tests.unit.whatif.test_replay import _line, _write

THINK_S = 0.5


def _log(tmp_path: Path, output_tokens: int) -> Path:
    """Session `a`: four turns, each sent THINK_S after the previous one ended (1 s each in the log);
    session `b`: two requests that overlapped; four requests without a session."""
    size = {"completion_tokens": output_tokens, "max_tokens": output_tokens}
    turns = [_line(k * (1.0 + THINK_S), request_id=f"a{k}", session_hash="aa", **size) for k in range(4)]
    overlapping = [_line(t, request_id=f"b{t}", session_hash="bb", **size) for t in (0.1, 0.6)]
    lone = [
        _line(k * 1.5 + 0.2, request_id=f"lone{k}", completion_tokens=20, max_tokens=20) for k in range(4)
    ]
    return _write(tmp_path / "access.jsonl", [*turns, *overlapping, *lone])


def _replay(
    log: Path, tmp_path: Path, keep_sessions: bool, scrape_interval_s: float = 0.2, drain_s: float = 600.0
) -> tuple[dict[str, Outcome], dict[str, float]]:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "model: llama-3.1-8b\ngroups:\n  - {pool: h100, vendor: nvidia, accelerator: h100, count: 1,"
        " price_per_gpu_hour: 2.9, profile: {gpu: h100-sxm5}}\n"
    )
    trace = read_log(log)
    fleet = build_fleet(load_fleet_spec(fleet_file))
    engine = PolicyEngine(load_policy(policy_file("balanced")), [s.backend for s in fleet])
    replay = Replay(fleet, engine, trace.requests, scrape_interval_s, drain_s, keep_sessions=keep_sessions)
    result = replay.run()
    assert len(result.outcomes) == len(trace.requests)  # one outcome per logged request, always
    ids = {r.index: r.line.request_id for r in trace.requests}
    logged = {r.line.request_id: r.at_s for r in trace.requests}
    return {ids[o.index]: o for o in result.outcomes}, logged


def _end(outcome: Outcome) -> float:
    assert outcome.status == 200 and outcome.e2e is not None
    return outcome.sent_at + outcome.e2e


@pytest.mark.parametrize("output_tokens", [40, 600], ids=["faster-fleet", "slower-fleet"])
def test_a_sessions_next_turn_is_sent_its_think_time_after_the_replayed_answer(
    tmp_path: Path, output_tokens: int
) -> None:
    log = _log(tmp_path, output_tokens)
    kept, logged = _replay(log, tmp_path, keep_sessions=True)
    assert len(kept) == 10
    for k in range(1, 4):
        assert kept[f"a{k}"].sent_at == pytest.approx(_end(kept[f"a{k - 1}"]) + THINK_S, abs=1e-9)
        assert kept[f"a{k}"].sent_at != pytest.approx(logged[f"a{k}"], abs=0.01)  # the fleet is not the log's
    untouched = [name for name in kept if not name.startswith("a") or name == "a0"]
    for name in untouched:  # no session, overlapping in the log, or a session's first: at its logged time
        assert kept[name].sent_at == pytest.approx(logged[name], abs=1e-9), name


def test_an_open_loop_replay_sends_every_request_at_its_logged_time(tmp_path: Path) -> None:
    """The slower fleet without sessions: a session's turns pile up (sent before the previous ended)."""
    opened, logged = _replay(_log(tmp_path, 600), tmp_path, keep_sessions=False)
    assert all(outcome.sent_at == pytest.approx(logged[name], abs=1e-9) for name, outcome in opened.items())
    assert any(opened[f"a{k}"].sent_at < _end(opened[f"a{k - 1}"]) for k in range(1, 4))


def test_sessions_chain_only_what_followed_an_answer(tmp_path: Path) -> None:
    requests = read_log(_log(tmp_path, 40)).requests
    names = {r.index: r.line.request_id for r in requests}
    sessions = Sessions(requests)
    assert {names[i] for i in sessions.follows} == {"a1", "a2", "a3"}
    assert not Sessions(requests, keep_order=False).follows
    first = next(r for r in requests if r.line.request_id == "a0")
    sessions.ended(first.index, 10.0)
    assert sessions.next_at() == pytest.approx(10.0 + THINK_S)
    assert sessions.pop().line.request_id == "a1"
    sessions.ended(first.index, 20.0)  # told twice: released once
    assert sessions.next_at() == float("inf")


def test_a_turn_released_while_decode_steps_are_coasted_joins_the_next_step(tmp_path: Path) -> None:
    """The replay applies runs of decode-only steps at once up to the next arrival (coasting); a turn its
    session releases inside such a run is an arrival too: the replay gives the same answers whether it
    coasts (scrapes far apart) or steps one at a time (a scrape before every step)."""
    background = _line(0.0, request_id="long", completion_tokens=3000, max_tokens=3000)
    turns = [_line(0.05 + k * 1.5, request_id=f"a{k}", session_hash="aa", completion_tokens=30, max_tokens=30)
             for k in range(6)]  # fmt: skip
    log = _write(tmp_path / "access.jsonl", [background, *turns])
    coasting, _ = _replay(log, tmp_path, keep_sessions=True, scrape_interval_s=1000.0)
    stepwise, _ = _replay(log, tmp_path, keep_sessions=True, scrape_interval_s=0.001)
    assert coasting.keys() == stepwise.keys() and len(coasting) == 7
    assert _end(stepwise["a5"]) < _end(stepwise["long"])  # every turn was released during the long decode
    for name, outcome in stepwise.items():
        assert coasting[name].sent_at == pytest.approx(outcome.sent_at, abs=1e-6), name
        assert coasting[name].ttft == pytest.approx(outcome.ttft, abs=1e-6), name
        assert coasting[name].e2e == pytest.approx(outcome.e2e, abs=1e-6), name


def test_a_turn_whose_previous_answer_outlasts_the_replay_is_reported_unsent(tmp_path: Path) -> None:
    """The replay drains for `drain_s` after the last logged arrival; a session's turn still waiting for
    its previous answer then was never sent: it is an outcome with an error, not a missing line."""
    size = {"completion_tokens": 4000, "max_tokens": 4000, "duration_s": 0.2}
    turns = [_line(k * 0.5, request_id=f"a{k}", session_hash="aa", **size) for k in range(2)]
    outcomes, _ = _replay(_write(tmp_path / "access.jsonl", turns), tmp_path, True, drain_s=1.0)
    assert outcomes["a0"].error == outcomes["a1"].error == "unfinished at deadline"
    assert outcomes["a1"].e2e is None
