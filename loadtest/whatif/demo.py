"""`make whatif-demo`: record real traffic, then replay it under two presets and compare.

1. A simulated fleet (the `mixed` scenario's 70B fleet) and the gateway with its access log on serve the
   scenario's traffic for about `--seconds` real seconds (loadtest/whatif/record.py), routed by `balanced`.
2. The access log the gateway wrote is replayed on a virtual clock under `balanced` and `cheapest`.
3. The load test's report for each, and the difference, are printed and written (JSON + HTML).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from loadtest.scenario import load_scenario, with_overrides
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import print_report, whatif
from loadtest.whatif.record import SCRAPE_INTERVAL_S, record
from loadtest.workload import plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make whatif-demo", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="mixed")
    parser.add_argument("--seconds", type=float, default=25.0, help="real seconds of traffic to record")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    scale = scenario.time_scale
    scenario = with_overrides(scenario, duration_s=min(scenario.spec.duration_s, args.seconds * scale))
    out = Path(tempfile.mkdtemp(prefix="switchyard-whatif-demo-"))
    print(f"recording {scenario.spec.duration_s:g} simulated s of `{scenario.spec.name}` traffic through "
          f"the gateway (access log on, policy balanced, time scale {scale:g})...")  # fmt: skip
    served, log = record(scenario, "balanced", plan(scenario), out / "recorded")
    print(f"recorded {served['overall']['requests']} requests in {log}\n")
    trace = read_log(log, scale=1 / scale)  # the log's times are real; the fleet ran `scale` times faster
    report = whatif(
        trace,
        scenario.fleet,
        ("balanced", policy_file("balanced")),
        ("cheapest", policy_file("cheapest")),
        out,
        None,  # the log's classes are the gateway's: each judged by its route's SLO in balanced
        scrape_interval_s=SCRAPE_INTERVAL_S * scale,
        command=f"switchyard whatif --log {log} --policy cheapest --baseline balanced (time scale {scale:g})",
    )
    print_report(report)
    print(f"\nlog: {log}\nreport: {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
