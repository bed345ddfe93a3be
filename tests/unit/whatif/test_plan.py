"""`switchyard plan` end to end on a recorded log: the fleet it writes meets every class's SLO when
replayed (at the recorded load and at --scale times it), and the next cheaper mix on its frontier does not
under any policy; the frontier, the plot and the gateway config are written."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.sim.fleet_spec import load_fleet_spec
from gateway.cli.main import main
from gateway.config.settings import load_settings
from loadtest.scenario import Slo, parse_scenario
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import replay_policy, whatif_scenario
from loadtest.whatif.plan import fleet_of
from loadtest.whatif.plan_cli import make_plan, preset_policies
from loadtest.whatif.synth import write_log
from loadtest.workload import plan

SCENARIO = """
name: plan
seed: 5
duration_s: 40
time_scale: 1
max_requests: 200
arrivals: {process: poisson, rate: 2.5}
fleet: {model: llama-3.1-70b, groups: [{pool: x, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1,
        profile: {gpu: mi300x}}]}
classes:
  - name: chat
    weight: 4
    prompt_tokens: {mean: 600, spread: 0.5, min: 50, max: 1500}
    output_tokens: {mean: 60, spread: 0.4, min: 8, max: 150}
    priority: {value: high, fraction: 0.3}
  - name: rag
    weight: 1
    prompt_tokens: {mean: 4000, spread: 0.05, min: 3600, max: 4400}
    output_tokens: {mean: 60, spread: 0.3, min: 16, max: 120}
    shared_prefix: {documents: 2, tokens: 3500}
"""
SLOS = {"chat": Slo(ttft_ms=400, tpot_ms=40), "rag": Slo(ttft_ms=1500, tpot_ms=80)}
ARGS = ["--slo", "chat:ttft_ms=400,tpot_ms=40", "--slo", "rag:ttft_ms=1500,tpot_ms=80", "--target", "0.9"]


def _worst(log: Path, fleet: object, policy: str, path: Path, scale: float) -> float:
    trace = read_log(log, scale)
    report = replay_policy(policy, path, whatif_scenario(trace, fleet, SLOS), trace).report  # type: ignore[arg-type]
    return min(report["classes"][c]["slo_attainment"] for c in SLOS)


@pytest.mark.timeout(180)
def test_plan_recommends_the_cheapest_fleet_that_meets_the_slos(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(plan(parse_scenario(SCENARIO, tmp_path / "s.yaml")), tmp_path / "access.jsonl")
    out = tmp_path / "plan"
    assert main(["plan", "--log", str(log), "--scale", "1.5", "--out", str(out), *ARGS]) == 0
    printed = capsys.readouterr().out
    assert "<- cheapest that meets the SLOs" in printed and "$/hour" in printed
    assert (out / "frontier.svg").read_text().startswith("<svg")
    settings = load_settings(out / "gateway.yaml")  # a config the gateway accepts
    recommended = load_fleet_spec(out / "fleet.yaml")
    assert sum(len(p.backends) for p in settings.pools) == sum(g.count for g in recommended.groups)

    result = make_plan(log, [], 1.5, None, SLOS, 0.9)  # the same search, to read its frontier
    assert result.best is not None and result.best.policy is not None
    policies = dict(preset_policies())
    winner = result.best.policy
    for scale in (1.0, 1.5):
        assert _worst(log, recommended, winner, policies[winner], scale) >= 0.9
    frontier = result.frontier
    cheaper = frontier[frontier.index(result.best) - 1]
    assert cheaper.usd_per_hour < result.best.usd_per_hour
    cheaper_fleet = fleet_of(result.types, cheaper.counts, result.model)
    assert all(
        min(_worst(log, cheaper_fleet, name, path, s) for s in (1.0, 1.5)) < 0.9
        for name, path in policies.items()
    )


def test_plan_refuses_an_unknown_gpu_and_a_bad_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(plan(parse_scenario(SCENARIO, tmp_path / "s.yaml"))[:5], tmp_path / "access.jsonl")
    assert main(["plan", "--log", str(log), "--gpu", "tpu=3"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    assert main(["plan", "--log", str(log), "--gpu", "h100=abc"]) == 2
    assert "NAME=USD_PER_GPU_HOUR" in capsys.readouterr().err
