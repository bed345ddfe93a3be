"""What accounting costs: gateway requests/s with the Redis ledger, the in-memory ledger, and none.

One run: one simulated backend with zero token delays and wrk (64 connections) share the second CPU;
three gateways, identical but for `ledger.store` (redis | memory | none), are pinned to the first CPU
and loaded one at a time, in alternating rounds so drift on a shared machine hits all three. Reports
requests/s and gateway CPU µs per request per mode (medians over rounds), and the throughput ratio
against `none` (the median of each round's ratio, so drift between rounds cancels).
The Redis mode uses the Redis at --redis-url (loopback only) under a private key prefix, deleted after.

`--baseline DIR` also runs the gateway code of another checkout (e.g. a git worktree of main, with this
checkout's interpreter) in the same run: three more gateways, interleaved round by round with these, and
reports per mode the CPU per request of this code over the baseline's (median of the rounds' ratios).

Usage: python -m loadtest.bench.accounting [--duration 5] [--rounds 3] [--connections 64]
       [--redis-url redis://127.0.0.1:6379/0] [--baseline DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import yaml

from gateway.ledger.keys import Keys
from loadtest.bench._util import (
    bench_pools,
    http_post,
    pick_cpus,
    run_wrk,
    serve_argv,
    session_cpu_seconds,
    start_gateway,
    start_zero_delay_backend,
    which,
)
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers

MODEL = "bench-model"
MODES = ("redis", "memory", "none")
_BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Why is decode bandwidth bound?"}],
        "max_tokens": 16,
    }
)
_WRK_SCRIPT = (
    'wrk.method = "POST"\n'
    f"wrk.body = {json.dumps(_BODY)}\n"
    'wrk.headers["Content-Type"] = "application/json"\n'
    'wrk.headers["Authorization"] = "Bearer bench-key"\n'
)


def _gateway_config(port: int, backend_url: str, mode: str, redis_url: str, prefix: str) -> dict[str, Any]:
    ledger: dict[str, Any] = {"store": mode, "key_prefix": prefix}
    if mode == "redis":
        ledger["redis_url"] = redis_url
    return {
        "gateway": {"port": port},
        "ledger": ledger,
        "pools": bench_pools(backend_url, MODEL),
    }


def run(
    duration: float, rounds: int, connections: int, redis_url: str, baseline: Path | None = None
) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    if not redis_url.startswith("redis://127.0.0.1:"):
        raise SystemExit("only a loopback Redis is allowed")
    proxy_cpu, load_cpu = pick_cpus()
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    trees: dict[str, str | None] = {"": None}
    if baseline is not None:
        trees["baseline "] = str(baseline.resolve())
    runs = [(tree, mode) for tree in trees for mode in MODES]
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {run: [] for run in runs}
    with tempfile.TemporaryDirectory(prefix="bench-accounting-") as tmp:
        work = Path(tmp)
        script = work / "post.lua"
        script.write_text(_WRK_SCRIPT)
        group = ProcessGroup(work)
        try:
            backend_url = start_zero_delay_backend(group, MODEL, load_cpu)
            gateways: dict[tuple[str, str], tuple[str, int]] = {}
            for n, (tree, mode) in enumerate(runs):
                port = free_port()
                path = work / f"gateway-{n}.yaml"
                config = _gateway_config(port, backend_url, mode, redis_url, f"{prefix}-{n}")
                path.write_text(yaml.safe_dump(config))
                url, child = start_gateway(
                    group, f"gateway-{n}", serve_argv(path), port, proxy_cpu, cwd=trees[tree]
                )
                status, body = http_post(url + "/v1/chat/completions", _BODY.encode())
                if status != 200:
                    raise RuntimeError(f"{tree}{mode} gateway answered {status}: {body[:300]!r}")
                gateways[(tree, mode)] = (url, child.pid)
            for url, _ in gateways.values():  # warm up
                run_wrk(wrk, url + "/v1/chat/completions", script, connections, 1, load_cpu)
            for r in range(rounds):
                order = runs[r % len(runs) :] + runs[: r % len(runs)]
                for run in order:
                    url, pid = gateways[run]
                    cpu_before = session_cpu_seconds(pid)
                    chat = url + "/v1/chat/completions"
                    rps, _ = run_wrk(wrk, chat, script, connections, duration, load_cpu)
                    cpu = session_cpu_seconds(pid) - cpu_before
                    samples[run].append((rps, cpu / max(1.0, rps * duration) * 1e6))
            time.sleep(0.5)  # let the Redis gateway flush its last batch
            ledger = json.loads(_get(gateways[("", "redis")][0] + "/ready"))["ledger"]
        finally:
            group.close()
            for n in range(len(runs)):
                _delete_prefix(redis_url, f"{prefix}-{n}")
    summary: dict[str, Any] = {}
    for tree, mode in runs:
        s = samples[(tree, mode)]
        pairs = zip(s, samples[(tree, "none")], strict=True)  # each round's runs ran back to back
        summary[tree + mode] = {
            "rps": statistics.median(x[0] for x in s),
            "cpu_us_per_req": statistics.median(x[1] for x in s),
            "rounds": [round(x[0]) for x in s],
            "cpu_rounds": [round(x[1], 1) for x in s],
            "vs_none": statistics.median(m[0] / n[0] for m, n in pairs),
        }
    if baseline is not None:
        summary["cpu_vs_baseline"] = {
            mode: statistics.median(
                a[1] / b[1] for a, b in zip(samples[("", mode)], samples[("baseline ", mode)], strict=True)
            )
            for mode in MODES
        }
    summary["redis_ledger_stats"] = ledger
    return summary


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as r:
        return str(r.read().decode())


def _delete_prefix(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    batch: list[bytes] = []
    for key in client.scan_iter(match=Keys(prefix).pattern, count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)
    client.close()


def format_table(summary: dict[str, Any]) -> str:
    lines = [f"{'ledger':<17} {'req/s':>8} {'vs none':>8} {'CPU µs/req':>11}  req/s per round"]
    for name in [k for k in summary if k.removeprefix("baseline ") in MODES]:
        s = summary[name]
        lines.append(
            f"{name:<17} {s['rps']:>8.0f} {s['vs_none']:>8.3f} {s['cpu_us_per_req']:>11.1f}  {s['rounds']}"
        )
    ratios = summary.get("cpu_vs_baseline")
    if ratios:
        lines.append(
            "CPU per request, this code / baseline (median of paired rounds): "
            + ", ".join(f"{mode} {ratio:.3f}" for mode, ratio in ratios.items())
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to compare with")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 120 or not 1 <= args.rounds <= 20 or not 1 <= args.connections <= 512:
        parser.error("--duration 1..120, --rounds 1..20, --connections 1..512")
    install_interrupt_handlers()
    if args.baseline is not None and not (args.baseline / "gateway" / "cli.py").is_file():
        parser.error(f"--baseline {args.baseline}: not a Switchyard checkout")
    summary = run(args.duration, args.rounds, args.connections, args.redis_url, args.baseline)
    print(format_table(summary))
    print("redis ledger:", summary["redis_ledger_stats"])
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
