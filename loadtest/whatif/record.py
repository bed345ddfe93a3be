"""Record real traffic: a simulated fleet, the gateway with its access log written to a file, and the load
test's open-loop client sending a scenario's planned requests through it (loadtest/stack.py's stack, with
the access log on). What `make whatif-demo` and the agreement test replay is what the gateway wrote.

`serve_config` runs the same load test against a gateway config written elsewhere (`switchyard plan`'s
gateway.yaml): its pools and policy as written, its backend URLs pointed at the simulated fleet.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends.sim.fleet import Fleet
from loadtest.progress import Progress
from loadtest.report import policy_report
from loadtest.runner import RunLimits, run_open_loop
from loadtest.scenario import Scenario
from loadtest.stack import gateway_config, get_json, policy_file, serving_gateway
from loadtest.workload import PlannedRequest

SCRAPE_INTERVAL_S = 0.25
"""Real seconds between the recording gateway's scrapes (loadtest/stack.py's gateway_config)."""

ConfigFor = Callable[[Fleet, int], dict[str, Any]]
"""The gateway config for a started fleet and the gateway's port."""


def record(
    scenario: Scenario, policy: str, requests: list[PlannedRequest], workdir: Path
) -> tuple[dict[str, Any], Path]:
    """Serve `requests` through a fresh fleet and gateway; returns the load test's report and the access
    log the gateway wrote (its times are real: divide by the time scale, `read_log(scale=1/time_scale)`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "access.jsonl"
    log.unlink(missing_ok=True)

    def config_for(fleet: Fleet, port: int) -> dict[str, Any]:
        config = gateway_config(fleet, policy_file(policy), port)
        config["telemetry"] = {"access_log": {"destination": str(log)}}
        return config

    return _serve(scenario, policy, requests, workdir, config_for), log


def serve_config(
    scenario: Scenario, written: dict[str, Any], requests: list[PlannedRequest], workdir: Path
) -> dict[str, Any]:
    """Serve `requests` through `scenario.fleet` behind a gateway configured as `written` says (pools,
    backends and policy), with each backend's URL replaced by its simulated namesake's; the report."""

    def config_for(fleet: Fleet, port: int) -> dict[str, Any]:
        config = copy.deepcopy(written)
        urls = {b.name: b.url for b in fleet.backends}
        for pool in config["pools"]:
            for backend in pool["backends"]:
                if backend["name"] not in urls:
                    raise ValueError(f"backend `{backend['name']}` is not in the fleet ({', '.join(urls)})")
                backend["url"] = urls.pop(backend["name"])
        if urls:
            raise ValueError(f"the config does not route to {', '.join(urls)}")
        config["gateway"] = gateway_config(fleet, policy_file("balanced"), port)["gateway"]
        config["ledger"] = {"store": "memory", "bucket_seconds": 10}
        return config

    policy = str(written.get("policy", {}).get("file", "?"))
    return _serve(scenario, policy, requests, workdir, config_for)


def _serve(
    scenario: Scenario,
    label: str,
    requests: list[PlannedRequest],
    workdir: Path,
    config_for: ConfigFor,
) -> dict[str, Any]:
    spec = scenario.spec
    workdir.mkdir(parents=True, exist_ok=True)
    limits = RunLimits(time_scale=scenario.time_scale, max_inflight=spec.max_inflight, drain_s=spec.drain_s)
    with (
        Fleet(scenario.fleet, log_dir=workdir / "fleet", startup_timeout=60.0) as fleet,
        serving_gateway(lambda port: config_for(fleet, port), workdir, "info") as base,  # info: the log
    ):
        progress = Progress(label, len(requests), spec.duration_s / scenario.time_scale)
        result = asyncio.run(run_open_loop(base, requests, limits, progress))
        time.sleep(0.3)  # let the gateway account the last streams
        costs = get_json(f"{base}/admin/v1/costs?by=vendor&window=15m")
    return policy_report(scenario, result.outcomes, costs["rows"], result.wall_s, result.max_lag_s)
