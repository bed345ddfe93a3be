"""One command, several policies, the same traffic: plan once, then for each policy start a fresh fleet
and gateway, replay the plan, read the ledger's costs, and write the report (JSON, HTML, terminal)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadtest.batch_job import batch_report, submit, wait
from loadtest.html import render_html
from loadtest.progress import Progress
from loadtest.report import format_table, policy_report, scenario_header
from loadtest.runner import RunLimits, run_open_loop
from loadtest.scenario import Scenario
from loadtest.stack import get_json, running_stack
from loadtest.workload import plan

STANDARD_POLICIES: tuple[str, ...] = ("balanced", "round-robin", "least-loaded")


def run_policy(scenario: Scenario, policy: str, requests: list[Any], workdir: Path) -> dict[str, Any]:
    spec = scenario.spec
    limits = RunLimits(time_scale=scenario.time_scale, max_inflight=spec.max_inflight, drain_s=spec.drain_s)
    real_duration = spec.duration_s / scenario.time_scale
    batch = None
    with running_stack(scenario.fleet, policy, workdir) as base, ThreadPoolExecutor(1) as poller:
        progress = Progress(policy, len(requests), real_duration)
        began = time.monotonic()
        batch_id = submit(base, scenario) if scenario.spec.batch and scenario.spec.batch.lines else None
        # The batch must end within the run: the online drain is the longest it may take.
        until = began + (spec.duration_s + spec.drain_s) / scenario.time_scale
        waiting = poller.submit(wait, base, batch_id, until) if batch_id is not None else None
        result = asyncio.run(run_open_loop(base, requests, limits, progress))
        wall = result.wall_s
        if waiting is not None:
            state, ended = waiting.result()
            wall = max(wall, time.monotonic() - began)
            batch = batch_report(state, began, ended, wall, scenario.time_scale)
        time.sleep(0.3)  # let the gateway account the last streams
        costs = get_json(f"{base}/admin/v1/costs?by=vendor&window=15m")
    report = policy_report(scenario, result.outcomes, costs["rows"], wall, result.max_lag_s)
    if batch is not None:
        report["batch"] = batch
        print(f"{policy}: batch {batch}")
    return report


def compare(scenario: Scenario, policies: list[str], out_dir: Path) -> dict[str, Any]:
    """Run every policy on the scenario's planned traffic; writes report.json and report.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    requests = plan(scenario)
    report: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["switchyard", "loadtest", *sys.argv[2:]])
        if sys.argv[1:2] == ["loadtest"]
        else None,
        "scenario": scenario_header(scenario, len(requests)),
        "policies": {},
    }
    for policy in policies:
        report["policies"][policy] = run_policy(scenario, policy, requests, out_dir / policy)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1))
    (out_dir / "report.html").write_text(render_html(report), encoding="utf-8")
    print(format_table(report))
    return report
