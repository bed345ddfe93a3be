"""`switchyard loadtest SCENARIO`: compare routing policies on the same open-loop traffic.

    switchyard loadtest mixed --policies balanced,round-robin,least-loaded --out /tmp/lt

Starts a simulated fleet and a gateway per policy (everything on 127.0.0.1), replays the scenario's
planned requests, and writes report.json and report.html into --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from backends.yamlfile import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="a shipped scenario (mixed, chat, rag, ramp, trace) or a YAML path")
    parser.add_argument(
        "--policies",
        default="balanced,round-robin,least-loaded",
        help="comma-separated presets, baselines (round-robin, least-loaded) or policy files",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="report folder (default /tmp/switchyard-loadtest-*)"
    )
    parser.add_argument("--duration", type=float, default=None, help="simulated seconds of arrivals")
    parser.add_argument("--rate", type=float, default=None, help="arrivals per simulated second")
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed of the arrivals (default: the scenario's)"
    )
    parser.add_argument("--time-scale", type=float, default=None, help="simulated seconds per real second")
    parser.add_argument(
        "--max-requests", type=int, default=None, help="stop each run after this many requests"
    )
    parser.add_argument(
        "--batch-lines", type=int, default=None, help="lines of the scenario's batch job (0: no batch)"
    )
    parser.add_argument(
        "--fleet", default=None, help="`demo`, a fleet of loadtest/fleets/ (h100x4-mi300x4) or a fleet file"
    )
    capacity = parser.add_argument_group("capacity search (--find-capacity)")
    capacity.add_argument(
        "--find-capacity",
        action="store_true",
        help="bisect the rate for each policy's highest one meeting every class's SLO",
    )
    capacity.add_argument(
        "--rates",
        default=None,
        help="LOW,HIGH requests/s to bracket the search (default: the scenario's rate x 0.5 and x 2.5)",
    )
    capacity.add_argument(
        "--slo-target", type=float, default=0.95, help="share of each class that must meet its SLO"
    )
    capacity.add_argument("--steps", type=int, default=4, help="bisection steps after bracketing")
    capacity.add_argument("--repeats", type=int, default=1, help="whole searches, alternating policy order")
    capacity.add_argument(
        "--overload", type=float, default=1.25, help="also run at this multiple of each capacity (0: skip)"
    )
    capacity.add_argument(
        "--virtual",
        action="store_true",
        help="replay each point on a virtual clock (no HTTP, seconds per policy) instead of serving it",
    )


def run(args: argparse.Namespace) -> int:
    from loadtest.compare import compare
    from loadtest.processes import install_interrupt_handlers
    from loadtest.scenario import load_fleet, load_scenario, with_overrides

    try:
        fleet = load_fleet(args.fleet) if args.fleet else None
        scenario = with_overrides(
            load_scenario(args.scenario),
            duration_s=args.duration,
            rate=args.rate,
            seed=args.seed,
            time_scale=args.time_scale,
            max_requests=args.max_requests,
            batch_lines=args.batch_lines,
            fleet=fleet,
        )
    except ConfigError as exc:
        print(f"switchyard: invalid scenario: {exc}", file=sys.stderr)
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    out = args.out or Path(f"/tmp/switchyard-loadtest-{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    install_interrupt_handlers()
    began = time.monotonic()
    try:
        if args.find_capacity:
            _find_capacity(args, scenario, policies, out)
        else:
            compare(scenario, policies, out)
    except ValueError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    if not args.find_capacity:
        print(f"\nreport: {out / 'report.html'} (and report.json)")
    print(f"{time.monotonic() - began:.0f} s")
    return 0


def _find_capacity(args: argparse.Namespace, scenario: Any, policies: list[str], out: Path) -> None:
    from loadtest.capacity import RunPoint, SearchSettings, find_capacity
    from loadtest.compare import run_policy
    from loadtest.scenario import Bursts, Poisson, Ramp, Scenario
    from loadtest.workload import plan

    arrivals = scenario.spec.arrivals
    if not isinstance(arrivals, Poisson | Ramp | Bursts):
        raise ValueError("--find-capacity needs generated arrivals (poisson, ramp or bursts), not a trace")
    if args.rates:
        low, high = (float(v) for v in args.rates.split(","))
    else:
        low, high = arrivals.rate * 0.5, arrivals.rate * 2.5
    if not 0 < low < high:
        raise ValueError(f"--rates needs 0 < LOW < HIGH, got {args.rates}")
    settings = SearchSettings(
        low=low,
        high=high,
        target=args.slo_target,
        steps=args.steps,
        repeats=args.repeats,
        overload=args.overload,
    )

    def run_live(point: Scenario, policy: str, workdir: Path) -> dict[str, Any]:
        return run_policy(point, policy, plan(point), workdir)

    run: RunPoint = run_live
    if args.virtual:
        from loadtest.whatif.points import replay_point

        run = replay_point
    find_capacity(scenario, policies, settings, run, out)
    print(f"\ncapacity report: {out / 'capacity.html'} (and capacity.json)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.cli", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
