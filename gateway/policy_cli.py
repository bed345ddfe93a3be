"""`switchyard policy check|explain`: validate a policy file, and show how it would route a request.

Both work offline against a fleet: the pools of a gateway config (`--config`), or the demo fleet's.
`explain` can also take a backend state file, to see what the policy does under load:

    {"h100-0": {"inflight": 12, "waiting": 5, "kv_cache_usage": 0.97, "ttft_ms": 900},
     "mi300x-1": {"healthy": false}}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import yaml

from backends.models import Backend, EngineLoad, build_backends
from backends.yamlfile import ConfigError
from gateway.errors import GatewayError
from gateway.request.classify import classify
from gateway.request.parse import UPSTREAM_PATHS, parse
from gateway.routes import read_caller
from gateway.settings import ConfigFile, load_settings
from policies.config import load_policy
from policies.engine import PolicyEngine
from policies.presets import preset_names, resolve


def _backends(config: str | None) -> tuple[list[Backend], str]:
    if config is not None:
        settings = load_settings(config)
        return settings.backends, config
    from backends.sim.fleet import Fleet
    from backends.sim.fleet_spec import DEMO_FLEET, load_fleet_spec

    data = Fleet(load_fleet_spec(DEMO_FLEET)).gateway_config()
    pools = msgspec.convert(data, ConfigFile).pools
    return build_backends(pools), f"the demo fleet ({DEMO_FLEET})"


def _apply_state(backends: list[Backend], path: str) -> None:
    state: dict[str, dict[str, Any]] = json.loads(Path(path).read_text())
    by_name = {b.name: b for b in backends}
    for name, values in state.items():
        backend = by_name.get(name)
        if backend is None:
            raise SystemExit(f"switchyard: state file names an unknown backend `{name}`")
        backend.healthy = bool(values.get("healthy", True))
        backend.inflight = int(values.get("inflight", 0))
        backend.load = EngineLoad(
            running=float(values.get("running", 0)),
            waiting=float(values.get("waiting", 0)),
            kv_cache_usage=float(values.get("kv_cache_usage", 0)),
            scraped_at=0.0,
        )
        if "ttft_ms" in values:
            backend.observed.ttft = float(values["ttft_ms"]) / 1000
        if "tpot_ms" in values:
            backend.observed.tpot = float(values["tpot_ms"]) / 1000
        if "cost_per_mtok" in values:
            backend.measured_cost_per_mtok = float(values["cost_per_mtok"])


def _engine(args: argparse.Namespace) -> tuple[PolicyEngine, list[Backend], str] | None:
    """The policy bound to the fleet the command names; None (after printing why) when invalid."""
    try:
        loaded = load_policy(resolve(args.file))
        backends, against = _backends(args.config)
        return PolicyEngine(loaded, backends), backends, against
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def check(args: argparse.Namespace) -> int:
    built = _engine(args)
    if built is None:
        return 1
    engine, backends, against = built
    loaded = engine.loaded
    policy = loaded.policy
    print(f"ok: policy `{policy.name}` ({loaded.source})")
    print(f"  classes: {', '.join([r.name for r in policy.classes] + ['default'])}")
    print(f"  checked against {against}: {len(backends)} backends")
    for warning in engine.warnings:
        print(f"  warning: {warning}")
    return 0


def explain(args: argparse.Namespace) -> int:
    built = _engine(args)
    if built is None:
        return 1
    engine, backends, _ = built
    if args.state:
        _apply_state(backends, args.state)
    headers = [
        (k.strip().lower().encode(), v.strip().encode()) for k, v in (h.split("=", 1) for h in args.header)
    ]
    caller = read_caller({"headers": headers})
    try:
        parsed = parse(args.endpoint, Path(args.request).read_bytes())
    except GatewayError as exc:
        print(f"error: the request is invalid: {exc.body.message}", file=sys.stderr)
        return 1
    profile = classify(parsed, caller)
    serving = [b for b in backends if profile.model in b.models]
    if not serving:
        print(f"error: no backend serves model `{profile.model}`", file=sys.stderr)
        return 1
    decision = engine.explain(profile, serving)
    if args.json:
        print(json.dumps(decision.explanation, indent=2))
        return 0
    print(_render(decision.explanation or {}, decision.why_none))
    return 0


def _render(e: dict[str, Any], why_none: str | None) -> str:
    lines = [
        f"policy {e.get('policy')}: class `{e.get('request_class')}` (matched by {e.get('matched_by')})",
        "route: " + yaml.safe_dump(e.get("route"), default_flow_style=True, width=200).strip(),
    ]
    candidates = e.get("candidates") or []
    if candidates:
        names = sorted({name for c in candidates for name in c["scores"]})
        header = (
            f"  {'backend':<12} {'tier':<9} " + " ".join(f"{n:>17}" for n in names) + f" {'total':>7}  note"
        )
        lines.append(header)
        for c in candidates:
            scores = " ".join(f"{c['scores'][n]:>17.3f}" for n in names)
            note = c["why_not"] or ""
            lines.append(f"  {c['backend']:<12} {c['tier']:<9} {scores} {c['total']:>7.3f}  {note}")
        lines.append(f"choice: {e.get('choice')}")
    for d in e.get("dropped") or []:
        lines.append(f"  dropped {d['backend']}: {d['reason']}")
    if why_none:
        lines.append(f"no backend: {why_none}")
    lines.append(f"decided in {e.get('decision_us')} µs")
    return "\n".join(lines)


def add_commands(commands: Any) -> None:
    policy = commands.add_parser("policy", help="check a routing policy, or explain a routing decision")
    sub = policy.add_subparsers(dest="policy_command", required=True)
    presets = ", ".join(preset_names())
    c = sub.add_parser("check", help="validate a policy file (errors name the file and line)")
    c.add_argument("file", help=f"policy file, or a preset name ({presets})")
    c.add_argument("--config", help="gateway config whose pools the policy is checked against")
    c.set_defaults(run=check)
    x = sub.add_parser("explain", help="show the class, candidates, scores and choice for one request")
    x.add_argument("file", help=f"policy file, or a preset name ({presets})")
    x.add_argument("--request", required=True, help="JSON file with an OpenAI request body")
    x.add_argument("--endpoint", default="chat", choices=list(UPSTREAM_PATHS))
    x.add_argument("--config", help="gateway config with the pools (default: the demo fleet)")
    x.add_argument(
        "--state", help="JSON file of backend state (inflight, waiting, kv_cache_usage, healthy, ...)"
    )
    x.add_argument("--header", action="append", default=[], help="request header NAME=VALUE (repeatable)")
    x.add_argument("--json", action="store_true", help="print the whole explanation as JSON")
    x.set_defaults(run=explain)
