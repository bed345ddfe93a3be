"""`switchyard whatif`: replay recorded traffic under a baseline and a candidate policy, and compare.

The report is the load test's (loadtest/report.py: same JSON, same HTML) with a `whatif` section: the
difference candidate minus baseline per class, and what the replay could not model. Classes are the ones
the log recorded (the policy in force when it was served), so both policies are judged on the same
requests; each class's SLO is its route's in the baseline policy unless given.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backends.sim.fleet_spec import FleetSpec
from loadtest.html import render_html
from loadtest.report import format_table, policy_report, scenario_header
from loadtest.scenario import Lengths, RequestClass, Scenario, ScenarioFile, Slo
from loadtest.scenario import Trace as TraceArrivals
from loadtest.whatif.accesslog import Trace
from loadtest.whatif.replay import Replay, ReplayResult
from loadtest.whatif.simfleet import build_fleet
from policies.config import load_policy
from policies.engine import PolicyEngine


@dataclass(slots=True)
class PolicyRun:
    name: str
    result: ReplayResult
    wall_s: float
    report: dict[str, Any]


def route_slos(policy: Path) -> dict[str, Slo]:
    """Each class's SLO as the policy's routes set it (classes without one have none)."""
    loaded = load_policy(policy)
    return {
        name: Slo(ttft_ms=route.slo.ttft_ms, tpot_ms=route.slo.tpot_ms)
        for name, route in loaded.policy.routes.items()
        if route.slo is not None
    }


def whatif_scenario(trace: Trace, fleet: FleetSpec, slos: dict[str, Slo]) -> Scenario:
    """The recorded traffic described as a load-test scenario, so the load test's report applies."""
    by_class: dict[str, list[Any]] = {}
    for request in trace.requests:
        by_class.setdefault(request.line.request_class or "default", []).append(request.line)
    classes = [
        RequestClass(
            name=name,
            weight=len(lines),
            prompt_tokens=Lengths(mean=max(1.0, sum(x.prompt_tokens for x in lines) / len(lines))),
            output_tokens=Lengths(mean=max(1.0, sum(x.completion_tokens for x in lines) / len(lines))),
            slo=slos.get(name, Slo()),
        )
        for name, lines in sorted(by_class.items())
    ]
    spec = ScenarioFile(
        name="whatif",
        description=f"Replay of {trace.source} on a simulated fleet (virtual clock).",
        duration_s=trace.duration_s,
        time_scale=1.0,
        max_requests=max(1, len(trace.requests)),
        arrivals=TraceArrivals(file=trace.source),
        fleet={},
        model=fleet.model,
        classes=classes,
    )
    return Scenario(source=Path(trace.source), spec=spec, fleet=fleet, time_scale=1.0, model=fleet.model)


def replay_policy(
    name: str,
    policy: Path,
    scenario: Scenario,
    trace: Trace,
    scrape_interval_s: float = 1.0,
    clock_scale: float = 1.0,
) -> PolicyRun:
    fleet = build_fleet(scenario.fleet)
    engine = PolicyEngine(load_policy(policy), [s.backend for s in fleet])
    began = time.perf_counter()
    replay = Replay(fleet, engine, trace.requests, scrape_interval_s, clock_scale=clock_scale)
    result = replay.run()
    wall = time.perf_counter() - began
    rows = cost_rows(fleet, result)
    report = policy_report(scenario, result.outcomes, rows, wall_s=trace.duration_s, max_lag_s=0.0)
    report["wall_s"] = round(wall, 3)
    report["replayed_per_s"] = round(len(result.outcomes) / wall, 1) if wall > 0 else None
    report["held_for_room"] = result.held  # then sent, or refused (`error_kinds` counts the 429s)
    report["sent_after_their_session"] = len(replay.sessions.follows)  # loadtest/whatif/sessions.py
    return PolicyRun(name, result, wall, report)


def cost_rows(fleet: Sequence[Any], result: ReplayResult) -> list[dict[str, Any]]:
    """What `/admin/v1/costs?by=vendor` would say: tokens served and busy GPU time, per vendor."""
    rows: dict[str, dict[str, Any]] = {}
    for sim in fleet:
        pool = sim.backend.pool
        row = rows.setdefault(
            pool.vendor,
            {
                "name": pool.vendor,
                "requests": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "spend_usd": 0.0,
            },
        )
        row["spend_usd"] += pool.backend_price_per_second * result.busy_s[sim.backend.name]
        row.setdefault("_busy", []).append(result.busy_s[sim.backend.name] / max(result.duration_s, 1e-9))
    for outcome in result.outcomes:
        if outcome.ok and outcome.vendor in rows:
            row = rows[outcome.vendor]
            row["requests"] += 1
            row["prompt_tokens"] += outcome.prompt_tokens
            row["completion_tokens"] += outcome.completion_tokens
    for row in rows.values():
        busy = row.pop("_busy")
        row["utilisation"] = sum(busy) / len(busy)
    return list(rows.values())


def describe_limits(trace: Trace, limits: Counter[str]) -> list[str]:
    """In words, what the recorded traffic holds that the simulator does not model."""
    notes = []
    models = {k.split(":", 1)[1]: v for k, v in limits.items() if k.startswith("model:")}
    if models:
        shown = ", ".join(f"{m or '(none)'} ({c})" for m, c in sorted(models.items()))
        notes.append(f"{sum(models.values())} requests for models the fleet does not serve: {shown}")
    if limits.get("embeddings"):
        notes.append(f"{limits['embeddings']} embeddings requests: the simulator does not time embeddings")
    if limits.get("context"):
        notes.append(
            f"{limits['context']} requests longer than any chosen backend's context or KV cache "
            "(the simulator refuses them)"
        )
    if trace.refused:
        notes.append(f"{trace.refused} lines the gateway answered itself with an error: not replayed")
    if trace.bad_lines:
        notes.append(f"unreadable lines skipped, e.g. {trace.bad_lines[0]}")
    return notes


def difference(baseline: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """Candidate minus baseline: SLO attainment (points), TTFT p50 (ms), goodput, cost per Mtok."""

    def row(b: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
        def minus(x: float | None, y: float | None) -> float | None:
            return None if x is None or y is None else x - y

        return {
            "slo_attainment_points": None
            if minus(c["slo_attainment"], b["slo_attainment"]) is None
            else round(100 * (c["slo_attainment"] - b["slo_attainment"]), 2),
            "ttft_p50_ms": minus(c["ttft_ms"]["p50"], b["ttft_ms"]["p50"]),
            "goodput_rps": c["goodput_rps"] - b["goodput_rps"],
        }

    out = {cls: row(baseline["classes"][cls], candidate["classes"][cls]) for cls in baseline["classes"]}
    out["ALL"] = row(baseline["overall"], candidate["overall"])
    b_cost, c_cost = baseline["cost"]["usd_per_mtok"], candidate["cost"]["usd_per_mtok"]
    out["ALL"]["usd_per_mtok"] = None if b_cost is None or c_cost is None else c_cost - b_cost
    return out


def format_difference(diff: dict[str, Any], baseline: str, candidate: str) -> str:
    lines = [f"{candidate} vs {baseline} (candidate minus baseline)"]
    lines.append(f"{'class':<14} {'SLO met':>9} {'TTFT p50 ms':>12} {'goodput/s':>10} {'$/Mtok':>8}")
    for cls, d in diff.items():
        slo = "-" if d["slo_attainment_points"] is None else f"{d['slo_attainment_points']:+.1f} pt"
        ttft = "-" if d["ttft_p50_ms"] is None else f"{d['ttft_p50_ms']:+.0f}"
        cost = d.get("usd_per_mtok")
        shown = "" if cost is None else f"{cost:+.3f}"
        lines.append(f"{cls:<14} {slo:>9} {ttft:>12} {d['goodput_rps']:>+10.3f} {shown:>8}")
    return "\n".join(lines)


def whatif(
    trace: Trace,
    fleet: FleetSpec,
    baseline: tuple[str, Path],
    candidate: tuple[str, Path],
    out_dir: Path | None,
    slos: dict[str, Slo] | None = None,
    scrape_interval_s: float = 1.0,
    command: str | None = None,
    clock_scale: float = 1.0,
) -> dict[str, Any]:
    """Replay under both policies; writes report.json and report.html into `out_dir` when given."""
    classes = route_slos(baseline[1]) | (slos or {})
    scenario = whatif_scenario(trace, fleet, classes)
    report: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "scenario": scenario_header(scenario, len(trace.requests)),
        "policies": {},
    }
    limits: Counter[str] = Counter()
    for name, path in (baseline, candidate):
        run = replay_policy(name, path, scenario, trace, scrape_interval_s, clock_scale)
        report["policies"][name] = run.report
        limits |= run.result.limits
    report["whatif"] = {
        "baseline": baseline[0],
        "candidate": candidate[0],
        "difference": difference(report["policies"][baseline[0]], report["policies"][candidate[0]]),
        "limits": describe_limits(trace, limits),
        "scrape_interval_s": scrape_interval_s,
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.json").write_text(json.dumps(report, indent=1))
        (out_dir / "report.html").write_text(render_html(report), encoding="utf-8")
    return report


def print_report(report: dict[str, Any]) -> None:
    w = report["whatif"]
    print(format_table(report))
    print()
    print(format_difference(w["difference"], w["baseline"], w["candidate"]))
    for name, data in report["policies"].items():
        print(f"{name}: replayed {data['overall']['requests']} requests in {data['wall_s']:.2f} s "
              f"({data['replayed_per_s']:.0f} requests/s)")  # fmt: skip
    for note in w["limits"] or ["everything in the log was modelled"]:
        print(f"limits: {note}")
