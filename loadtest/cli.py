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


def run(args: argparse.Namespace) -> int:
    from loadtest.compare import compare
    from loadtest.processes import install_interrupt_handlers
    from loadtest.scenario import load_scenario, with_overrides

    try:
        scenario = with_overrides(
            load_scenario(args.scenario),
            duration_s=args.duration,
            rate=args.rate,
            seed=args.seed,
            time_scale=args.time_scale,
            max_requests=args.max_requests,
            batch_lines=args.batch_lines,
        )
    except ConfigError as exc:
        print(f"switchyard: invalid scenario: {exc}", file=sys.stderr)
        return 2
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    out = args.out or Path(f"/tmp/switchyard-loadtest-{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    install_interrupt_handlers()
    began = time.monotonic()
    try:
        compare(scenario, policies, out)
    except ValueError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    print(f"\nreport: {out / 'report.html'} (and report.json); {time.monotonic() - began:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.cli", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
