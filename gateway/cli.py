"""`switchyard`: serve the gateway, run the demo, start a simulated fleet."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys

from gateway import policy_cli
from gateway.ledger.records import DIMENSIONS
from gateway.yamlfile import ConfigError
from loadtest import cli as loadtest_cli


def _serve(args: argparse.Namespace) -> int:
    from gateway.server import run_server
    from gateway.settings import load_settings

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"switchyard: invalid config: {exc}", file=sys.stderr)
        return 2
    host = args.host or settings.server.host
    port = settings.server.port if args.port is None else args.port
    # The JSON access log (gateway/telemetry/logs.py) follows --log-level: `warning` silences it.
    logging.getLogger("switchyard.access").setLevel(args.log_level.upper())
    with contextlib.suppress(KeyboardInterrupt):
        run_server(settings, host=host, port=port, log_level=args.log_level)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    return run_demo(port=args.port, exit_after_traffic=args.exit_after_traffic, requests=args.requests)


def _costs(args: argparse.Namespace) -> int:
    import httpx

    from gateway.ledger.costs import format_cost_table

    params = {"by": args.by, "window": args.window}
    try:
        response = httpx.get(args.url.rstrip("/") + "/admin/v1/costs", params=params, timeout=10)
    except httpx.HTTPError as exc:
        print(f"switchyard: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        print(f"switchyard: {response.status_code}: {response.text}", file=sys.stderr)
        return 1
    body = response.json()
    print(format_cost_table(body["by"], body["window"], body["rows"], body["idle_cost"]))
    return 0


def _backends(args: argparse.Namespace) -> int:
    import httpx

    base = args.url.rstrip("/") + "/admin/v1/backends"
    try:
        if args.action == "list":
            response = httpx.get(base, timeout=10)
        else:
            if not args.name:
                print(f"switchyard: `backends {args.action}` needs a backend name", file=sys.stderr)
                return 2
            response = httpx.post(f"{base}/{args.name}/{args.action}", timeout=10)
    except httpx.HTTPError as exc:
        print(f"switchyard: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        print(f"switchyard: {response.status_code}: {response.text}", file=sys.stderr)
        return 1
    body = response.json()
    rows = body["data"] if args.action == "list" else [body]
    print(
        f"{'backend':<16} {'pool':<10} {'routable':<9} {'health':<7} {'breaker':<10} {'draining':<9} inflight"
    )
    for r in rows:
        print(
            f"{r['name']:<16} {r['pool']:<10} {str(r['routable']).lower():<9} "
            f"{'ok' if r['healthy'] else 'failing':<7} {r['breaker']:<10} {str(r['draining']).lower():<9} "
            f"{r['inflight']}"
        )
    return 0


def _sim_fleet(args: argparse.Namespace) -> int:
    from backends.sim.fleet import main as fleet_main

    return fleet_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway from a config file")
    serve.add_argument("--config", required=True, help="gateway config YAML")
    serve.add_argument("--host", default=None, help="override gateway.host")
    serve.add_argument("--port", type=int, default=None, help="override gateway.port")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(run=_serve)

    demo = commands.add_parser(
        "demo", help="simulated H100 + MI300X fleet, the gateway, and a burst of traffic"
    )
    demo.add_argument("--port", type=int, default=8080)
    demo.add_argument("--requests", type=int, default=14, help="requests in the burst")
    demo.add_argument("--exit-after-traffic", action="store_true", help="stop after the burst (for scripts)")
    demo.set_defaults(run=_demo)

    costs = commands.add_parser("costs", help="the cost table of a running gateway")
    costs.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway's base URL")
    costs.add_argument("--by", default="backend", choices=list(DIMENSIONS))
    costs.add_argument("--window", default="15m", choices=["1m", "15m", "1h", "24h"])
    costs.set_defaults(run=_costs)

    backends = commands.add_parser(
        "backends", help="list, drain or undrain the backends of a running gateway"
    )
    backends.add_argument("action", choices=["list", "drain", "undrain"])
    backends.add_argument("name", nargs="?", help="the backend (for drain and undrain)")
    backends.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway's base URL")
    backends.set_defaults(run=_backends)

    policy_cli.add_commands(commands)
    loadtest_cli.add_commands(commands)

    sim = commands.add_parser("sim", help="the vLLM-compatible simulator")
    sim_commands = sim.add_subparsers(dest="sim_command", required=True)
    fleet = sim_commands.add_parser(
        "fleet", help="start simulated backends from a fleet file", add_help=False
    )
    fleet.add_argument("rest", nargs=argparse.REMAINDER)
    fleet.set_defaults(run=_sim_fleet)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.command in ("demo", "costs", "backends") else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
