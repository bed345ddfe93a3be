"""The latency the gateway adds: the same requests sent straight to a backend and through the gateway.

Starts one simulated backend with zero token delays (so the backend's own time is only its HTTP work) on
the second CPU and the gateway pinned to the first, then, for each concurrency level, sends a bounded
number of chat requests (non-streaming, and streaming with 16 tokens) directly and through the gateway,
alternating the two so drift on a shared machine hits both. Reports p50/p90/p99 per path and the added
latency (gateway minus direct) at each percentile.

Usage: python -m loadtest.bench.added_latency [--requests 2000] [--concurrency 1,8] [--json out.json]
       (make bench-latency ARGS="...")
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from loadtest.bench._util import bench_pools, pick_cpus, serve_argv, start_gateway, start_zero_delay_backend
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers

MODEL = "bench-model"
_PROMPT = "Explain in two sentences why decode is memory-bandwidth bound on an H100. " * 6


def _body(stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": _PROMPT}],
        "max_tokens": 16,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    started = time.perf_counter()
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}")
    return time.perf_counter() - started


async def _measure(
    urls: dict[str, str], body: bytes, requests: int, concurrency: int
) -> dict[str, list[float]]:
    """Send `requests` per path in rounds of `concurrency`, alternating paths round by round."""
    samples: dict[str, list[float]] = {name: [] for name in urls}
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        for url in urls.values():  # warm connections and caches
            await asyncio.gather(*(_one(session, url, body) for _ in range(concurrency * 4)))
        rounds = max(1, requests // concurrency)
        for _ in range(rounds):
            for name, url in urls.items():
                samples[name].extend(
                    await asyncio.gather(*(_one(session, url, body) for _ in range(concurrency)))
                )
    return samples


def _summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, values in samples.items():
        ordered = sorted(values)
        out[name] = {f"p{q}": _percentile(ordered, q) * 1000 for q in (50, 90, 99)}
        out[name]["mean"] = statistics.fmean(ordered) * 1000
        out[name]["count"] = len(ordered)
    out["added"] = {k: out["gateway"][k] - out["direct"][k] for k in ("p50", "p90", "p99", "mean")}
    return out


def _start(group: ProcessGroup, workdir: Path) -> dict[str, str]:
    proxy_cpu, load_cpu = pick_cpus()
    backend_url = start_zero_delay_backend(group, MODEL, load_cpu)
    gateway_port = free_port()
    config = {
        "gateway": {"port": gateway_port},
        "pools": bench_pools(backend_url, MODEL),
    }
    config_path = workdir / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    gateway_url, _ = start_gateway(group, "gateway", serve_argv(config_path), gateway_port, proxy_cpu)
    return {"direct": backend_url + "/v1/chat/completions", "gateway": gateway_url + "/v1/chat/completions"}


def run(requests: int, concurrencies: list[int]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="added-latency-") as tmp:
        group = ProcessGroup(Path(tmp))
        try:
            urls = _start(group, Path(tmp))
            for stream in (False, True):
                for concurrency in concurrencies:
                    samples = asyncio.run(_measure(urls, _body(stream), requests, concurrency))
                    results[f"{'stream' if stream else 'json'} c={concurrency}"] = _summary(samples)
        finally:
            group.close()
    return results


def format_table(results: dict[str, Any]) -> str:
    lines = [f"{'case':<12} {'path':<8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'n':>6}"]
    for case, summary in results.items():
        for path in ("direct", "gateway", "added"):
            row = summary[path]
            count = str(row.get("count", ""))
            lines.append(
                f"{case:<12} {path:<8} {row['p50']:>8.3f} {row['p90']:>8.3f} {row['p99']:>8.3f} {count:>6}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests per path and case (bounded)")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated concurrency levels")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 100_000:
        parser.error("--requests must be between 1 and 100000")
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    if not concurrencies or any(not 1 <= c <= 256 for c in concurrencies):
        parser.error("--concurrency levels must be between 1 and 256")
    install_interrupt_handlers()
    results = run(args.requests, concurrencies)
    print(format_table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
