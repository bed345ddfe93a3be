"""The virtual-clock replay agrees with the real thing: the same trace through the HTTP load test (simulated
fleet processes, the gateway, streamed requests) and through `switchyard whatif`'s replay gives the same SLO
attainment (within 2 points) and TTFT p50 (within 10%), per class. Run by `make test-whatif` (~1 minute)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.compare import run_policy
from loadtest.scenario import parse_scenario
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import replay_policy, whatif_scenario
from loadtest.whatif.synth import write_log
from loadtest.workload import plan

pytestmark = pytest.mark.whatif

SCENARIO = """
name: agree
seed: 11
duration_s: 40
time_scale: 2
max_requests: 120
drain_s: 60
arrivals: {process: poisson, rate: 2.5}
fleet:
  model: llama-3.1-70b
  groups:
    - {pool: h100, vendor: nvidia, accelerator: h100, count: 1, gpus_per_backend: 2, price_per_gpu_hour: 2.9,
       profile: {gpu: h100-sxm5, model: llama-3.1-70b}}
    - {pool: mi300x, vendor: amd, accelerator: mi300x, count: 1, price_per_gpu_hour: 1.75,
       max_model_len: 32768, profile: {gpu: mi300x, model: llama-3.1-70b}}
classes:
  - name: chat
    weight: 4
    prompt_tokens: {mean: 600, spread: 0.5, min: 50, max: 1500}
    output_tokens: {mean: 60, spread: 0.4, min: 8, max: 150}
    priority: {value: high, fraction: 0.3}
    slo: {ttft_ms: 400, tpot_ms: 40}
  - name: rag
    weight: 1
    prompt_tokens: {mean: 4000, spread: 0.05, min: 3600, max: 4400}
    output_tokens: {mean: 60, spread: 0.3, min: 16, max: 120}
    shared_prefix: {documents: 2, tokens: 3500}
    slo: {ttft_ms: 1500, tpot_ms: 60}
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replay_agrees_with_the_http_load_test(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO, tmp_path / "agree.yaml")
    requests = plan(scenario)
    http = run_policy(scenario, "balanced", requests, tmp_path / "http")

    trace = read_log(write_log(requests, tmp_path / "access.jsonl"))
    slos = {c.name: c.slo for c in scenario.spec.classes}
    replay_scenario = whatif_scenario(trace, scenario.fleet, slos)
    # the load test's gateway scrapes every 0.25 real seconds: that many simulated seconds times the scale
    replayed = replay_policy("balanced", Path(_policy("balanced")), replay_scenario, trace, 0.25 * 2).report

    summary = {
        cls: {
            "http": (http["classes"][cls]["slo_attainment"], http["classes"][cls]["ttft_ms"]["p50"]),
            "replay": (
                replayed["classes"][cls]["slo_attainment"],
                replayed["classes"][cls]["ttft_ms"]["p50"],
            ),
        }
        for cls in ("chat", "rag")
    }
    (tmp_path / "agreement.json").write_text(json.dumps(summary))
    assert http["overall"]["errors"] == 0 and replayed["overall"]["errors"] == 0
    for cls, both in summary.items():
        (http_met, http_ttft), (replay_met, replay_ttft) = both["http"], both["replay"]
        assert abs(http_met - replay_met) <= 0.02, (cls, summary)
        assert replay_ttft == pytest.approx(http_ttft, rel=0.10), (cls, summary)


def _policy(name: str) -> str:
    from loadtest.stack import policy_file

    return str(policy_file(name))
