"""The virtual-clock replay agrees with the real thing: a scenario's traffic served over HTTP (simulated
fleet processes, the gateway with its access log on, streamed requests), then the access log the gateway
wrote replayed by `switchyard whatif`'s replay, give the same SLO attainment (within 2 points) and TTFT
p50 (within 10%), per class. Run by `make test-whatif` (~1 minute).

The replay is told what the load test does to time: the fleet runs `time_scale` times faster than real
time, so the log's real times are divided by it, the gateway's 0.25 s scrape is that many simulated
seconds, and the latency averages the gateway routes by are measured on its own (real) clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.scenario import parse_scenario
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import replay_policy, whatif_scenario
from loadtest.whatif.record import SCRAPE_INTERVAL_S, record
from loadtest.workload import plan

pytestmark = pytest.mark.whatif

TIME_SCALE = 2
SCENARIO = f"""
name: agree
seed: 11
duration_s: 100
time_scale: {TIME_SCALE}
max_requests: 400
drain_s: 60
arrivals: {{process: poisson, rate: 2.5}}
fleet:
  model: llama-3.1-70b
  groups:
    - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, gpus_per_backend: 2, price_per_gpu_hour: 2.9,
       profile: {{gpu: h100-sxm5, model: llama-3.1-70b}}}}
    - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 1, price_per_gpu_hour: 1.75,
       max_model_len: 32768, profile: {{gpu: mi300x, model: llama-3.1-70b}}}}
classes:
  - name: chat
    weight: 4
    prompt_tokens: {{mean: 600, spread: 0.5, min: 50, max: 1500}}
    output_tokens: {{mean: 60, spread: 0.4, min: 8, max: 150}}
    priority: {{value: high, fraction: 0.3}}
    slo: {{ttft_ms: 400, tpot_ms: 40}}
  - name: rag
    weight: 1
    prompt_tokens: {{mean: 4000, spread: 0.05, min: 3600, max: 4400}}
    output_tokens: {{mean: 60, spread: 0.3, min: 16, max: 120}}
    shared_prefix: {{documents: 2, tokens: 3500}}
    slo: {{ttft_ms: 1500, tpot_ms: 60}}
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replay_of_the_gateways_access_log_agrees_with_the_http_load_test(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO, tmp_path / "agree.yaml")
    requests = plan(scenario)
    http, log = record(scenario, "balanced", requests, tmp_path / "http")

    trace = read_log(log, scale=1 / TIME_SCALE)
    assert len(trace.requests) == len(requests) and trace.refused == 0
    # the log's class is the gateway's (balanced's routes); the load test reports by the scenario's class
    class_of = {r.headers["x-request-id"]: r.request_class for r in requests}
    for recorded in trace.requests:
        recorded.line.request_class = class_of[recorded.line.request_id]
    slos = {c.name: c.slo for c in scenario.spec.classes}
    replayed = replay_policy(
        "balanced",
        policy_file("balanced"),
        whatif_scenario(trace, scenario.fleet, slos),
        trace,
        scrape_interval_s=SCRAPE_INTERVAL_S * TIME_SCALE,
        clock_scale=TIME_SCALE,
    ).report

    summary = {
        cls: {
            side: (
                report["classes"][cls]["requests"],
                report["classes"][cls]["slo_attainment"],
                report["classes"][cls]["ttft_ms"]["p50"],
            )
            for side, report in (("http", http), ("replay", replayed))
        }
        for cls in ("chat", "rag")
    }
    (tmp_path / "agreement.json").write_text(json.dumps(summary))
    print(json.dumps(summary))
    assert http["overall"]["errors"] == 0 and replayed["overall"]["errors"] == 0
    for cls, both in summary.items():
        (_, http_met, http_ttft), (_, replay_met, replay_ttft) = both["http"], both["replay"]
        assert abs(http_met - replay_met) <= 0.02, (cls, summary)
        assert replay_ttft == pytest.approx(http_ttft, rel=0.10), (cls, summary)
