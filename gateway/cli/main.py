"""`switchyard`: serve the gateway, run the demo, start a simulated fleet."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from types import ModuleType
from typing import Any

from backends.yamlfile import ConfigError
from gateway.cli import cluster as cluster_cli
from gateway.cli import keys as tenants_cli
from gateway.cli import policy as policy_cli
from gateway.ledger.records import DIMENSIONS

_PROJECT = ("gateway", "backends", "policies", "loadtest")


def _tooling(module: str, extra: str) -> ModuleType | None:
    """A tooling command's module, imported when it runs; None (after naming the extra) when one is missing.

    The runtime install serves traffic; the simulator, the demo and the load test come with extras, so
    nothing here imports them before their command is asked for (tests/unit/test_packaging.py).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] in _PROJECT:
            raise
        print(
            f"switchyard: this command needs the [{extra}] extra (cannot import {exc.name}): "
            f"pip install 'switchyard[{extra}]'",
            file=sys.stderr,
        )
        return None


def _serve(args: argparse.Namespace) -> int:
    from gateway.config.settings import load_settings
    from gateway.serve.server import run_server
    from gateway.tenants.admin_key import ALLOW_ENV, WeakAdminKey, check_admin_key

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"switchyard: invalid config: {exc}", file=sys.stderr)
        return 2
    if args.allow_weak_admin_key:
        os.environ[ALLOW_ENV] = "1"  # the worker processes, which build the app themselves, inherit it
    try:
        check_admin_key(settings.auth.admin_key_env, settings.auth.allow_weak_admin_key)
    except WeakAdminKey as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    host = args.host or settings.server.host
    port = settings.server.port if args.port is None else args.port
    workers = settings.server.workers if args.workers is None else args.workers
    if workers < 1:
        print("switchyard: --workers must be at least 1", file=sys.stderr)
        return 2
    if workers > 1:
        return _serve_workers(args, settings, host, port, workers)
    # The JSON access log (gateway/telemetry/logs.py) follows --log-level: `warning` silences it.
    logging.getLogger("switchyard.access").setLevel(args.log_level.upper())
    with contextlib.suppress(KeyboardInterrupt):
        run_server(settings, host=host, port=port, log_level=args.log_level)
    return 0


def _serve_workers(args: argparse.Namespace, settings: Any, host: str, port: int, workers: int) -> int:
    from gateway.serve.workers import serve_workers

    if not settings.ledger.redis_url:
        logging.warning("switchyard: %d workers without ledger.redis_url: each has its own view", workers)
    grace = settings.server.shutdown_grace
    balance = settings.server.worker_balance
    return serve_workers(args.config, host, port, workers, args.log_level, grace, balance)


def _demo(args: argparse.Namespace) -> int:
    demo = _tooling("gateway.cli.demo", "sim")
    if demo is None:
        return 2
    return demo.run_demo(port=args.port, exit_after_traffic=args.exit_after_traffic, requests=args.requests)


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
    fleet = _tooling("backends.sim.fleet", "sim")
    if fleet is None:
        return 2
    return fleet.main(args.fleet_args)


def _loadtest(argv: list[str]) -> int:
    """`switchyard loadtest ...`: the tool's own parser, loaded only when the command is asked for."""
    cli = _tooling("loadtest.cli", "bench")
    if cli is None:
        return 2
    parser = argparse.ArgumentParser(prog="switchyard loadtest", description=_LOADTEST_HELP)
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


_LOADTEST_HELP = "compare routing policies under open-loop load"


def _run_tooling(module: str, command: str, argv: list[str]) -> int:
    """`switchyard <command> ...`, run by `module` (HELP, add_arguments, run), imported only when asked."""
    cli = _tooling(module, "bench")
    if cli is None:
        return 2
    parser = argparse.ArgumentParser(prog=f"switchyard {command}", description=cli.HELP)
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


def _whatif(argv: list[str]) -> int:
    """`switchyard whatif ...`: replay an access log on a simulated fleet."""
    return _run_tooling("loadtest.whatif.cli", "whatif", argv)


def _plan(argv: list[str]) -> int:
    """`switchyard plan ...`: the cheapest fleet for an access log's traffic."""
    return _run_tooling("loadtest.whatif.plan_cli", "plan", argv)


def _calibrate(argv: list[str]) -> int:
    """`switchyard calibrate ...`: measure a live vLLM server and write its profile."""
    return _run_tooling("loadtest.calibrate.cli", "calibrate", argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway from a config file")
    serve.add_argument("--config", required=True, help="gateway config YAML")
    serve.add_argument("--host", default=None, help="override gateway.host")
    serve.add_argument("--port", type=int, default=None, help="override gateway.port")
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s; `warning` also silences the access log)",
    )
    serve.add_argument("--workers", type=int, default=None, help="override gateway.workers (processes)")
    serve.add_argument(
        "--allow-weak-admin-key",
        action="store_true",
        help="start even if the admin key is weak (logs a warning at every start)",
    )
    serve.set_defaults(run=_serve)

    demo = commands.add_parser(
        "demo", help="simulated H100 + MI300X fleet, the gateway, and a burst of traffic"
    )
    demo.add_argument("--port", type=int, default=8080, help="the gateway's port (default: %(default)s)")
    demo.add_argument("--requests", type=int, default=14, help="requests in the burst")
    demo.add_argument("--exit-after-traffic", action="store_true", help="stop after the burst (for scripts)")
    demo.set_defaults(run=_demo)

    costs = commands.add_parser("costs", help="the cost table of a running gateway")
    costs.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway's base URL")
    costs.add_argument(
        "--by",
        default="backend",
        choices=list(DIMENSIONS),
        help="what each row of the table sums (default: %(default)s)",
    )
    costs.add_argument(
        "--window",
        default="15m",
        choices=["1m", "15m", "1h", "24h"],
        help="how far back the table looks (default: %(default)s)",
    )
    costs.set_defaults(run=_costs)

    backends = commands.add_parser(
        "backends", help="list, drain or undrain the backends of a running gateway"
    )
    backends.add_argument(
        "action",
        choices=["list", "drain", "undrain"],
        help="list them; drain one (no new requests, in-flight ones finish); undrain one",
    )
    backends.add_argument("name", nargs="?", help="the backend (for drain and undrain)")
    backends.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway's base URL")
    backends.set_defaults(run=_backends)

    policy_cli.add_commands(commands)
    tenants_cli.add_commands(commands)
    cluster_cli.add_commands(commands)
    loadtest = commands.add_parser("loadtest", help=_LOADTEST_HELP, add_help=False)
    loadtest.add_argument("rest", nargs=argparse.REMAINDER)
    loadtest.set_defaults(run=lambda args: _loadtest(args.rest))

    whatif = commands.add_parser(
        "whatif", help="replay an access log under a candidate policy", add_help=False
    )
    whatif.add_argument("rest", nargs=argparse.REMAINDER)
    whatif.set_defaults(run=lambda args: _whatif(args.rest))
    plan = commands.add_parser(
        "plan", help="the cheapest GPU mix for an access log's traffic", add_help=False
    )
    plan.add_argument("rest", nargs=argparse.REMAINDER)
    plan.set_defaults(run=lambda args: _plan(args.rest))
    calibrate = commands.add_parser(
        "calibrate", help="measure a live vLLM server and write its profile", add_help=False
    )
    calibrate.add_argument("rest", nargs=argparse.REMAINDER)
    calibrate.set_defaults(run=lambda args: _calibrate(args.rest))

    sim = commands.add_parser("sim", help="the vLLM-compatible simulator")
    sim_commands = sim.add_subparsers(dest="sim_command", required=True)
    # The fleet's own parser (backends.sim.fleet.main) reads its options, --help included: main()
    # hands it what this parser does not know, so the simulator is imported only when it runs.
    fleet = sim_commands.add_parser(
        "fleet", help="start simulated backends from a fleet file", add_help=False
    )
    fleet.set_defaults(run=_sim_fleet)
    return parser


EXIT_BROKEN_PIPE = 128 + 13
"""What a shell reports for a command killed by SIGPIPE (`| head` closed its input): what `cat` does."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["loadtest"]:  # its options (and --help) belong to loadtest/cli.py, imported only now
        args = argparse.Namespace(command="loadtest", run=lambda _: _loadtest(argv[1:]))
    elif argv[:1] == ["whatif"]:
        args = argparse.Namespace(command="whatif", run=lambda _: _whatif(argv[1:]))
    elif argv[:1] == ["plan"]:
        args = argparse.Namespace(command="plan", run=lambda _: _plan(argv[1:]))
    elif argv[:1] == ["calibrate"]:
        args = argparse.Namespace(command="calibrate", run=lambda _: _calibrate(argv[1:]))
    else:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if args.run is _sim_fleet:
            args.fleet_args = unknown
        elif unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    quiet = ("demo", "costs", "backends", "keys", "teams")
    level = logging.WARNING if args.command in quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.run(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of our output left (`... | head`): stop quietly. Python ignores SIGPIPE (the server
        # needs that), so the write raised instead; point stdout at /dev/null so the flush at exit is
        # silent too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
