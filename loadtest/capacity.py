"""`switchyard loadtest SCENARIO --find-capacity`: each policy's highest rate that meets every class's SLO.

A rate passes when every class of the scenario meets its SLO on at least `target` of its requests (a
refused or failed request is a miss). The search brackets the capacity between a passing and a failing
rate, then bisects; a point whose worst class lands within `close` of the target is run again with
another seed and the two are averaged, so one lucky or unlucky run does not decide the verdict.

With `repeats: 2` the whole search runs twice, the second time with the policies in reverse order (a
policy measured first is not always the one measured on a fresher machine). After the search, each
policy is run once more at `overload` x its capacity, to show what it does beyond it: the attainment of
the classes it protects, and whether the others got 429s or timeouts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.capacity_html import capacity_text, render_capacity
from loadtest.scenario import Scenario, with_overrides
from loadtest.workload import plan

RunPoint = Callable[[Scenario, str, Path], dict[str, Any]]
"""Runs one policy on one scenario; returns loadtest.report.policy_report's dict."""


MAX_STEP_UP = 8
"""Past `high`, the rate doubles up to this multiple of it; a policy still passing is reported unbracketed."""


@dataclass(frozen=True, slots=True)
class SearchSettings:
    low: float
    high: float
    target: float = 0.95
    steps: int = 4
    close: float = 0.03
    repeats: int = 1
    overload: float = 1.25


def _attainments(report: dict[str, Any]) -> dict[str, float]:
    return {
        name: m["slo_attainment"] if m["slo_attainment"] is not None else 1.0
        for name, m in report["classes"].items()
        if m["requests"]
    }


def _point(rate: float, reports: list[dict[str, Any]]) -> dict[str, Any]:
    classes = [_attainments(r) for r in reports]
    averaged = {c: sum(a[c] for a in classes) / len(classes) for c in classes[0]}
    costs = [r["cost"]["usd_per_mtok"] for r in reports if r["cost"]["usd_per_mtok"] is not None]
    refused: dict[str, int] = {}
    timeouts: dict[str, int] = {}
    for r in reports:
        for name, m in r["classes"].items():
            kinds = m["error_kinds"]
            refused[name] = refused.get(name, 0) + kinds.get("refused (429)", 0)
            timeouts[name] = timeouts.get(name, 0) + sum(
                count for kind, count in kinds.items() if kind != "refused (429)"
            )
    return {
        "rate": round(rate, 3),
        "runs": len(reports),
        "attainment": averaged,
        "worst": min(averaged.values()) if averaged else 1.0,
        "usd_per_mtok": sum(costs) / len(costs) if costs else None,
        "refused": refused,
        "other_errors": timeouts,
    }


class CapacitySearch:
    def __init__(self, scenario: Scenario, settings: SearchSettings, run: RunPoint, workdir: Path) -> None:
        self.scenario = scenario
        self.settings = settings
        self.run = run
        self.workdir = workdir

    def measure(self, policy: str, rate: float, tag: str) -> dict[str, Any]:
        """One point: run at `rate`; again with the next seed when the verdict is close."""
        s = self.settings
        reports = []
        for attempt in range(2):
            scenario = with_overrides(self.scenario, rate=rate, seed=self.scenario.spec.seed + attempt)
            where = self.workdir / f"{policy}-{tag}-{rate:.2f}-{attempt}"
            reports.append(self.run(scenario, policy, where))
            point = _point(rate, reports)
            if attempt == 0 and abs(point["worst"] - s.target) >= s.close:
                break
        verdict = "pass" if point["worst"] >= s.target else "fail"
        print(
            f"  {policy:<16} {rate:7.2f}/s  worst class {point['worst'] * 100:5.1f}%  {verdict}", flush=True
        )
        return point

    def search(self, policy: str, tag: str) -> dict[str, Any]:
        s = self.settings
        points: list[dict[str, Any]] = []

        def passes(rate: float) -> bool:
            point = self.measure(policy, rate, tag)
            points.append(point)
            return point["worst"] >= s.target

        low, high = s.low, s.high
        bracketed = False
        if passes(low):
            # a policy that passes the top of the bracket is searched above it, or its capacity would
            # read as the bracket's top
            while high <= s.high * MAX_STEP_UP:
                if not passes(high):
                    bracketed = True
                    break
                low, high = high, high * 2
        else:
            while low > s.low / 8:
                high, low = low, low / 2
                if passes(low):
                    bracketed = True
                    break
        for _ in range(s.steps if bracketed else 0):
            middle = (low + high) / 2
            if passes(middle):
                low = middle
            else:
                high = middle
        passing = [p for p in points if p["worst"] >= s.target]
        best = max(passing, key=lambda p: p["rate"]) if passing else None
        capacity = best["rate"] if best else 0.0
        overload = None
        if capacity > 0 and s.overload > 0:
            overload = self.measure(policy, capacity * s.overload, tag + "-overload")
        return {
            "capacity_rps": capacity,
            "bracketed": bracketed,
            "usd_per_mtok_at_capacity": best["usd_per_mtok"] if best else None,
            "overload": overload,
            "points": sorted(points, key=lambda p: p["rate"]),
        }


def find_capacity(
    scenario: Scenario, policies: list[str], settings: SearchSettings, run: RunPoint, out_dir: Path
) -> dict[str, Any]:
    """Every policy's capacity, `settings.repeats` times in alternating order; writes capacity.json/html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    search = CapacitySearch(scenario, settings, run, out_dir)
    rounds: list[dict[str, Any]] = []
    for repeat in range(settings.repeats):
        order = policies if repeat % 2 == 0 else list(reversed(policies))
        print(f"round {repeat + 1}: {', '.join(order)}", flush=True)
        rounds.append({"order": order, "policies": {p: search.search(p, f"r{repeat + 1}") for p in order}})
    report = {
        "scenario": scenario.name,
        "fleet": [
            f"{g.count}x {(g.profile.gpu or g.accelerator) if g.profile else g.accelerator}"
            for g in scenario.fleet.groups
        ],
        "requests_per_point": len(plan(scenario)),
        "duration_s": scenario.spec.duration_s,
        "time_scale": scenario.time_scale,
        "settings": {k: getattr(settings, k) for k in settings.__slots__},
        "rounds": rounds,
    }
    (out_dir / "capacity.json").write_text(json.dumps(report, indent=1))

    (out_dir / "capacity.html").write_text(render_capacity(report), encoding="utf-8")
    print(format_capacity(report))
    return report


def format_capacity(report: dict[str, Any]) -> str:
    lines = [
        f"{'round':<6} {'policy':<16} {'capacity/s':>10} {'$/Mtok':>8}  at {report['settings']['overload']}x"
    ]
    for i, rnd in enumerate(report["rounds"]):
        for policy, found in rnd["policies"].items():
            cost = found["usd_per_mtok_at_capacity"]
            over = found["overload"]
            beyond = (
                " ".join(
                    f"{c}={a * 100:.0f}% (429:{over['refused'].get(c, 0)} "
                    f"err:{over['other_errors'].get(c, 0)})"
                    for c, a in over["attainment"].items()
                )
                if over
                else "-"
            )
            lines.append(
                f"{i + 1:<6} {policy:<16} {capacity_text(found):>10} "
                f"{'-' if cost is None else f'{cost:.4f}':>8}  {beyond}"
            )
    return "\n".join(lines)
