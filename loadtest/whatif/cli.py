"""`switchyard whatif`: what a policy would do to the traffic an access log recorded.

    switchyard whatif --log access.jsonl --policy candidate.yaml [--baseline current.yaml] [--fleet F]

Replays the log's arrivals on a simulated copy of the fleet (virtual clock: no HTTP, no waiting) under the
baseline and the candidate, prints both and their difference, and writes report.json and report.html.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from backends.sim.fleet_spec import DEMO_FLEET, load_fleet_spec
from backends.yamlfile import ConfigError
from loadtest.scenario import Slo

HELP = "replay an access log under a candidate policy on a simulated fleet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, type=Path, help="the gateway's JSON access log")
    parser.add_argument("--policy", required=True, help="the candidate: a preset name or a policy file")
    parser.add_argument("--baseline", default="balanced", help="the policy in force (default: %(default)s)")
    parser.add_argument(
        "--fleet", type=Path, default=DEMO_FLEET, help="fleet file to simulate (default: the demo fleet)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="simulate the fleet a gateway config routes to (instead of --fleet)",
    )
    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="CLASS:ttft_ms=N,tpot_ms=N",
        help="a class's SLO (default: its route's SLO in the baseline); repeatable",
    )
    parser.add_argument("--scale", type=float, default=1.0, help="replay at this many times the load")
    parser.add_argument(
        "--scrape-interval", type=float, default=1.0, help="the gateway's scrape interval (s)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="report folder (default /tmp/switchyard-whatif-*)"
    )


def parse_slo(text: str) -> tuple[str, Slo]:
    """`chat:ttft_ms=500,tpot_ms=40` -> ("chat", Slo(500, 40)); raises ValueError naming the problem."""
    name, _, bounds = text.partition(":")
    if not name or not bounds:
        raise ValueError(f"--slo `{text}`: expected CLASS:ttft_ms=N[,tpot_ms=N][,e2e_ms=N]")
    values: dict[str, float] = {}
    for part in bounds.split(","):
        key, _, value = part.partition("=")
        if key not in ("ttft_ms", "tpot_ms", "e2e_ms"):
            raise ValueError(f"--slo `{text}`: unknown bound `{key}` (ttft_ms, tpot_ms, e2e_ms)")
        try:
            values[key] = float(value)
        except ValueError:
            raise ValueError(f"--slo `{text}`: `{value}` is not a number") from None
        if values[key] <= 0:
            raise ValueError(f"--slo `{text}`: `{key}` must be positive")
    return name, Slo(**values)


def run(args: argparse.Namespace) -> int:
    from loadtest.stack import policy_file
    from loadtest.whatif.accesslog import LogError, read_log
    from loadtest.whatif.compare import print_report, whatif

    if args.scale <= 0 or args.scrape_interval <= 0:
        print("switchyard: --scale and --scrape-interval must be positive", file=sys.stderr)
        return 2
    try:
        slos = dict(parse_slo(s) for s in args.slo)
        if args.config is not None:
            from loadtest.whatif.simfleet import fleet_from_gateway_config

            fleet = fleet_from_gateway_config(str(args.config))
        else:
            fleet = load_fleet_spec(args.fleet)
        baseline = (Path(args.baseline).stem, policy_file(args.baseline))
        candidate = (Path(args.policy).stem, policy_file(args.policy))
        trace = read_log(args.log, args.scale)
    except (ValueError, ConfigError, LogError) as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    if candidate[0] == baseline[0]:
        candidate = (candidate[0] + " (candidate)", candidate[1])
    out = args.out or Path(f"/tmp/switchyard-whatif-{time.strftime('%Y%m%d-%H%M%S')}")
    command = " ".join(["switchyard", "whatif", *sys.argv[2:]]) if sys.argv[1:2] == ["whatif"] else None
    try:
        report = whatif(trace, fleet, baseline, candidate, out, slos, args.scrape_interval, command)
    except ConfigError as exc:
        print(f"switchyard: invalid policy: {exc}", file=sys.stderr)
        return 2
    print_report(report)
    print(f"\nreport: {out / 'report.html'} (and report.json)")
    return 0
