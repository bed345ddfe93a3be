"""What API keys, rate limits and budgets cost: non-streaming throughput of `auth.mode: keys` (a key with
RPM, TPM, parallel and budget limits, in a team with limits of its own, on the shared Redis) against
`open`, in one run.

How: two gateway processes share the first CPU and are loaded at the same time, one wrk each (64
connections), so the kernel gives each half the core and their throughputs compare their costs over the
very same seconds (speed on a shared machine drifts by tens of percent from one second to the next). Each
round starts a fresh pair (other hash seeds, other memory layout: two processes of identical code differ
by several percent) and the rounds alternate which one starts first; the result is the median of the
per-round ratios `keys / open`. wrk and the backend (nginx answering a static chat completion, or a
simulated backend with zero token delays) run on the second CPU.

Usage: python -m loadtest.bench.keys [--duration 4] [--rounds 6] [--connections 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtest.bench._util import (
    bench_pools,
    delete_prefix,
    http_post,
    pick_cpus,
    process_cpu_seconds,
    serve_argv,
    start_gateway,
    start_static_backend,
    which,
)
from loadtest.bench.accounting import _BODY, MODEL
from loadtest.bench.telemetry import _wrk_pair
from loadtest.processes import Child, ProcessGroup, free_port, install_interrupt_handlers

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/0"
ADMIN_KEY = "sy-bench-admin-" + uuid.uuid4().hex
MODES = ("open", "keys")
KEY_LIMITS = {"rpm": 10**9, "tpm": 10**12, "max_parallel": 10**6, "budget_usd": 10**6, "budget_period": "day"}
TEAM_LIMITS = {"rpm": 10**9, "tpm": 10**12, "max_parallel": 10**6, "budget_usd": 10**6}


def _config(port: int, backend_url: str, mode: str, prefix: str) -> dict[str, Any]:
    auth: dict[str, Any] = {"mode": "open"}
    if mode == "keys":
        auth = {"mode": "keys", "store": "redis", "redis_url": REDIS_URL, "replicas": 3}
    return {
        "gateway": {"port": port},
        "ledger": {"store": "memory", "key_prefix": prefix},
        "auth": auth,
        "telemetry": {"metrics": True, "access_log": {"enabled": False}},
        "pools": bench_pools(backend_url, MODEL),
    }


def _script(key: str) -> str:
    return (
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(_BODY)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )


def _start(
    group: ProcessGroup, work: Path, name: str, mode: str, backend_url: str, prefix: str, cpu: int, seed: int
) -> tuple[str, Child]:
    port = free_port()
    path = work / f"gateway-{name}.yaml"
    path.write_text(yaml.safe_dump(_config(port, backend_url, mode, prefix)))
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "SWITCHYARD_ADMIN_KEY": ADMIN_KEY}
    return start_gateway(
        group, f"gateway-{name}", serve_argv(path), port, cpu, cwd=str(ROOT), env=env, timeout=60
    )


def _make_key(url: str) -> str:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=url, headers=admin, timeout=10) as client:
        client.put("/admin/v1/teams/bench", json=TEAM_LIMITS).raise_for_status()
        answer = client.post("/admin/v1/keys", json={"name": "bench", "team": "bench", **KEY_LIMITS})
        answer.raise_for_status()
        return str(answer.json()["key"])


def run(duration: float, rounds: int, connections: int) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    gw_cpu, load_cpu = pick_cpus()
    prefix = "bench-keys-" + uuid.uuid4().hex[:8]
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpu_us: dict[str, list[float]] = {m: [] for m in MODES}
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-keys-") as tmp:
        work = Path(tmp)
        script = work / "post.lua"
        group = ProcessGroup(work)
        try:
            backend_url = start_static_backend(group, MODEL, load_cpu, work)
            key = ""
            for r in range(rounds):
                order = MODES if r % 2 == 0 else MODES[::-1]
                started = {
                    mode: _start(group, work, f"{mode}-{r}", mode, backend_url, prefix, gw_cpu, r * 2 + i + 1)
                    for i, mode in enumerate(order)
                }
                if not key:
                    key = _make_key(started["keys"][0])
                    script.write_text(_script(key))
                for mode, (url, _) in started.items():
                    status, body = http_post(url + "/v1/chat/completions", _BODY.encode())
                    if mode == "open" and status != 200:
                        raise RuntimeError(f"{mode} gateway answered {status}: {body[:300]!r}")
                urls = (
                    started["open"][0] + "/v1/chat/completions",
                    started["keys"][0] + "/v1/chat/completions",
                )
                _wrk_pair(wrk, urls, script, connections, 1, load_cpu)  # warm-up
                before = [process_cpu_seconds(started[m][1].pid) for m in MODES]
                pair = _wrk_pair(wrk, urls, script, connections, duration, load_cpu)
                for i, mode in enumerate(MODES):
                    rates[mode].append(pair[i])
                    spent = process_cpu_seconds(started[mode][1].pid) - before[i]
                    cpu_us[mode].append(spent / max(1.0, pair[i] * duration) * 1e6)
                ratios.append(pair[1] / pair[0])
                for _, child in started.values():
                    group.stop(child)
        finally:
            group.close()
            delete_prefix(REDIS_URL, prefix)
    return {
        "rps_sharing_the_core": {m: statistics.median(rates[m]) for m in MODES},
        "cpu_us_per_req": {m: statistics.median(cpu_us[m]) for m in MODES},
        "keys_vs_open": statistics.median(ratios),
        "rounds_keys_vs_open": [round(x, 3) for x in ratios],
    }


def format_table(summary: dict[str, Any]) -> str:
    rps, cpu = summary["rps_sharing_the_core"], summary["cpu_us_per_req"]
    lines = [f"{'auth':<6} {'req/s (half a core)':>20} {'gw CPU µs/req':>14}"]
    lines += [f"{m:<6} {rps[m]:>20.0f} {cpu[m]:>14.0f}" for m in MODES]
    lines.append(f"keys / open throughput: {summary['keys_vs_open']:.3f} (median of rounds)")
    lines.append(f"per round: {summary['rounds_keys_vs_open']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of load per round")
    parser.add_argument("--rounds", type=int, default=6, help="fresh gateway pairs measured")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections per gateway")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 120 or not 1 <= args.rounds <= 100 or not 1 <= args.connections <= 512:
        parser.error("--duration 1..120, --rounds 1..100, --connections 1..512")
    install_interrupt_handlers()
    summary = run(args.duration, args.rounds, args.connections)
    print(format_table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
