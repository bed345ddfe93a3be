"""The what-if replay on a backend timed by a measured profile: its front end and busy-engine wait count."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.calibrated import Pace, StepFit
from loadtest.calibrate.agreement import ClassSlo, calibrated_fleet, replayed_attainment
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.replay import Replay
from loadtest.whatif.simfleet import build_fleet
from policies.config import load_policy
from policies.engine import PolicyEngine
from tests.calibrated_replay import MODEL, write_log, write_profile


def _profile(
    path: Path,
    request_s: float,
    admit_busy_s: float,
    prefill: list[tuple[int, float]] | None = None,
    pace: Pace | None = None,
) -> Path:
    step = StepFit(
        step_s=0.002,
        per_seq_s=0.0,
        per_prefill_token_s=0.0001,
        per_context_token_s=0.0,
        request_s=request_s,
        admit_busy_s=admit_busy_s,
        prefill=prefill or [],
        pace=pace,
    )
    return write_profile(path, step)


def _log(path: Path, arrivals: list[float]) -> Path:
    return write_log(path, [(at, None, 0.5) for at in arrivals])


def _outcomes(log: Path, profile: Path) -> list[tuple[float, float]]:
    """Each request's replayed TTFT and time per output token."""
    fleet = build_fleet(calibrated_fleet(profile, MODEL, 512, "calibrated"))
    engine = PolicyEngine(load_policy(policy_file("balanced")), [s.backend for s in fleet])
    result = Replay(fleet, engine, read_log(log).requests, 0.2).run()
    return [(o.ttft or 0.0, o.tpot or 0.0) for o in result.outcomes]


def _ttfts(log: Path, profile: Path) -> list[float]:
    return [ttft for ttft, _ in _outcomes(log, profile)]


def test_replayed_ttft_counts_the_front_end_and_the_busy_engines_wait(tmp_path: Path) -> None:
    log = _log(tmp_path / "a.jsonl", [0.0, 10.0, 10.015])  # one alone, then one while another runs
    bare = _ttfts(log, _profile(tmp_path / "bare.yaml", 0.0, 0.0))
    measured = _ttfts(log, _profile(tmp_path / "front.yaml", 0.01, 0.02))
    prefill = 0.002 + 100 * 0.0001
    assert bare[0] == pytest.approx(prefill)
    assert measured[0] == pytest.approx(0.01 + prefill)  # the front end, then its prefill step
    assert measured[2] >= 0.01 + 0.02 + prefill - 1e-9  # arrived while the engine was busy: it waited
    slos = {"chat": ClassSlo(ttft_s=0.03, tpot_s=1.0)}
    shares = replayed_attainment(log, calibrated_fleet(tmp_path / "front.yaml", MODEL, 512, "calibrated"),
                                 policy_file("balanced"), slos)  # fmt: skip
    assert shares["chat"] == pytest.approx(2 / 3)


def test_replay_prefills_on_the_profiles_curve_at_each_steps_total(tmp_path: Path) -> None:
    """A measured prefill curve: a 100-token prompt alone, then one more (A) whose prefill step two
    others (B, C) arrive during; B and C are prefilled together in the next step, at the curve's value for
    200 tokens (not twice its value for 100)."""
    log = _log(tmp_path / "a.jsonl", [0.0, 10.0, 10.001, 10.001])
    curve = [(50, 0.006), (200, 0.010)]
    alone = 0.002 + 0.006 + 0.004 * 50 / 150  # one step of one sequence prefilling 100 tokens
    ttfts = _ttfts(log, _profile(tmp_path / "curve.yaml", 0.0, 0.0, curve))
    assert ttfts[:2] == pytest.approx([alone, alone])
    assert ttfts[2:] == pytest.approx([alone + 0.002 + 0.010 - 0.001] * 2)
    linear = _ttfts(log, _profile(tmp_path / "linear.yaml", 0.0, 0.0))
    assert linear[2:] == pytest.approx([0.002 + 100 * 0.0001 + 0.002 + 200 * 0.0001 - 0.001] * 2)


def test_replayed_steps_run_at_the_pace_of_the_servers_spells(tmp_path: Path) -> None:
    """Every step, coasted decode steps too, takes its model's time times its spell's factor; the front
    end is not a step and keeps its own time."""
    log = _log(tmp_path / "a.jsonl", [0.0, 10.0, 10.001])
    steady = _outcomes(log, _profile(tmp_path / "steady.yaml", 0.01, 0.0))
    slow = _outcomes(log, _profile(tmp_path / "slow.yaml", 0.01, 0.0, pace=Pace(spell_s=0.05, factors=[2.0])))
    for (ttft, tpot), (slow_ttft, slow_tpot) in zip(steady, slow, strict=True):
        assert slow_ttft - 0.01 == pytest.approx(2 * (ttft - 0.01), rel=0.05)
        assert slow_tpot == pytest.approx(2 * tpot)
    spread = _outcomes(
        log, _profile(tmp_path / "spread.yaml", 0.01, 0.0, pace=Pace(spell_s=0.001, factors=[0.5, 1.5]))
    )
    assert spread != steady and spread == _outcomes(
        log, tmp_path / "spread.yaml"
    )  # drawn, and the same each time


def test_attainment_on_a_profile_with_spells_is_the_mean_over_draws(tmp_path: Path) -> None:
    """One replay meets one draw of the spells; the attainment the check compares is the mean of several,
    each its own draw (another seed per draw), and a profile without spells is replayed once."""
    arrivals = [i * 0.05 for i in range(60)]
    log = _log(tmp_path / "a.jsonl", arrivals)
    paced = _profile(tmp_path / "p.yaml", 0.0, 0.0, pace=Pace(spell_s=0.02, factors=[0.5, 1.0, 2.0]))
    fleet = calibrated_fleet(paced, MODEL, 512, "calibrated")
    policy = policy_file("balanced")
    ttfts = sorted(_ttfts(log, paced))
    slos = {"chat": ClassSlo(ttft_s=ttfts[len(ttfts) // 2], tpot_s=1.0)}
    singles = []
    for draw in range(4):
        sims = build_fleet(fleet, draw)
        engine = PolicyEngine(load_policy(policy), [s.backend for s in sims])
        outcomes = Replay(sims, engine, read_log(log).requests, 0.2).run().outcomes
        singles.append(sum(o.ok and (o.ttft or 0.0) <= slos["chat"].ttft_s for o in outcomes) / len(outcomes))
    assert len(set(singles)) > 1  # each draw its own spells
    assert replayed_attainment(log, fleet, policy, slos, draws=4)["chat"] == pytest.approx(sum(singles) / 4)
    steady = calibrated_fleet(_profile(tmp_path / "s.yaml", 0.0, 0.0), MODEL, 512, "calibrated")
    assert replayed_attainment(log, steady, policy, slos, draws=4) == replayed_attainment(
        log, steady, policy, slos, draws=1
    )
