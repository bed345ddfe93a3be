"""Scenarios (shipped ones validate; errors name the line), the planned traffic, and the report's contents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from backends.yamlfile import ConfigError
from loadtest.client import Outcome
from loadtest.html import render_html
from loadtest.report import format_table, met_slo, policy_report, scenario_header
from loadtest.scenario import SCENARIOS_DIR, Slo, load_scenario, parse_scenario, with_overrides
from loadtest.workload import plan

SMALL = """
name: small
seed: 3
duration_s: 20
time_scale: 10
arrivals: {process: poisson, rate: 5}
fleet:
  model: m
  groups:
    - {pool: h100, vendor: nvidia, accelerator: h100, price_per_gpu_hour: 2.9, ttft_ms: 5, tpot_ms: 1}
    - {pool: mi300x, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1.75, ttft_ms: 5, tpot_ms: 1}
classes:
  - name: chat
    weight: 3
    prompt_tokens: {mean: 50, spread: 0.5, min: 5, max: 200}
    output_tokens: {mean: 20}
    priority: {value: high, fraction: 0.5}
    slo: {ttft_ms: 100, tpot_ms: 10}
  - name: rag
    prompt_tokens: {mean: 400}
    output_tokens: {mean: 10}
    shared_prefix: {documents: 2, tokens: 300}
"""


def small(tmp_path: Path):
    return parse_scenario(SMALL, tmp_path / "small.yaml")


@pytest.mark.parametrize("path", sorted(SCENARIOS_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_scenarios_validate_and_plan(path: Path) -> None:
    scenario = load_scenario(path)
    requests = plan(scenario)
    assert 0 < len(requests) <= scenario.spec.max_requests
    assert all(r.at_s < scenario.spec.duration_s for r in requests)


def test_scenario_errors_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"small.yaml:6") as info:
        parse_scenario(SMALL.replace("rate: 5", "rate: -5"), tmp_path / "small.yaml")
    assert "rate" in str(info.value)
    with pytest.raises(ConfigError, match="defined twice"):
        parse_scenario(SMALL.replace("name: rag", "name: chat"), tmp_path / "small.yaml")


def test_the_plan_is_the_same_for_the_same_seed(tmp_path: Path) -> None:
    scenario = small(tmp_path)
    first, second = plan(scenario), plan(scenario)
    assert [(r.at_s, r.body, r.headers) for r in first] == [(r.at_s, r.body, r.headers) for r in second]
    other = plan(with_overrides(scenario, seed=4))
    assert [r.at_s for r in other] != [r.at_s for r in first]
    assert len(plan(with_overrides(scenario, max_requests=7))) == 7


def test_planned_requests_follow_their_class(tmp_path: Path) -> None:
    requests = plan(small(tmp_path))
    chats = [r for r in requests if r.request_class == "chat"]
    rags = [r for r in requests if r.request_class == "rag"]
    assert chats and rags
    assert any("x-switchyard-priority" in r.headers for r in chats)
    assert not any("x-switchyard-priority" in r.headers for r in rags)
    bodies = [msgspec.json.decode(r.body) for r in rags]
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in bodies)
    documents = {b["messages"][0]["content"] for b in bodies}
    assert len(documents) <= 2  # shared prefixes
    assert all(b["max_tokens"] == 10 for b in bodies)


def test_slo_check() -> None:
    slo = Slo(ttft_ms=100, tpot_ms=10)
    good = Outcome(0, "chat", 0.0, status=200, ttft=0.09, tpot=0.009, e2e=0.3)
    assert met_slo(good, slo)
    assert not met_slo(Outcome(0, "chat", 0.0, status=200, ttft=0.2, tpot=0.009, e2e=0.3), slo)
    assert not met_slo(Outcome(0, "chat", 0.0, status=502, error="http 502"), slo)


def test_report_contents(tmp_path: Path) -> None:
    scenario = small(tmp_path)
    outcomes = [
        Outcome(
            i,
            "chat",
            i * 0.5,
            status=200,
            ttft=0.05 * (i + 1),
            tpot=0.005,
            e2e=0.2,
            prompt_tokens=50,
            completion_tokens=20,
            backend=f"h100-{i % 2}",
            pool="h100",
            vendor="nvidia",
        )
        for i in range(8)
    ] + [
        Outcome(
            8,
            "rag",
            5.0,
            status=200,
            ttft=0.5,
            tpot=0.02,
            e2e=1.0,
            prompt_tokens=400,
            completion_tokens=10,
            backend="mi300x-0",
            pool="mi300x",
            vendor="amd",
        ),
        Outcome(9, "rag", 6.0, error="dropped"),
    ]
    rows = [
        {
            "name": "nvidia",
            "requests": 8,
            "prompt_tokens": 400,
            "completion_tokens": 160,
            "spend_usd": 0.001,
            "utilisation": 0.5,
            "blended_usd_per_mtok": 1.0,
        },
        {
            "name": "amd",
            "requests": 1,
            "prompt_tokens": 400,
            "completion_tokens": 10,
            "spend_usd": 0.0005,
            "utilisation": 0.1,
            "blended_usd_per_mtok": 0.5,
        },
    ]
    data = policy_report(scenario, outcomes, rows, wall_s=3.0, max_lag_s=0.001)
    chat = data["classes"]["chat"]
    assert chat["requests"] == 8 and chat["slo_met"] == 2  # ttft 50 and 100 ms meet 100 ms
    assert chat["slo_attainment"] == 0.25 and chat["goodput_rps"] == pytest.approx(2 / 20)
    assert chat["ttft_ms"]["p50"] == pytest.approx(225.0)
    assert data["classes"]["rag"]["errors"] == 1 and data["classes"]["rag"]["error_kinds"] == {"dropped": 1}
    assert data["overall"]["requests"] == 10 and data["overall"]["slo_met"] == 3
    assert data["split"]["vendor"] == {"amd": 1, "nvidia": 8}
    assert data["split"]["backend"]["h100-0"] == 4
    assert sum(sum(b.values()) for b in data["split_over_time"]["bins"]) == 9
    assert data["cost"]["ledger_usd_per_mtok"] == pytest.approx(0.0015 / 970 * 1e6)
    # Paid: both GPUs for the run's 3 s, whatever the ledger had claimed when it was read.
    spend = 3.0 * (2.9 + 1.75) / 3600
    assert (data["cost"]["gpus"], data["cost"]["paid_gpu_s"]) == (2, pytest.approx(6.0))
    assert data["cost"]["spend_usd"] == pytest.approx(spend)
    assert data["cost"]["usd_per_mtok"] == pytest.approx(spend / 970 * 1e6 * 10)
    assert data["cost"]["by_vendor"]["amd"]["paid_gpu_s"] == pytest.approx(3.0)
    assert data["cost"]["by_vendor"]["amd"]["usd_per_mtok"] == pytest.approx(3.0 * 1.75 / 3600 / 410 * 1e7)
    report = {
        "generated_at": "now",
        "command": "switchyard loadtest small",
        "scenario": scenario_header(scenario, 10),
        "policies": {"balanced": data, "round-robin": data},
    }
    json.dumps(report)
    table = format_table(report)
    assert "balanced" in table and "round-robin" in table and "30.0%" in table
    page = render_html(report)
    assert page.count("<svg") >= 6 and "<script" not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "SLO attainment" in page and "nvidia" in page


def _bar_heights(page: str, title: str) -> dict[str, float]:
    """{bar title: height} of the chart called `title` in the page."""
    start = page.index(f'aria-label="{title}"')
    chart = page[start : page.index("</svg>", start)]
    bars = re.findall(r'height="([\d.]+)" fill="[^"]+"><title>([^<]+)</title>', chart)
    return {label: float(height) for height, label in bars}


def test_goodput_and_cost_each_have_their_own_axis(tmp_path: Path) -> None:
    """Goodput (a fraction of a request a second) next to dollars per Mtok used to be a flat line."""
    scenario = small(tmp_path)
    outcomes = [
        Outcome(
            i,
            "chat",
            i * 0.5,
            status=200,
            ttft=0.05,
            tpot=0.005,
            e2e=0.2,
            prompt_tokens=50,
            completion_tokens=20,
            backend="h100-0",
            pool="h100",
            vendor="nvidia",
        )
        for i in range(4)
    ]
    rows = [
        {
            "name": "nvidia",
            "requests": 4,
            "prompt_tokens": 200,
            "completion_tokens": 80,
            "spend_usd": 0.01,
            "utilisation": 0.5,
            "blended_usd_per_mtok": 30.0,
        }
    ]
    data = policy_report(scenario, outcomes, rows, wall_s=20.0, max_lag_s=0.0)
    assert data["overall"]["goodput_rps"] == pytest.approx(0.2)
    assert data["cost"]["usd_per_mtok"] > 100  # dollars: three orders above the goodput
    report = {
        "generated_at": "now",
        "command": None,
        "scenario": scenario_header(scenario, 4),
        "policies": {"balanced": data},
    }
    page = render_html(report)
    plot_h = 260 - 28 - 44
    goodput = _bar_heights(page, "Goodput per policy")
    assert list(goodput) == ["balanced all classes: 0.2"]
    assert goodput["balanced all classes: 0.2"] > 0.4 * plot_h
    cost = _bar_heights(page, "Cost per policy")
    assert len(cost) == 2 and all(h > 0.4 * plot_h for h in cost.values())
