"""Time to route one request with the policy engine, for fleets of 16, 64 and 1,000 backends.

Builds a synthetic fleet (half H100, half MI300X pools of 8 backends each, all serving one model), gives
every backend a random load (in flight, waiting, KV usage, observed latency, measured cost), then times
`PolicyEngine.choose` for a mix of requests that hits every class of the chosen policy (interactive,
long-context, batch, default), with loads re-randomised between rounds. Reports p50, p90, p99 and max in
microseconds per fleet size. Pinned to one CPU; single-threaded; bounded in rounds.

Usage: python -m loadtest.bench.routing [--policy balanced] [--sizes 16,64,1000] [--requests 20000]
Target (issue 4): p99 at most 100 µs at 64 backends.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from backends.models import Backend, BackendConfig, EngineLoad, PoolConfig, build_backends
from gateway.request.classify import Caller, classify
from gateway.request.parse import parse
from policies.config import load_policy
from policies.engine import PolicyEngine
from policies.presets import resolve

MODEL = "llama-3.1-8b"


def fleet(size: int) -> list[Backend]:
    """`size` backends in pools of up to 8, alternating H100 and MI300X pools."""
    per_pool = min(8, max(1, size // 2))
    pools: list[PoolConfig] = []
    for p, start in enumerate(range(0, size, per_pool)):
        amd = p % 2 == 1
        pools.append(
            PoolConfig(
                name=f"{'mi300x' if amd else 'h100'}-{p}",
                vendor="amd" if amd else "nvidia",
                accelerator="mi300x" if amd else "h100",
                price_per_gpu_hour=1.75 if amd else 2.90,
                labels={"tier": "capacity" if amd else "latency"},
                backends=[
                    BackendConfig(url=f"http://127.0.0.1:{9000 + i}", models=[MODEL], max_model_len=32768)
                    for i in range(start, min(size, start + per_pool))
                ],
            )
        )
    return build_backends(pools)


def randomise(backends: list[Backend], rng: random.Random) -> None:
    for b in backends:
        b.inflight = rng.randint(0, 40)
        b.healthy = rng.random() > 0.03
        b.load = EngineLoad(
            running=rng.randint(0, 64),
            waiting=rng.choice((0, 0, 0, 1, 3, 8)),
            kv_cache_usage=rng.random(),
            scraped_at=0,
        )
        b.observed.ttft = rng.uniform(0.02, 1.2)
        b.observed.tpot = rng.uniform(0.005, 0.08)
        b.measured_cost_per_mtok = rng.choice((None, rng.uniform(0.02, 0.2)))


def requests() -> list[Any]:
    bodies = [
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi " * 50}],
            "stream": True,
            "max_tokens": 200,
        },
        {"model": MODEL, "messages": [{"role": "user", "content": "doc " * 9000}], "max_tokens": 500},
        {"model": MODEL, "messages": [{"role": "user", "content": "list " * 100}], "n": 4, "max_tokens": 300},
        {"model": MODEL, "messages": [{"role": "user", "content": "summarise " * 400}], "max_tokens": 400},
    ]
    caller = Caller("bench", None, {}, session="session-42")
    return [classify(parse("chat", json.dumps(body).encode()), caller) for body in bodies]


def measure(engine: PolicyEngine, backends: list[Backend], count: int, rng: random.Random) -> list[float]:
    profiles = requests()
    samples: list[float] = []
    rounds = max(1, count // 200)
    gc.disable()
    try:
        for _ in range(rounds):
            randomise(backends, rng)
            for i in range(200):
                profile = profiles[i % len(profiles)]
                started = time.perf_counter_ns()
                engine.choose(profile, backends)
                samples.append((time.perf_counter_ns() - started) / 1000)
    finally:
        gc.enable()
    return samples


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q / 100 * len(sorted_values)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", default="balanced", help="preset name or policy file")
    parser.add_argument("--sizes", default="16,64,1000")
    parser.add_argument("--requests", type=int, default=20_000, help="routing decisions per fleet size")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 200 <= args.requests <= 1_000_000:
        parser.error("--requests must be between 200 and 1000000")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rng = random.Random(7)
    loaded = load_policy(resolve(args.policy))
    results: dict[str, Any] = {}
    print(f"policy {loaded.policy.name}, {args.requests} decisions per size, pinned to one CPU")
    print(f"{'backends':>9} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} {'max µs':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        backends = fleet(size)
        engine = PolicyEngine(loaded, backends)
        measure(engine, backends, 2000, rng)  # warm-up
        samples = sorted(measure(engine, backends, args.requests, rng))
        row = {q: percentile(samples, q) for q in (50, 90, 99)}
        row[100] = samples[-1]
        results[str(len(backends))] = {f"p{q}": v for q, v in row.items()}
        print(f"{len(backends):>9} {row[50]:>8.1f} {row[90]:>8.1f} {row[99]:>8.1f} {row[100]:>8.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
