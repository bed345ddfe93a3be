"""How fast `switchyard whatif` replays: an hour of recorded traffic (36,000 requests) on one core.

Writes an access log for an hour of a scenario's traffic (default: `chat` on the demo fleet at 10
requests/s; loadtest/whatif/synth.py writes the lines the gateway would have), pins this process to one
CPU, and replays the log under a policy on the scenario's fleet (loadtest/whatif/compare.py's
replay_policy: the policy engine and the simulator on a virtual clock). Reports requests replayed per
second of wall time, for the replay alone and for the whole whatif step (reading the log, replaying,
building the report), with the CPU seconds each took and what the replay found (SLO attainment).

Usage: python -m loadtest.bench.whatif [--scenario chat] [--rate 10] [--seconds 3600] [--policy balanced]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from loadtest.bench._util import usable_cpus
from loadtest.scenario import load_scenario, with_overrides
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import replay_policy, route_slos, whatif_scenario
from loadtest.whatif.synth import write_log
from loadtest.workload import plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.bench.whatif", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--scenario", default="chat")
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per simulated second")
    parser.add_argument("--seconds", type=float, default=3600.0, help="simulated seconds of traffic")
    parser.add_argument("--policy", default="balanced")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)

    cpu = usable_cpus()[0]
    os.sched_setaffinity(0, {cpu})
    total = int(args.rate * args.seconds * 1.5)  # the cap is never what ends the hour
    scenario = with_overrides(
        load_scenario(args.scenario),
        duration_s=args.seconds,
        rate=args.rate,
        max_requests=total,
        time_scale=1,
    )
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-whatif-") as folder:
        log = write_log(plan(scenario), Path(folder) / "access.jsonl")
        policy = policy_file(args.policy)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        trace = read_log(log)
        read_wall = time.perf_counter() - wall0
        slos = route_slos(policy) | {c.name: c.slo for c in scenario.spec.classes}  # the log's classes
        run = replay_policy(args.policy, policy, whatif_scenario(trace, scenario.fleet, slos), trace)
        wall, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    replayed = len(run.result.outcomes)
    figures = {
        "scenario": args.scenario,
        "policy": args.policy,
        "fleet_backends": sum(g.count for g in scenario.fleet.groups),
        "simulated_s": round(trace.duration_s, 1),
        "requests": replayed,
        "cpu": cpu,
        "python": platform.python_version(),
        "read_log_s": round(read_wall, 2),
        "replay_wall_s": round(run.wall_s, 2),
        "replayed_per_wall_s": round(replayed / run.wall_s),
        "whatif_wall_s": round(wall, 2),
        "whatif_cpu_s": round(cpu_s, 2),
        "whatif_requests_per_wall_s": round(replayed / wall),
        "errors": run.report["overall"]["errors"],
        "slo_attainment": {c: v["slo_attainment"] for c, v in run.report["classes"].items()},
    }
    print(
        f"{args.scenario} under {args.policy}: {replayed} requests ({trace.duration_s / 3600:.2f} simulated "
        f"hours) on {figures['fleet_backends']} simulated backends, one core (cpu {cpu})\n"
        f"  replay alone: {run.wall_s:.2f} s wall -> {figures['replayed_per_wall_s']:,} requests/s\n"
        f"  read + replay + report: {wall:.2f} s wall, {cpu_s:.2f} s CPU -> "
        f"{figures['whatif_requests_per_wall_s']:,} requests/s"
    )
    print(json.dumps(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
