"""`switchyard policy check|explain|plugins`: validate a policy file, show how it would route a request, and
list the filters, scorers and pickers a policy file can name (policies/reference.py).

Both work offline against a fleet: the pools of a gateway config (`--config`), or the demo fleet's.
`check` fails when the policy is invalid or part of it (a `prefer` or `fallback` selector) matches no pool
of that fleet. `explain` can also take a backend state file, to see what the policy does under load:

    {"h100-0": {"inflight": 12, "waiting": 5, "kv_cache_usage": 0.97, "ttft_ms": 900},
     "mi300x-1": {"healthy": false}}
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from backends.models import Backend, EngineLoad, build_backends
from backends.yamlfile import ConfigError
from gateway.config.settings import ConfigFile, load_settings
from gateway.http.routes import read_caller
from gateway.openai.errors import GatewayError
from gateway.request.classify import classify
from gateway.request.parse import UPSTREAM_PATHS, parse
from policies.engine import PolicyEngine, load_engine
from policies.explain import Explained, explain
from policies.presets import preset_names, resolve
from policies.reference import markdown, plugin_docs, text


def _backends(config: str | None) -> tuple[list[Backend], str]:
    if config is not None:
        settings = load_settings(config)
        return settings.backends, config
    from backends.sim.fleet import Fleet
    from backends.sim.fleet_spec import DEMO_FLEET, load_fleet_spec

    data = Fleet(load_fleet_spec(DEMO_FLEET)).gateway_config()
    pools = msgspec.convert(data, ConfigFile).pools
    return build_backends(pools), f"the demo fleet ({DEMO_FLEET})"


class BackendState(msgspec.Struct, forbid_unknown_fields=True):
    """One backend's entry in a `--state` file; what is not given keeps an idle, healthy backend."""

    healthy: bool = True
    inflight: Annotated[int, msgspec.Meta(ge=0)] = 0
    inflight_seqs: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """Sequences those requests hold (n per request with n choices); `inflight` when not given."""
    running: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    waiting: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    kv_cache_usage: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    ttft_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    tpot_ms: Annotated[float, msgspec.Meta(ge=0)] | None = None
    cost_per_mtok: Annotated[float, msgspec.Meta(ge=0)] | None = None


STATE_FIELDS = ", ".join(BackendState.__struct_fields__)


def read_state(path: str, backends: list[Backend]) -> dict[Backend, BackendState]:
    """The `--state` file, checked whole; ValueError saying which backend and field is wrong."""
    try:
        raw = msgspec.json.decode(Path(path).read_bytes(), type=dict[str, dict[str, Any]])
    except OSError as exc:
        raise ValueError(f"cannot read state file {path}: {exc.strerror}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: expected an object of backend name to state: {exc}") from None
    by_name = {b.name: b for b in backends}
    states: dict[Backend, BackendState] = {}
    for name, values in raw.items():
        backend = by_name.get(name)
        if backend is None:
            raise ValueError(f"{path}: unknown backend `{name}` (backends: {', '.join(by_name)})")
        try:
            states[backend] = msgspec.convert(values, BackendState)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{path}: backend `{name}`: {exc} (allowed fields: {STATE_FIELDS})") from None
    return states


def _apply_state(states: dict[Backend, BackendState]) -> None:
    for backend, state in states.items():
        backend.healthy = state.healthy
        backend.inflight = state.inflight
        backend.inflight_seqs = state.inflight if state.inflight_seqs is None else state.inflight_seqs
        backend.load = EngineLoad(
            running=state.running, waiting=state.waiting, kv_cache_usage=state.kv_cache_usage, scraped_at=0.0
        )
        if state.ttft_ms is not None:
            backend.observed.ttft = state.ttft_ms / 1000
        if state.tpot_ms is not None:
            backend.observed.tpot = state.tpot_ms / 1000
        if state.cost_per_mtok is not None:
            backend.measured_cost_per_mtok = state.cost_per_mtok


def _engine(args: argparse.Namespace) -> tuple[PolicyEngine, list[Backend], str] | None:
    """The policy bound to the fleet the command names; None (after printing why) when invalid."""
    try:
        backends, against = _backends(args.config)
        return load_engine(resolve(args.file), backends), backends, against
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def check(args: argparse.Namespace) -> int:
    """0 when the policy loads and every part of it can match the fleet; 1 otherwise."""
    built = _engine(args)
    if built is None:
        return 1
    engine, backends, against = built
    loaded = engine.loaded
    policy = loaded.policy
    if engine.warnings:
        for warning in engine.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(
            f"error: policy `{policy.name}` ({loaded.source}) loads, but part of it can never match "
            f"{against}; fix it, or check against the right fleet with --config",
            file=sys.stderr,
        )
        return 1
    print(f"ok: policy `{policy.name}` ({loaded.source}), version {engine.version}")
    print(f"  classes: {', '.join([r.name for r in policy.classes] + ['default'])}")
    print(f"  checked against {against}: {len(backends)} backends")
    return 0


def explain_command(args: argparse.Namespace) -> int:
    built = _engine(args)
    if built is None:
        return 1
    engine, backends, _ = built
    if args.state:
        try:
            _apply_state(read_state(args.state, backends))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
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
    explained = explain(engine, profile, serving)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(explained), indent=2).decode())
    else:
        print(render(explained))
    return 0


def render(explained: Explained) -> str:
    """The explanation as a table for a terminal."""
    e = explained.explanation
    assert e is not None  # the CLI always explains a policy engine
    lines = [
        f"policy {e.policy} (version {e.version}): class `{e.request_class}` (matched by {e.matched_by})",
        "route: " + yaml.safe_dump(e.route, default_flow_style=True, width=200).strip(),
    ]
    if e.candidates:
        names = sorted({name for c in e.candidates for name in c.scores})
        header = (
            f"  {'backend':<12} {'tier':<9} " + " ".join(f"{n:>17}" for n in names) + f" {'total':>7}  note"
        )
        lines.append(header)
        for c in e.candidates:
            scores = " ".join(f"{c.scores[n]:>17.3f}" for n in names)
            lines.append(f"  {c.backend:<12} {c.tier:<9} {scores} {c.total:>7.3f}  {c.why_not or ''}")
        lines.append(f"choice: {e.choice}")
    for d in e.dropped:
        lines.append(f"  dropped {d.backend}: {d.reason}")
    if explained.why_none:
        lines.append(f"no backend: {explained.why_none}")
    lines.append(f"decided in {e.decision_us} µs")
    return "\n".join(lines)


def plugins_command(args: argparse.Namespace) -> int:
    """Print the plugin reference: every registered plugin, after importing the modules named."""
    for module in args.imports:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a plugin module may fail in any way while importing
            print(f"error: cannot import `{module}`: {exc}", file=sys.stderr)
            return 1
    docs = plugin_docs()
    sys.stdout.write(markdown(docs) if args.markdown else text(docs))
    return 0


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
    x.add_argument(
        "--endpoint", default="chat", choices=list(UPSTREAM_PATHS), help="the API the request is for"
    )
    x.add_argument("--config", help="gateway config with the pools (default: the demo fleet)")
    x.add_argument("--state", help=f"JSON file of backend state by backend name; fields: {STATE_FIELDS}")
    x.add_argument("--header", action="append", default=[], help="request header NAME=VALUE (repeatable)")
    x.add_argument(
        "--json",
        action="store_true",
        help="print the explanation as JSON (as POST /admin/v1/explain answers)",
    )
    x.set_defaults(run=explain_command)
    p = sub.add_parser("plugins", help="list every filter, scorer and picker, with its parameters")
    p.add_argument("--markdown", action="store_true", help="print it as markdown (docs/plugins.md)")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a plugin module first, as a policy file's `imports:` does (repeatable)",
    )
    p.set_defaults(run=plugins_command)
