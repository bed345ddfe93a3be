"""One short end-to-end comparison: a small simulated fleet, two policies, the same traffic, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.compare import compare
from loadtest.scenario import parse_scenario
from loadtest.workload import plan

# measures time or capacity on the whole machine: `make test` runs it by itself (pyproject.toml)
pytestmark = pytest.mark.alone

SCENARIO = """
name: tiny
seed: 2
duration_s: 8
time_scale: 10
max_requests: 60
drain_s: 20
arrivals: {process: poisson, rate: 6}
fleet:
  model: llama-3.1-8b
  groups:
    - {pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.9, ttft_ms: 40,
       tpot_ms: 8}
    - {pool: mi300x, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1.75, ttft_ms: 60, tpot_ms: 10,
       max_model_len: 32768}
classes:
  - name: chat
    weight: 3
    prompt_tokens: {mean: 60, spread: 0.5, min: 5, max: 300}
    output_tokens: {mean: 12, spread: 0.3, min: 2, max: 40}
    priority: {value: high, fraction: 0.5}
    slo: {ttft_ms: 500, tpot_ms: 50}
  - name: batch
    prompt_tokens: {mean: 100}
    output_tokens: {mean: 1100, min: 1030}
    n: 2
    slo: {tpot_ms: 50}
"""


def test_two_policies_on_the_same_traffic(tmp_path: Path) -> None:
    scenario = parse_scenario(SCENARIO, tmp_path / "tiny.yaml")
    sent = len(plan(scenario))
    report = compare(scenario, ["round-robin", "balanced"], tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["scenario"]["requests"] == sent
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<svg" in html and "<script" not in html
    for policy in ("round-robin", "balanced"):
        data = report["policies"][policy]
        overall = data["overall"]
        assert overall["requests"] == sent and overall["errors"] == 0, overall["error_kinds"]
        assert overall["slo_attainment"] is not None and overall["slo_attainment"] > 0.5
        assert set(data["classes"]) == {"chat", "batch"}
        assert overall["ttft_ms"]["p50"] is not None and overall["tpot_ms"]["p99"] is not None
        assert sum(data["split"]["vendor"].values()) == sent
        assert data["cost"]["tokens"] > 0 and data["cost"]["usd_per_mtok"] > 0
        # Paid: the fleet's three GPUs for the whole run, not what the ledger had claimed by then.
        cost = data["cost"]
        assert cost["gpus"] == 3 and cost["paid_gpu_s"] == pytest.approx(3 * cost["wall_s"])
        assert cost["wall_s"] == pytest.approx(data["wall_s"], abs=0.01)
    # round robin visits every backend; balanced keeps the n=2 batch jobs on MI300X (its batch route)
    assert set(report["policies"]["round-robin"]["split"]["backend"]) == {"h100-0", "h100-1", "mi300x-0"}
    assert report["policies"]["balanced"]["classes"]["batch"]["requests"] > 0
