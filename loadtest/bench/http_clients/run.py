"""Run the client benchmark: start upstream, proxy and load per client and mode, measure, print the table."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import loadtest.bench.http_clients as package
from loadtest.bench._util import (
    http_post,
    pick_cpus,
    session_cpu_seconds,
    which,
)
from loadtest.bench.http_clients.loadgen import LoadGen, run_loadgen
from loadtest.bench.http_clients.payloads import (
    CHAT_PATH,
    CLIENTS,
    MODES,
    MODULE,
    chat_request,
    check_response,
)
from loadtest.bench.http_clients.proxy import proxy_argv, serve_uvicorn
from loadtest.bench.http_clients.upstream import Upstream, serve_aiohttp_upstream, start_upstream
from loadtest.processes import Child, ProcessGroup, free_port, install_interrupt_handlers, wait_until

DESCRIPTION = (package.__doc__ or "").split("\n\n")[0]

# -------------------------------------------------------------------------------------- orchestration


@dataclass
class Config:
    duration: float = 10.0
    warmup: float = 3.0
    connections: int = 64
    server: str = "uvicorn"
    clients: tuple[str, ...] = CLIENTS
    modes: tuple[str, ...] = MODES
    reps: int = 1
    upstream: str = "auto"
    loadgen: str = "auto"


@dataclass
class Phase:
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float
    proxy_cpu_pct: float
    requests: int
    errors: int


@dataclass
class Setup:
    group: ProcessGroup
    workdir: Path
    upstream: Upstream
    load: LoadGen
    proxy_cpu: int


def resolve_tools(config: Config) -> tuple[str, str]:
    """(upstream kind, load generator kind) after applying the ``auto`` choices."""
    upstream = config.upstream
    if upstream == "auto":
        upstream = "nginx" if which("nginx", "/usr/sbin", "/usr/local/sbin") else "aiohttp"
    loadgen = config.loadgen
    if loadgen == "auto":
        loadgen = "wrk" if which("wrk") else "aiohttp"
    return upstream, loadgen


def start_proxy(setup: Setup, config: Config, client: str) -> tuple[Child, str]:
    port = free_port()
    env = dict(
        os.environ,
        BENCH_CLIENT=client,
        BENCH_CONNECTIONS=str(config.connections),
        BENCH_UPSTREAM_JSON=setup.upstream.json_base,
        BENCH_UPSTREAM_STREAM=setup.upstream.stream_base,
        PYTHONUNBUFFERED="1",
    )
    cwd = str(Path(__file__).resolve().parent.parent)
    argv = proxy_argv(config.server, port)
    child = setup.group.start(f"proxy-{client}", argv, cpu=setup.proxy_cpu, env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}{CHAT_PATH}"
    body = chat_request(False)
    wait_until(lambda: http_post(url, body)[0] == 200, timeout=30, what=f"proxy-{client}", child=child)
    return child, url


def measure(setup: Setup, config: Config, proxy: Child, url: str, mode: str) -> Phase:
    check_response(mode, *http_post(url, chat_request(mode == "stream")))
    if config.warmup > 0:
        setup.load.run(setup.group, url, mode, config.warmup)
        time.sleep(0.3)  # let in-flight work drain before the measured phase
    cpu_before = session_cpu_seconds(proxy.pid)
    wall_before = time.perf_counter()
    result = setup.load.run(setup.group, url, mode, config.duration)
    cpu = session_cpu_seconds(proxy.pid) - cpu_before
    wall = time.perf_counter() - wall_before
    if not proxy.alive():
        raise RuntimeError(f"proxy died during {mode}:\n{proxy.log_tail()}")
    ok = max(result.requests - result.errors, 1)
    time.sleep(0.3)
    return Phase(
        rps=result.requests / result.duration_s if result.duration_s else 0.0,
        p50_ms=result.p50_ms,
        p99_ms=result.p99_ms,
        cpu_us_per_req=cpu * 1e6 / ok,
        proxy_cpu_pct=100.0 * cpu / wall,
        requests=result.requests,
        errors=result.errors,
    )


def run_client(setup: Setup, config: Config, client: str) -> dict[str, Phase]:
    proxy, url = start_proxy(setup, config, client)
    try:
        phases = {}
        for mode in config.modes:
            phases[mode] = measure(setup, config, proxy, url, mode)
            _log(f"  {client:8} {mode:7} {_fmt_phase(phases[mode])}")
        return phases
    finally:
        setup.group.stop(proxy)


def _median_phase(phases: list[Phase]) -> Phase:
    fields = asdict(phases[0]).keys()
    merged = {name: statistics.median(getattr(p, name) for p in phases) for name in fields}
    merged["requests"] = int(sum(p.requests for p in phases))
    merged["errors"] = int(sum(p.errors for p in phases))
    return Phase(**merged)


def run_benchmark(config: Config) -> dict[str, Any]:
    """Run every client x mode (``reps`` alternating rounds) and return the result dict."""
    upstream_kind, loadgen_kind = resolve_tools(config)
    proxy_cpu, load_cpu = pick_cpus()
    with tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp:
        workdir = Path(tmp)
        group = ProcessGroup(workdir)
        try:
            upstream = start_upstream(group, upstream_kind, load_cpu, workdir)
            load = LoadGen(loadgen_kind, load_cpu, workdir, config.connections)
            setup = Setup(group, workdir, upstream, load, proxy_cpu)
            _log(_describe(config, upstream_kind, loadgen_kind, proxy_cpu, load_cpu))
            runs: dict[str, dict[str, list[Phase]]] = {
                c: {m: [] for m in config.modes} for c in config.clients
            }
            for rep in range(config.reps):
                order = config.clients if rep % 2 == 0 else tuple(reversed(config.clients))
                for client in order:
                    for mode, phase in run_client(setup, config, client).items():
                        runs[client][mode].append(phase)
        finally:
            group.close()
    return _summarise(config, runs, upstream_kind, loadgen_kind, proxy_cpu, load_cpu)


def _summarise(
    config: Config,
    runs: dict[str, dict[str, list[Phase]]],
    upstream: str,
    loadgen: str,
    proxy_cpu: int,
    load_cpu: int,
) -> dict[str, Any]:
    results = {c: {m: asdict(_median_phase(p)) for m, p in modes.items()} for c, modes in runs.items()}
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    if "httpx" in results:
        for client in results:
            if client == "httpx":
                continue
            ratios[client] = {}
            for mode in config.modes:
                base, other = results["httpx"][mode], results[client][mode]
                ratios[client][mode] = {
                    key: (other[key] / base[key]) if base[key] else float("nan")
                    for key in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req")
                }
    return {
        "config": asdict(config),
        "environment": {
            "server": config.server,
            "upstream": upstream,
            "loadgen": loadgen,
            "proxy_cpu": proxy_cpu,
            "load_cpu": load_cpu,
            "python": sys.version.split()[0],
        },
        "results": results,
        "ratios_over_httpx": ratios,
        "all_reps": {c: {m: [asdict(p) for p in ps] for m, ps in modes.items()} for c, modes in runs.items()},
    }


# ------------------------------------------------------------------------------------------ reporting


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _fmt_phase(p: Phase) -> str:
    return (
        f"{p.rps:9.0f} req/s  p50 {p.p50_ms:7.2f} ms  p99 {p.p99_ms:7.2f} ms  "
        f"{p.cpu_us_per_req:7.0f} CPU us/req  ({p.proxy_cpu_pct:.0f}% CPU, {p.errors} errors)"
    )


def _describe(config: Config, upstream: str, loadgen: str, proxy_cpu: int, load_cpu: int) -> str:
    return (
        f"bench.http_clients: server={config.server} upstream={upstream} loadgen={loadgen} "
        f"proxy on CPU {proxy_cpu}, upstream+load on CPU {load_cpu}; {config.connections} connections, "
        f"warm-up {config.warmup:g}s, measured {config.duration:g}s, reps {config.reps}"
    )


def format_table(report: dict[str, Any]) -> str:
    env = report["environment"]
    cfg = report["config"]
    head = (
        f"{'mode':7} {'client':16} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'CPU us/req':>11} {'proxy CPU%':>10} {'errors':>7}"
    )
    lines = [
        f"server={env['server']} upstream={env['upstream']} loadgen={env['loadgen']} "
        f"connections={cfg['connections']} duration={cfg['duration']:g}s reps={cfg['reps']} "
        f"(proxy CPU {env['proxy_cpu']}, upstream+load CPU {env['load_cpu']})",
        head,
        "-" * len(head),
    ]
    for mode in cfg["modes"]:
        for client in cfg["clients"]:
            r = report["results"][client][mode]
            lines.append(
                f"{mode:7} {client:16} {r['rps']:9.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
                f"{r['cpu_us_per_req']:11.0f} {r['proxy_cpu_pct']:10.0f} {r['errors']:7d}"
            )
        for client, by_mode in report["ratios_over_httpx"].items():
            ratio = by_mode.get(mode)
            if ratio:
                lines.append(
                    f"{mode:7} {client + '/httpx':16} {ratio['rps']:9.2f} {ratio['p50_ms']:8.2f} "
                    f"{ratio['p99_ms']:8.2f} {ratio['cpu_us_per_req']:11.2f}"
                )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- CLI


def _csv(choices: Sequence[str]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}")
        return items

    return parse


def parse_args(argv: Sequence[str] | None) -> tuple[Config, Path | None]:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=DESCRIPTION)
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per client x mode")
    p.add_argument("--warmup", type=float, default=3.0, help="discarded warm-up seconds (0 = none)")
    p.add_argument("--connections", type=int, default=64, help="concurrent client connections")
    p.add_argument("--server", choices=("uvicorn", "granian"), default="uvicorn")
    p.add_argument("--clients", type=_csv(CLIENTS), default=CLIENTS, help="default: httpx,aiohttp,switchyard")
    p.add_argument("--modes", type=_csv(MODES), default=MODES, help="default: json,stream")
    p.add_argument("--reps", type=int, default=1, help="alternating rounds; the table shows medians")
    p.add_argument("--upstream", choices=("auto", "nginx", "aiohttp"), default="auto")
    p.add_argument("--loadgen", choices=("auto", "wrk", "aiohttp"), default="auto")
    p.add_argument("--json", type=Path, default=None, help="also write the full result dict here")
    a = p.parse_args(argv)
    if a.duration <= 0 or a.duration > 600 or a.connections < 1 or a.connections > 4096 or a.reps < 1:
        p.error("need 0 < duration <= 600, 1 <= connections <= 4096, reps >= 1")
    warmup = min(max(a.warmup, 0.0), 120.0)
    config = Config(
        a.duration, warmup, a.connections, a.server, a.clients, a.modes, a.reps, a.upstream, a.loadgen
    )
    return config, a.json


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "_proxy":
        serve_uvicorn(int(args[1]))
        return 0
    if args and args[0] == "_upstream":
        serve_aiohttp_upstream(int(args[1]), int(args[2]))
        return 0
    if args and args[0] == "_loadgen":
        run_loadgen(args[1], args[2], int(args[3]), float(args[4]))
        return 0
    config, json_path = parse_args(args)
    install_interrupt_handlers()
    try:
        report = run_benchmark(config)
    except KeyboardInterrupt:
        _log("interrupted; all child processes stopped")
        return 130
    print(format_table(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        _log(f"wrote {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
