"""Two trees in `auth.mode: keys` side by side: what one change to keys, limits and budgets costs.

How: a `keys` gateway of each tree (`--base`: another checkout with its own `.venv`, e.g. main; and this
one) shares the first CPU with the other, both loaded at once by one wrk each (the keys benchmark's key,
team and body), so their throughputs and p50s compare over the very same seconds; rounds alternate which
starts first, the result is the median of the per-round ratios `this / base`. Each tree's gateway has a
private `redis-server` of its own (on the second CPU, with wrk and nginx), so Redis's `INFO commandstats`
and CPU say what each tree's admissions cost Redis: calls inside the scripts and script time per script
call, Redis CPU per request.

`--sdk-headers` adds to each request the headers the official `openai` SDK sends (taken from the installed
SDK: its `x-stainless-*` ones, Accept, User-Agent), some ten more than wrk's: the gateway reads every
header, so a change to what each one costs shows only with them.

Usage: python -m loadtest.bench.keys_ab --base /path/to/other/tree [--connections 8] [--rounds 4]
       [--duration 8] [--sdk-headers] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis
import yaml

from loadtest.bench._util import (
    bench_pools,
    pick_cpus,
    process_cpu_seconds,
    start_gateway,
    start_static_backend,
    wrk_argv,
    wrk_figures,
)
from loadtest.bench.accounting import MODEL
from loadtest.bench.keys import ADMIN_KEY, _make_key, _script
from loadtest.processes import Child, ProcessGroup, free_port, install_interrupt_handlers, wait_until

ROOT = Path(__file__).resolve().parents[2]
TREES = ("base", "this")
_OUTSIDE = {"evalsha", "eval", "info", "hello", "ping", "client", "select", "script"}
"""Commands the gateway sends itself (the rest ran inside its scripts)."""


def _config(port: int, backend_url: str, redis_port: int, prefix: str) -> dict[str, Any]:
    auth = {"mode": "keys", "store": "redis", "redis_url": f"redis://127.0.0.1:{redis_port}/0", "replicas": 3}
    return {
        "gateway": {"port": port},
        "ledger": {"store": "memory", "key_prefix": prefix},
        "auth": auth,
        "telemetry": {"metrics": True, "access_log": {"enabled": False}},
        "pools": bench_pools(backend_url, MODEL),
    }


def _start_redis(group: ProcessGroup, name: str, cpu: int) -> tuple[int, Child]:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed")
    port = free_port()
    child = group.start(name, [server, "--port", str(port), "--save", "", "--appendonly", "no"], cpu=cpu)
    client = redis.Redis(port=port)
    wait_until(lambda: bool(client.ping()), timeout=10, what=f"redis-server :{port}", child=child)
    client.close()
    return port, child


def _redis_figures(client: redis.Redis) -> dict[str, float]:
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    calls = {name.removeprefix("cmdstat_"): float(v["calls"]) for name, v in stats.items()}
    calls["script_us"] = float(stats.get("cmdstat_evalsha", {}).get("usec", 0))
    calls["cpu_us"] = (float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])) * 1e6
    return calls


def _wrk_pair(
    wrk: str, urls: list[str], scripts: list[Path], connections: int, duration: float, cpu: int
) -> list[tuple[float, float]]:
    """Load both gateways at once: per gateway (requests/s, p50 ms)."""
    procs = [
        subprocess.Popen(
            wrk_argv(wrk, url, script, connections, duration),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        )
        for url, script in zip(urls, scripts, strict=True)
    ]
    return [
        wrk_figures(proc.communicate(timeout=duration + 30)[0], url)
        for proc, url in zip(procs, urls, strict=True)
    ]


def sdk_headers() -> dict[str, str]:
    """The headers the installed `openai` SDK sends with every request, but for those wrk sets itself
    (Content-Type, and Authorization from the key), as the SDK gives them: its `x-stainless-*` ones."""
    import openai

    client = openai.OpenAI(api_key="sy-unused", max_retries=0)
    headers = {k: v for k, v in client.default_headers.items() if isinstance(v, str)}
    headers["X-Stainless-Retry-Count"] = "0"  # set per attempt by the SDK, not among its defaults
    client.close()
    return {k: v for k, v in headers.items() if k.lower() not in ("content-type", "authorization")}


def _with_headers(script: str, headers: dict[str, str]) -> str:
    return script + "".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in headers.items())


def run(
    base: Path, duration: float, rounds: int, connections: int, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (make wrk)")
    trees = {"base": base.resolve(), "this": ROOT}
    for checkout in trees.values():
        if not (checkout / ".venv/bin/python").exists():
            raise SystemExit(f"{checkout} has no .venv (make venv there)")
    gw_cpu, load_cpu = pick_cpus()
    per_tree: dict[str, dict[str, list[float]]] = {
        t: {
            "rps": [],
            "p50_ms": [],
            "gateway_cpu_us_per_req": [],
            "calls_per_script": [],
            "script_us": [],
            "redis_cpu_us_per_req": [],
        }
        for t in TREES
    }
    ratios: dict[str, list[float]] = {"rps": [], "p50": []}
    with tempfile.TemporaryDirectory(prefix="bench-keys-ab-") as tmp:
        work = Path(tmp)
        group = ProcessGroup(work)
        try:
            backend_url = start_static_backend(group, MODEL, load_cpu, work)
            redis_ports = {t: _start_redis(group, f"redis-{t}", load_cpu)[0] for t in TREES}
            clients = {t: redis.Redis(port=redis_ports[t]) for t in TREES}
            scripts: dict[str, Path] = {}
            for r in range(rounds):
                order = TREES if r % 2 == 0 else TREES[::-1]
                started: dict[str, tuple[str, Child]] = {}
                for i, tree in enumerate(order):
                    port = free_port()
                    path = work / f"gateway-{tree}-{r}.yaml"
                    path.write_text(yaml.safe_dump(_config(port, backend_url, redis_ports[tree], "keys-ab")))
                    env = {
                        **os.environ,
                        "PYTHONHASHSEED": str(r * 2 + i + 1),
                        "PYTHONPATH": str(trees[tree]),
                        "SWITCHYARD_ADMIN_KEY": ADMIN_KEY,
                    }
                    python = str(trees[tree] / ".venv/bin/python")
                    argv = [
                        python,
                        "-m",
                        "gateway.cli",
                        "serve",
                        "--config",
                        str(path),
                        "--log-level",
                        "warning",
                    ]
                    started[tree] = start_gateway(
                        group,
                        f"gateway-{tree}-{r}",
                        argv,
                        port,
                        gw_cpu,
                        cwd=str(trees[tree]),
                        env=env,
                        timeout=60,
                    )
                for tree in TREES:
                    if tree not in scripts:
                        scripts[tree] = work / f"post-{tree}.lua"
                        script = _script(_make_key(started[tree][0]))
                        scripts[tree].write_text(_with_headers(script, headers or {}))
                urls = [started[t][0] + "/v1/chat/completions" for t in TREES]
                paths = [scripts[t] for t in TREES]
                _wrk_pair(wrk, urls, paths, connections, 1, load_cpu)  # warm-up
                before = {t: _redis_figures(clients[t]) for t in TREES}
                cpu_before = {t: process_cpu_seconds(started[t][1].pid) for t in TREES}
                pair = _wrk_pair(wrk, urls, paths, connections, duration, load_cpu)
                for tree, (rps, p50) in zip(TREES, pair, strict=True):
                    after = _redis_figures(clients[tree])
                    delta = {k: after[k] - before[tree].get(k, 0.0) for k in after}
                    scripts_run = max(1.0, delta.get("evalsha", 0.0))
                    inner = sum(v for k, v in delta.items() if k not in _OUTSIDE | {"script_us", "cpu_us"})
                    figures = per_tree[tree]
                    figures["rps"].append(rps)
                    figures["p50_ms"].append(p50)
                    cpu = process_cpu_seconds(started[tree][1].pid) - cpu_before[tree]
                    figures["gateway_cpu_us_per_req"].append(cpu / max(1.0, rps * duration) * 1e6)
                    figures["calls_per_script"].append(inner / scripts_run)
                    figures["script_us"].append(delta["script_us"] / scripts_run)
                    figures["redis_cpu_us_per_req"].append(delta["cpu_us"] / max(1.0, rps * duration))
                ratios["rps"].append(pair[1][0] / pair[0][0])
                ratios["p50"].append(pair[1][1] / pair[0][1])
                for _, child in started.values():
                    group.stop(child)
            for client in clients.values():
                client.close()
        finally:
            group.close()
    base_cpu, this_cpu = (per_tree[t]["gateway_cpu_us_per_req"] for t in TREES)
    ratios["cpu"] = [this / base for base, this in zip(base_cpu, this_cpu, strict=True)]
    return {
        "connections": connections,
        "extra_headers": len(headers or {}),
        "this_vs_base_rps": statistics.median(ratios["rps"]),
        "this_vs_base_p50": statistics.median(ratios["p50"]),
        "this_vs_base_cpu": statistics.median(ratios["cpu"]),
        "rounds_rps": [round(x, 3) for x in ratios["rps"]],
        "rounds_p50": [round(x, 3) for x in ratios["p50"]],
        "rounds_cpu": [round(x, 3) for x in ratios["cpu"]],
        "medians": {t: {k: statistics.median(v) for k, v in per_tree[t].items()} for t in TREES},
    }


def format_table(summary: dict[str, Any]) -> str:
    head = f"{'tree':<5} {'req/s':>8} {'p50 ms':>8} {'gw CPU µs/req':>14}"
    lines = [head + f" {'Redis calls/script':>19} {'script µs':>10} {'Redis CPU µs/req':>17}"]
    for tree in TREES:
        m = summary["medians"][tree]
        lines.append(
            f"{tree:<5} {m['rps']:>8.0f} {m['p50_ms']:>8.2f} {m['gateway_cpu_us_per_req']:>14.0f} "
            f"{m['calls_per_script']:>19.1f} "
            f"{m['script_us']:>10.0f} {m['redis_cpu_us_per_req']:>17.1f}"
        )
    lines.append(
        f"this / base at {summary['connections']} connections"
        + (f", {summary['extra_headers']} headers of the SDK's more" if summary.get("extra_headers") else "")
        + f": req/s {summary['this_vs_base_rps']:.3f} "
        f"{summary['rounds_rps']}, p50 {summary['this_vs_base_p50']:.3f} {summary['rounds_p50']}, "
        f"gateway CPU/req {summary['this_vs_base_cpu']:.3f} {summary['rounds_cpu']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True, help="the other tree (with its own .venv)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of load per round")
    parser.add_argument("--rounds", type=int, default=4, help="fresh gateway pairs measured")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections per gateway")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--sdk-headers",
        action="store_true",
        help="send what the openai SDK sends besides the key and body (its x-stainless-* headers)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 120 or not 1 <= args.rounds <= 100 or not 1 <= args.connections <= 512:
        parser.error("--duration 1..120, --rounds 1..100, --connections 1..512")
    install_interrupt_handlers()
    headers = sdk_headers() if args.sdk_headers else None
    summary = run(args.base, args.duration, args.rounds, args.connections, headers)
    print(format_table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
