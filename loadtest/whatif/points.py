"""One load-test point on the virtual clock: a scenario's planned traffic replayed under a policy.

`switchyard loadtest SCENARIO --find-capacity --virtual` bisects on these instead of HTTP runs: the same
planned arrivals, the real policy engine and the simulator's scheduler, KV and performance model in one
process (loadtest/whatif/replay.py), no waiting. The gateway is mirrored as the load test runs it: its
scrape every 0.25 s of its clock (`time_scale` simulated seconds per second), latencies and back-pressure
on the fleet's clock (`policy.clock_scale`), classes reported by the scenario's names. What it leaves out:
HTTP and the gateway's own milliseconds (the replay agrees with the load test within ~2 points,
tests/integration/test_whatif.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadtest.report import policy_report
from loadtest.scenario import Scenario
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import cost_rows
from loadtest.whatif.record import SCRAPE_INTERVAL_S
from loadtest.whatif.replay import Replay
from loadtest.whatif.simfleet import build_fleet
from loadtest.whatif.synth import write_log
from loadtest.workload import plan
from policies.config import load_policy
from policies.engine import PolicyEngine


def replay_point(scenario: Scenario, policy: str, workdir: Path) -> dict[str, Any]:
    """The load test's report (loadtest/report.py `policy_report`) of `policy` on the scenario, replayed."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = read_log(write_log(plan(scenario), workdir / "planned.jsonl"))
    fleet = build_fleet(scenario.fleet)
    engine = PolicyEngine(load_policy(policy_file(policy)), [s.backend for s in fleet])
    scrape = SCRAPE_INTERVAL_S * scenario.time_scale
    result = Replay(fleet, engine, trace.requests, scrape, drain_s=scenario.spec.drain_s).run()
    # the fleet is paid for the simulated run (arrivals and drain), as the load test pays its wall time
    virtual = Scenario(
        source=scenario.source, spec=scenario.spec, fleet=scenario.fleet, time_scale=1.0, model=scenario.model
    )
    report = policy_report(virtual, result.outcomes, cost_rows(fleet, result), result.duration_s, 0.0)
    report["held_for_room"] = result.held
    return report
