"""`switchyard plan`: the cheapest fleet mix that meets every class's SLO on an access log's traffic.

    switchyard plan --log access.jsonl [--scale 1.5] [--gpu h100=2.90 --gpu mi300x --gpu b200] [--policy P]

Prints the cost-versus-SLO frontier (table, and frontier.svg), writes the winning fleet file (fleet.yaml)
and a gateway config routing to it with the policy that served it best (gateway.yaml).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import yaml

from backends.accelerators import CATALOGUE, find
from backends.yamlfile import ConfigError
from loadtest.whatif.accesslog import Trace
from loadtest.whatif.plan import DEFAULT_PRICES, Plan, PlanError, fleet_of

HELP = "find the cheapest GPU mix that meets every class's SLO on an access log's traffic"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, type=Path, help="the gateway's JSON access log")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="also meet the SLOs at this many times the load"
    )
    parser.add_argument(
        "--gpu", action="append", default=[], metavar="NAME[=USD_PER_GPU_HOUR]",
        help="a GPU type to buy and its price (default: the accelerator catalogue's); repeatable "
        "(default: h100=2.90 mi300x=1.75)",
    )  # fmt: skip
    parser.add_argument("--policy", default=None, help="a candidate policy (file or preset) to try too")
    parser.add_argument(
        "--slo", action="append", default=[], metavar="CLASS:ttft_ms=N,tpot_ms=N",
        help="a class's SLO (default: its route's SLO in `balanced`); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--target", type=float, default=0.95, help="share of each class's requests that must meet its SLO"
    )
    parser.add_argument("--model", default=None, help="the model to plan for (default: the log's most used)")
    parser.add_argument(
        "--scrape-interval", type=float, default=1.0, help="the gateway's scrape interval (s)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default /tmp/switchyard-plan-*)"
    )


def parse_gpu(text: str) -> tuple[str, float]:
    name, equals, price = text.partition("=")
    if not equals:
        accelerator = find(name)
        if accelerator is None:
            raise PlanError(f"--gpu {name}: unknown GPU; known: {', '.join(sorted(CATALOGUE))}")
        return name, accelerator.price_per_gpu_hour
    try:
        value = float(price)
    except ValueError:
        raise PlanError(f"--gpu `{text}`: expected NAME=USD_PER_GPU_HOUR, e.g. h100=2.90") from None
    return name, value


def preset_policies() -> list[tuple[str, Path]]:
    from loadtest.stack import policy_file

    presets = Path(policy_file("balanced")).parent
    return [(p.stem, p) for p in sorted(presets.glob("*.yaml"))]


def make_plan(
    log: Path,
    gpus: list[tuple[str, float]],
    scale: float = 1.0,
    candidate: str | None = None,
    slos: dict[str, Any] | None = None,
    target: float = 0.95,
    model: str | None = None,
    scrape_interval_s: float = 1.0,
) -> Plan:
    from loadtest.stack import policy_file
    from loadtest.whatif.accesslog import read_log
    from loadtest.whatif.compare import route_slos
    from loadtest.whatif.plan import Planner, gpu_type

    if scale <= 0 or scrape_interval_s <= 0 or not 0 < target <= 1:
        raise PlanError("--scale and --scrape-interval must be positive and --target in (0, 1]")
    traces = [read_log(log, scale)] + ([read_log(log)] if scale != 1.0 else [])
    model = model or _main_model(traces[0])
    context = max(
        (r.line.prompt_tokens + r.output_per_choice for r in traces[0].requests if r.line.model == model),
        default=1,
    )
    types = [gpu_type(name, price, model, context) for name, price in (gpus or list(DEFAULT_PRICES.items()))]
    if len({t.name for t in types}) != len(types):
        raise PlanError("--gpu: each GPU type once")
    policies = preset_policies()
    if candidate is not None:
        policies.append((Path(candidate).stem + " (candidate)", policy_file(candidate)))
    classes = route_slos(policy_file("balanced")) | (slos or {})
    planner = Planner(traces, types, model, policies, classes, target, scrape_interval_s)
    plan = planner.search()
    plan.scales = sorted({1.0, scale})
    return plan


def _main_model(trace: Trace) -> str:
    return Counter(r.line.model for r in trace.requests).most_common(1)[0][0]


def mix_name(plan: Plan, counts: tuple[int, ...]) -> str:
    parts = [
        f"{c}x {t.name}" + (f" (TP{t.gpus_per_backend})" if t.gpus_per_backend > 1 else "")
        for t, c in zip(plan.types, counts, strict=True)
        if c
    ]
    return " + ".join(parts) or "nothing"


def format_frontier(plan: Plan) -> str:
    loads = " and ".join(f"{s:g}x" for s in plan.scales)
    lines = [
        f"Cost vs SLO frontier for {plan.model} (worst class's SLO attainment at {loads} the load; "
        f"target {plan.target:.0%})",
        f"{'fleet':<34} {'GPUs':>4} {'$/hour':>8} {'worst class':>11}  policy",
    ]
    for v in plan.frontier:
        gpus = sum(t.gpus_per_backend * c for t, c in zip(plan.types, v.counts, strict=True))
        mark = "  <- cheapest that meets the SLOs" if plan.best and v.counts == plan.best.counts else ""
        lines.append(
            f"{mix_name(plan, v.counts):<34} {gpus:>4} {v.usd_per_hour:>8.2f} {v.worst:>10.1%}  "
            f"{v.policy if v.passed else '-'}{mark}"
        )
    return "\n".join(lines)


def write_outputs(plan: Plan, out: Path) -> dict[str, Path]:
    from loadtest.svg import frontier_chart
    from loadtest.whatif.simfleet import gateway_yaml

    out.mkdir(parents=True, exist_ok=True)
    frontier = plan.frontier
    points = [(v.usd_per_hour, v.worst, mix_name(plan, v.counts), v.passed) for v in plan.verdicts]
    line = [(v.usd_per_hour, v.worst) for v in frontier]
    svg = frontier_chart("Cost vs worst class SLO attainment", points, line, plan.target)
    written = {"svg": out / "frontier.svg"}
    written["svg"].write_text(svg, encoding="utf-8")
    if plan.best is not None:
        spec = fleet_of(plan.types, plan.best.counts, plan.model)
        written["fleet"] = out / "fleet.yaml"
        data = msgspec.to_builtins(spec)
        written["fleet"].write_text(
            f"# `switchyard plan`: {mix_name(plan, plan.best.counts)}, ${plan.best.usd_per_hour:.2f}/hour\n"
            + yaml.safe_dump(data, sort_keys=False),
            encoding="utf-8",
        )
        written["gateway"] = out / "gateway.yaml"
        written["gateway"].write_text(gateway_yaml(spec, _policy_ref(plan)), encoding="utf-8")
    return written


def _policy_ref(plan: Plan) -> str:
    """A preset by name, a candidate by its file."""
    assert plan.best is not None and plan.best.policy is not None
    path = plan.policies[plan.best.policy]
    return plan.best.policy if path.parent.name == "presets" else str(path.resolve())


def run(args: argparse.Namespace) -> int:
    from loadtest.whatif.accesslog import LogError
    from loadtest.whatif.cli import parse_slo

    began = time.perf_counter()
    try:
        gpus = [parse_gpu(g) for g in args.gpu]
        slos = dict(parse_slo(s) for s in args.slo)
        plan = make_plan(
            args.log, gpus, args.scale, args.policy, slos, args.target, args.model, args.scrape_interval
        )
    except (ValueError, ConfigError, LogError) as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(f"/tmp/switchyard-plan-{time.strftime('%Y%m%d-%H%M%S')}")
    written = write_outputs(plan, out)
    print(format_frontier(plan))
    wall = time.perf_counter() - began
    print(f"\n{len(plan.verdicts)} mixes, {plan.replays} replays in {wall:.1f} s")
    if plan.best is None:
        print("no mix searched meets the SLOs (up to 64 backends per GPU type)")
        return 1
    print(f"cheapest: {mix_name(plan, plan.best.counts)} at ${plan.best.usd_per_hour:.2f}/hour with "
          f"`{plan.best.policy}`")  # fmt: skip
    for kind, path in written.items():
        print(f"{kind}: {path}")
    return 0
